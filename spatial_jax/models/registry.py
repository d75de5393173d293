"""The model registry: every supported architecture, keyed by its checkpoint's `model_type` (HF config.json).

This is the one place an architecture's name is read. An entry says how its config.json maps onto `ModelConfig`
(and back), which vision tower it builds, where its tensors sit in a safetensors checkpoint, and which
transformers class loads what `save_pretrained` writes. Everything else (decoder, rollout, RL, export, plan) reads
only the feature switches of `ModelConfig` (q/k norm, window size, experts, ...), so a new architecture is new
modules plus an entry here.

    qwen3_vl       Qwen3-VL (dense): LayerNorm ViT with learned positions and DeepStack, interleaved M-RoPE.
    qwen2_5_vl     Qwen2.5-VL: RMSNorm ViT with window attention and a gated MLP, merger on the last block only,
                   contiguous M-RoPE with video time positions from tokens_per_second; q/k/v biases, no q/k norm.
    qwen3_vl_moe   Qwen3-VL-MoE (30B-A3B, 235B-A22B): Qwen3-VL with routed experts in its sparse decoder layers.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from spatial_jax.models.config import DType, LoRAConfig, ModelConfig, TextConfig, VisionConfig
from spatial_jax.models.vision import VisionTower
from spatial_jax.models.vision_window import WindowVisionTower


@dataclasses.dataclass(frozen=True)
class Architecture:
    """One registered architecture.

    hf_class: the transformers class (config.json `architectures`); text_prefix / vision_prefix: where the decoder's
    and the tower's tensors sit in its checkpoints (Qwen2.5-VL's released files keep the older `model.` / `visual.`
    layout, which transformers still reads and writes). vision_tower(cfg, rngs=) builds the tower, which returns
    (merged features, DeepStack features). image_processing: the released preprocessor_config.json's values
    (both use transformers' Qwen2VLImageProcessor rules; spatial_jax.data.image_processing.ImageProcessingConfig
    fields): normalisation and the default pixel budget; the resize factor follows the vision config's patch and
    merge sizes (28 for Qwen2.5-VL's 14-pixel patches, 32 for Qwen3-VL's 16). processor_files: the transformers
    classes an export's processor files name (spatial_jax.data.processor_files.write_processor_configs' `classes`):
    the processor, its image processor and its video processor, as AutoProcessor maps the model_type.
    """

    model_type: str
    hf_class: str
    text_prefix: str
    vision_prefix: str
    config_from_hf: Callable[..., ModelConfig]
    config_to_hf: Callable[[ModelConfig, str | None], dict[str, Any]]
    vision_tower: Callable[..., Any]
    image_processing: dict[str, Any]
    processor_files: dict[str, str]


def _rope(t: dict) -> dict:
    rope = dict(t.get("rope_parameters") or t.get("rope_scaling") or {})
    if rope.get("rope_type", rope.get("type", "default")) not in ("default", "mrope"):
        raise ValueError(f"unsupported text rope type {rope.get('rope_type')!r}")
    return rope


def _sections(hf: dict) -> tuple[dict, dict]:
    t = dict(hf.get("text_config") or {})
    v = dict(hf.get("vision_config") or {})
    if not t or not v:
        raise ValueError("config.json needs both text_config and vision_config")
    if t.get("hidden_act", "silu") != "silu":
        raise ValueError(f"unsupported text hidden_act {t.get('hidden_act')!r}")
    return t, v


def _text_kwargs(t: dict, default_theta: float) -> dict:
    rope = _rope(t)
    return dict(
        vocab_size=t["vocab_size"], hidden_size=t["hidden_size"], intermediate_size=t["intermediate_size"],
        num_hidden_layers=t["num_hidden_layers"], num_attention_heads=t["num_attention_heads"],
        num_key_value_heads=t.get("num_key_value_heads") or t["num_attention_heads"],
        head_dim=t.get("head_dim") or t["hidden_size"] // t["num_attention_heads"],
        rope_theta=float(rope.get("rope_theta", t.get("rope_theta", default_theta))),
        mrope_section=tuple(rope.get("mrope_section", (24, 20, 20))),
        rms_norm_eps=float(t.get("rms_norm_eps", 1e-6)), attention_bias=bool(t.get("attention_bias", False)),
        max_position_embeddings=int(t.get("max_position_embeddings", 262144)),
    )


def _vision_kwargs(v: dict) -> dict:
    return dict(
        depth=v["depth"], hidden_size=v["hidden_size"], intermediate_size=v["intermediate_size"],
        num_heads=v["num_heads"], in_channels=v.get("in_channels", 3), patch_size=v["patch_size"],
        temporal_patch_size=v.get("temporal_patch_size", 2), spatial_merge_size=v.get("spatial_merge_size", 2),
        out_hidden_size=v["out_hidden_size"],
        rope_theta=float(dict(v.get("rope_parameters") or {}).get("rope_theta", 10000.0)),
    )


def _model_config(model_type: str, hf: dict, text: TextConfig, vision: VisionConfig, t: dict, *, lora: LoRAConfig,
                  dtype: DType, param_dtype: DType | None) -> ModelConfig:
    tie = hf.get("tie_word_embeddings", t.get("tie_word_embeddings", False))
    defaults = ModelConfig()
    return ModelConfig(
        model_type=model_type, text=text, vision=vision, lora=lora, tie_word_embeddings=bool(tie),
        image_token_id=hf.get("image_token_id", defaults.image_token_id),
        video_token_id=hf.get("video_token_id", defaults.video_token_id),
        vision_start_token_id=hf.get("vision_start_token_id", defaults.vision_start_token_id),
        vision_end_token_id=hf.get("vision_end_token_id", defaults.vision_end_token_id),
        dtype=dtype, param_dtype=param_dtype or dtype,
    )


def _common_hf(cfg: ModelConfig, arch: Architecture, torch_dtype: str | None) -> dict[str, Any]:
    return {
        "architectures": [arch.hf_class], "model_type": arch.model_type, "dtype": torch_dtype or cfg.param_dtype,
        "image_token_id": cfg.image_token_id, "video_token_id": cfg.video_token_id,
        "vision_start_token_id": cfg.vision_start_token_id, "vision_end_token_id": cfg.vision_end_token_id,
        "tie_word_embeddings": cfg.tie_word_embeddings,
    }


def _text_hf(cfg: ModelConfig) -> dict[str, Any]:
    t = cfg.text
    return {
        "vocab_size": t.vocab_size, "hidden_size": t.hidden_size, "intermediate_size": t.intermediate_size,
        "num_hidden_layers": t.num_hidden_layers, "num_attention_heads": t.num_attention_heads,
        "num_key_value_heads": t.num_key_value_heads, "head_dim": t.head_dim, "hidden_act": "silu",
        "rms_norm_eps": t.rms_norm_eps, "attention_dropout": 0.0,
        "max_position_embeddings": t.max_position_embeddings, "tie_word_embeddings": cfg.tie_word_embeddings,
        "rope_parameters": {"rope_type": "default", "rope_theta": t.rope_theta,
                            "mrope_section": list(t.mrope_section), "mrope_interleaved": t.mrope_interleaved},
    }


def _vision_hf(cfg: ModelConfig) -> dict[str, Any]:
    v = cfg.vision
    return {
        "depth": v.depth, "hidden_size": v.hidden_size, "intermediate_size": v.intermediate_size,
        "num_heads": v.num_heads, "in_channels": v.in_channels, "patch_size": v.patch_size,
        "temporal_patch_size": v.temporal_patch_size, "spatial_merge_size": v.spatial_merge_size,
        "out_hidden_size": v.out_hidden_size, "hidden_act": v.hidden_act,
        "rope_parameters": {"rope_type": "axial", "rope_theta": v.rope_theta},
    }


# ---------------------------------------------------------------- Qwen3-VL and Qwen3-VL-MoE


def _qwen3_vision(v: dict) -> VisionConfig:
    return VisionConfig(**_vision_kwargs(v), num_position_embeddings=v["num_position_embeddings"],
                        deepstack_visual_indexes=tuple(v.get("deepstack_visual_indexes", ())),
                        hidden_act=v.get("hidden_act", "gelu_pytorch_tanh"))


def _qwen3_from_hf(hf: dict, **kw) -> ModelConfig:
    t, v = _sections(hf)
    return _model_config("qwen3_vl", hf, TextConfig(**_text_kwargs(t, 5_000_000.0)), _qwen3_vision(v), t, **kw)


def _qwen3_moe_from_hf(hf: dict, **kw) -> ModelConfig:
    t, v = _sections(hf)
    text = TextConfig(
        **_text_kwargs(t, 5_000_000.0),
        num_experts=int(t.get("num_experts", t.get("num_local_experts", 0))),
        num_experts_per_tok=int(t["num_experts_per_tok"]), moe_intermediate_size=int(t["moe_intermediate_size"]),
        decoder_sparse_step=int(t.get("decoder_sparse_step", 1)),
        mlp_only_layers=tuple(t.get("mlp_only_layers") or ()),
        router_aux_loss_coef=float(t.get("router_aux_loss_coef", 0.001)),
    )
    return _model_config("qwen3_vl_moe", hf, text, _qwen3_vision(v), t, **kw)


def _qwen3_to_hf(cfg: ModelConfig, torch_dtype: str | None) -> dict[str, Any]:
    arch = architecture(cfg.model_type)
    t, v = cfg.text, cfg.vision
    text = {"model_type": f"{arch.model_type}_text", **_text_hf(cfg), "attention_bias": t.attention_bias}
    if t.num_experts:
        text.update(num_experts=t.num_experts, num_experts_per_tok=t.num_experts_per_tok,
                    moe_intermediate_size=t.moe_intermediate_size, decoder_sparse_step=t.decoder_sparse_step,
                    mlp_only_layers=list(t.mlp_only_layers), router_aux_loss_coef=t.router_aux_loss_coef)
    vision = {"model_type": f"{arch.model_type}_vision", **_vision_hf(cfg),
              "num_position_embeddings": v.num_position_embeddings,
              "deepstack_visual_indexes": list(v.deepstack_visual_indexes)}
    out = {**_common_hf(cfg, arch, torch_dtype), "text_config": text, "vision_config": vision}
    if t.num_experts:
        # the expert stacks are written in transformers 5's layout (hf_io._to_hf): say so, for square ones
        out["transformers_version"] = "5.0.0"
    return out


# ---------------------------------------------------------------- Qwen2.5-VL


def _qwen2_5_from_hf(hf: dict, **kw) -> ModelConfig:
    t, v = _sections(hf)
    text = TextConfig(**_text_kwargs(t, 1_000_000.0), qkv_bias=True, qk_norm=False, mrope_interleaved=False)
    vision = VisionConfig(**_vision_kwargs(v), deepstack_visual_indexes=(), hidden_act=v.get("hidden_act", "silu"),
                          window_size=int(v.get("window_size", 112)),
                          fullatt_block_indexes=tuple(v.get("fullatt_block_indexes") or ()),
                          tokens_per_second=float(v.get("tokens_per_second", 4)))
    return _model_config("qwen2_5_vl", hf, text, vision, t, **kw)


def _qwen2_5_to_hf(cfg: ModelConfig, torch_dtype: str | None) -> dict[str, Any]:
    v = cfg.vision
    text = {"model_type": "qwen2_5_vl_text", **_text_hf(cfg)}
    del text["rope_parameters"]["mrope_interleaved"]  # not a Qwen2.5-VL key: its sections are contiguous
    tps = int(v.tokens_per_second) if float(v.tokens_per_second).is_integer() else v.tokens_per_second
    vision = {"model_type": "qwen2_5_vl_vision", **_vision_hf(cfg), "window_size": v.window_size,
              "fullatt_block_indexes": list(v.fullatt_block_indexes), "tokens_per_second": tps}
    return {**_common_hf(cfg, ARCHITECTURES["qwen2_5_vl"], torch_dtype), "text_config": text,
            "vision_config": vision}


QWEN3_IMAGES = dict(image_mean=(0.5, 0.5, 0.5), image_std=(0.5, 0.5, 0.5), min_pixels=65536, max_pixels=16777216)
QWEN2_5_IMAGES = dict(image_mean=(0.48145466, 0.4578275, 0.40821073), image_std=(0.26862954, 0.26130258, 0.27577711),
                      min_pixels=3136, max_pixels=12845056)

# Qwen3-VL-MoE's processor is Qwen3-VL's (transformers' processing_auto / video_processing_auto); Qwen2.5-VL's video
# processor is Qwen2-VL's (2-frame temporal patches, no timestamps)
QWEN3_PROCESSORS = dict(processor_class="Qwen3VLProcessor", image_processor_type="Qwen2VLImageProcessor",
                        video_processor_type="Qwen3VLVideoProcessor")
QWEN2_5_PROCESSORS = dict(processor_class="Qwen2_5_VLProcessor", image_processor_type="Qwen2VLImageProcessor",
                          video_processor_type="Qwen2VLVideoProcessor")

ARCHITECTURES: dict[str, Architecture] = {
    a.model_type: a for a in (
        Architecture("qwen3_vl", "Qwen3VLForConditionalGeneration", "model.language_model.", "model.visual.",
                     _qwen3_from_hf, _qwen3_to_hf, VisionTower, QWEN3_IMAGES, QWEN3_PROCESSORS),
        Architecture("qwen3_vl_moe", "Qwen3VLMoeForConditionalGeneration", "model.language_model.", "model.visual.",
                     _qwen3_moe_from_hf, _qwen3_to_hf, VisionTower, QWEN3_IMAGES, QWEN3_PROCESSORS),
        Architecture("qwen2_5_vl", "Qwen2_5_VLForConditionalGeneration", "model.", "visual.",
                     _qwen2_5_from_hf, _qwen2_5_to_hf, WindowVisionTower, QWEN2_5_IMAGES, QWEN2_5_PROCESSORS),
    )
}


def architecture(model_type: str) -> Architecture:
    if model_type not in ARCHITECTURES:
        raise ValueError(f"unsupported model_type {model_type!r}; supported: {sorted(ARCHITECTURES)}")
    return ARCHITECTURES[model_type]


def config_from_hf(hf: dict[str, Any], *, lora: LoRAConfig = LoRAConfig(), dtype: DType = "float32",
                   param_dtype: DType | None = None) -> ModelConfig:
    """ModelConfig of a config.json dict (`rope_parameters` or legacy `rope_scaling`); no model_type: Qwen3-VL."""
    return architecture(hf.get("model_type") or "qwen3_vl").config_from_hf(
        hf, lora=lora, dtype=dtype, param_dtype=param_dtype)


def config_to_hf(cfg: ModelConfig, torch_dtype: str | None = None) -> dict[str, Any]:
    """A `config.json` dict that transformers reads back to the same architecture."""
    return architecture(cfg.model_type).config_to_hf(cfg, torch_dtype)
