"""The policy in Flax NNX (Qwen3-VL, Qwen2.5-VL, Qwen3-VL-MoE: spatial_jax/models/registry.py), LoRA, Hugging Face
checkpoints in and out, sharding rules.

See spatial_jax/models/qwen3_vl.py for the public API; `from_pretrained` / `save_pretrained` mirror transformers'.
"""

from spatial_jax.models.config import LoRAConfig, ModelConfig, TextConfig, VisionConfig
from spatial_jax.models.hf_io import from_pretrained, load_config, save_pretrained
from spatial_jax.models.lora import LoRAParam, disable_adapters, merge_lora
from spatial_jax.models.qwen3_vl import Qwen3VL, create_model, rope_index
from spatial_jax.models.rope import decode_positions, get_rope_index
from spatial_jax.models.text import KVCache
from spatial_jax.models.vision import VisionInputs, prepare_vision_inputs

__all__ = [
    "KVCache", "LoRAConfig", "LoRAParam", "ModelConfig", "Qwen3VL", "TextConfig", "VisionConfig", "VisionInputs",
    "create_model",
    "decode_positions", "disable_adapters", "from_pretrained", "get_rope_index", "load_config", "merge_lora",
    "prepare_vision_inputs", "rope_index", "save_pretrained",
]
