"""`spatial-jax plan`: every program of a step compiled for a target, per-chip figures printed and written, a
setting that does not fit refused naming the program and the excess, GPU targets estimated from the same layout.

The tiny policy at small shapes keeps each compile to seconds; the recipes' own figures (8B at real shapes, ~1 min
per program) are in benchmarks/RESULTS.md. The TPU test needs libtpu (the `tpu` extra) and is skipped without it.
"""

import contextlib
import io
import json

import pytest

from spatial_jax.cli import main
from spatial_jax.rl.plan import rollouts, shapes, targets
from spatial_jax.rl.plan.measure import compiler_oom_bytes, fmt_bytes

SMALL = ["data.bucket_lengths=[64]", "rl.prompts_per_step=2", "rl.group_size=2", "rl.micro_batch=4",
         "rl.sampling.max_new_tokens=16", "rl.loss.kl_coef=0.01", "rl.loss.max_completion_length=16",
         "sft.batch_size=4", "policy.min_pixels=3136", "policy.max_pixels=3136", "plan.image_size=56"]
PROGRAMS = {"rl_update", "reference_forward", "rollout_prefill", "rollout_decode", "sft_update"}


def _plan(tmp_path, capsys, topology, *extra, programs=()):
    out = tmp_path / "plan.json"
    only = [arg for name in programs for arg in ("--program", name)]  # options before the key=value overrides
    code = main(["plan", "--topology", topology, "--json", str(out), *only, *SMALL, *extra])
    printed = capsys.readouterr()
    return code, (json.loads(out.read_text()) if out.exists() else None), printed


def _check_figures(report, fits=True, programs=PROGRAMS):
    assert {p["name"] for p in report["programs"]} == programs
    for p in report["programs"]:
        assert p["argument"] > 0 and p["peak"] >= p["argument"] + p["temp"] - p["alias"]
        assert p["compile_s"] > 0 and p["flops"] > 0
    assert report["fits"] is fits


@pytest.fixture(scope="module")
def cpu_report(tmp_path_factory):
    """One compile of every program on cpu:8 (full fine-tuning with a KL copy, mesh 2 x 2 x 2), against 2 MiB per
    chip: the decode loop (~0.8 MiB) fits, the others (3-4 MiB) do not."""
    out = tmp_path_factory.mktemp("plan") / "plan.json"
    with contextlib.redirect_stdout(io.StringIO()) as printed, contextlib.redirect_stderr(io.StringIO()) as err:
        code = main(["plan", "--topology", "cpu:8", "--json", str(out), "--hbm", str(HBM), *SMALL, "mesh.data=2",
                     "mesh.fsdp=2", "mesh.tensor=2"])
    return code, json.loads(out.read_text()), printed.getvalue(), err.getvalue()


HBM = 2 / 1024  # GiB


@pytest.mark.slow
def test_cpu_plan_writes_every_program(cpu_report):
    code, report, printed, _ = cpu_report
    assert report["platform"] == "cpu" and report["chips"] == 8 and report["hbm_bytes_per_chip"] == int(HBM * 2**30)
    assert report["mesh"] == {"data": 2, "fsdp": 2, "tensor": 2} and not report["estimate"]
    _check_figures(report, fits=False)
    by_name = {p["name"]: p for p in report["programs"]}
    # full fine-tuning with a KL term keeps a reference copy and Adam's state in memory while sampling
    assert by_name["rollout_decode"]["resident"] > by_name["rl_update"]["resident"] > 0
    assert all(name in printed for name in PROGRAMS)  # the table is printed whether or not it fits
    assert all(p["mosaic_kernels"] == 0 for p in report["programs"])  # host devices: the XLA head and attention


def test_over_hbm_fails_naming_each_program_and_its_excess(cpu_report):
    code, report, _, err = cpu_report
    assert code == 1
    (err,) = [line for line in err.splitlines() if line.startswith("spatial-jax plan:")]  # progress lines aside
    over = [p for p in report["programs"] if p["peak"] > HBM * 2**30]
    assert {p["name"] for p in over} == PROGRAMS - {"rollout_decode"}
    for p in over:
        assert (f"{p['name']} needs {fmt_bytes(p['peak'])} per chip, {fmt_bytes(p['peak'] - int(HBM * 2**30))} over "
                f"the 2.00 MiB of a cpu chip") in err
    assert "rollout_decode" not in err


def test_gpu_target_is_an_estimate_from_the_same_layout(tmp_path, capsys, cpu_report):
    code, report, printed = _plan(tmp_path, capsys, "gpu:h100x8", "mesh.data=2", "mesh.fsdp=2", "mesh.tensor=2")
    assert code == 0 and report["estimate"] is True and "ESTIMATE" in printed.out
    assert report["hbm_bytes_per_chip"] == 80 * 2**30
    est = {p["name"]: p for p in report["programs"]}
    compiled = {p["name"]: p for p in cpu_report[1]["programs"]}
    assert set(est) == PROGRAMS
    # the update's arguments (sharded weights + Adam state) are exact, not modelled: the compiled ones add the batch
    assert 0.9 < est["rl_update"]["argument"] / compiled["rl_update"]["argument"] < 1.1


def test_a_gpu_estimate_chooses_the_updates_remat_to_fit(tmp_path, capsys):
    """dots (matmul outputs kept) where the updates fit the chip, else full; the choice printed and estimated."""
    code, report, printed = _plan(tmp_path, capsys, "gpu:h100x8", "policy.remat_policy=full")
    remat = report["remat"]
    assert code == 0 and remat["chosen"] == "dots" and remat["recipe"] == "full"
    assert remat["update_peaks"]["dots"] > remat["update_peaks"]["full"]
    assert "remat: dots chosen for the updates" in printed.out and "set policy.remat_policy=dots" in printed.out
    dots = max(p["peak"] for p in report["programs"] if p["name"] in ("rl_update", "sft_update"))
    assert dots == remat["update_peaks"]["dots"]  # the figures printed are the chosen policy's
    between = (remat["update_peaks"]["dots"] + remat["update_peaks"]["full"]) / 2 / 2**30
    _, report, printed = _plan(tmp_path, capsys, "gpu:h100x8", "--hbm", str(between))
    assert report["remat"]["chosen"] == "full" and report["remat"]["recipe"] == "none"
    assert max(p["peak"] for p in report["programs"] if p["name"] in ("rl_update", "sft_update")) <= between * 2**30


def test_a_gpu_estimate_plans_only_the_programs_named(tmp_path, capsys):
    code, report, _ = _plan(tmp_path, capsys, "gpu:h100x8", programs=("sft_update", "rollout_decode"))
    assert code == 0 and {p["name"] for p in report["programs"]} == {"sft_update", "rollout_decode"}


@pytest.mark.parametrize("overrides, message", [
    (["rl.prompts_per_step=100000000", "rl.micro_batch=0", "rl.steps=1"],
     "rl.prompts_per_step x rl.group_size: a batch of 200000000 rows"),
    (["sft.batch_size=1000000000"], "sft.batch_size: a batch of 1000000000 rows x 64 tokens"),
    (["rl.sampling.max_new_tokens=1000000000"], "exceed the policy's context of 32768 positions"),
])
def test_absurd_batch_sizes_are_refused_before_any_array_is_built(overrides, message, tmp_path, capsys):
    """numpy asked for terabytes before (an out-of-memory traceback, or the host's memory taken)."""
    code, report, printed = _plan(tmp_path, capsys, "gpu:h100x8", *overrides)
    assert code == 2 and report is None and message in printed.err and "Traceback" not in printed.err


def test_compiler_refusal_is_read_as_the_programs_need():
    # XLA:TPU's own words for spatialcore_8b full fine-tuning on v5p:2x2x1, mesh.fsdp=4, no remat
    message = ("RESOURCE_EXHAUSTED: Ran out of memory on HBM, the total memory required for HLO temporaries "
               "(318.00G) exceeds available HBM (95.74G).")
    assert compiler_oom_bytes(message) == 318 * 2**30
    assert compiler_oom_bytes("RESOURCE_EXHAUSTED: something else") is None


@pytest.mark.parametrize("bad, message", [
    (["--topology", "v9z:2x2"], "unknown target"),
    (["--topology", "cpu:64"], "host device"),
    (["--topology", "cpu:100000"], "at most cpu:1024 host devices"),  # jax would take hours making them
    (["--topology", "gpu:h100"], "gpu:<chip>x<count>"),
    (["--topology", "cpu:2", "mesh.fsdp=4"], "has 2 chips"),
    (["--topology", "cpu:2", "--hbm", "0"], "--hbm must be > 0"),
])
def test_bad_targets_are_configuration_errors(bad, message, capsys):
    assert main(["plan", *bad]) == 2
    assert message in capsys.readouterr().err


def test_tpu_refusals_name_the_extra_only_when_libtpu_is_missing(capsys, monkeypatch):
    """A slice libtpu does not know is its refusal, not advice to install what is installed (issue 36 item 22)."""
    pytest.importorskip("libtpu", reason="libtpu is not installed: every TPU target needs it")
    assert main(["plan", "--topology", "v5p:3x3x7"]) == 2
    err = capsys.readouterr().err
    assert "libtpu cannot describe this slice" in err and "not divisible" in err and "install" not in err
    monkeypatch.setattr(targets, "tpu_compiler_installed", lambda: False)
    assert main(["plan", "--topology", "v5p:3x3x7"]) == 2
    assert "needs libtpu; install the tpu extra" in capsys.readouterr().err


@pytest.mark.slow
def test_tpu_plan_compiles_every_program(tmp_path, capsys):
    """XLA:TPU for a v5e slice: the job's programs (here without SFT and KL, to keep the test short; the CPU test
    covers those two) compile, and their figures are checked against the chip's 16 GiB."""
    pytest.importorskip("libtpu", reason="libtpu is not installed (pip install 'jax[tpu]'): no XLA:TPU compiler")
    code, report, printed = _plan(tmp_path, capsys, "v5e:2x2", "mesh.fsdp=2", "mesh.tensor=2", "sft.steps=0",
                                  "rl.loss.kl_coef=0")
    assert code == 0, printed.err
    assert report["platform"] == "tpu" and report["chip"] == "v5e" and report["hbm_bytes_per_chip"] == 16 * 2**30
    _check_figures(report, programs=PROGRAMS - {"sft_update", "reference_forward"})
    by_name = {p["name"]: p for p in report["programs"]}
    # the LM head resolves from the mesh's devices, not this CPU host's backend: the update holds the Pallas
    # forward, dh and dw kernels (XLA's head would hold none), and splash attention's besides
    assert by_name["rl_update"]["lm_head_kernels"] == 3
    assert by_name["rl_update"]["mosaic_kernels"] > 3


def _by_name(report):
    return {p["name"]: p for p in report["programs"]}


def test_rollouts_are_planned_on_the_decoding_copy_as_the_job_samples(tmp_path, capsys, cpu_report):
    """The rollout programs are the paged engine's (the job's default) on the decoding copy: its KV pool follows
    `rl.sampling.slots`, its weights `decode.dtype`, and the trainer's master weights stay resident meanwhile."""
    from spatial_jax import config as C
    from spatial_jax.models.sharding import make_mesh
    from spatial_jax.rl.config import TrainConfig

    paged = _by_name(cpu_report[1])
    assert all("paged" in paged[n]["what"] and "4 slots" in paged[n]["what"]
               for n in ("rollout_prefill", "rollout_decode"))
    # while sampling, the masters (float32) are resident beside Adam's state and the KL copy
    assert paged["rollout_decode"]["resident"] > paged["rl_update"]["resident"] + paged["reference_forward"]["resident"]
    _, fewer, _ = _plan(tmp_path, capsys, "cpu:8", "mesh.data=2", "mesh.fsdp=2", "mesh.tensor=2",
                        "rl.sampling.slots=2", programs=["rollout_decode"])
    fewer = _by_name(fewer)["rollout_decode"]
    assert "2 slots" in fewer["what"] and fewer["argument"] < paged["rollout_decode"]["argument"]
    assert fewer["resident"] == paged["rollout_decode"]["resident"]
    # the copy is cast to decode.dtype ("auto": the compute dtype, float32 for the tiny policy here)
    mesh = make_mesh(2, 2, 2, devices=targets.parse_target("cpu:8").devices)
    sizes, layout = {}, ["mesh.data=2", "mesh.fsdp=2", "mesh.tensor=2"]
    for dtype in ("auto", "float32", "bfloat16"):
        cfg = C.load(TrainConfig, None, [*SMALL, *layout, f"decode.dtype={dtype}"])
        policy = shapes.abstract_policy(cfg, shapes.model_config(cfg), mesh)
        dec = rollouts.decoding(cfg, policy, mesh, shapes.Shapes.of(cfg))
        assert dec.processes == 1 and dec.rows == 4 and dec.mesh.devices.size == 8
        sizes[dtype] = shapes._local_bytes(dec.params, dec.mesh)
    assert sizes["auto"] == sizes["float32"] and 0.45 < sizes["bfloat16"] / sizes["float32"] < 0.55


def test_the_static_sampler_is_planned_when_the_job_runs_it(tmp_path, capsys):
    code, report, _ = _plan(tmp_path, capsys, "cpu:4", "mesh.fsdp=4", "rl.sampling.engine=static",
                            programs=["rollout_decode"])
    assert code == 0
    assert {p["name"] for p in report["programs"]} == {"rollout_decode"}
    assert all(p["what"].startswith("static, 4 ") for p in report["programs"])


def test_each_host_of_a_multi_host_slice_decodes_its_own_block():
    """On a v6e:4x4 slice (4 hosts of 4 chips) the copy sits on host 0's 4 chips (compiled as a v6e:2x2 slice of
    their own) and decodes a quarter of the rollouts; prompts that do not split among the hosts are a configuration
    error."""
    pytest.importorskip("libtpu", reason="libtpu is not installed (pip install 'jax[tpu]'): no XLA:TPU compiler")
    from spatial_jax import config as C
    from spatial_jax.config import ConfigError
    from spatial_jax.models.sharding import make_mesh
    from spatial_jax.rl.config import TrainConfig

    target = targets.parse_target("v6e:4x4")
    mesh = make_mesh(1, 16, 1, devices=target.devices)
    cfg = C.load(TrainConfig, None, [*SMALL, "mesh.fsdp=16", "rl.prompts_per_step=8", "rl.group_size=2"])
    policy = shapes.abstract_policy(cfg, shapes.model_config(cfg), mesh)
    host = targets.host_slice(target, mesh)
    assert len(host) == 4 and {tuple(d.coords) for d in host} == {(0, 0, 0), (1, 0, 0), (0, 1, 0), (1, 1, 0)}
    one_host = targets.parse_target("v6e:2x2")
    assert targets.host_slice(one_host, make_mesh(1, 4, 1, devices=one_host.devices)) is None
    dec = rollouts.decoding(cfg, policy, mesh, shapes.Shapes.of(cfg), host)
    assert dec.processes == 4 and dec.rows == 4 and dec.mesh.devices.size == 4
    bad = C.load(TrainConfig, None, [*SMALL, "mesh.fsdp=16", "rl.prompts_per_step=6"])
    with pytest.raises(ConfigError, match="does not split among the 4 hosts"):
        rollouts.decoding(bad, policy, mesh, shapes.Shapes.of(bad))


def test_the_shared_prefix_update_is_planned_when_the_job_runs_it(tmp_path, capsys):
    """rl.shared_prefix: the update is compiled as the trainer runs it, each prompt once for its G rollouts; at a
    64-token prompt and 16-token completions its temporaries are below the whole-row update's."""
    figures = {}
    for shared in ("false", "true"):
        code, report, _ = _plan(tmp_path, capsys, "cpu:1", f"rl.shared_prefix={shared}", programs=["rl_update"])
        assert code == 0
        (figures[shared],) = report["programs"]
    assert figures["true"]["what"] == "2 prompts x 64 + 4 completions x 16 tokens (shared prefix)"
    assert figures["false"]["what"] == "4 rollouts x (64 + 16) tokens"
    assert figures["true"]["temp"] < figures["false"]["temp"]
    assert figures["true"]["flops"] < figures["false"]["flops"]


def test_a_rollout_mesh_of_its_own_is_planned_beside_the_training_mesh(tmp_path, capsys):
    """decode.devices (rl.rollout_mode=one_step_off's disaggregation): the update compiles on the training mesh's 4
    devices, the rollouts on the 4 after them, with none of the trainer's state resident there; the GPU estimate
    plans the same, and a rollout mesh past the one host it runs on is refused."""
    code, report, printed = _plan(tmp_path, capsys, "cpu:8", "mesh.fsdp=4", "decode.devices=4",
                                  "rl.rollout_mode=one_step_off", programs=["rl_update", "rollout_decode"])
    assert code == 0, printed.err
    by_name = _by_name(report)
    assert report["rollout_devices"] == 4 and "rollouts on a mesh of their own, the 4 chips" in printed.out
    assert by_name["rollout_decode"]["resident"] == 0 and "on 4 chips" in by_name["rollout_decode"]["what"]
    code, shared, _ = _plan(tmp_path, capsys, "cpu:8", "mesh.fsdp=4", programs=["rollout_decode"])
    assert _by_name(shared)["rollout_decode"]["resident"] > 0  # the trainer's state beside the copy
    code, gpu, printed = _plan(tmp_path, capsys, "gpu:h100x8", "mesh.fsdp=4", "decode.devices=4")
    assert code == 0 and gpu["estimate"] and _by_name(gpu)["rollout_prefill"]["resident"] == 0
    code, _, printed = _plan(tmp_path, capsys, "gpu:h100x16", "mesh.tensor=8", "decode.devices=8")
    assert code != 0 and "exceed a host's 8" in printed.err


@pytest.mark.slow
def test_one_step_off_compiles_for_tpu_on_both_meshes(tmp_path, capsys):
    """v6e:2x4 is one host of 8 chips (a v6e-8 VM): the training mesh takes 4 of them and the rollout mesh the other
    4, each compiled by XLA:TPU as a v6e:2x2 slice of its own, the rollouts with nothing of the trainer resident;
    on v6e:4x4 (hosts of 4 chips) 8 + 8 chips span hosts and are refused, naming decode.devices=0."""
    pytest.importorskip("libtpu", reason="libtpu is not installed (pip install 'jax[tpu]'): no XLA:TPU compiler")
    from spatial_jax import config as C
    from spatial_jax.config import ConfigError
    from spatial_jax.rl.config import TrainConfig

    code, report, printed = _plan(tmp_path, capsys, "v6e:2x4", "mesh.fsdp=4", "decode.devices=4",
                                  "rl.rollout_mode=one_step_off", "sft.steps=0", "rl.loss.kl_coef=0",
                                  programs=["rl_update", "rollout_decode"])
    assert code == 0, printed.err
    by_name = _by_name(report)
    assert report["platform"] == "tpu" and report["rollout_devices"] == 4
    assert by_name["rollout_decode"]["resident"] == 0 and by_name["rl_update"]["peak"] > 0
    own = C.load(TrainConfig, None, [*SMALL, "mesh.fsdp=4", "decode.devices=4"])
    training, rollout = rollouts.rollout_mesh_devices(own, targets.parse_target("v6e:2x4"))
    assert len(training) == len(rollout) == 4 and len({d.process_index for d in training}) == 1
    wide = C.load(TrainConfig, None, [*SMALL, "mesh.fsdp=8", "decode.devices=8", "rl.prompts_per_step=4"])
    with pytest.raises(ConfigError, match="span several: use decode.devices=0"):
        rollouts.rollout_mesh_devices(wide, targets.parse_target("v6e:4x4"))


def test_the_trainer_old_logp_forward_is_planned_when_the_job_runs_it(tmp_path, capsys):
    """rl.old_logp = trainer with a rollout correction adds the pi_old forward before the first optimiser call:
    compiled for the trainer's mesh and estimated for a GPU; without a correction (one pass, no dropout) the first
    pass's own forward is pi_old and nothing is added."""
    trainer = ("rl.old_logp=trainer", "rl.correction.tis=token")
    code, report, _ = _plan(tmp_path, capsys, "cpu:1", *trainer, programs=["old_logp_forward"])
    assert code == 0
    (forward,) = report["programs"]
    assert forward["name"] == "old_logp_forward" and forward["what"] == "4 rollouts x (64 + 16) tokens"
    assert forward["flops"] > 0 and forward["peak"] > 0
    code, report, _ = _plan(tmp_path, capsys, "gpu:h100x8", *trainer)
    assert code == 0 and "old_logp_forward" in {p["name"] for p in report["programs"]}
    code, report, _ = _plan(tmp_path, capsys, "gpu:h100x8", "rl.old_logp=trainer")
    assert code == 0 and "old_logp_forward" not in {p["name"] for p in report["programs"]}
