"""Will a recipe fit its machine? Compile every program a training step runs, for the target, without weights.

`plan(cfg, "v5p:2x4x4")` builds the recipe's policy abstractly (nnx.eval_shape: shapes, dtypes and shardings, no
weights and no checkpoint read), lays its state out on the recipe's mesh over the target's devices, and compiles
ahead of time, at the recipe's real shapes, the RL update (one micro-batch), the KL reference forward, the SFT step,
and the rollouts as the job samples them: on host 0's decoding copy (its chips, the decode dtype), host 0's block of
the rollouts, through the configured engine (the paged engine's widest prefill and decode chunk at its slots and
page pool, or the static sampler's prefill and decode loop), with the trainer's state resident meanwhile (or, with
decode.devices > 0, on a rollout mesh of its own: the chips after the training mesh's, holding nothing else). Each
program's per-chip memory comes from the compiler's own buffer assignment (`memory_analysis`), its FLOPs from
`cost_analysis`.

Targets: a TPU topology ("v5p:2x4x4", "v6e:4x4"; libtpu compiles for it from a CPU host), `cpu:N` (N host devices),
or `gpu:<chip>x<count>` ("gpu:h100x8"). jaxlib builds without a CUDA plugin cannot compile for a GPU target without
a GPU, so a GPU target gets an analytic estimate instead, labelled as such (`estimate_gpu`), with the updates' remat
policy chosen to fit (`choose_remat`: the matmul outputs saved where the chip's memory allows, else whole layers
recomputed) and printed.

The parts: targets.py (the TPU topologies and other targets), shapes.py (the policy and a step's inputs, abstract),
measure.py (one compiled program's figures), update.py (planning the updates), rollouts.py (planning the rollouts),
gpu.py (the GPU estimate); this module composes them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from spatial_jax.config import ConfigError
from spatial_jax.models.sharding import make_mesh
from spatial_jax.rl.config import TrainConfig, check_context, old_logp_forward, validate
from spatial_jax.rl.optim import make_optimizer
from spatial_jax.rl.plan import gpu, rollouts, targets, update
from spatial_jax.rl.plan.measure import Program, fmt_bytes
from spatial_jax.rl.plan.shapes import Shapes, _key, _local_bytes, _opt_state, abstract_policy, image_grid, model_config
from spatial_jax.rl.plan.targets import GiB, Target

PROGRAMS = ("rl_update", "reference_forward", "old_logp_forward", "rollout_prefill", "rollout_decode", "sft_update")


def programs(cfg: TrainConfig, mesh, only: tuple[str, ...] = (), host: tuple | None = None) -> list[Program]:
    """Compiles each program the job runs (or those named in `only`) for `mesh`'s devices (the rollouts' for
    `host`'s, when given: `host_slice`, or the rollout mesh's with decode.devices); returns their figures.
    Host arrays are built outside the mesh (under it jnp.asarray would place them on its devices); only the
    lowering runs under it."""
    mc = model_config(cfg)
    policy = abstract_policy(cfg, mc, mesh)
    shapes, rc = Shapes.of(cfg), cfg.rl
    grid = image_grid(cfg, mc)
    lora = cfg.policy.lora
    adapters = lora.rank > 0 or lora.vision_rank > 0
    key = _key(mesh) if lora.dropout > 0 and adapters else None
    rl_tx = make_optimizer(dataclasses.replace(rc.optim, total_steps=max(rc.steps, 1),
                                               grad_accum_steps=shapes.mini_batch // shapes.micro_batch))
    rl_opt = _opt_state(rl_tx, policy.trainable, mesh)
    # the KL reference of full fine-tuning is a copy of the trainable weights (workspace.start_reference)
    reference = _local_bytes(policy.trainable, mesh) if rc.loss.kl_coef > 0 and not adapters else 0
    run = {name for name in PROGRAMS if not only or name in only}
    if rc.steps == 0:
        run -= {"rl_update", "reference_forward", "rollout_prefill", "rollout_decode"}
    if rc.loss.kl_coef == 0:
        run.discard("reference_forward")
    if not old_logp_forward(cfg):
        run.discard("old_logp_forward")
    if cfg.sft.steps == 0:
        run.discard("sft_update")
    out = update.rl_programs(cfg, mc, policy, mesh, shapes, grid, run, rl_tx, rl_opt, reference, key)
    if run & {"rollout_prefill", "rollout_decode"}:
        out += rollouts.rollout_programs(cfg, mc, policy, mesh, shapes, grid, run, rl_opt, reference, host)
    if "sft_update" in run:
        out.append(update.sft_program(cfg, mc, policy, mesh, shapes, grid, key))
    return out


@dataclasses.dataclass
class Report:
    """One plan: the target, the mesh and each program's per-chip figures (compiled, or estimated for a GPU)."""

    config: str
    target: Target
    mesh: tuple[int, int, int]  # data, fsdp, tensor
    programs: list[Program]
    estimate: bool = False
    rollout_devices: int = 0  # decode.devices: chips of a rollout mesh of their own (0: the training mesh's)
    remat: tuple[str, str, dict[str, int]] | None = None  # GPU: (chosen policy, the recipe's, updates' peak per choice)

    def over(self) -> list[tuple[Program, int]]:
        """(program, bytes over the chip's HBM) for each program that does not fit."""
        hbm = self.target.hbm_bytes
        return [] if hbm is None else [(p, p.peak - hbm) for p in self.programs if p.peak > hbm]

    def to_json(self) -> dict[str, Any]:
        t = self.target
        return {"config": self.config, "target": t.name, "platform": t.platform, "chip": t.chip, "chips": t.count,
                "hbm_bytes_per_chip": t.hbm_bytes, "mesh": dict(zip(("data", "fsdp", "tensor"), self.mesh)),
                "rollout_devices": self.rollout_devices,
                **({} if self.remat is None else {"remat": {"chosen": self.remat[0], "recipe": self.remat[1],
                                                            "update_peaks": self.remat[2]}}),
                "estimate": self.estimate, "fits": not self.over(), "programs": [p.row() for p in self.programs]}

    def table(self) -> str:
        t = self.target
        hbm = "host memory" if t.hbm_bytes is None else fmt_bytes(t.hbm_bytes)
        kind = "ESTIMATE (analytic; no compiler for this target here)" if self.estimate else "compiled"
        head = (f"{self.config} on {t.name} ({t.count} x {t.chip}, {hbm} per chip), mesh data={self.mesh[0]} "
                f"fsdp={self.mesh[1]} tensor={self.mesh[2]}: {kind}, per chip")
        if self.rollout_devices:
            head += (f"; rollouts on a mesh of their own, the {self.rollout_devices} chips after the training mesh's "
                     "(nothing of the trainer resident there)")
        lines = [head, f"{'program':<18} {'argument':>10} {'temp':>10} {'output':>10} {'resident':>10} {'peak':>10} "
                       f"{'of HBM':>7} {'compile s':>9} {'cache':>5} {'TFLOPs':>8} {'Mosaic':>6} {'a2a':>4}  shape"]
        for p in self.programs:
            share = "-" if t.hbm_bytes is None else f"{100 * p.peak / t.hbm_bytes:.0f}%"
            flops = "-" if p.flops is None else f"{p.flops / 1e12:.3g}"
            sizes = " ".join(f"{fmt_bytes(n):>10}" for n in (p.argument, p.temp, p.output, p.resident, p.peak))
            seconds = "-" if self.estimate else f"{p.compile_s:.1f}"
            kernels = "-" if self.estimate else f"{p.mosaic_kernels}/{p.lm_head_kernels}"
            a2a = "-" if self.estimate else str(p.all_to_alls)
            cache = "-" if self.estimate else p.cache
            lines.append(f"{p.name:<18} {sizes} {share:>7} {seconds:>9} {cache:>5} {flops:>8} {kernels:>6} {a2a:>4}  "
                         f"{p.what}")
        if self.remat is not None:
            chosen, recipe, peaks = self.remat
            each = ", ".join(f"{name} {fmt_bytes(peak)}" for name, peak in peaks.items())
            lines.append(f"remat: {chosen} chosen for the updates (their estimated peak: {each}; the first that fits "
                         f"is chosen, in that order); the recipe sets {recipe}"
                         + ("" if chosen == recipe else f": set policy.remat_policy={chosen}"))
        lines.append("peak = argument + output - aliased + temp (the compiler's buffer assignment) + resident (trainer "
                     "state held meanwhile: Adam state and KL reference copy while sampling); Mosaic = Pallas kernel "
                     "calls / of which the LM head's; a2a = all-to-all call sites (expert parallelism); cache = the "
                     "persistent compilation cache served the program (hit), compiled it into the cache (miss) or is "
                     "off")
        return "\n".join(lines)


def over_message(report: Report) -> str:
    t = report.target
    parts = [f"{p.name} needs {fmt_bytes(p.peak)} per chip, {fmt_bytes(excess)} over the {fmt_bytes(t.hbm_bytes)} of a "
             f"{t.chip} chip" for p, excess in report.over()]
    return (f"{report.config} does not fit {t.name}: " + "; ".join(parts) +
            " (raise mesh.fsdp / mesh.tensor, set policy.remat_policy, or lower rl.micro_batch or rl.sampling.slots)")


# The plan traces each program on a batch built on the host (token ids, masks, positions: int32 arrays of rows x
# tokens). A recipe's batches hold a few million tokens; past this many the numbers are a typo's, and numpy would
# fail allocating them (or take the host's memory) instead of the plan saying so.
MAX_BATCH_TOKENS = 2**27


def check_batches(cfg: TrainConfig) -> None:
    """ConfigError naming the setting whose batch the plan cannot build: sequences past the policy's context, or
    more than MAX_BATCH_TOKENS tokens in one batch."""
    check_context(cfg, model_config(cfg).text.max_position_embeddings)
    shapes, rc = Shapes.of(cfg), cfg.rl
    batches = {}
    if rc.steps > 0:  # the rollouts' rows at their full length: every update's micro-batch is a part of them
        batches["rl.prompts_per_step x rl.group_size"] = (shapes.rollouts, shapes.cache)
    if cfg.sft.steps > 0:
        batches["sft.batch_size"] = (cfg.sft.batch_size, shapes.prompt)
    for key, (rows, tokens) in batches.items():
        if rows * tokens > MAX_BATCH_TOKENS:
            raise ConfigError(f"{key}: a batch of {rows} rows x {tokens} tokens = {rows * tokens:,} tokens, more than "
                              f"the {MAX_BATCH_TOKENS:,} a plan builds")


def plan(cfg: TrainConfig, topology: str, *, config_name: str = "", only: tuple[str, ...] = (),
         hbm_gib: float | None = None) -> Report:
    """Compiles (TPU, CPU) or estimates (GPU) every program of `cfg`'s job for `topology`; see the module doc.
    hbm_gib: the memory per chip to check against instead of the chip's."""
    target = targets.parse_target(topology)
    if hbm_gib is not None:
        if not hbm_gib > 0:
            raise ConfigError(f"--hbm must be > 0 GiB, got {hbm_gib}")
        target = dataclasses.replace(target, hbm_bytes=int(hbm_gib * GiB))
    if cfg.mesh.size > target.count:
        raise ConfigError(f"mesh data*fsdp*tensor = {cfg.mesh.data}*{cfg.mesh.fsdp}*{cfg.mesh.tensor} = "
                          f"{cfg.mesh.size} but {target.name} has {target.count} chips")
    validate(cfg, target.count)
    check_batches(cfg)
    mesh_shape = (cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor)
    own = cfg.decode.devices
    training, rollout = rollouts.rollout_mesh_devices(cfg, target) if own else (target.devices[: cfg.mesh.size], None)
    if target.platform == "gpu":
        chosen, peaks = gpu.choose_remat(cfg, target)
        estimates = [p for p in gpu.estimate_gpu(cfg, target, remat=chosen) if not only or p.name in only]
        return Report(config_name, target, mesh_shape, estimates, estimate=True, rollout_devices=own,
                      remat=(chosen, model_config(cfg).decoder_remat, peaks))
    mesh = make_mesh(*mesh_shape, devices=training)
    host = rollout or targets.host_slice(target, mesh)
    return Report(config_name, target, mesh_shape, programs(cfg, mesh, only, host), rollout_devices=own)
