"""The sampler's typed configuration."""

from __future__ import annotations

import dataclasses
from typing import Literal

from spatial_jax.config import check_at_least, check_non_negative, check_range, require


@dataclasses.dataclass(frozen=True)
class SamplingConfig:
    """How tokens are drawn. temperature 0 is greedy (argmax); top_k 0 and top_p 1.0 switch those filters off.

    Filters apply in Hugging Face's order: suppressed ids removed, logits / temperature, then top-k, then top-p on
    what top-k kept. Ties at either cut-off are kept (the kept set never depends on the order of equal logits).
    The sampler always suppresses the model's image and video placeholder ids (a completion holding them could not
    be re-encoded without pixels); `suppress_token_ids` adds more. Filters change which token is drawn, never the
    reported log-probs and entropies, which are over the full vocabulary as the loss recomputes them.

    `engine` picks how rollouts are decoded: "paged" (rollout/engine.py: `slots` requests at a time, 0 = all of a
    call's rows, continuous batching over a pool of `pages` KV pages of `page_size` tokens, 0 = enough for every
    slot's longest request, `chunk` decode steps per jitted call) or "static" (rollout/sampler.py: the whole batch in
    one fixed-shape loop). Both draw the same tokens for the same seed and row ids.

    Speed knobs of the paged engine (same tokens to float rounding): `decode_kernel` "pallas" attends a decode step
    with the GPU paged-attention kernel (kernels/attention/paged.py, pages read in place; the Pallas interpreter off
    GPU), "auto" as the model's attention decides (the TPU kernel or the XLA path); `command_buffers` compiles the
    decode chunk with XLA's command buffers over its whole loop (CUDA graphs; no effect off GPU).
    """

    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    stop_token_ids: tuple[int, ...] = ()
    suppress_token_ids: tuple[int, ...] = ()
    max_new_tokens: int = 256
    seed: int = 0
    pad_token_id: int = 0
    engine: Literal["paged", "static"] = "paged"
    slots: int = 0
    page_size: int = 16
    pages: int = 0
    chunk: int = 16
    decode_kernel: Literal["auto", "pallas"] = "auto"
    command_buffers: bool = False

    def __post_init__(self):
        require("engine", self.engine, self.engine in ("paged", "static"), 'be "paged" or "static"')
        require("decode_kernel", self.decode_kernel, self.decode_kernel in ("auto", "pallas"), 'be "auto" or "pallas"')
        check_non_negative(self, "temperature", "top_k", "slots", "pages")  # temperature 0 = greedy, top_k 0 = off
        check_at_least(self, page_size=1, chunk=1)
        require("pages", self.pages, self.pages != 1, "be 0 (automatic) or at least 2 (page 0 is scratch)")
        check_range(self, "top_p", 0.0, 1.0, low_open=True)
        check_at_least(self, max_new_tokens=1)
        for name in ("stop_token_ids", "suppress_token_ids"):
            ids = getattr(self, name)
            require(name, ids, all(t >= 0 for t in ids), "be non-negative token ids")
        object.__setattr__(self, "stop_token_ids", tuple(int(t) for t in self.stop_token_ids))
        object.__setattr__(self, "suppress_token_ids", tuple(int(t) for t in self.suppress_token_ids))

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0
