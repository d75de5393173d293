"""Export benchmark: save_pretrained streamed tensor by tensor vs the whole-model gather it replaced, one process.

    python benchmarks/training/export.py [--hidden 512] [--layers 8] [--vocab 16384] [--devices 8]

A random policy with LoRA adapters in both towers, FSDP-sharded over `--devices` host CPU devices, is written as a
Hugging Face checkpoint twice: by `save_pretrained` (adapters merged per layer on the device, one tensor at a time
on the host) and by the previous method (merge_lora on a clone of the model, every tensor brought to the host into
one dict, then written). Peak host memory is numpy's allocations traced by tracemalloc (device buffers are not
counted: on a GPU or TPU they are not host memory); time is wall clock, warm (each method run twice, the second
timed). Both outputs are checked equal. Writes benchmarks/out/export.json and prints a table.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import tempfile
import time
import tracemalloc
from pathlib import Path

from spatial_jax.cli.script_guard import check_counts, check_own_output, write_own
from spatial_jax.config import ConfigError

OUT = Path(__file__).resolve().parents[1] / "out" / "export.json"
OWNER = Path(__file__).name


def whole_model_save(model, path) -> None:
    """The previous save: a merged clone, then every tensor on the host at once, then one write."""
    import jax
    import numpy as np
    from flax import nnx

    from spatial_jax.models.hf_io import _layer_paths, _to_hf, hf_name, write_safetensors
    from spatial_jax.models.lora import merge_lora

    merged = merge_lora(model)
    tensors = {}
    for var_path, var in nnx.to_flat_state(nnx.state(merged, nnx.Param)):
        if hf_name(var_path) is None:
            continue
        w = np.asarray(jax.device_get(var.get_value()))
        per_layer = _layer_paths(var_path, model.cfg)
        for p, wp in [(var_path, w)] if per_layer is None else zip(per_layer, w):
            tensors[hf_name(p)] = _to_hf(p, wp, model.cfg)
    Path(path).mkdir(parents=True, exist_ok=True)
    write_safetensors(Path(path) / "model.safetensors", tensors)


def measure(fn) -> tuple[float, float]:
    """(seconds, peak traced host MiB) of the second of two calls."""
    fn()
    tracemalloc.start()
    t0 = time.perf_counter()
    fn()
    seconds = time.perf_counter() - t0
    peak = tracemalloc.get_traced_memory()[1] / 2**20
    tracemalloc.stop()
    return seconds, peak


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hidden", type=int, default=512)
    ap.add_argument("--layers", type=int, default=8)
    ap.add_argument("--vocab", type=int, default=16384)
    ap.add_argument("--devices", type=int, default=8)
    args = ap.parse_args(argv)
    try:
        check_counts({"--hidden": (args.hidden, 64, 2**16), "--layers": (args.layers, 1, 1024),
                      "--vocab": (args.vocab, 16, 2**20), "--devices": (args.devices, 1, 1024)})
        check_own_output(OUT, "the output", OWNER)
    except ConfigError as e:
        ap.error(str(e))
    os.environ["XLA_FLAGS"] = f"--xla_force_host_platform_device_count={args.devices}"
    os.environ.setdefault("JAX_PLATFORMS", "cpu")
    import numpy as np
    from flax import nnx

    from spatial_jax.models import LoRAConfig, ModelConfig, create_model
    from spatial_jax.models.hf_io import _CheckpointReader, save_pretrained
    from spatial_jax.models.sharding import make_mesh

    tiny = ModelConfig.tiny(args.vocab, tie_word_embeddings=False, lora=LoRAConfig(rank=8, vision_rank=4))
    text = dataclasses.replace(tiny.text, hidden_size=args.hidden, intermediate_size=3 * args.hidden,
                               num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64, head_dim=64,
                               mrope_section=(16, 8, 8))
    cfg = dataclasses.replace(tiny, text=text, vision=dataclasses.replace(tiny.vision, out_hidden_size=args.hidden))
    model = create_model(cfg, mesh=make_mesh(1, args.devices))
    params = sum(int(np.prod(v.get_value().shape)) for _, v in nnx.to_flat_state(nnx.state(model, nnx.Param)))
    with tempfile.TemporaryDirectory() as tmp:
        streamed = measure(lambda: save_pretrained(model, Path(tmp) / "streamed"))
        whole = measure(lambda: whole_model_save(model, Path(tmp) / "whole"))
        a, b = _CheckpointReader(Path(tmp) / "streamed"), _CheckpointReader(Path(tmp) / "whole")
        assert a.names() == b.names() and all(np.array_equal(a.get(n), b.get(n)) for n in a.names())
        largest = max(int(np.prod(a.get(n).shape)) * 4 for n in a.names()) / 2**20
    row = {"params_M": params / 1e6, "float32_MiB": params * 4 / 2**20, "largest_tensor_MiB": largest,
           "devices": args.devices, "streamed_s": streamed[0], "streamed_peak_MiB": streamed[1],
           "whole_s": whole[0], "whole_peak_MiB": whole[1], "peak_ratio": whole[1] / max(streamed[1], 1e-9),
           "time_ratio": streamed[0] / whole[0]}
    write_own(OUT, row, OWNER, "the output")
    for k, v in row.items():
        print(f"{k:>20}: {v:.3f}" if isinstance(v, float) else f"{k:>20}: {v}")


if __name__ == "__main__":
    main()
