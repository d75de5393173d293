"""Hugging Face checkpoints in and out, without torch.

Reads `config.json` + `*.safetensors` (single file or sharded with `model.safetensors.index.json`) and writes the
same layout that transformers' `Qwen3VLForConditionalGeneration.from_pretrained` loads. The safetensors container
is read and written here directly (8-byte header length, JSON header, raw little-endian data) so bfloat16 works with
numpy through ml_dtypes.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import ml_dtypes
import numpy as np
from flax import nnx
from jax.sharding import Mesh, NamedSharding

from spatial_jax.models.config import DType, LoRAConfig, ModelConfig, RematPolicy
from spatial_jax.models.lora import merge_lora, reset_adapters
from spatial_jax.models.qwen3_vl import Qwen3VL
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


def write_safetensors(path: str | Path, tensors: dict[str, np.ndarray]) -> None:
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    offset = 0
    arrays = []
    for name, arr in tensors.items():
        arr = np.ascontiguousarray(arr)
        if arr.dtype not in _ST_NAMES:
            raise ValueError(f"cannot write {name} with dtype {arr.dtype}")
        header[name] = {"dtype": _ST_NAMES[arr.dtype], "shape": list(arr.shape),
                        "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
        arrays.append(arr)
    raw = json.dumps(header, separators=(",", ":")).encode()
    raw += b" " * (-len(raw) % 8)
    with open(path, "wb") as f:
        f.write(len(raw).to_bytes(8, "little"))
        f.write(raw)
        for arr in arrays:
            f.write(arr.astype(arr.dtype.newbyteorder("<"), copy=False).tobytes())


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


def hf_name(path: tuple) -> str | None:
    """HF state-dict name of the model Variable at `path` (None for adapters and RNG state)."""
    p = ".".join(str(x) for x in path)
    if re.search(r"(^|\.)(lora_a|lora_b|lora_dropout)(\.|$)", p):
        return None
    if p == "lm_head":
        return "lm_head.weight"
    if p == "embed_tokens.embedding":
        return "model.language_model.embed_tokens.weight"
    if p == "visual.pos_embed":
        return "model.visual.pos_embed.weight"
    p = re.sub(r"^visual\.patch_embed\.", "visual.patch_embed.proj.", p)
    p = re.sub(r"\.kernel$", ".weight", p)
    if p.startswith("visual."):
        return "model." + p
    return "model.language_model." + p


def _to_ours(path: tuple, w: np.ndarray, shape: tuple) -> np.ndarray:
    """HF tensor -> our layout: Linear [out, in] -> [in, out]; Conv3d [D, C, t, p, p] -> [C*t*p*p, D]; lm_head T."""
    if path[-1] == "kernel":
        w = w.reshape(w.shape[0], -1).T
    elif path == ("lm_head",):
        w = w.T
    if w.shape != shape:
        raise ValueError(f"{'.'.join(map(str, path))}: checkpoint shape {w.shape} != model shape {shape}")
    return w


def _to_hf(path: tuple, w: np.ndarray, cfg: ModelConfig) -> np.ndarray:
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
    return ModelConfig.from_hf(json.loads(cfg_file.read_text()), **kwargs)


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
) -> Qwen3VL:
    """Builds `Qwen3VL` from a HF checkpoint directory; adapters (if any) are fresh (B = 0).

    Base weights are read tensor by tensor and placed directly with their sharding when `mesh` is given; the model
    is built abstractly (nnx.eval_shape), so no random base initialisation is ever materialised. With
    `scan_layers` the per-layer tensors are stacked into the [L, ...] arrays of the scanned layers.
    """
    path = Path(path)
    cfg = load_config(path, lora=lora, dtype=dtype, param_dtype=param_dtype).replace(
        remat=remat, attention_chunk=attention_chunk, remat_policy=remat_policy, scan_layers=scan_layers)
    reader = _CheckpointReader(path)
    graphdef, abstract = nnx.split(nnx.eval_shape(lambda: Qwen3VL(cfg, rngs=nnx.Rngs(seed))))

    pdt = jnp.dtype(cfg.param_dtype)
    used = set()

    def read(var_path: tuple, shape: tuple) -> np.ndarray:
        name = hf_name(var_path)
        if name not in reader:
            raise KeyError(f"checkpoint {path} lacks {name} (for {'.'.join(map(str, var_path))})")
        used.add(name)
        return _to_ours(var_path, reader.get(name), shape).astype(pdt)

    leaves = []
    for var_path, var in nnx.to_flat_state(abstract):
        if hf_name(var_path) is None:  # adapters and their RNG streams: filled by reset_adapters below
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


def save_pretrained(model: Qwen3VL, path: str | os.PathLike, *, dtype: DType | None = None,
                    max_shard_bytes: int = 4 * 2**30) -> None:
    """Writes config.json + safetensors (sharded with an index when larger than max_shard_bytes), adapters merged.

    Parameters are gathered to this host; `dtype` (default: the parameter dtype) is the saved dtype.
    """
    path = Path(path)
    path.mkdir(parents=True, exist_ok=True)
    cfg: ModelConfig = model.cfg
    saved = dtype or cfg.param_dtype
    out_dtype = np.dtype(ml_dtypes.bfloat16) if saved == "bfloat16" else np.dtype(saved)
    merged = merge_lora(model)
    tensors: dict[str, np.ndarray] = {}
    for var_path, var in nnx.to_flat_state(nnx.state(merged, nnx.Param)):
        name = hf_name(var_path)
        if name is None:
            continue
        w = np.asarray(jax.device_get(var.get_value()))
        per_layer = _layer_paths(var_path, cfg)
        for p, wp in [(var_path, w)] if per_layer is None else zip(per_layer, w):
            tensors[hf_name(p)] = _to_hf(p, wp, cfg).astype(out_dtype)
    shards: list[dict[str, np.ndarray]] = [{}]
    size = 0
    for name, arr in tensors.items():
        if size and size + arr.nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = arr
        size += arr.nbytes
    # files of an earlier save in the other layout would shadow this one
    for stale in [*path.glob("model-*-of-*.safetensors"), path / "model.safetensors",
                  path / "model.safetensors.index.json"]:
        if stale.exists():
            stale.unlink()
    if len(shards) == 1:
        write_safetensors(path / "model.safetensors", shards[0])
    else:
        weight_map = {}
        for i, shard in enumerate(shards):
            fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
            write_safetensors(path / fname, shard)
            weight_map.update({n: fname for n in shard})
        total = sum(a.nbytes for a in tensors.values())
        (path / "model.safetensors.index.json").write_text(
            json.dumps({"metadata": {"total_size": total}, "weight_map": weight_map}, indent=2)
        )
    saved_dtype = "bfloat16" if out_dtype == np.dtype(ml_dtypes.bfloat16) else str(out_dtype)
    (path / "config.json").write_text(json.dumps(cfg.to_hf(torch_dtype=saved_dtype), indent=2))
