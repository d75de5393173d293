"""The policy and a step's inputs as the plan compiles them: abstract (no weights), at the recipe's shapes, placed on
the mesh as the trainer places them; the architectures a recipe can be planned for without its checkpoint."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from spatial_jax.config import ConfigError
from spatial_jax.data.image_processing import smart_resize
from spatial_jax.data.tokenizer import build_tokenizer
from spatial_jax.models import ModelConfig, Qwen3VL, load_config
from spatial_jax.models.registry import config_from_hf
from spatial_jax.models.sharding import logical_to_spec, variable_names
from spatial_jax.rl import step as st
from spatial_jax.rl.config import TrainConfig
from spatial_jax.rl.policy import image_config, trainable_filter
from spatial_jax.rollout.multiturn import required_cache_len

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


def model_config(cfg: TrainConfig) -> ModelConfig:
    """The policy's architecture: the checkpoint's config.json when it is here, else `plan.model`, else (no
    checkpoint) the tiny random policy; with the run's adapters, dtypes and memory settings."""
    pc = cfg.policy
    if pc.checkpoint and (Path(pc.checkpoint) / "config.json").is_file():
        mc = load_config(pc.checkpoint)
    elif cfg.plan.model:
        mc = config_from_hf(ARCHITECTURES[cfg.plan.model])
    elif not pc.checkpoint:
        tok = build_tokenizer(pc.tokenizer_vocab_size)
        mc = ModelConfig.tiny(tok.vocab_size, **tok.model_token_ids())
    else:
        raise ConfigError(f"policy.checkpoint {pc.checkpoint!r} has no config.json here: set plan.model to one of "
                          f"{sorted(ARCHITECTURES)} to plan without it")
    return mc.replace(lora=pc.lora, dtype=pc.dtype, param_dtype=pc.param_dtype, remat=pc.remat,
                      remat_policy=pc.remat_policy, scan_layers=pc.scan_layers, attention_chunk=pc.attention_chunk,
                      moe_matmul=pc.moe_matmul)


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


def _ints(mesh, n: int, dtype=jnp.int32):
    return jax.ShapeDtypeStruct((n,), dtype, sharding=NamedSharding(mesh, P()))


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
