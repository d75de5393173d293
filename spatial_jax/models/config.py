"""Typed configuration of the Qwen3-VL policy, read from and written to a Hugging Face `config.json` dict.

The dataclasses are frozen and hold only hashable values (tuples, not lists), because NNX keeps the config as a
static attribute of the model and jit caches compiled code on it.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from spatial_jax.config import check_at_least, check_non_negative, check_positive, check_range, require

DType = Literal["float32", "bfloat16", "float16"]
# What a rematerialised layer keeps for the backward pass (spatial_jax.models.scan.REMAT_POLICIES): nothing ("full"),
# every matmul output ("dots"), or the matmuls without batch dimensions, i.e. the projections but not attention
# scores ("dots_no_batch"). "none" saves every activation (no recomputation).
RematPolicy = Literal["none", "full", "dots", "dots_no_batch"]
REMAT_POLICY_NAMES = ("none", "full", "dots", "dots_no_batch")
# Attention kernels (spatial_jax.models.attention): "auto" = splash on TPU, cuDNN on GPU (16-bit), XLA otherwise.
AttentionImpl = Literal["auto", "xla", "splash", "cudnn", "pallas"]
ATTENTION_IMPLS = ("auto", "xla", "splash", "cudnn", "pallas")
# The MoE experts' grouped matmul (spatial_jax.kernels.grouped_matmul): XLA's ragged_dot, or jax's Pallas TPU kernel
# megablox (off TPU in the Pallas interpreter, for tests). ragged_dot is the default because it runs on every backend
# and is the path held to transformers; no TPU here has timed the two, so neither is claimed faster.
MoeMatmul = Literal["ragged_dot", "megablox"]
MOE_MATMULS = ("ragged_dot", "megablox")
# Patches per frame slot of the vision tower: a frame is padded to the smallest bucket that holds it, so a new image
# size reuses a compiled shape (beyond the last bucket: the next multiple of it).
VISION_BUCKETS = (64, 256, 1024, 4096, 16384)

LORA_TEXT_TARGETS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# the vision MLP's projections are linear_fc1/2 in Qwen3-VL's tower and gate/up/down_proj in Qwen2.5-VL's; the
# default names Qwen3-VL's, as every run before Qwen2.5-VL recorded it (a Qwen2.5-VL run adds its MLP's names)
LORA_VISION_TARGETS = ("qkv", "proj", "linear_fc1", "linear_fc2", "gate_proj", "up_proj", "down_proj")
LORA_VISION_DEFAULT = ("qkv", "proj", "linear_fc1", "linear_fc2")
# LoRA on the experts of a MoE layer: their fused gate/up and down projections (spatial_jax.models.moe)
LORA_EXPERT_TARGETS = ("experts_gate_up", "experts_down")


@dataclasses.dataclass(frozen=True)
class TextConfig:
    """The decoder (HF `text_config`): Qwen3 by default; Qwen2.5-VL's has q/k/v biases, no q/k norm and contiguous
    M-RoPE sections; Qwen3-VL-MoE's replaces the MLP of its sparse layers by `num_experts` routed experts."""

    vocab_size: int = 151936
    hidden_size: int = 4096
    intermediate_size: int = 12288
    num_hidden_layers: int = 36
    num_attention_heads: int = 32
    num_key_value_heads: int = 8
    head_dim: int = 128
    rope_theta: float = 5_000_000.0
    mrope_section: tuple[int, int, int] = (24, 20, 20)
    rms_norm_eps: float = 1e-6
    attention_bias: bool = False
    max_position_embeddings: int = 262144
    # Qwen2.5-VL: biases on q/k/v only (attention_bias puts them on all four projections), no per-head q/k RMSNorm,
    # and the rotary frequencies split into contiguous (t, h, w) runs instead of Qwen3-VL's interleaving.
    qkv_bias: bool = False
    qk_norm: bool = True
    mrope_interleaved: bool = True
    # Mixture of experts (0 experts: every layer dense). Layer i is sparse when i is not in mlp_only_layers and
    # (i + 1) % decoder_sparse_step == 0 (HF Qwen3VLMoeTextDecoderLayer). router_aux_loss_coef scales the
    # load-balancing loss (Switch Transformer eq. 4) when a trainer asks for it.
    num_experts: int = 0
    num_experts_per_tok: int = 0
    moe_intermediate_size: int = 0
    decoder_sparse_step: int = 1
    mlp_only_layers: tuple[int, ...] = ()
    router_aux_loss_coef: float = 0.0

    def is_sparse(self, layer: int) -> bool:
        """Whether decoder layer `layer` holds routed experts instead of the dense MLP."""
        return (self.num_experts > 0 and layer not in self.mlp_only_layers
                and (layer + 1) % self.decoder_sparse_step == 0)

    def __post_init__(self):
        check_non_negative(self, "num_experts", "num_experts_per_tok", "moe_intermediate_size",
                           "router_aux_loss_coef")
        if self.num_experts:
            check_at_least(self, num_experts_per_tok=1, moe_intermediate_size=1, decoder_sparse_step=1)
            require("num_experts_per_tok", self.num_experts_per_tok, self.num_experts_per_tok <= self.num_experts,
                    f"be at most num_experts={self.num_experts}")
        check_at_least(self, vocab_size=1, hidden_size=1, intermediate_size=1, num_hidden_layers=1,
                       num_attention_heads=1, num_key_value_heads=1, head_dim=1, max_position_embeddings=1)
        check_positive(self, "rope_theta", "rms_norm_eps")
        require("num_key_value_heads", self.num_key_value_heads,
                self.num_attention_heads % self.num_key_value_heads == 0,
                f"divide num_attention_heads={self.num_attention_heads}")
        require("head_dim", self.head_dim, self.head_dim % 2 == 0, "be even for rotary embeddings")
        require("mrope_section", self.mrope_section,
                len(self.mrope_section) == 3 and sum(self.mrope_section) == self.head_dim // 2,
                f"have 3 entries summing to head_dim/2 = {self.head_dim // 2}")


@dataclasses.dataclass(frozen=True)
class VisionConfig:
    """The ViT tower with patch merger and DeepStack mergers (HF `vision_config`)."""

    depth: int = 27
    hidden_size: int = 1152
    intermediate_size: int = 4304
    num_heads: int = 16
    in_channels: int = 3
    patch_size: int = 16
    temporal_patch_size: int = 2
    spatial_merge_size: int = 2
    out_hidden_size: int = 4096
    num_position_embeddings: int = 2304
    deepstack_visual_indexes: tuple[int, ...] = (8, 16, 24)
    rope_theta: float = 10000.0
    hidden_act: Literal["gelu_pytorch_tanh", "gelu", "silu"] = "gelu_pytorch_tanh"
    # Qwen2.5-VL's windowed tower: blocks not in fullatt_block_indexes attend within windows of window_size pixels
    # (0: every block attends over the whole frame); tokens_per_second spaces a video's temporal positions.
    window_size: int = 0
    fullatt_block_indexes: tuple[int, ...] = ()
    tokens_per_second: float = 0.0

    @property
    def merge_window(self) -> int:
        """A window's side in merged tokens (HF vit_merger_window_size); 0 without windows."""
        return self.window_size // self.spatial_merge_size // self.patch_size

    def __post_init__(self):
        check_non_negative(self, "window_size", "tokens_per_second")
        if self.window_size:
            require("window_size", self.window_size, self.merge_window >= 1,
                    f"be at least spatial_merge_size * patch_size = {self.spatial_merge_size * self.patch_size}")
        require("fullatt_block_indexes", self.fullatt_block_indexes,
                all(0 <= i < self.depth for i in self.fullatt_block_indexes), f"lie in [0, depth={self.depth})")
        check_at_least(self, depth=1, hidden_size=1, intermediate_size=1, num_heads=1, in_channels=1, patch_size=1,
                       temporal_patch_size=1, spatial_merge_size=1, out_hidden_size=1, num_position_embeddings=1)
        check_positive(self, "rope_theta")
        require("num_heads", self.num_heads, self.hidden_size % self.num_heads == 0,
                f"divide hidden_size={self.hidden_size}")
        require("num_heads", self.num_heads, (self.hidden_size // self.num_heads) % 4 == 0,
                "leave a head_dim divisible by 4 (2D rotary over h and w)")
        side = int(round(self.num_position_embeddings**0.5))
        require("num_position_embeddings", self.num_position_embeddings,
                side * side == self.num_position_embeddings, "be a square")
        require("deepstack_visual_indexes", self.deepstack_visual_indexes,
                all(0 <= i < self.depth for i in self.deepstack_visual_indexes), f"lie in [0, depth={self.depth})")

    @property
    def patch_dim(self) -> int:
        """Length of one flattened patch row of `pixel_values` (C * tp * ps * ps, HF layout)."""
        return self.in_channels * self.temporal_patch_size * self.patch_size * self.patch_size


@dataclasses.dataclass(frozen=True)
class LoRAConfig:
    """Low-rank adapters; rank 0 disables them (SpatialCORE Table 4: r=32, alpha=64, dropout 0.05; vision 4/8)."""

    rank: int = 0
    alpha: float = 64.0
    dropout: float = 0.05
    targets: tuple[str, ...] = LORA_TEXT_TARGETS
    vision_rank: int = 0
    vision_alpha: float = 8.0
    vision_targets: tuple[str, ...] = LORA_VISION_DEFAULT

    def __post_init__(self):
        check_non_negative(self, "rank", "vision_rank")  # 0: no adapters
        check_positive(self, "alpha", "vision_alpha")
        check_range(self, "dropout", 0.0, 1.0, high_open=True)
        for name, known in (("targets", LORA_TEXT_TARGETS + LORA_EXPERT_TARGETS),
                            ("vision_targets", LORA_VISION_TARGETS)):
            unknown = sorted(set(getattr(self, name)) - set(known))
            require(name, getattr(self, name), not unknown, f"name only layers of {known} (unknown: {unknown})")

    def layer_kwargs(self, name: str, vision: bool = False) -> dict:
        """LoRALinear adapter arguments for the projection `name` of the text (or vision) tower; {} = no adapter."""
        rank, alpha, targets = ((self.vision_rank, self.vision_alpha, self.vision_targets) if vision
                                else (self.rank, self.alpha, self.targets))
        return dict(rank=rank, alpha=alpha, dropout=self.dropout) if rank > 0 and name in targets else {}

    @classmethod
    def spatialcore(cls, vision: bool = True) -> LoRAConfig:
        """The paper's adapters (SpatialCORE Table 4)."""
        return cls(rank=32, alpha=64.0, dropout=0.05, vision_rank=4 if vision else 0, vision_alpha=8.0)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    """Whole policy: decoder, vision tower, special tokens, adapters and dtypes. `model_type` is the checkpoint's
    (HF config.json), the key of spatial_jax.models.registry, which alone tells architectures apart."""

    model_type: str = "qwen3_vl"
    text: TextConfig = TextConfig()
    vision: VisionConfig = VisionConfig()
    lora: LoRAConfig = LoRAConfig()
    image_token_id: int = 151655
    video_token_id: int = 151656
    vision_start_token_id: int = 151652
    vision_end_token_id: int = 151653
    tie_word_embeddings: bool = False
    dtype: DType = "float32"
    param_dtype: DType = "float32"
    # Memory knobs for long sequences (no effect on results): recompute each decoder layer in the backward pass
    # (`remat=True` is `remat_policy="full"`; any other remat_policy than "none" wins over it), and process queries
    # in blocks of this many tokens (0 = all at once) so attention scores stay [B, H, block, S].
    remat: bool = False
    remat_policy: RematPolicy = "none"
    attention_chunk: int = 1024
    # Compile-time knob (no effect on results): decoder layers and vision blocks keep their parameters stacked on a
    # leading "layers" axis and run under lax.scan, so compile time barely grows with depth.
    scan_layers: bool = False
    # Which attention implementation runs (results equal to float rounding; the KV-cache calls always use XLA).
    attention_impl: AttentionImpl = "auto"
    # Which grouped matmul runs the MoE experts (MOE_MATMULS; results equal to float rounding).
    moe_matmul: MoeMatmul = "ragged_dot"
    # Sorted patch counts per frame slot of the vision tower (VISION_BUCKETS); each a multiple of merge**2.
    vision_buckets: tuple[int, ...] = VISION_BUCKETS

    def __post_init__(self):
        check_non_negative(self, "attention_chunk")
        require("attention_impl", self.attention_impl, self.attention_impl in ATTENTION_IMPLS,
                f"be one of {ATTENTION_IMPLS}")
        require("moe_matmul", self.moe_matmul, self.moe_matmul in MOE_MATMULS, f"be one of {MOE_MATMULS}")
        m2 = self.vision.spatial_merge_size**2
        buckets = self.vision_buckets
        require("vision_buckets", buckets, len(buckets) > 0 and list(buckets) == sorted(set(buckets))
                and all(isinstance(b, int) and b > 0 and b % m2 == 0 for b in buckets),
                f"be a non-empty increasing tuple of positive multiples of spatial_merge_size**2 = {m2}")
        sparse = {self.text.is_sparse(i) for i in range(self.text.num_hidden_layers)}
        require("scan_layers", self.scan_layers, not (self.scan_layers and len(sparse) > 1),
                "be false when dense and MoE decoder layers mix (a scan stacks layers of one structure)")
        require("remat_policy", self.remat_policy, self.remat_policy in REMAT_POLICY_NAMES,
                f"be one of {REMAT_POLICY_NAMES}")
        require("vision.out_hidden_size", self.vision.out_hidden_size,
                self.vision.out_hidden_size == self.text.hidden_size,
                f"equal text.hidden_size={self.text.hidden_size}")
        require("vision.deepstack_visual_indexes", self.vision.deepstack_visual_indexes,
                len(self.vision.deepstack_visual_indexes) <= self.text.num_hidden_layers,
                f"hold at most text.num_hidden_layers={self.text.num_hidden_layers} layers to receive them")
        for name in ("image_token_id", "video_token_id", "vision_start_token_id", "vision_end_token_id"):
            tok = getattr(self, name)
            require(name, tok, 0 <= tok < self.text.vocab_size,
                    f"lie in [0, {self.text.vocab_size}) (an id outside the vocabulary names no token)")

    def replace(self, **kwargs: Any) -> ModelConfig:
        return dataclasses.replace(self, **kwargs)

    @property
    def decoder_remat(self) -> RematPolicy:
        """The remat policy the decoder layers run under (`remat=True` alone means "full")."""
        return "full" if self.remat and self.remat_policy == "none" else self.remat_policy

    @classmethod
    def tiny(
        cls,
        vocab_size: int = 256,
        *,
        image_token_id: int | None = None,
        video_token_id: int | None = None,
        vision_start_token_id: int | None = None,
        vision_end_token_id: int | None = None,
        tie_word_embeddings: bool = True,
        lora: LoRAConfig = LoRAConfig(),
        num_hidden_layers: int = 2,
        hidden_size: int = 64,
        dtype: DType = "float32",
        param_dtype: DType = "float32",
    ) -> ModelConfig:
        """A < 1M-parameter model for tests and the CPU default (at hidden_size 64).

        Special token ids default to the last four ids of the vocabulary (image, video, vision start, vision end).
        hidden_size: the decoder's width, in 4 query heads (2 key/value heads) of hidden_size / 4 with the MLP twice
        as wide; a multiple of 32, so that each head's rotary pairs split 2:1:1 over Qwen3-VL's (t, h, w) sections.
        """
        if vocab_size < 8:
            raise ValueError(f"tiny(): vocab_size must be >= 8, got {vocab_size}")
        if hidden_size < 32 or hidden_size % 32:
            raise ValueError(f"tiny(): hidden_size must be a positive multiple of 32, got {hidden_size}")
        head_dim = hidden_size // 4
        ids = dict(
            image_token_id=vocab_size - 4 if image_token_id is None else image_token_id,
            video_token_id=vocab_size - 3 if video_token_id is None else video_token_id,
            vision_start_token_id=vocab_size - 2 if vision_start_token_id is None else vision_start_token_id,
            vision_end_token_id=vocab_size - 1 if vision_end_token_id is None else vision_end_token_id,
        )
        text = TextConfig(
            vocab_size=vocab_size, hidden_size=hidden_size, intermediate_size=2 * hidden_size,
            num_hidden_layers=num_hidden_layers, num_attention_heads=4, num_key_value_heads=2, head_dim=head_dim,
            rope_theta=10000.0, mrope_section=(head_dim // 4, head_dim // 8, head_dim // 8),
            max_position_embeddings=32768,
        )
        vision = VisionConfig(
            depth=2, hidden_size=32, intermediate_size=64, num_heads=4, patch_size=16, temporal_patch_size=2,
            spatial_merge_size=2, out_hidden_size=hidden_size, num_position_embeddings=64,
            deepstack_visual_indexes=(0,),
        )
        return cls(text=text, vision=vision, lora=lora, tie_word_embeddings=tie_word_embeddings,
                   dtype=dtype, param_dtype=param_dtype, **ids)
