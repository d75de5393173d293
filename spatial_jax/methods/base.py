"""What a method is: one record of everything the rest of the code asks about it, registered once by name.

The data layer sees only the method's PromptFormat, the rollout layer only `needs_blank` / `uses_tools`, evaluation
only `accuracy_key`, `well_formed` and `final_answer`; no module outside a method's plug-in compares method names.
"""

from __future__ import annotations

import dataclasses
import importlib
from collections.abc import Callable, Iterable
from typing import Any

from spatial_jax.config import Registry, apply_overrides
from spatial_jax.data.prompts import PromptFormat


@dataclasses.dataclass(frozen=True)
class Method:
    """name: the `method` config value. config_cls: the reward's typed config (a `rewards.<name>` table).
    score_batch(rollouts, cfg) -> one dict of reward components per rollout. reference: "module:function" of the
    torch reference scorer, imported only for `--backend torch`, tests and benchmarks. prompt: how the method asks
    for its output, and which reference completion is its SFT target. accuracy_key: the component that says the
    answer is right. well_formed(components): whether a completion follows the format. final_answer(completion): the
span of a completion that holds its final answer, what a benchmark's official extraction reads (None: it gives
none, and is scored wrong and counted unparsed). needs_blank: one blank-image
    rollout per prompt, paired with its group (ProSR eq. 8). uses_tools: multi-turn tool rollouts (AlloSpatial).
    box_details(rollouts, cfg) -> per rollout, one {H, matched, iou} per predicted box, for evaluation's
    uncertainty-IoU analyses (None: the method has no box uncertainty)."""

    name: str
    config_cls: type
    score_batch: Callable[..., list[dict[str, float]]]
    reference: str
    prompt: PromptFormat
    accuracy_key: str
    well_formed: Callable[[dict[str, float]], bool]
    final_answer: Callable[[str], str | None]
    needs_blank: bool = False
    uses_tools: bool = False
    box_details: Callable[..., list[list[dict]]] | None = None

    @property
    def reference_score_batch(self) -> Callable[..., list[dict[str, float]]]:
        module, _, attr = self.reference.partition(":")
        return getattr(importlib.import_module(module), attr)

    def config(self, overrides: Iterable[str] | dict[str, Any] = ()) -> Any:
        """The method's default reward config with `key=value` overrides (ConfigError on an unknown key or value)."""
        return apply_overrides(self.config_cls(), overrides)


METHODS: Registry[Method] = Registry("method")
register = METHODS.register
get_method = METHODS.lookup
