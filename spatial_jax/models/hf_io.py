"""Hugging Face checkpoints in and out, without torch.

Reads `config.json` + `*.safetensors` (single file or sharded with `model.safetensors.index.json`) and writes the
same layout that transformers' `Qwen3VLForConditionalGeneration.from_pretrained` loads. The safetensors container
is read and written here directly (8-byte header length, JSON header, raw little-endian data) so bfloat16 works with
numpy through ml_dtypes, and a save streams tensor by tensor from weights sharded over any number of processes.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from spatial_jax.distributed import barrier, is_primary, to_host
from spatial_jax.models.config import AttentionImpl, DType, LoRAConfig, ModelConfig, MoeMatmul, RematPolicy
from spatial_jax.models.lora import LoRALinear, reset_adapters
from spatial_jax.models.qwen3_vl import Qwen3VL
from spatial_jax.models.registry import architecture, config_from_hf, config_to_hf
from spatial_jax.models.sharding import logical_to_spec, shard_model, variable_names

_ST_DTYPES = {
    "F64": np.dtype(np.float64), "F32": np.dtype(np.float32), "F16": np.dtype(np.float16),
    "BF16": np.dtype(ml_dtypes.bfloat16), "I64": np.dtype(np.int64), "I32": np.dtype(np.int32),
    "I16": np.dtype(np.int16), "I8": np.dtype(np.int8), "U8": np.dtype(np.uint8), "BOOL": np.dtype(np.bool_),
}
_ST_NAMES = {v: k for k, v in _ST_DTYPES.items()}


# ---------------------------------------------------------------- safetensors container


def read_safetensors_header(path: str | Path) -> tuple[dict[str, Any], int]:
    with open(path, "rb") as f:
        n = int.from_bytes(f.read(8), "little")
        header = json.loads(f.read(n))
    header.pop("__metadata__", None)
    return header, 8 + n


def read_tensor(path: str | Path, header: dict[str, Any], data_start: int, name: str) -> np.ndarray:
    info = header[name]
    dtype = _ST_DTYPES.get(info["dtype"])
    if dtype is None:
        raise ValueError(f"{path}: tensor {name} has unsupported dtype {info['dtype']}")
    begin, end = info["data_offsets"]
    shape = tuple(info["shape"])
    if end - begin != int(np.prod(shape, dtype=np.int64)) * dtype.itemsize:
        raise ValueError(f"{path}: tensor {name} byte range does not match its shape {shape}")
    mm = np.memmap(path, dtype=np.uint8, mode="r", offset=data_start + begin, shape=(end - begin,))
    return np.asarray(mm).view(dtype.newbyteorder("<")).reshape(shape)


def _safetensors_header(entries: list[tuple[str, np.dtype, tuple[int, ...]]]) -> bytes:
    """The length-prefixed JSON header for tensors (name, dtype, shape) laid out back to back in this order."""
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    for name, dtype, shape in entries:
        if dtype not in _ST_NAMES:
            raise ValueError(f"cannot write {name} with dtype {dtype}")
        nbytes = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
        header[name] = {"dtype": _ST_NAMES[dtype], "shape": list(shape), "data_offsets": [offset, offset + nbytes]}
        offset += nbytes
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    return len(raw).to_bytes(8, "little") + raw


def _write_tensor(f, arr: np.ndarray) -> None:
    """Writes the raw little-endian bytes; no copy of a contiguous little-endian array."""
    arr = np.ascontiguousarray(arr).astype(arr.dtype.newbyteorder("<"), copy=False)
    f.write(arr.reshape(-1).view(np.uint8))


def write_safetensors(path: str | Path, tensors: dict[str, np.ndarray]) -> None:
    arrays = {name: np.asarray(arr) for name, arr in tensors.items()}
    with open(path, "wb") as f:
        f.write(_safetensors_header([(name, arr.dtype, arr.shape) for name, arr in arrays.items()]))
        for arr in arrays.values():
            _write_tensor(f, arr)


class _CheckpointReader:
    """Name -> tensor over one or several safetensors files of a checkpoint directory."""

    def __init__(self, path: Path):
        index = path / "model.safetensors.index.json"
        if index.exists():
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        else:
            files = sorted(p.name for p in path.glob("*.safetensors"))
        if not files:
            raise FileNotFoundError(f"no *.safetensors in {path}")
        self.where: dict[str, tuple[Path, dict, int]] = {}
        for fname in files:
            header, start = read_safetensors_header(path / fname)
            for name in header:
                self.where[name] = (path / fname, header, start)

    def __contains__(self, name: str) -> bool:
        return name in self.where

    def names(self) -> set[str]:
        return set(self.where)

    def get(self, name: str) -> np.ndarray:
        file, header, start = self.where[name]
        return read_tensor(file, header, start, name)


# ---------------------------------------------------------------- parameter names


def hf_name(path: tuple, model_type: str = ModelConfig.model_type) -> str | None:
    """HF state-dict name of the model Variable at `path` in a `model_type` checkpoint (None for adapters and RNG
    state)."""
    p = ".".join(str(x) for x in path)
    if re.search(r"(^|\.)(lora_a|lora_b|lora_dropout)(\.|$)", p):
        return None
    arch = architecture(model_type)
    if p == "lm_head":
        return "lm_head.weight"
    if p == "embed_tokens.embedding":
        return arch.text_prefix + "embed_tokens.weight"
    if p == "visual.pos_embed":
        return arch.vision_prefix + "pos_embed.weight"
    p = re.sub(r"^visual\.patch_embed\.", "visual.patch_embed.proj.", p)
    p = re.sub(r"\.experts\.(\w+)\.kernel$", r".experts.\1", p)  # stacked expert weights are bare tensors
    p = re.sub(r"\.kernel$", ".weight", p)
    if p.startswith("visual."):
        return arch.vision_prefix + p[len("visual."):]
    return arch.text_prefix + p


def _to_ours(path: tuple, w: np.ndarray, shape: tuple, experts_swapped: bool = False) -> np.ndarray:
    """HF tensor -> our layout: Linear [out, in] -> [in, out]; Conv3d [D, C, t, p, p] -> [C*t*p*p, D]; lm_head T.
    Expert stacks [E, in, out] are ours as released (Qwen3-VL-MoE's files: [E, D, 2I], [E, I, D]); transformers 5
    saves them [E, out, in]. A shape tells the two apart unless in == out; then `experts_swapped` (the checkpoint
    was written by transformers 5 or by save_pretrained here) decides."""
    if _is_expert(path):
        square = shape[-1] == shape[-2]
        if (square and experts_swapped) or (not square and w.shape[-2:] == shape[:-3:-1]):
            w = np.swapaxes(w, -1, -2)
    elif path[-1] == "kernel":
        w = w.reshape(w.shape[0], -1).T
    elif path == ("lm_head",):
        w = w.T
    if w.shape != shape:
        raise ValueError(f"{'.'.join(map(str, path))}: checkpoint shape {w.shape} != model shape {shape}")
    return w


def _is_expert(path: tuple) -> bool:
    return len(path) > 2 and path[-3] == "experts"


def _to_hf(path: tuple, w: np.ndarray, cfg: ModelConfig) -> np.ndarray:
    if _is_expert(path):  # transformers 5's layout, which it reads whatever the sizes (see _to_ours)
        return jnp.swapaxes(w, -1, -2)
    if path[-1] == "kernel":
        w = w.T
        if path[:2] == ("visual", "patch_embed"):
            v = cfg.vision
            w = w.reshape(v.hidden_size, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size)
    elif path == ("lm_head",):
        w = w.T
    return w


def _layer_paths(path: tuple, cfg: ModelConfig) -> list[tuple] | None:
    """The per-layer (HF) paths of a stacked variable of a scanned model (ModelConfig.scan_layers), in layer order;
    None for a variable that is not stacked."""
    if not cfg.scan_layers:
        return None
    if path[0] == "layers":
        k, n = 1, cfg.text.num_hidden_layers
    elif path[:2] == ("visual", "blocks"):
        k, n = 2, cfg.vision.depth
    else:
        return None
    return [path[:k] + (i,) + path[k:] for i in range(n)]


# ---------------------------------------------------------------- load / save


def load_config(path: str | Path, **kwargs) -> ModelConfig:
    cfg_file = Path(path) / "config.json"
    if not cfg_file.exists():
        raise FileNotFoundError(f"{cfg_file} not found")
    return config_from_hf(json.loads(cfg_file.read_text()), **kwargs)


def from_pretrained(
    path: str | os.PathLike,
    *,
    dtype: DType = "float32",
    param_dtype: DType | None = None,
    mesh: Mesh | None = None,
    lora: LoRAConfig = LoRAConfig(),
    seed: int = 0,
    remat: bool = False,
    attention_chunk: int = 1024,
    remat_policy: RematPolicy = "none",
    scan_layers: bool = False,
    attention_impl: AttentionImpl = "auto",
    moe_matmul: MoeMatmul = "ragged_dot",
) -> Qwen3VL:
    """Builds `Qwen3VL` from a HF checkpoint directory; adapters (if any) are fresh (B = 0).

    Base weights are read tensor by tensor and placed directly with their sharding when `mesh` is given; the model
    is built abstractly (nnx.eval_shape), so no random base initialisation is ever materialised. With
    `scan_layers` the per-layer tensors are stacked into the [L, ...] arrays of the scanned layers.
    """
    path = Path(path)
    cfg = load_config(path, lora=lora, dtype=dtype, param_dtype=param_dtype).replace(
        remat=remat, attention_chunk=attention_chunk, remat_policy=remat_policy, scan_layers=scan_layers,
        attention_impl=attention_impl, moe_matmul=moe_matmul)
    reader = _CheckpointReader(path)
    version = json.loads((path / "config.json").read_text()).get("transformers_version", "0")
    experts_swapped = int(str(version).split(".")[0] or 0) >= 5
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Qwen3VL(cfg, rngs=nnx.Rngs(seed))))

    pdt = jnp.dtype(cfg.param_dtype)
    used = set()

    def read(var_path: tuple, shape: tuple) -> np.ndarray:
        name = hf_name(var_path, cfg.model_type)
        if name not in reader:
            raise KeyError(f"checkpoint {path} lacks {name} (for {'.'.join(map(str, var_path))})")
        used.add(name)
        return _to_ours(var_path, reader.get(name), shape, experts_swapped).astype(pdt)

    leaves = []
    for var_path, var in nnx.to_flat_state(abstract):
        if hf_name(var_path, cfg.model_type) is None:  # adapters and their RNG streams: filled by reset_adapters below
            leaves.append((var_path, var))
            continue
        shape = tuple(var.get_value().shape)
        per_layer = _layer_paths(var_path, cfg)
        arr = read(var_path, shape) if per_layer is None else np.stack([read(p, shape[1:]) for p in per_layer])
        if mesh is not None:
            names = variable_names(var)
            spec = logical_to_spec(names, arr.shape, mesh) if names else jax.sharding.PartitionSpec()
            # each device (on every host) copies only its own block
            value = jax.make_array_from_callback(arr.shape, NamedSharding(mesh, spec), lambda idx, a=arr: a[idx])
        else:
            value = jnp.asarray(arr)
        leaves.append((var_path, var.replace(value)))
    unused = reader.names() - used
    if cfg.tie_word_embeddings:
        unused.discard("lm_head.weight")
    if unused:
        raise KeyError(f"checkpoint {path} has weights the model does not use: {sorted(unused)[:8]}")
    model = reset_adapters(nnx.merge(graphdef, nnx.from_flat_state(leaves)), seed)
    abstract_left = [p for p, v in nnx.to_flat_state(nnx.state(model))
                     if isinstance(v.get_value(), jax.ShapeDtypeStruct)]
    if abstract_left:
        raise RuntimeError(f"from_pretrained left uninitialised state: {abstract_left[:4]}")
    if mesh is not None:
        shard_model(model, mesh)
    return model


def _hf_shape(path: tuple, shape: tuple, cfg: ModelConfig) -> tuple[int, ...]:
    """The shape `_to_hf` gives a tensor of our `shape` (known before any value is fetched)."""
    if _is_expert(path):
        return (*shape[:-2], shape[-1], shape[-2])
    if path[-1] == "kernel" and path[:2] == ("visual", "patch_embed"):
        v = cfg.vision
        return (v.hidden_size, v.in_channels, v.temporal_patch_size, v.patch_size, v.patch_size)
    if path[-1] == "kernel" or path == ("lm_head",):
        return tuple(reversed(shape))
    return tuple(shape)


@dataclasses.dataclass(frozen=True)
class _Tensor:
    """One HF tensor of an export: `value()` is the (possibly sharded) device array of variable `var_path`, adapters
    merged; `layer` picks one layer of a stacked (scanned) variable."""

    name: str
    path: tuple  # the per-layer path, for _to_hf
    shape: tuple[int, ...]  # HF shape
    var_path: tuple
    layer: int | None
    value: Callable[[], jax.Array]


def _export_plan(model: Qwen3VL) -> list[_Tensor]:
    cfg: ModelConfig = model.cfg
    adapted = {tuple(p): node for p, node in nnx.iter_graph(model) if isinstance(node, LoRALinear) and node.rank > 0}
    plan = []
    for var_path, var in nnx.to_flat_state(nnx.state(model, nnx.Param)):
        if hf_name(var_path, cfg.model_type) is None:
            continue
        layer = adapted.get(tuple(var_path[:-1])) if var_path[-1] == "kernel" else None
        value = layer.merged_kernel if layer is not None else var.get_value
        shape = tuple(var.get_value().shape)
        per_layer = _layer_paths(var_path, cfg)
        if per_layer is None:
            plan.append(_Tensor(hf_name(var_path, cfg.model_type), var_path, _hf_shape(var_path, shape, cfg),
                                var_path, None, value))
        else:
            plan.extend(_Tensor(hf_name(p, cfg.model_type), p, _hf_shape(p, shape[1:], cfg), var_path, i, value)
                        for i, p in enumerate(per_layer))
    return plan


def save_pretrained(model: Qwen3VL, path: str | os.PathLike, *, dtype: DType | None = None,
                    max_shard_bytes: int = 4 * 2**30) -> None:
    """Writes config.json + safetensors (sharded with an index when larger than max_shard_bytes), adapters merged.

    Streamed one tensor (one layer of a stacked variable) at a time, so the host holds one tensor, not the model, and
    adapters are merged per layer on the device. Weights sharded across processes (multi-host) are gathered with
    `process_allgather`: every process takes part, in the same order; only the first process writes (its file
    system alone needs `path`), and the others return once the files are complete. `dtype` (default: the
    parameter dtype) is the saved dtype.
    """
    path = Path(path)
    cfg: ModelConfig = model.cfg
    saved = dtype or cfg.param_dtype
    out_dtype = np.dtype(ml_dtypes.bfloat16) if saved == "bfloat16" else np.dtype(saved)
    plan = _export_plan(model)
    itemsize = out_dtype.itemsize
    shards: list[list[_Tensor]] = [[]]
    size = 0
    for t in plan:
        nbytes = int(np.prod(t.shape, dtype=np.int64)) * itemsize
        if size and size + nbytes > max_shard_bytes:
            shards.append([])
            size = 0
        shards[-1].append(t)
        size += nbytes
    names = ["model.safetensors"] if len(shards) == 1 else [
        f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors" for i in range(len(shards))]
    write = is_primary()
    if write:
        path.mkdir(parents=True, exist_ok=True)
        # files of an earlier save in the other layout would shadow this one
        for stale in [*path.glob("model-*-of-*.safetensors"), path / "model.safetensors",
                      path / "model.safetensors.index.json"]:
            if stale.exists():
                stale.unlink()
    held: tuple[tuple | None, jax.Array | None] = (None, None)  # the stacked variable whose layers are being written
    for fname, shard in zip(names, shards):
        with open(path / fname, "wb") if write else contextlib.nullcontext() as f:
            if f is not None:
                f.write(_safetensors_header([(t.name, out_dtype, t.shape) for t in shard]))
            for t in shard:
                if held[0] != t.var_path:
                    held = (t.var_path, t.value())
                # HF layout and dtype on the device, so the host receives the bytes to write and holds one copy
                w = held[1] if t.layer is None else held[1][t.layer]
                w = to_host(_to_hf(t.path, w, cfg).astype(out_dtype))
                if f is not None:
                    _write_tensor(f, w)
    if write:
        if len(shards) > 1:
            total = sum(int(np.prod(t.shape, dtype=np.int64)) * itemsize for t in plan)
            weight_map = {t.name: fname for fname, shard in zip(names, shards) for t in shard}
            (path / "model.safetensors.index.json").write_text(
                json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
            )
        saved_dtype = "bfloat16" if out_dtype == np.dtype(ml_dtypes.bfloat16) else str(out_dtype)
        (path / "config.json").write_text(json.dumps(config_to_hf(cfg, torch_dtype=saved_dtype), indent=2))
    barrier("save_pretrained")
