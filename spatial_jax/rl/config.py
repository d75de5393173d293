"""The run's typed configuration: `spatial-jax sft|train|eval --config configs/X.toml key=value ...`.

The defaults are the smallest whole job: a tiny random policy on the default synthetic world, SFT then GRPO with the
SpatialCORE reward, on CPU (configs/tiny_random.toml writes them out; the tests run them). The README main job,
configs/tiny_cpu.toml, starts from the shipped grounding-pretrained base instead (cli/job_config.py). Each config checks
its own values when built (FieldError, reported with its dotted key); `validate` checks what depends on the machine
(mesh vs devices, batch divisibility) and `check_context` what depends on the policy (sequence lengths vs its
positions), so a bad run fails at start, before anything is compiled.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from spatial_jax.config import ConfigError, check_at_least, check_range, from_dict, require, to_dict
from spatial_jax.data.pipeline import DataConfig
from spatial_jax.eval.evaluate import DIAGNOSTIC_ROLLOUTS
from spatial_jax.methods import METHODS, Method, get_method
from spatial_jax.models.config import LoRAConfig
from spatial_jax.rewards.overlong import OverlongPenaltyConfig
from spatial_jax.rl.dynamic_sampling import DynamicSamplingConfig
from spatial_jax.rl.losses import LossConfig
from spatial_jax.rl.optim import OptimConfig
from spatial_jax.rl.rollout_correction import CorrectionConfig
from spatial_jax.rollout.config import SamplingConfig
from spatial_jax.rollout.decode_copy import DecodeConfig
from spatial_jax.rollout.multiturn import required_cache_len

# Seeds key jax.random, numpy's generators and grain's shuffle (which takes < 2**32); 31 bits leave room for the
# seeds derived from them by small offsets.
MAX_SEED = 2**31 - 1
# optax counts optimiser calls in int32, and steps key the random streams through jax.random.fold_in (uint32).
MAX_STEPS = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class PolicyConfig:
    """checkpoint: a Hugging Face Qwen3-VL directory (config.json + safetensors); "" builds the tiny random policy.

    train_vision: whether the vision tower's weights (or its adapters) train; lora.rank 0 trains full weights.
    remat: recompute each decoder layer in the backward pass (long sequences); remat_policy names what the backward
      keeps instead ("none", "full", "dots", "dots_no_batch": jax.checkpoint_policies, models/scan.py) and wins over
      remat; scan_layers runs decoder layers and vision blocks under one scan over stacked weights (compile time flat
      in depth; its training state is laid out differently, so a run cannot switch it on resume).
    attention_chunk: queries per attention block, which bounds the score matrix held in memory.
    attention_impl: the attention kernel ("auto": splash on TPU, cuDNN flash on GPU for 16-bit compute, XLA
      otherwise; "xla", "splash", "cudnn" force one; "pallas": the Pallas flash kernel, whose causal mask can be
      offset for rl.shared_prefix on a GPU; models/attention.py); results equal up to float rounding.
    moe_matmul: the grouped matmul of a mixture-of-experts model's experts ("ragged_dot": XLA's, on every backend;
      "megablox": jax's Pallas TPU kernel, off TPU in the slow Pallas interpreter; kernels/grouped_matmul/); results
      equal up to float rounding. The default is ragged_dot as it runs everywhere; no TPU has timed the two here.
    min_pixels / max_pixels: the image processor's pixel budget (0 = Qwen3-VL's defaults; the tiny default keeps the
      synthetic 96 px scenes at 84 px, 9 image tokens).
    tiny_layers: decoder layers of the tiny random policy (no checkpoint); a deeper one can compose more look-ups.
    tiny_width: the tiny random policy's decoder width (a multiple of 32; ModelConfig.tiny).
    """

    checkpoint: str = ""
    dtype: Literal["float32", "bfloat16"] = "float32"
    param_dtype: Literal["float32", "bfloat16"] = "float32"
    lora: LoRAConfig = LoRAConfig()
    train_vision: bool = False
    init_seed: int = 0
    remat: bool = False
    remat_policy: Literal["none", "full", "dots", "dots_no_batch"] = "none"
    scan_layers: bool = False
    attention_chunk: int = 1024
    attention_impl: Literal["auto", "xla", "splash", "cudnn", "pallas"] = "auto"
    moe_matmul: Literal["ragged_dot", "megablox"] = "ragged_dot"
    min_pixels: int = 3136
    max_pixels: int = 12544
    tokenizer_vocab_size: int = 768
    tiny_layers: int = 2
    tiny_width: int = 64

    def __post_init__(self):
        check_range(self, "init_seed", 0, MAX_SEED)
        check_at_least(self, attention_chunk=1, min_pixels=0, max_pixels=0, tokenizer_vocab_size=1, tiny_layers=1)
        require("tiny_width", self.tiny_width, self.tiny_width >= 32 and self.tiny_width % 32 == 0,
                "be a positive multiple of 32")


@dataclasses.dataclass(frozen=True)
class MeshConfig:
    """Device mesh (data, fsdp, tensor) over the first data*fsdp*tensor devices."""

    data: int = 1
    fsdp: int = 1
    tensor: int = 1

    def __post_init__(self):
        check_at_least(self, data=1, fsdp=1, tensor=1)

    @property
    def size(self) -> int:
        return self.data * self.fsdp * self.tensor

    @property
    def batch_shards(self) -> int:
        return self.data * self.fsdp


@dataclasses.dataclass(frozen=True)
class SFTConfig:
    """Cold start: completion-only cross-entropy on the dataset's reference completions (0 steps skips it).
    train_vision false keeps the vision tower's weights (or adapters) as they are through this stage even when
    policy.train_vision trains them in RL (SpatialCORE Table 4: vision frozen in the cold start, vision LoRA in RL)."""

    steps: int = 1000
    batch_size: int = 8
    optim: OptimConfig = OptimConfig(lr=2e-3, min_lr=2e-4, warmup_ratio=0.05)
    checkpoint_every: int = 50
    train_vision: bool = True

    def __post_init__(self):
        check_range(self, "steps", 0, MAX_STEPS)
        check_at_least(self, batch_size=1, checkpoint_every=1)
        require("optim.grad_accum_steps", self.optim.grad_accum_steps, self.optim.grad_accum_steps == 1,
                "be 1 (not supported: raise sft.batch_size instead)")


@dataclasses.dataclass(frozen=True)
class RLConfig:
    """GRPO / GSPO. Each step samples group_size rollouts for each of prompts_per_step prompts, scores them, and
    runs updates_per_batch passes over them (verl's ppo_epochs). A pass makes one optimiser update per mini-batch of
    mini_batch rollouts (verl's ppo_mini_batch_size; 0 = the whole batch, one update a pass), each accumulated over
    micro-batches of micro_batch rollouts (0 = the whole mini-batch): micro-batches bound memory and change nothing
    else, while every update after a step's first is off-policy (its ratio to pi_old differs from 1).
    Group advantages (eq. 2) take eps and the std kind from the method's reward config where it has them.
    max_tool_turns > 0 (AlloSpatial) runs multi-turn rollouts: tool output joins the context but carries no loss.
    shared_prefix: the update (and the KL reference) runs each prompt through the decoder once for its G rollouts,
    whose completions attend to its keys; the same loss to float rounding, fewer tokens through every layer. It
    applies to micro-batches of whole groups without tool pictures, and takes xla, splash or pallas attention
    (cudnn falls back to xla for those calls).
    overlong_penalty: DAPO's soft overlong punishment added to every rollout's reward (rewards/overlong.py, DAPO
    eq. 13; off unless cache > 0). dynamic_sampling: DAPO's dynamic sampling (rl/dynamic_sampling.py, DAPO Sec. 3.2):
    groups whose rewards are all equal are dropped and more prompts sampled, up to max_rounds extra rounds.
    rollout_mode: "sync" samples a step's rollouts, then updates; "one_step_off" samples step k + 1's rollouts in a
    thread while step k's update runs (rl/async_rollouts.py), on the decoding copy of the weights step k started
    from (on a rollout mesh of its own with decode.devices > 0); the loss's ratio is then taken against that
    behaviour policy's log-probs, one step stale. rollout_lag (one_step_off only): 1 overlaps as described; 0 starts
    the next rollouts after the update, so nothing is stale and the run equals "sync" (the check of the pipeline).
    old_logp: where the loss's pi_old comes from: "sampler", the log-probs the sampler returned with the rollouts
    (SPEC §6); "trainer", the trainer's at the step's starting weights, so the numerical gap between the decoding
    copy and the trainer (bfloat16, other kernels) does not enter the PPO ratio as a policy change: the first
    pass's own forward (its ratio is exactly 1) and, where pi_old is read outside it (correction, updates_per_batch
    > 1, adapter dropout), one forward more before the first optimiser call (time/old_logp_s; `plan`'s
    old_logp_forward). correction (old_logp = "trainer" only): verl's rollout
    correction of the remaining pi_old / pi_sampler gap, truncated (TIS) or masked (MIS) importance sampling
    (rl/rollout_correction.py). Every step logs the gap (gap/*, the sampler against the trainer's first forward)."""

    def __post_init__(self):
        check_range(self, "steps", 0, MAX_STEPS)
        check_at_least(self, prompts_per_step=1, group_size=1, updates_per_batch=1, mini_batch=0, micro_batch=0,
                       max_tool_turns=0, max_tool_tokens=64, checkpoint_every=1)
        require("optim.grad_accum_steps", self.optim.grad_accum_steps, self.optim.grad_accum_steps == 1,
                "be 1 (it is set from rl.micro_batch)")
        require("sampling.temperature", self.sampling.temperature, self.steps == 0 or self.sampling.temperature > 0,
                "be > 0: greedy groups are identical and get no advantage")
        require("dynamic_sampling.enabled", self.dynamic_sampling.enabled,
                not self.dynamic_sampling.enabled or self.group_size >= 2,
                f"be false with group_size={self.group_size}: a group of one rollout never holds two different "
                "rewards, so every group would be dropped")
        require("rollout_lag", self.rollout_lag, self.rollout_lag in (0, 1),
                "be 0 or 1: one_step_off samples at most one step ahead of the update")
        require("rollout_lag", self.rollout_lag, self.rollout_mode == "one_step_off" or self.rollout_lag == 1,
                f"keep its default with rollout_mode={self.rollout_mode!r}: it sets one_step_off's staleness")
        require("correction", self.correction.tis + "/" + self.correction.mis,
                not self.correction.enabled or self.old_logp == "trainer",
                "stay off with old_logp='sampler': pi_old is then the sampler's own and every weight is 1")
        rollouts = self.prompts_per_step * self.group_size
        micro = self.micro_batch or self.mini_batch or rollouts
        calls = self.steps * self.updates_per_batch * max(1, rollouts // micro)
        require("steps", self.steps, calls <= MAX_STEPS,
                f"make at most {MAX_STEPS} optimiser calls (steps x updates_per_batch x micro-batches = {calls}; "
                "optax counts them in int32)")

    steps: int = 60
    prompts_per_step: int = 4
    group_size: int = 8
    updates_per_batch: int = 1
    mini_batch: int = 0
    micro_batch: int = 0
    loss: LossConfig = LossConfig(kl_coef=0.0)
    optim: OptimConfig = OptimConfig(lr=1e-4, min_lr=1e-5, warmup_ratio=0.05)
    sampling: SamplingConfig = SamplingConfig(temperature=1.0, max_new_tokens=288)
    blank_fill: Literal["mean", "black", "white"] = "mean"
    overlong_filter: bool = False
    overlong_penalty: OverlongPenaltyConfig = OverlongPenaltyConfig()
    dynamic_sampling: DynamicSamplingConfig = DynamicSamplingConfig()
    shared_prefix: bool = False
    max_tool_turns: int = 0
    max_tool_tokens: int = 512
    checkpoint_every: int = 10
    rollout_mode: Literal["sync", "one_step_off"] = "sync"
    rollout_lag: int = 1
    old_logp: Literal["sampler", "trainer"] = "sampler"
    correction: CorrectionConfig = CorrectionConfig()


@dataclasses.dataclass(frozen=True)
class PlanConfig:
    """What `spatial-jax plan` checks the recipe against: target (a TPU topology such as "v5p:2x4x4", the machine
    its mesh, remat and micro-batch are sized for), gpu_target (e.g. "gpu:h100x8", estimated), model (an
    architecture of rl/plan/shapes.ARCHITECTURES when the checkpoint's config.json is not at hand) and image_size (the
    side in pixels of the square image each prompt holds, before the policy's resize)."""

    target: str = ""
    gpu_target: str = ""
    model: str = ""
    image_size: int = 448

    def __post_init__(self):
        check_at_least(self, image_size=1)


@dataclasses.dataclass(frozen=True)
class EvalConfig:
    """Greedy decoding on the held-out split after each stage (max_samples 0 = the whole split). diagnostics: where
    ProSR's process diagnostics read their (image, blank) pairs, for a method with blank rollouts: "sampled" at
    temperature 1 as its eq. 2 draws them (a second pass), or the "greedy" evaluation rollouts."""

    batch_size: int = 16
    max_new_tokens: int = 288
    max_samples: int = 0
    after_sft: bool = True
    after_rl: bool = True
    diagnostics: str = "sampled"

    def __post_init__(self):
        check_at_least(self, batch_size=1, max_new_tokens=1, max_samples=0)
        require("diagnostics", self.diagnostics, self.diagnostics in DIAGNOSTIC_ROLLOUTS,
                f"be one of {DIAGNOSTIC_ROLLOUTS}")


_REWARDS_TYPES: dict[tuple, type] = {}


def rewards_config_type() -> type:
    """The `rewards` table's type: one `rewards.<method>` table per registered method, typed by that method's reward
    config. Built for the registry as it stands, so a plug-in registered after this module was imported (a test's)
    has its table too."""
    key = tuple((name, m.config_cls) for name, m in METHODS.items())
    if key not in _REWARDS_TYPES:
        cls = dataclasses.make_dataclass(
            "RewardsConfig", [(name, c, dataclasses.field(default_factory=c)) for name, c in key], frozen=True
        )
        cls.__module__ = __name__
        _REWARDS_TYPES[key] = cls
    return _REWARDS_TYPES[key]


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    run_dir: str = "runs/tiny_random"
    seed: int = 0
    method: str = "spatialcore"
    policy: PolicyConfig = PolicyConfig()
    data: DataConfig = DataConfig(train="synthetic:train:2000", eval="synthetic:heldout:128",
                                  bucket_lengths=(256, 512, 1024))
    mesh: MeshConfig = MeshConfig()
    decode: DecodeConfig = DecodeConfig()  # the copy rollouts and evaluation decode from
    sft: SFTConfig = SFTConfig()
    rl: RLConfig = RLConfig()
    eval: EvalConfig = EvalConfig()
    plan: PlanConfig = PlanConfig()
    rewards: Any = dataclasses.field(default_factory=lambda: rewards_config_type()())  # typed in __post_init__
    tensorboard: bool = True
    progress: bool = True
    export_hf: bool = True  # at the end of the job, the policy as a Hugging Face checkpoint in <run_dir>/hf

    def __post_init__(self):
        get_method(self.method)  # an unknown name fails here, listing the registered ones
        check_range(self, "seed", 0, MAX_SEED)
        for key, seed in (("data.seed", self.data.seed), ("data.synthetic.seed", self.data.synthetic.seed)):
            require(key, seed, 0 <= seed <= MAX_SEED, f"lie in [0, {MAX_SEED}]")
        rewards = rewards_config_type()
        if not isinstance(self.rewards, rewards):  # a table from a file, or typed before a plug-in registered
            raw = self.rewards if isinstance(self.rewards, dict) else {
                name: table for name, table in to_dict(self.rewards).items() if name in METHODS}
            object.__setattr__(self, "rewards", from_dict(rewards, raw, prefix="rewards."))

    @property
    def plugin(self) -> Method:
        return get_method(self.method)

    def reward_config(self):
        return getattr(self.rewards, self.method)


def validate(cfg: TrainConfig, num_devices: int) -> None:
    """Machine-dependent checks; raises ConfigError with the key to fix."""
    if cfg.mesh.size > num_devices:
        raise ConfigError(
            f"mesh data*fsdp*tensor = {cfg.mesh.data}*{cfg.mesh.fsdp}*{cfg.mesh.tensor} = {cfg.mesh.size} "
            f"but only {num_devices} device(s) are visible"
        )
    if cfg.mesh.size + cfg.decode.devices > num_devices:
        raise ConfigError(
            f"decode.devices={cfg.decode.devices}: the rollout mesh takes the devices after the training mesh's "
            f"{cfg.mesh.size}, but only {num_devices} device(s) are visible"
        )
    shards = cfg.mesh.batch_shards
    rollouts = cfg.rl.prompts_per_step * cfg.rl.group_size
    mini = cfg.rl.mini_batch or rollouts
    micro = cfg.rl.micro_batch or mini
    if cfg.rl.steps > 0:
        if cfg.rl.group_size < 2:
            raise ConfigError(f"rl.group_size must be >= 2 for group-relative advantages, got {cfg.rl.group_size}")
        for key, size in (("mini_batch", mini), ("micro_batch", micro)):
            if rollouts % size:
                raise ConfigError(f"rl.prompts_per_step * rl.group_size = {rollouts} rollouts is not divisible by "
                                  f"rl.{key}={size}")
            if size % cfg.rl.group_size and getattr(cfg.rl, key):
                raise ConfigError(f"rl.{key}={size} must be a multiple of rl.group_size={cfg.rl.group_size}")
        if mini % micro:
            raise ConfigError(f"rl.micro_batch={micro} must divide rl.mini_batch={mini}: an optimiser update "
                              "accumulates whole micro-batches")
        if micro % shards:
            raise ConfigError(
                f"rl micro-batch of {micro} rollouts is not divisible by mesh.data*mesh.fsdp = {shards}"
            )
        if cfg.rl.prompts_per_step % shards and cfg.plugin.needs_blank:
            raise ConfigError(
                f"{cfg.method}'s blank rollouts need rl.prompts_per_step={cfg.rl.prompts_per_step} divisible by "
                f"{shards}"
            )
    if cfg.sft.steps > 0 and cfg.sft.batch_size % shards:
        raise ConfigError(f"sft.batch_size={cfg.sft.batch_size} is not divisible by mesh.data*mesh.fsdp = {shards}")
    if cfg.eval.batch_size % shards:
        raise ConfigError(f"eval.batch_size={cfg.eval.batch_size} is not divisible by mesh.data*mesh.fsdp = {shards}")
    if cfg.rl.steps > 0 and cfg.rl.loss.aggregation == "seq_mean_token_sum_norm":
        # Dr. GRPO's constant must bound the loss tokens of any rollout
        if cfg.rl.loss.max_completion_length < model_token_budget(cfg):
            raise ConfigError(
                f"rl.loss.max_completion_length={cfg.rl.loss.max_completion_length} must be >= the model tokens a "
                f"rollout can hold: rl.sampling.max_new_tokens x (rl.max_tool_turns + 1) = {model_token_budget(cfg)}"
            )
    penalty = cfg.rl.overlong_penalty
    if cfg.rl.steps > 0 and penalty.cache > overlong_max_length(cfg):
        raise ConfigError(
            f"rl.overlong_penalty.cache={penalty.cache} must be <= L_max = {overlong_max_length(cfg)} (rl.overlong_"
            "penalty.max_length, or when 0 the model-token budget rl.sampling.max_new_tokens x (rl.max_tool_turns + 1))"
        )
    if cfg.rl.steps > 0 and penalty.enabled and overlong_max_length(cfg) - penalty.cache >= model_token_budget(cfg):
        raise ConfigError(
            f"rl.overlong_penalty.cache={penalty.cache} never applies: the penalty starts past L_max - L_cache = "
            f"{overlong_max_length(cfg) - penalty.cache} tokens, but a rollout writes at most "
            f"rl.sampling.max_new_tokens x (rl.max_tool_turns + 1) = {model_token_budget(cfg)}; lower "
            "rl.overlong_penalty.max_length or raise the cache"
        )


def model_token_budget(cfg: TrainConfig) -> int:
    """The most tokens a rollout's policy can write: each of the max_tool_turns + 1 decode rounds of a multi-turn
    rollout may write up to max_new_tokens (tool tokens are not the policy's)."""
    turns = cfg.rl.max_tool_turns if cfg.plugin.uses_tools else 0
    return cfg.rl.sampling.max_new_tokens * (turns + 1)


def overlong_max_length(cfg: TrainConfig) -> int:
    """L_max of DAPO's overlong penalty: rl.overlong_penalty.max_length, or the rollout's model-token budget."""
    return cfg.rl.overlong_penalty.max_length or model_token_budget(cfg)


def check_context(cfg: TrainConfig, max_positions: int) -> None:
    """Every sequence the job builds fits the policy's `max_positions` (its max_position_embeddings): the longest
    prompt bucket, plus what a rollout or an evaluation may add to it (each decode round's new tokens and, for a
    method with tools, the tool turns). The sampler sizes its KV cache by this length, so a bound past the context
    would otherwise fail late, as an out-of-memory error or positions the policy never learned."""
    prompt = max(cfg.data.bucket_lengths)
    turns = cfg.rl.max_tool_turns if cfg.plugin.uses_tools else 0
    lengths = {"data.bucket_lengths": (prompt, "the longest bucket")}
    for key, new in (("rl.sampling.max_new_tokens", cfg.rl.sampling.max_new_tokens),
                     ("eval.max_new_tokens", cfg.eval.max_new_tokens)):
        detail = f"the longest bucket {prompt} + {turns + 1} x {new} new tokens"
        if turns:
            detail += f" + {turns} x rl.max_tool_tokens={cfg.rl.max_tool_tokens}"
        lengths[key] = (required_cache_len(prompt, new, turns, cfg.rl.max_tool_tokens), detail)
    for key, (n, detail) in lengths.items():
        if n > max_positions:
            raise ConfigError(f"{key}: sequences of up to {n} positions ({detail}) exceed the policy's context of "
                              f"{max_positions} positions (max_position_embeddings)")


def old_logp_forward(cfg: TrainConfig) -> bool:
    """Whether an RL step runs the trainer's pi_old forward before its first optimiser call (rl.old_logp =
    "trainer"): where something reads pi_old before or after the first pass, i.e. the rollout correction, a second
    pass (updates_per_batch > 1), adapter dropout (the first pass's own forward then draws dropout, pi_old does
    not) or several updates per pass (rl.mini_batch below the batch). Otherwise the first update's own forward, at
    the same weights, is pi_old and no forward is added."""
    lora = cfg.policy.lora
    dropout = lora.dropout > 0 and (lora.rank > 0 or lora.vision_rank > 0)
    rc = cfg.rl
    several = rc.updates_per_batch > 1 or 0 < rc.mini_batch < rc.prompts_per_step * rc.group_size
    return rc.old_logp == "trainer" and (rc.correction.enabled or several or dropout)
