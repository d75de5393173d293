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
"""

from __future__ import annotations

import dataclasses
import importlib.util
import math
import os
import re
import sys
import time
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from spatial_jax.config import ConfigError
from spatial_jax.data.image_processing import smart_resize
from spatial_jax.data.tokenizer import build_tokenizer
from spatial_jax.kernels import pallas as pallas_kernels
from spatial_jax.models import ModelConfig, Qwen3VL, get_rope_index, load_config, prepare_vision_inputs
from spatial_jax.models.sharding import logical_to_spec, make_mesh, variable_names
from spatial_jax.rl import step as st
from spatial_jax.rl.config import TrainConfig, check_context, old_logp_forward, validate
from spatial_jax.rl.optim import make_optimizer
from spatial_jax.rl.policy import image_config, trainable_filter
from spatial_jax.rollout import engine, sampler
from spatial_jax.rollout.decode_copy import decode_mesh
from spatial_jax.rollout.engine import Engine, Request
from spatial_jax.rollout.multiturn import required_cache_len

GiB = 1 << 30
# HBM per chip, by the generation prefix of a topology name
TPU_HBM_GIB = {"v4": 32, "v5e": 16, "v5litepod": 16, "v5p": 95, "v6e": 32}
GPU_HBM_GIB = {"a100": 80, "h100": 80, "h200": 141, "b200": 180}
GPUS_PER_HOST = 8  # a GPU target of more chips is hosts of 8, each decoding its own block of rollouts
# Slices sold as one host of 8 chips (v5litepod-8, v6e-8: one VM), which libtpu describes as two hosts of 4 unless
# told the host's bounds
ONE_HOST_SLICES = {("v5e", "2x4"), ("v5litepod", "2x4"), ("v6e", "2x4")}

# Architectures by name, for planning without the checkpoint directory: the fields of the published config.json
# files that shape the model (Qwen3-VL 4B and 8B, Instruct and Thinking alike; Qwen2.5-VL-3B / 7B-Instruct and
# Qwen3-VL-30B-A3B-Instruct, SpatialThinker's backbones).
_VOCAB = 151_936
_QWEN2_5_VISION = {"depth": 32, "hidden_size": 1280, "intermediate_size": 3420, "num_heads": 16, "patch_size": 14,
                   "hidden_act": "silu", "window_size": 112, "fullatt_block_indexes": [7, 15, 23, 31],
                   "tokens_per_second": 2}
ARCHITECTURES: dict[str, dict[str, Any]] = {
    "qwen3-vl-4b": {
        "model_type": "qwen3_vl", "tie_word_embeddings": True,
        "text_config": {"vocab_size": _VOCAB, "hidden_size": 2560, "intermediate_size": 9728,
                        "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
                        "head_dim": 128, "rope_theta": 5_000_000, "max_position_embeddings": 262144},
        "vision_config": {"depth": 24, "hidden_size": 1024, "intermediate_size": 4096, "num_heads": 16,
                          "patch_size": 16, "out_hidden_size": 2560, "num_position_embeddings": 2304,
                          "deepstack_visual_indexes": [5, 11, 17]},
    },
    "qwen3-vl-8b": {
        "model_type": "qwen3_vl", "tie_word_embeddings": False,
        "text_config": {"vocab_size": _VOCAB, "hidden_size": 4096, "intermediate_size": 12288,
                        "num_hidden_layers": 36, "num_attention_heads": 32, "num_key_value_heads": 8,
                        "head_dim": 128, "rope_theta": 5_000_000, "max_position_embeddings": 262144},
        "vision_config": {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16,
                          "patch_size": 16, "out_hidden_size": 4096, "num_position_embeddings": 2304,
                          "deepstack_visual_indexes": [8, 16, 24]},
    },
    "qwen2.5-vl-3b": {
        "model_type": "qwen2_5_vl", "tie_word_embeddings": True,
        "text_config": {"vocab_size": _VOCAB, "hidden_size": 2048, "intermediate_size": 11008,
                        "num_hidden_layers": 36, "num_attention_heads": 16, "num_key_value_heads": 2,
                        "rope_theta": 1_000_000, "max_position_embeddings": 128000,
                        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}},
        "vision_config": {**_QWEN2_5_VISION, "out_hidden_size": 2048},
    },
    "qwen2.5-vl-7b": {
        "model_type": "qwen2_5_vl", "tie_word_embeddings": False,
        "text_config": {"vocab_size": 152_064, "hidden_size": 3584, "intermediate_size": 18944,
                        "num_hidden_layers": 28, "num_attention_heads": 28, "num_key_value_heads": 4,
                        "rope_theta": 1_000_000, "max_position_embeddings": 128000,
                        "rope_scaling": {"type": "mrope", "mrope_section": [16, 24, 24]}},
        "vision_config": {**_QWEN2_5_VISION, "out_hidden_size": 3584},
    },
    "qwen3-vl-30b-a3b": {
        "model_type": "qwen3_vl_moe", "tie_word_embeddings": False,
        "text_config": {"vocab_size": _VOCAB, "hidden_size": 2048, "intermediate_size": 6144,
                        "num_hidden_layers": 48, "num_attention_heads": 32, "num_key_value_heads": 4,
                        "head_dim": 128, "rope_theta": 5_000_000, "max_position_embeddings": 262144,
                        "num_experts": 128, "num_experts_per_tok": 8, "moe_intermediate_size": 768,
                        "decoder_sparse_step": 1, "mlp_only_layers": [], "router_aux_loss_coef": 0.001},
        "vision_config": {"depth": 27, "hidden_size": 1152, "intermediate_size": 4304, "num_heads": 16,
                          "patch_size": 16, "out_hidden_size": 2048, "num_position_embeddings": 2304,
                          "deepstack_visual_indexes": [8, 16, 24]},
    },
}


class PlanError(Exception):
    """A program does not fit the target's memory (the message names it and by how much)."""


@dataclasses.dataclass(frozen=True)
class Target:
    name: str
    platform: str  # "tpu", "cpu" or "gpu"
    chip: str  # "v5p", "cpu", "h100", ...
    count: int
    hbm_bytes: int | None  # per chip; None for host devices
    devices: tuple = ()  # empty for a GPU target (nothing to compile for)


def tpu_compiler_installed() -> bool:
    """Whether jax finds libtpu: the libtpu package, or a library named by TPU_LIBRARY_PATH."""
    return importlib.util.find_spec("libtpu") is not None or os.path.isfile(os.environ.get("TPU_LIBRARY_PATH", ""))


def parse_target(name: str) -> Target:
    """`v5p:2x4x4` (TPU topology), `cpu:N` or `gpu:h100x8`; ConfigError naming what is wrong."""
    kind, _, rest = name.partition(":")
    if kind == "cpu":
        if not rest.isdigit() or int(rest) < 1:
            raise ConfigError(f"--topology {name!r}: write cpu:N with N >= 1 host devices")
        devices = jax.devices("cpu")
        if len(devices) < int(rest):
            raise ConfigError(f"--topology {name}: only {len(devices)} host device(s); set XLA_FLAGS="
                              f"--xla_force_host_platform_device_count={rest} before jax starts")
        return Target(name, "cpu", "cpu", int(rest), None, tuple(devices[: int(rest)]))
    if kind == "gpu":
        found = re.fullmatch(r"([a-z0-9]+)x(\d+)", rest)
        if not found or found.group(1) not in GPU_HBM_GIB or int(found.group(2)) < 1:
            raise ConfigError(f"--topology {name!r}: write gpu:<chip>x<count>, chip one of {sorted(GPU_HBM_GIB)}")
        chip = found.group(1)
        return Target(name, "gpu", chip, int(found.group(2)), GPU_HBM_GIB[chip] * GiB)
    if kind not in TPU_HBM_GIB:
        raise ConfigError(f"--topology {name!r}: unknown target; use a TPU topology ({', '.join(TPU_HBM_GIB)} as "
                          "in v5p:2x4x4), cpu:N or gpu:<chip>x<count>")
    # libtpu loads here; its machine-wide lock would bar a second process (a test run, a benchmark) using it
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")
    try:
        from jax.experimental import topologies

        bounds = {"chips_per_host_bounds": [2, 4, 1]} if (kind, rest) in ONE_HOST_SLICES else {}
        devices = topologies.get_topology_desc(platform="tpu", topology_name=name, **bounds).devices
    except Exception as err:  # no libtpu, or a shape libtpu does not know
        if not tpu_compiler_installed():
            raise ConfigError(f"--topology {name}: compiling for a TPU target needs libtpu; install the tpu extra "
                              "(pip install -e '.[tpu]')") from None
        raise ConfigError(f"--topology {name}: libtpu cannot describe this slice ({' '.join(str(err).split())[:300]})"
                          ) from None
    return Target(name, "tpu", kind, len(devices), TPU_HBM_GIB[kind] * GiB, tuple(devices))


def model_config(cfg: TrainConfig) -> ModelConfig:
    """The policy's architecture: the checkpoint's config.json when it is here, else `plan.model`, else (no
    checkpoint) the tiny random policy; with the run's adapters, dtypes and memory settings."""
    pc = cfg.policy
    if pc.checkpoint and (Path(pc.checkpoint) / "config.json").is_file():
        mc = load_config(pc.checkpoint)
    elif cfg.plan.model:
        mc = ModelConfig.from_hf(ARCHITECTURES[cfg.plan.model])
    elif not pc.checkpoint:
        tok = build_tokenizer(pc.tokenizer_vocab_size)
        mc = ModelConfig.tiny(tok.vocab_size, **tok.model_token_ids())
    else:
        raise ConfigError(f"policy.checkpoint {pc.checkpoint!r} has no config.json here: set plan.model to one of "
                          f"{sorted(ARCHITECTURES)} to plan without it")
    return mc.replace(lora=pc.lora, dtype=pc.dtype, param_dtype=pc.param_dtype, remat=pc.remat,
                      remat_policy=pc.remat_policy, scan_layers=pc.scan_layers, attention_chunk=pc.attention_chunk)


def _placed(tree, mesh, names_of=variable_names, float_dtype=None):
    """Every array leaf of an abstract tree as a ShapeDtypeStruct laid out by its logical names (Variables) or
    replicated (anything else); floating leaves in `float_dtype` when given (the decoding copy's cast)."""

    def dtype_of(x):
        return float_dtype if float_dtype is not None and jnp.issubdtype(x.dtype, jnp.floating) else x.dtype

    def one(x):
        if isinstance(x, nnx.Variable):
            value = x.get_value()
            names = names_of(x)
            spec = P() if names is None else logical_to_spec(names, value.shape, mesh)
            return x.replace(jax.ShapeDtypeStruct(value.shape, dtype_of(value), sharding=NamedSharding(mesh, spec)))
        return jax.ShapeDtypeStruct(x.shape, dtype_of(x), sharding=NamedSharding(mesh, P()))

    return jax.tree.map(one, tree, is_leaf=lambda x: isinstance(x, nnx.Variable))


def _spec_on(mesh, batch: int, ndim: int, axis: int = 0) -> NamedSharding:
    return NamedSharding(mesh, P(*([None] * axis), *logical_to_spec(("batch",), (batch,), mesh),
                                 *([None] * (ndim - axis - 1))))


def _batch_placed(tree, mesh, batch: int):
    """Batch arrays as ShapeDtypeStructs placed as `step.shard_batch` places them: the rollout axis over
    (data, fsdp) (axis 1 of M-RoPE positions), vision packs and scalars replicated."""

    def one(path, x):
        names = [getattr(p, "name", "") for p in path]
        shape = np.shape(x)
        if "vision" in names or not shape:
            sharding = NamedSharding(mesh, P())
        else:
            sharding = _spec_on(mesh, batch, len(shape), 1 if "positions" in names else 0)
        return jax.ShapeDtypeStruct(shape, x.dtype, sharding=sharding)

    return jax.tree_util.tree_map_with_path(one, tree)


def _replicated(tree, mesh):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(np.shape(x), x.dtype, sharding=NamedSharding(mesh, P())),
                        tree)


def image_grid(cfg: TrainConfig, mc: ModelConfig) -> tuple[int, int, int]:
    """(t, h, w) patches of one `plan.image_size` square image after the policy's resize."""
    ic = image_config(mc, cfg.policy)
    h, w = smart_resize(cfg.plan.image_size, cfg.plan.image_size, ic.factor, ic.min_pixels, ic.max_pixels)
    return 1, h // ic.patch_size, w // ic.patch_size


def _rows(mc: ModelConfig, rows: int, length: int, grid) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`rows` prompts of `length` tokens, each holding one image of `grid` (ids, mask, pixels, grids)."""
    n_img = int(np.prod(grid)) // mc.vision.spatial_merge_size**2
    if n_img + 2 > length:
        raise ConfigError(f"plan.image_size gives {n_img} image tokens, more than the prompt of {length} holds")
    ids = np.full((rows, length), 1, np.int32)
    ids[:, 1 : 1 + n_img] = mc.image_token_id
    pixels = np.broadcast_to(np.zeros((1, 1), np.float32), (rows * int(np.prod(grid)), mc.vision.patch_dim))
    return ids, np.ones_like(ids), pixels, np.tile(np.asarray([grid], np.int64), (rows, 1))


def _seq_batch(mc, rows, prompt, completion, grid, group: int = 1):
    """The update's rows; with `group` > 1 each run of `group` rows shares its prompt (rl.shared_prefix)."""
    ids, mask, pixels, grids = _rows(mc, rows, prompt, grid)
    targets = np.ones((rows, completion), np.int32)
    return st.make_seq_batch(mc, ids, mask, targets, np.ones_like(targets), pixels, grids, group=group)


def _rl_data(seq, rows: int, completion: int, cfg: TrainConfig) -> st.RLData:
    """The update's data as the trainer passes it (TIS weights and the first pass's own pi_old as configured)."""
    zeros = np.zeros((rows, completion), np.float32)
    rc = cfg.rl
    return st.RLData(seq=seq, old_logp=zeros, ref_logp=zeros, advantages=np.zeros((rows,), np.float32),
                     normalizer=np.float32(1.0), is_weights=zeros if rc.correction.tis != "off" else None,
                     own_old=np.float32(1.0) if rc.old_logp == "trainer" else None)


def _sft_seq(mc, rows, length, grid):
    """The SFT row as the trainer builds it (train.full_seq_batch): the whole row is the target block."""
    ids, mask, pixels, grids = _rows(mc, rows, length, grid)
    return st.make_seq_batch(mc, ids[:, :1], mask[:, :1], ids[:, 1:], mask[:, 1:], pixels, grids)


@dataclasses.dataclass
class Program:
    name: str
    what: str  # the shape it runs at, in words
    argument: int
    output: int
    alias: int
    temp: int
    peak: int  # the program's own peak plus `resident`
    compile_s: float
    flops: float | None
    resident: int = 0  # trainer state in memory meanwhile that is no argument (Adam state while sampling, ...)
    mosaic_kernels: int = 0  # Pallas/Mosaic kernel calls in the compiled program (splash attention, the LM head)
    lm_head_kernels: int = 0  # of those, the Pallas LM head's (forward; + dh and dw in an update)
    all_to_alls: int = 0  # all-to-all call sites in the compiled program (the MoE layers' expert parallelism)

    def row(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


_UNITS = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def compiler_oom_bytes(message: str) -> int | None:
    """The temporaries XLA:TPU says a program needs when it refuses it for want of HBM ("... required for HLO
    temporaries (318.00G) exceeds available HBM (95.74G)"), in bytes; None for any other error."""
    found = re.search(r"required for HLO temporaries \(([0-9.]+)([KMGT])\) exceeds available HBM", message)
    return None if found is None else int(float(found.group(1)) * _UNITS[found.group(2)])


def mosaic_kernels(hlo: str) -> tuple[int, int]:
    """(Mosaic kernel calls, of which the Pallas LM head's) in a compiled program's HLO text: each call site once
    (a kernel inside a scanned layer is one call)."""
    calls = [line for line in hlo.splitlines() if 'custom_call_target="tpu_custom_call"' in line]
    return len(calls), sum(f"/{pallas_kernels.SCOPE}/" in line for line in calls)


def all_to_alls(hlo: str) -> int:
    """All-to-all call sites in a compiled program's HLO text (synchronous or started asynchronously)."""
    return len(re.findall(r"= [^=]*? all-to-all(?:-start)?\(", hlo))


def _measure(mesh, name: str, what: str, jitted, args, resident: int = 0) -> Program:
    """Lowers and compiles `jitted` at abstract `args` under `mesh` (activations constrained as in training)."""
    t0 = time.perf_counter()
    print(f"plan: compiling {name} ({what})", file=sys.stderr, flush=True)
    with jax.set_mesh(mesh):
        lowered = jitted.lower(*args)
        try:
            compiled = lowered.compile()
        except jax.errors.JaxRuntimeError as err:
            needed = compiler_oom_bytes(str(err))
            if needed is None:
                raise
            # XLA:TPU refuses a program whose temporaries exceed the chip: that is the answer, not a failure
            seconds = time.perf_counter() - t0
            print(f"plan: {name} does not compile: {fmt_bytes(needed)} of temporaries", file=sys.stderr, flush=True)
            return Program(name, what + " [compiler: out of HBM]", 0, 0, 0, needed, needed + resident, seconds, None,
                           resident)
    seconds = time.perf_counter() - t0
    mem = compiled.memory_analysis()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, (list, tuple)) and cost else cost
    flops = float(cost["flops"]) if isinstance(cost, dict) and "flops" in cost else None
    peak = int(getattr(mem, "peak_memory_in_bytes", 0) or 0)
    derived = mem.argument_size_in_bytes + mem.output_size_in_bytes - mem.alias_size_in_bytes + mem.temp_size_in_bytes
    program = Program(name, what, int(mem.argument_size_in_bytes), int(mem.output_size_in_bytes),
                      int(mem.alias_size_in_bytes), int(mem.temp_size_in_bytes), max(peak, int(derived)) + resident,
                      seconds, flops, resident, *mosaic_kernels(hlo := compiled.as_text()), all_to_alls(hlo))
    print(f"plan: {name} compiled in {seconds:.0f} s, peak {fmt_bytes(program.peak)} per chip", file=sys.stderr,
          flush=True)
    return program


@dataclasses.dataclass
class Abstract:
    """The policy as the trainer holds it, abstract and placed: graphdef, trainable and frozen state."""

    model: Qwen3VL
    graphdef: Any
    trainable: Any
    frozen: Any


def abstract_policy(cfg: TrainConfig, mc: ModelConfig, mesh) -> Abstract:
    model = nnx.eval_shape(lambda: Qwen3VL(mc, rngs=nnx.Rngs(cfg.policy.init_seed)))
    graphdef, trainable, frozen = nnx.split(model, trainable_filter(cfg.policy), ...)
    return Abstract(model, graphdef, _placed(trainable, mesh), _placed(frozen, mesh))


@dataclasses.dataclass
class Decoding:
    """What rollouts run on (rollout/decode_copy.py): the decoding copy of process 0 of the training mesh, on that
    process's own devices, and the rollouts it decodes (its block of every batch, rollout/hosts.py)."""

    mesh: Mesh
    graphdef: Any
    params: Any  # the copy: every weight in the decode dtype, laid out on `mesh`
    processes: int  # processes holding devices of the training mesh (each decodes its own block)
    rows: int


def chips_slice(target: Target, devices) -> tuple:
    """`devices` of a TPU target as a slice of their own (e.g. v6e:2x2 of v6e:4x4): a program on some chips of a
    larger topology does not compile (XLA:TPU numbers its devices within the program). Host devices as they are."""
    devices = tuple(devices)
    if target.platform != "tpu" or len(devices) == target.count:
        return devices
    coords = np.asarray([d.coords for d in devices])
    dims = coords.max(axis=0) - coords.min(axis=0) + 1
    if target.chip in ("v5e", "v5litepod", "v6e"):  # 2-D slices
        dims = dims[:2]
    if int(np.prod(dims)) != len(devices):
        raise ConfigError(f"{len(devices)} chips of {target.name} from chip {devices[0].id} on do not form a "
                          "rectangular slice: choose a mesh and decode.devices that split the topology into slices")
    return parse_target(f"{target.chip}:{'x'.join(str(int(n)) for n in dims)}").devices


def host_slice(target: Target, mesh) -> tuple | None:
    """Host 0's chips of a TPU mesh spanning several hosts, as a slice of their own (`chips_slice`): a host's decode
    program spans only its own chips. None when the mesh is one host's."""
    local = [d for d in mesh.devices.flat if d.process_index == 0]
    if target.platform != "tpu" or len(local) == mesh.devices.size:
        return None
    return chips_slice(target, local)


def rollout_mesh_devices(cfg: TrainConfig, target: Target) -> tuple[tuple, tuple]:
    """(training mesh's devices, rollout mesh's) for decode.devices > 0: the chips after the training mesh's, on the
    one host a rollout mesh of its own runs on (rollout/decode_copy.rollout_devices); each a slice of its own."""
    n, d = cfg.mesh.size, cfg.decode.devices
    if target.platform == "gpu":
        if n + d > GPUS_PER_HOST:
            raise ConfigError(f"decode.devices={d}: a rollout mesh of its own runs on the training mesh's one host, "
                              f"but {n} + {d} GPUs exceed a host's {GPUS_PER_HOST}")
        return (), ()
    chips = target.devices[: n + d]
    if len({getattr(c, "process_index", 0) for c in chips}) > 1:
        raise ConfigError(f"decode.devices={d}: a rollout mesh of its own runs on one host, but the {n} + {d} chips "
                          f"of {target.name} span several: use decode.devices=0 there (one_step_off then overlaps on "
                          "the same chips)")
    return chips_slice(target, chips[:n]), chips_slice(target, chips[n:])


def decoding(cfg: TrainConfig, policy: Abstract, mesh, shapes: Shapes, host: tuple | None = None) -> Decoding:
    """The decoding copy as process 0 holds it while it samples its share of `shapes.rollouts` (on `host`, its
    chips as their own slice, when given: `host_slice`)."""
    processes = len({d.process_index for d in mesh.devices.flat})
    if cfg.rl.prompts_per_step % processes:
        raise ConfigError(f"rl.prompts_per_step={cfg.rl.prompts_per_step} does not split among the {processes} "
                          "hosts of the mesh (each host decodes its own block of prompts)")
    own = mesh if host is None else make_mesh(1, len(host), 1, devices=list(host))
    dmesh = decode_mesh(own, cfg.decode.tensor)
    graphdef, state = nnx.split(policy.model)
    dtype = cfg.decode.weights_dtype(policy.model.cfg.dtype)
    return Decoding(dmesh, graphdef, _placed(state, dmesh, float_dtype=dtype), processes,
                    shapes.rollouts // processes)


def _static_programs(cfg, mc, policy, dec: Decoding, shapes, grid, resident, run) -> list[Program]:
    """The static sampler's prefill and decode loop (sampling.engine = "static") over process 0's rollouts."""
    B, sc, out = dec.rows, cfg.rl.sampling, []
    where = f"on {dec.mesh.devices.size} chips of host 0 of {dec.processes}"
    if "rollout_prefill" in run:
        ids, mask, pixels, grids = _rows(mc, B, shapes.prompt, grid)
        positions, deltas = get_rope_index(ids, grids, mask, image_token_id=mc.image_token_id,
                                           spatial_merge_size=mc.vision.spatial_merge_size)
        tokens = [jax.ShapeDtypeStruct(x.shape, jnp.int32, sharding=_spec_on(dec.mesh, B, x.ndim, axis))
                  for x, axis in ((ids, 0), (mask, 0), (positions, 1), (deltas, 0))]
        vision = _replicated(prepare_vision_inputs(pixels, grids, mc.vision), dec.mesh)
        args = (dec.graphdef, dec.params, _sampler_state(policy, dec.mesh, B, shapes.cache), *tokens, vision)
        out.append(_measure(dec.mesh, "rollout_prefill", f"static, {B} prompts x {shapes.prompt} tokens, cache "
                            f"{shapes.cache}, {where}", sampler._extend_jit, args, resident))
    if "rollout_decode" in run:
        sampling = dataclasses.replace(sc, seed=0, stop_token_ids=(), suppress_token_ids=())
        args = (dec.graphdef, dec.params, _sampler_state(policy, dec.mesh, B, shapes.cache),
                _ints(dec.mesh, 1), _ints(dec.mesh, 2), sampling)
        out.append(_measure(dec.mesh, "rollout_decode", f"static, {B} rows, up to {sc.max_new_tokens} tokens, cache "
                            f"{shapes.cache}, {where}", sampler._decode_jit, args, resident))
    return out


def _paged_programs(cfg, mc, policy, dec: Decoding, shapes, grid, resident, run) -> list[Program]:
    """The paged engine's programs (sampling.engine = "paged", rollout/engine.py) at their largest shapes: the
    prefill admitting every slot's prompt at once, and a decode chunk with every slot holding its longest context.
    The KV pool is `sampling.pages` pages (default: every slot's longest request), the rows `sampling.slots`
    (default: all of the host's rollouts)."""
    sc, out = cfg.rl.sampling, []
    eng = Engine(policy.model, sc, slots=sc.slots or dec.rows, max_len=shapes.cache, page_size=sc.page_size,
                 pages=sc.pages, chunk=sc.chunk)
    S = eng.slots
    kv_spec = NamedSharding(dec.mesh, P(*logical_to_spec(("act_kv_heads", None, None, None),
                                                       (mc.text.num_key_value_heads, 1, 1, 1), dec.mesh)))
    pool = tuple(jax.ShapeDtypeStruct((mc.text.num_key_value_heads, eng.pages, eng.page_size, mc.text.head_dim),
                                      jnp.dtype(mc.dtype), sharding=kv_spec) for _ in range(mc.text.num_hidden_layers))
    logits = jax.ShapeDtypeStruct((S, mc.text.vocab_size), jnp.float32, sharding=NamedSharding(dec.mesh, P()))
    where = (f"{S} slots, {eng.pages} pages of {eng.page_size}, up to {shapes.cache} tokens a request, on "
             f"{dec.mesh.devices.size} chips of host 0 of {dec.processes}")
    if "rollout_prefill" in run:
        ids, _, pixels, grids = _rows(mc, 1, shapes.prompt, grid)
        inputs = eng.widest_prefill_inputs(Request(ids[0], 0, pixels, grids), cfg.rl.group_size)
        args = (dec.graphdef, dec.params, pool, pool, logits, *_replicated(inputs, dec.mesh))
        out.append(_measure(dec.mesh, "rollout_prefill", f"paged, {S} prompts x {shapes.prompt} tokens, {where}",
                            engine._prefill_jit, args, resident))
    if "rollout_decode" in run:
        inputs = eng.widest_chunk_inputs()
        static = dataclasses.replace(sc, seed=0, stop_token_ids=(), suppress_token_ids=())
        args = (dec.graphdef, dec.params, pool, pool, logits, *_replicated(inputs, dec.mesh),
                _ints(dec.mesh, 2, jnp.uint32), _ints(dec.mesh, 1), _ints(dec.mesh, 2), static, eng.chunk)
        out.append(_measure(dec.mesh, "rollout_decode", f"paged, a chunk of {eng.chunk} steps, {where}",
                            engine._chunk_jit, args, resident))
    return out


def _ints(mesh, n: int, dtype=jnp.int32):
    return jax.ShapeDtypeStruct((n,), dtype, sharding=NamedSharding(mesh, P()))


def _sampler_state(policy: Abstract, mesh, batch: int, max_len: int):
    """The static sampler's state for `batch` rows and a `max_len` cache on `mesh` (rows over the batch axes, KV
    heads over `tensor`); its cache index is traced, so one compile serves every position."""
    state = jax.eval_shape(lambda: sampler.init_state(policy.model, batch, max_len))
    kv = logical_to_spec(("batch", "cache_seq", "act_kv_heads", None), state.cache.keys[0].shape, mesh)

    def one(path, x):
        names = [getattr(p, "name", "") for p in path]
        if "keys" in names or "values" in names:
            spec = kv
        elif x.ndim and x.shape[0] == batch:
            spec = P(*logical_to_spec(("batch",), (batch,), mesh), *([None] * (x.ndim - 1)))
        else:
            spec = P()
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=NamedSharding(mesh, spec))

    return jax.tree_util.tree_map_with_path(one, state)


def _key(mesh):
    k = jax.eval_shape(lambda: jax.random.key(0))
    return jax.ShapeDtypeStruct(k.shape, k.dtype, sharding=NamedSharding(mesh, P()))


def _opt_state(tx, trainable, mesh):
    return _placed(jax.eval_shape(tx.init, trainable), mesh)


@dataclasses.dataclass(frozen=True)
class Shapes:
    """The sequence shapes a step runs at."""

    prompt: int  # the longest prompt bucket
    completion: int  # the rollout's token block: decode rounds (and tool turns) after the prompt
    rollouts: int  # sampled together: prompts_per_step x group_size
    mini_batch: int  # rollouts per optimiser update
    micro_batch: int
    cache: int  # KV slots of the rollout cache

    @classmethod
    def of(cls, cfg: TrainConfig) -> Shapes:
        prompt = max(cfg.data.bucket_lengths)
        turns = cfg.rl.max_tool_turns if cfg.plugin.uses_tools else 0
        cache = required_cache_len(prompt, cfg.rl.sampling.max_new_tokens, turns, cfg.rl.max_tool_tokens)
        rollouts = cfg.rl.prompts_per_step * cfg.rl.group_size
        mini = cfg.rl.mini_batch or rollouts
        return cls(prompt, cache - prompt, rollouts, mini, cfg.rl.micro_batch or mini, cache)


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
    temperature = rc.sampling.temperature or 1.0
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
    out: list[Program] = []
    R = shapes.micro_batch
    # as the trainer runs it: each prompt once for its G rollouts when the micro-batch holds whole groups
    group = rc.group_size if rc.shared_prefix and R % rc.group_size == 0 else 1
    seq = None
    if run & {"rl_update", "reference_forward", "old_logp_forward"}:
        seq = _seq_batch(mc, R, shapes.prompt, shapes.completion, grid, group)
    what = f"{R} rollouts x ({shapes.prompt} + {shapes.completion}) tokens"
    if group > 1:
        what = f"{R // group} prompts x {shapes.prompt} + {R} completions x {shapes.completion} tokens (shared prefix)"
    if "rl_update" in run:
        data = _rl_data(seq, R, shapes.completion, cfg)
        args = (policy.graphdef, policy.trainable, policy.frozen, rl_opt, _batch_placed(data, mesh, R), rc.loss,
                temperature, rl_tx, key)
        out.append(_measure(mesh, "rl_update", what, st.rl_update, args, reference))
    if "reference_forward" in run:
        args = (policy.graphdef, policy.trainable, policy.frozen, _batch_placed(seq, mesh, R), temperature)
        out.append(_measure(mesh, "reference_forward", what, st.reference_logprobs, args, _local_bytes(rl_opt, mesh)))
    if "old_logp_forward" in run:  # rl.old_logp = "trainer": pi_old at the step's starting weights
        args = (policy.graphdef, policy.trainable, policy.frozen, _batch_placed(seq, mesh, R), temperature)
        out.append(_measure(mesh, "old_logp_forward", what, st.policy_logprobs, args,
                            _local_bytes(rl_opt, mesh) + reference))
    if run & {"rollout_prefill", "rollout_decode"}:
        # while the copy samples, every chip still holds its shard of the trainer's state: the master weights,
        # Adam's state and the KL reference; a rollout mesh of its own (decode.devices) holds none of it
        resident = 0 if cfg.decode.devices else (
            _local_bytes(policy.trainable, mesh) + _local_bytes(policy.frozen, mesh) + _local_bytes(rl_opt, mesh)
            + reference)
        dec = decoding(cfg, policy, mesh, shapes, host)
        rollout = _paged_programs if rc.sampling.engine == "paged" else _static_programs
        out += rollout(cfg, mc, policy, dec, shapes, grid, resident, run)
    if "sft_update" in run:
        S = cfg.sft.batch_size
        sft_seq = _sft_seq(mc, S, shapes.prompt, grid)
        tx = make_optimizer(dataclasses.replace(cfg.sft.optim, total_steps=max(cfg.sft.steps, 1)))
        args = (policy.graphdef, policy.trainable, policy.frozen, _opt_state(tx, policy.trainable, mesh), tx,
                _batch_placed(sft_seq, mesh, S), key)
        out.append(_measure(mesh, "sft_update", f"{S} rows x {shapes.prompt} tokens", st.sft_update, args))
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
                       f"{'of HBM':>7} {'compile s':>9} {'TFLOPs':>8} {'Mosaic':>6} {'a2a':>4}  shape"]
        for p in self.programs:
            share = "-" if t.hbm_bytes is None else f"{100 * p.peak / t.hbm_bytes:.0f}%"
            flops = "-" if p.flops is None else f"{p.flops / 1e12:.3g}"
            sizes = " ".join(f"{fmt_bytes(n):>10}" for n in (p.argument, p.temp, p.output, p.resident, p.peak))
            seconds = "-" if self.estimate else f"{p.compile_s:.1f}"
            kernels = "-" if self.estimate else f"{p.mosaic_kernels}/{p.lm_head_kernels}"
            a2a = "-" if self.estimate else str(p.all_to_alls)
            lines.append(f"{p.name:<18} {sizes} {share:>7} {seconds:>9} {flops:>8} {kernels:>6} {a2a:>4}  {p.what}")
        if self.remat is not None:
            chosen, recipe, peaks = self.remat
            each = ", ".join(f"{name} {fmt_bytes(peak)}" for name, peak in peaks.items())
            lines.append(f"remat: {chosen} chosen for the updates (their estimated peak: {each}; the first that fits "
                         f"is chosen, in that order); the recipe sets {recipe}"
                         + ("" if chosen == recipe else f": set policy.remat_policy={chosen}"))
        lines.append("peak = argument + output - aliased + temp (the compiler's buffer assignment) + resident (trainer "
                     "state held meanwhile: Adam state and KL reference copy while sampling); Mosaic = Pallas kernel "
                     "calls / of which the LM head's; a2a = all-to-all call sites (expert parallelism)")
        return "\n".join(lines)


def fmt_bytes(n: float) -> str:
    return f"{n / GiB:.2f} GiB" if abs(n) >= GiB else f"{n / (1 << 20):.2f} MiB"


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
    target = parse_target(topology)
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
    training, rollout = rollout_mesh_devices(cfg, target) if own else (target.devices[: cfg.mesh.size], None)
    if target.platform == "gpu":
        chosen, peaks = choose_remat(cfg, target)
        estimates = [p for p in estimate_gpu(cfg, target, remat=chosen) if not only or p.name in only]
        return Report(config_name, target, mesh_shape, estimates, estimate=True, rollout_devices=own,
                      remat=(chosen, model_config(cfg).decoder_remat, peaks))
    mesh = make_mesh(*mesh_shape, devices=training)
    return Report(config_name, target, mesh_shape, programs(cfg, mesh, only, rollout or host_slice(target, mesh)),
                  rollout_devices=own)


# ---- GPU targets: an analytic estimate ------------------------------------------------------------------------


def _local_bytes(tree, mesh) -> int:
    """Per-device bytes of an abstract tree placed on `mesh` (an AbstractMesh is enough)."""
    total = 0
    for x in jax.tree.leaves(tree):
        spec = x.sharding.spec
        shards = 1
        for entry in spec:
            for ax in (entry,) if isinstance(entry, str) else (entry or ()):
                shards *= dict(zip(mesh.axis_names, mesh.axis_sizes))[ax]
        total += math.ceil(int(np.prod(x.shape)) / shards) * x.dtype.itemsize
    return total


def _saved_per_token(mc: ModelConfig, policy: str, tensor: int) -> float:
    """Bytes one decoder layer keeps per token for the backward pass under a remat policy (compute dtype)."""
    t, b = mc.text, jnp.dtype(mc.dtype).itemsize
    heads = t.num_attention_heads * t.head_dim / tensor
    kv = 2 * t.num_key_value_heads * t.head_dim / max(1, min(tensor, t.num_key_value_heads))
    mlp = t.intermediate_size / tensor
    dots = heads + kv + t.hidden_size + 2 * mlp + t.hidden_size  # q, k, v, o, gate, up, down
    if policy == "full":
        return b * t.hidden_size
    if policy in ("dots", "dots_no_batch"):
        return b * (dots + t.hidden_size)
    return b * (dots + heads + 3 * mlp + 4 * t.hidden_size)  # every elementwise input too


def _layer_working_set(mc: ModelConfig, rows: float, tokens: int, keys: int, tensor: int) -> float:
    """One decoder layer's live temporaries (recomputed forward + backward) for `rows` rows: activations of every
    op, and float32 attention scores of one query chunk over `keys` keys (x3: scores, probabilities, their
    gradient)."""
    t = mc.text
    chunk = min(tokens, mc.attention_chunk or tokens)
    scores = 3 * 4 * rows * (t.num_attention_heads / tensor) * chunk * keys
    return 2 * rows * tokens * _saved_per_token(mc, "none", tensor) + scores


def _forward_working_set(mc: ModelConfig, rows: float, tokens: int, keys: int, tensor: int) -> float:
    """One decoder layer's live temporaries in a forward without backward: the residual stream, normed input and
    attention output, the MLP's gate, up and product, and float32 scores and probabilities of one query chunk."""
    t, b = mc.text, jnp.dtype(mc.dtype).itemsize
    chunk = min(tokens, mc.attention_chunk or tokens)
    per_token = 4 * t.hidden_size + 3 * t.intermediate_size / tensor
    return rows * tokens * per_token * b + 2 * 4 * rows * (t.num_attention_heads / tensor) * chunk * keys


def _vision_bytes(mc: ModelConfig, images: float, grid, trains: bool) -> float:
    """The vision tower's activations for `images` images: per block inputs kept (remat) when it trains, one
    block's working set (with the dense [P, P] scores of one image) otherwise too."""
    v, b = mc.vision, jnp.dtype(mc.dtype).itemsize
    p = int(np.prod(grid))
    block = images * p * (6 * v.hidden_size + 2 * v.intermediate_size) * b + 3 * 4 * images * v.num_heads * p * p
    return block + (images * p * v.hidden_size * b * v.depth if trains else 0)


# The updates' remat policies `choose_remat` tries, fastest first: "dots" keeps every matmul's output for the backward
# pass (only the elementwise ops are recomputed), "full" keeps a layer's input alone (the whole layer recomputed)
REMAT_CHOICES = ("dots", "full")
UPDATES = ("rl_update", "sft_update")


def choose_remat(cfg: TrainConfig, target: Target) -> tuple[str, dict[str, int]]:
    """The first of REMAT_CHOICES under which every update's estimated peak fits the target's memory ("full" when
    none does), and each choice's largest update peak."""
    peaks = {}
    for policy in REMAT_CHOICES:
        peaks[policy] = max((p.peak for p in estimate_gpu(cfg, target, remat=policy) if p.name in UPDATES),
                            default=0)
    return next((p for p in REMAT_CHOICES if peaks[p] <= target.hbm_bytes), REMAT_CHOICES[-1]), peaks


def estimate_gpu(cfg: TrainConfig, target: Target, remat: str | None = None) -> list[Program]:
    """Per-GPU memory of each program from the layout (exact argument bytes of the sharded state on the recipe's
    mesh) and an activation model (remat policy: `remat`, else the recipe's; micro-batch, sequence lengths, KV
    cache). Labelled an estimate: jax cannot compile for a CUDA target on a machine without one."""
    mc = model_config(cfg)
    mesh = jax.sharding.AbstractMesh((cfg.mesh.data, cfg.mesh.fsdp, cfg.mesh.tensor), ("data", "fsdp", "tensor"))
    model = nnx.eval_shape(lambda: Qwen3VL(mc, rngs=nnx.Rngs(0)))
    _, trainable, frozen = nnx.split(model, trainable_filter(cfg.policy), ...)
    trainable, frozen = _placed(trainable, mesh), _placed(frozen, mesh)
    weights = _local_bytes(trainable, mesh) + _local_bytes(frozen, mesh)
    grads = _local_bytes(trainable, mesh)
    shapes, rc, t = Shapes.of(cfg), cfg.rl, mc.text
    grid = image_grid(cfg, mc)
    shards, tensor = cfg.mesh.batch_shards, cfg.mesh.tensor
    b = jnp.dtype(mc.dtype).itemsize
    policy = remat or mc.decoder_remat
    out = []

    lora = cfg.policy.lora
    reference = grads if rc.loss.kl_coef > 0 and lora.rank == 0 and lora.vision_rank == 0 else 0

    def optimiser_bytes(accumulate: bool) -> int:
        tx = make_optimizer(dataclasses.replace(rc.optim, grad_accum_steps=2 if accumulate else 1))
        return _local_bytes(_placed(jax.eval_shape(tx.init, trainable), mesh), mesh)

    def update(name: str, rows: int, tokens: int, what: str, accumulate: bool, batch, resident: int) -> Program:
        args = weights + optimiser_bytes(accumulate) + _local_bytes(_batch_placed(batch, mesh, rows), mesh)
        local = rows / shards
        acts = t.num_hidden_layers * local * tokens * _saved_per_token(mc, policy, tensor)
        temp = (grads + acts + _layer_working_set(mc, local, tokens, tokens, tensor)
                + _vision_bytes(mc, local, grid, cfg.policy.train_vision))
        return Program(name, what, args, 0, 0, int(temp), int(args + temp + resident), 0.0, None, resident)

    if rc.steps > 0:
        R, T = shapes.micro_batch, shapes.prompt + shapes.completion
        what = f"{R} rollouts x ({shapes.prompt} + {shapes.completion}) tokens"
        data = _rl_data(_seq_batch(mc, R, shapes.prompt, shapes.completion, grid), R, shapes.completion, cfg)
        out.append(update("rl_update", R, T, what, shapes.mini_batch > R, data, reference))
        sampling_resident = optimiser_bytes(shapes.rollouts > R) + reference
        local = R / shards
        forward = (local * T * t.hidden_size * b + _forward_working_set(mc, local, T, T, tensor)
                   + _vision_bytes(mc, local, grid, False))
        if rc.loss.kl_coef > 0:
            resident = sampling_resident - reference
            out.append(Program("reference_forward", what, weights, 0, 0, int(forward),
                               int(weights + forward + resident), 0.0, None, resident))
        if old_logp_forward(cfg):
            out.append(Program("old_logp_forward", what, weights, 0, 0, int(forward),
                               int(weights + forward + sampling_resident), 0.0, None, sampling_resident))
        # rollouts run on each host's decoding copy (rollout/decode_copy.py), the trainer's state resident meanwhile
        hosts = -(-cfg.mesh.size // GPUS_PER_HOST)
        local = cfg.mesh.size // hosts
        if cfg.decode.devices:  # a rollout mesh of its own on the one host: the trainer's state is not there
            hosts, local = 1, cfg.decode.devices
        dec_tensor = cfg.decode.tensor or local
        dec_mesh = jax.sharding.AbstractMesh((local // dec_tensor, 1, dec_tensor), ("data", "fsdp", "tensor"))
        dec_dtype = cfg.decode.weights_dtype(mc.dtype)
        copy = _local_bytes(_placed(nnx.state(model), dec_mesh, float_dtype=dec_dtype), dec_mesh)
        resident = 0 if cfg.decode.devices else weights + sampling_resident
        sc, rows = rc.sampling, shapes.rollouts / hosts
        kv_shards = max(1, min(dec_tensor, t.num_key_value_heads))
        if sc.engine == "paged":  # the engine's pool of pages, whole on each device of the copy; `slots` at a time
            eng = Engine(model, sc, slots=sc.slots or int(rows), max_len=shapes.cache, page_size=sc.page_size,
                         pages=sc.pages, chunk=sc.chunk)
            B, cache, how = eng.slots, eng.kv_bytes / kv_shards, f"paged, {eng.slots} slots, {eng.pages} pages"
        else:  # the static sampler: every row's whole cache, rows over the copy's data axis
            B = rows / dec_mesh.axis_sizes[0]
            per_token = t.num_hidden_layers * 2 * t.num_key_value_heads * t.head_dim * b / kv_shards
            cache, how = B * shapes.cache * per_token, f"static, {int(rows)} rows"
        logits = B * t.vocab_size * 4
        prefill = (_forward_working_set(mc, B, shapes.prompt, shapes.cache, dec_tensor)
                   + _vision_bytes(mc, max(1.0, B / rc.group_size), grid, False))
        shape = f"{how} per host of {local}, up to {shapes.cache} tokens a row"
        out.append(Program("rollout_prefill", f"{shape}, prompts of {shapes.prompt}", int(copy + cache), int(cache),
                           int(cache), int(prefill + logits), int(copy + cache + prefill + logits + resident), 0.0,
                           None, resident))
        decode = 4 * logits + B * sc.max_new_tokens * 16
        out.append(Program("rollout_decode", shape, int(copy + cache), int(cache), int(cache), int(decode),
                           int(copy + cache + decode + resident), 0.0, None, resident))
    if cfg.sft.steps > 0:
        S = cfg.sft.batch_size
        out.append(update("sft_update", S, shapes.prompt, f"{S} rows x {shapes.prompt} tokens", False,
                          _sft_seq(mc, S, shapes.prompt, grid), 0))
    return out
