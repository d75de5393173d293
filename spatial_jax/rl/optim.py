"""AdamW with linear warmup, cosine decay to a floor, global-norm clipping and gradient accumulation (optax).

Defaults are SpatialCORE's run (SPEC §2, Table 4): lr 5e-5 cosine to 5e-6, warmup 5%.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import jax.numpy as jnp
import optax

from spatial_jax.config import check_at_least, check_non_negative, check_positive, check_range


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    """Optimiser settings. Steps count optimiser updates (one per `grad_accum_steps` micro-batches).

    lr, min_lr: peak and final learning rate; warmup_ratio: share of total_steps spent warming up linearly from 0;
    weight_decay, b1, b2, eps: AdamW (decoupled weight decay); grad_clip_norm: global-norm clip (0 = off);
    grad_accum_steps: micro-batches averaged per update (1 = none).
    """

    lr: float = 5e-5
    min_lr: float = 5e-6
    warmup_ratio: float = 0.05
    total_steps: int = 1000
    weight_decay: float = 0.0
    b1: float = 0.9
    b2: float = 0.999
    eps: float = 1e-8
    grad_clip_norm: float = 1.0
    grad_accum_steps: int = 1

    def __post_init__(self) -> None:
        check_positive(self, "lr", "eps")
        check_range(self, "min_lr", 0.0, self.lr)
        check_range(self, "warmup_ratio", 0.0, 1.0, high_open=True)
        check_non_negative(self, "weight_decay", "grad_clip_norm")
        check_range(self, "b1", 0.0, 1.0, high_open=True)
        check_range(self, "b2", 0.0, 1.0, high_open=True)
        check_at_least(self, total_steps=1, grad_accum_steps=1)

    @property
    def warmup_steps(self) -> int:
        # Rounded up, as Hugging Face's get_warmup_steps does.
        return math.ceil(self.warmup_ratio * self.total_steps)


def lr_schedule(cfg: OptimConfig) -> Callable[[Any], Any]:
    """Learning rate after `step` optimiser updates: 0 -> lr linearly over warmup_steps, then cosine to min_lr
    at total_steps, and min_lr after. Works on ints and on traced jnp scalars (for logging, pass the step).

    The first update runs at learning rate 0, as optax's warmup schedules and transformers' (its LambdaLR stepped
    after each update) do, and every published figure here was measured so; a stage of 20 updates with warmup 1
    makes 19 that move the weights (warmup_ratio = 0 makes 20)."""
    warmup, total = cfg.warmup_steps, cfg.total_steps

    def schedule(step):
        step = jnp.asarray(step, jnp.float32)
        warm = cfg.lr * step / max(warmup, 1)
        progress = jnp.clip((step - warmup) / max(total - warmup, 1), 0.0, 1.0)
        cosine = cfg.min_lr + (cfg.lr - cfg.min_lr) * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
        return jnp.where(step < warmup, warm, cosine)

    return schedule


def make_optimizer(cfg: OptimConfig, weight_decay_mask: Any = None) -> optax.GradientTransformation:
    """clip_by_global_norm -> AdamW(lr_schedule), wrapped in optax.MultiSteps when grad_accum_steps > 1.

    With accumulation, call `update` once per micro-batch: the parameters change only every grad_accum_steps
    calls, with the mean of the accumulated gradients, and the schedule advances once per real update.
    weight_decay_mask: optional pytree of bools (or callable) selecting the parameters that decay.
    """
    parts = []
    if cfg.grad_clip_norm > 0:
        parts.append(optax.clip_by_global_norm(cfg.grad_clip_norm))
    parts.append(
        optax.adamw(
            learning_rate=lr_schedule(cfg),
            b1=cfg.b1,
            b2=cfg.b2,
            eps=cfg.eps,
            weight_decay=cfg.weight_decay,
            mask=weight_decay_mask,
        )
    )
    tx = optax.chain(*parts)
    if cfg.grad_accum_steps > 1:
        return optax.MultiSteps(tx, every_k_schedule=cfg.grad_accum_steps).gradient_transformation()
    return tx
