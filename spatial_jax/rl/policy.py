"""The policy a run trains: tokenizer, Qwen3-VL model placed on the mesh, image processor, trainable subset.

The trainer works functionally on `nnx.split(model, trainable, ...)`: jitted steps take (trainable, frozen) states,
so only the trainable state is differentiated, optimised and checkpointed (the frozen base is rebuilt from the seed
or the Hugging Face checkpoint on resume).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import jax
import optax
from flax import nnx

from spatial_jax.config import ConfigError
from spatial_jax.data.image_processing import ImageProcessingConfig
from spatial_jax.data.tokenizer import SpatialTokenizer, build_tokenizer
from spatial_jax.models import LoRAParam, ModelConfig, Qwen3VL
from spatial_jax.models.hf_io import from_pretrained, load_config
from spatial_jax.models.registry import architecture
from spatial_jax.models.sharding import make_mesh, shard_model
from spatial_jax.rl.config import MeshConfig, PolicyConfig


@dataclasses.dataclass
class Policy:
    model: Qwen3VL
    tokenizer: SpatialTokenizer
    image_cfg: ImageProcessingConfig
    mesh: jax.sharding.Mesh
    trainable: nnx.filterlib.Filter


def trainable_filter(cfg: PolicyConfig) -> nnx.filterlib.Filter:
    """Adapters when LoRA is on, else every weight; the vision tower only when train_vision."""
    base = LoRAParam if (cfg.lora.rank > 0 or cfg.lora.vision_rank > 0) else nnx.Param
    if cfg.train_vision:
        return base
    return nnx.All(base, nnx.Not(nnx.PathContains("visual")))


def freeze_vision(tx: optax.GradientTransformation, trainable: nnx.State) -> optax.GradientTransformation:
    """`tx` on the trainable weights outside the vision tower; the tower's get a zero update and no optimiser
    state (they stay bit-identical, and its gradients count in no clipping norm)."""
    labels = jax.tree_util.tree_map_with_path(
        lambda path, _: "frozen" if any(getattr(k, "key", None) == "visual" for k in path) else "train", trainable)
    return optax.multi_transform({"train": tx, "frozen": optax.set_to_zero()}, labels)


def image_config(model_cfg: ModelConfig, cfg: PolicyConfig) -> ImageProcessingConfig:
    """The model's image processor: its patch layout, its architecture's normalisation and pixel budget (the
    registry's), the policy's min / max pixels when set, and its video timing (second_per_grid where the vision
    config spaces video time positions by tokens_per_second)."""
    default = architecture(model_cfg.model_type).image_processing
    return ImageProcessingConfig(
        patch_size=model_cfg.vision.patch_size,
        temporal_patch_size=model_cfg.vision.temporal_patch_size,
        merge_size=model_cfg.vision.spatial_merge_size,
        min_pixels=cfg.min_pixels or default["min_pixels"],
        max_pixels=cfg.max_pixels or default["max_pixels"],
        image_mean=default["image_mean"],
        image_std=default["image_std"],
        video_timing="second_per_grid" if model_cfg.vision.tokens_per_second > 0 else "timestamps",
    )


def build_mesh(cfg: MeshConfig) -> jax.sharding.Mesh:
    return make_mesh(cfg.data, cfg.fsdp, cfg.tensor, devices=jax.devices()[: cfg.size])


def _tiny_config(cfg: PolicyConfig, tokenizer: SpatialTokenizer) -> ModelConfig:
    return ModelConfig.tiny(
        tokenizer.vocab_size, **tokenizer.model_token_ids(), lora=cfg.lora, num_hidden_layers=cfg.tiny_layers,
        hidden_size=cfg.tiny_width, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
    ).replace(remat=cfg.remat, remat_policy=cfg.remat_policy, scan_layers=cfg.scan_layers,
              attention_chunk=cfg.attention_chunk, attention_impl=cfg.attention_impl, moe_matmul=cfg.moe_matmul)


def checkpoint_dir(cfg: PolicyConfig) -> Path:
    """policy.checkpoint as a folder holding config.json: anything else is refused here, since transformers would
    take the name for a Hub repository and retry the network for minutes before failing."""
    path = Path(cfg.checkpoint)
    if not (path / "config.json").is_file():
        where = "" if path.is_absolute() else f"; a relative path is read from {Path.cwd()}"
        raise ConfigError(f"policy.checkpoint {cfg.checkpoint!r} is not a checkpoint folder (no config.json"
                          f"{' in it' if path.is_dir() else ', no such folder'}{where})")
    return path


def policy_encoding(cfg: PolicyConfig) -> tuple[SpatialTokenizer, ImageProcessingConfig]:
    """The tokenizer and image settings the policy's batches are encoded with, read without building the model (a
    checkpoint's config.json, or the tiny policy's), so that every row can be checked before anything compiles."""
    if cfg.checkpoint:
        tokenizer = SpatialTokenizer.load(checkpoint_dir(cfg))
        return tokenizer, image_config(load_config(cfg.checkpoint), cfg)
    tokenizer = build_tokenizer(cfg.tokenizer_vocab_size)
    return tokenizer, image_config(_tiny_config(cfg, tokenizer), cfg)


def build_policy(cfg: PolicyConfig, mesh: jax.sharding.Mesh) -> Policy:
    """A Hugging Face checkpoint (its own tokenizer) or the tiny random policy with the local tokenizer."""
    if cfg.checkpoint:
        path = checkpoint_dir(cfg)
        tokenizer = SpatialTokenizer.load(path)
        model = from_pretrained(path, dtype=cfg.dtype, param_dtype=cfg.param_dtype, mesh=mesh, lora=cfg.lora,
                                remat=cfg.remat, remat_policy=cfg.remat_policy, scan_layers=cfg.scan_layers,
                                attention_chunk=cfg.attention_chunk, attention_impl=cfg.attention_impl,
                                moe_matmul=cfg.moe_matmul)
    else:
        tokenizer = build_tokenizer(cfg.tokenizer_vocab_size)
        model = shard_model(Qwen3VL(_tiny_config(cfg, tokenizer), rngs=nnx.Rngs(cfg.init_seed)), mesh)
    return Policy(model, tokenizer, image_config(model.cfg, cfg), mesh, trainable_filter(cfg))
