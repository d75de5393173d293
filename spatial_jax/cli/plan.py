"""`spatial-jax plan`: does a recipe fit a machine? Compiles every program of its step for the target (no weights,
no devices needed) and prints per-chip memory against the chip's HBM; exits 1 naming each program that does not fit.

  spatial-jax plan --config configs/spatialcore_8b.toml --topology v5p:2x4x4 --json plan.json
  spatial-jax plan --config configs/prosr_8b.toml --topology gpu:h100x8          # an analytic estimate
"""

from __future__ import annotations

import argparse
import os
import sys


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default=None, help="a TOML file in configs/ (default: the embedded tiny CPU job)")
    p.add_argument("--topology", default=None,
                   help="v5p:2x4x4, v6e:4x4, ... (a TPU slice), cpu:N or gpu:h100x8 (default: the recipe's "
                        "plan.target)")
    p.add_argument("--json", default=None, metavar="OUT", help="also write the figures to this JSON file")
    p.add_argument("--hbm", type=float, default=None, metavar="GIB",
                   help="memory per chip to plan against (default: the chip's HBM; host devices have none)")
    p.add_argument("--program", action="append", default=None,
                   choices=("rl_update", "reference_forward", "old_logp_forward", "rollout_prefill", "rollout_decode",
                            "sft_update"),
                   help="compile only this program (repeatable; default: all the job runs)")
    p.add_argument("overrides", nargs="*", metavar="key=value", help="config overrides, e.g. mesh.fsdp=4")


# jax makes every host device at its start, in time that grows faster than their number (4,096: 14 s), so a count
# past this one would hang the command before anything is checked
MAX_HOST_DEVICES = 1024


def _check_host_devices(topology: str | None) -> None:
    from spatial_jax.config import ConfigError

    kind, _, count = (topology or "").partition(":")
    if kind == "cpu" and count.isdigit() and int(count) > MAX_HOST_DEVICES:
        raise ConfigError(f"--topology {topology}: at most cpu:{MAX_HOST_DEVICES} host devices; plan a larger "
                          "machine by its TPU topology or gpu:<chip>x<count>")


def _prepare_jax(topology: str | None) -> None:
    """Before jax is imported: compile on the host (targets are described, not used) and N host devices for cpu:N.
    A process that already runs jax is left as it is."""
    if "jax" in sys.modules:
        return
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    kind, _, count = (topology or "").partition(":")
    if kind == "cpu" and count.isdigit():
        flags = os.environ.get("XLA_FLAGS", "")
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={count}".strip()


def run(args) -> int:
    _check_host_devices(args.topology)
    _prepare_jax(args.topology)
    from spatial_jax.cli.job_config import default_config, job_files, load_job
    from spatial_jax.cli.outputs import check_output_files, check_writable_file
    from spatial_jax.config import ConfigError

    cfg = load_job(args.config, args.overrides)
    check_output_files({"--json": args.json}, job_files(args.config))
    if args.json:
        check_writable_file("--json", args.json)
    topology = args.topology or cfg.plan.target
    if not topology:
        raise ConfigError("name a target: --topology v5p:2x4x4 (or cpu:N, gpu:h100x8), or plan.target in the config")
    from spatial_jax.rl.plan import over_message, plan
    from spatial_jax.rl.report import write_json

    report = plan(cfg, topology, config_name=args.config or f"{default_config() or 'TrainConfig defaults'} (default)",
                  only=tuple(args.program or ()), hbm_gib=args.hbm)
    print(report.table(), flush=True)
    if args.json:
        write_json(args.json, report.to_json())
    if report.over():
        print(f"spatial-jax plan: {over_message(report)}", file=sys.stderr)
        return 1
    return 0
