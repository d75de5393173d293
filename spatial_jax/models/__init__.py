"""The Qwen3-VL policy in Flax NNX, LoRA, Hugging Face checkpoints in and out, sharding rules.

See spatial_jax/models/qwen3_vl.py for the public API.
"""

from spatial_jax.models.config import LoRAConfig, ModelConfig, TextConfig, VisionConfig
from spatial_jax.models.lora import LoRAParam, disable_adapters, merge_lora
from spatial_jax.models.qwen3_vl import Qwen3VL, create_model
from spatial_jax.models.rope import decode_positions, get_rope_index
from spatial_jax.models.text import KVCache
from spatial_jax.models.vision import VisionInputs, prepare_vision_inputs

__all__ = [
    "KVCache", "LoRAConfig", "LoRAParam", "ModelConfig", "Qwen3VL", "TextConfig", "VisionConfig", "VisionInputs", "create_model",
    "decode_positions", "disable_adapters", "get_rope_index", "merge_lora", "prepare_vision_inputs",
]
