"""The reward methods by name: config class, scorer and torch reference scorer, each imported on first use.

Entries hold dotted paths so listing the methods never imports a method's code (or torch).
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any, Callable, Iterable

from spatial_jax.config import ConfigError, apply_overrides


def _resolve(path: str) -> Any:
    module, _, attr = path.partition(":")
    return getattr(importlib.import_module(module), attr)


@dataclasses.dataclass(frozen=True)
class Method:
    name: str
    config_path: str
    score_batch_path: str
    reference_path: str  # torch reference's score_batch; imported only for --backend torch, tests, benchmarks

    @property
    def config_cls(self) -> type:
        return _resolve(self.config_path)

    @property
    def score_batch(self) -> Callable:
        return _resolve(self.score_batch_path)

    @property
    def reference_score_batch(self) -> Callable:
        return _resolve(self.reference_path)

    def config(self, overrides: Iterable[str] | dict[str, Any] = ()) -> Any:
        """The method's default config with `key=value` overrides (ConfigError on an unknown key or bad value)."""
        return apply_overrides(self.config_cls(), overrides)


def _method(name: str, module: str, config: str, reference: str) -> Method:
    return Method(
        name=name,
        config_path=f"spatial_jax.rewards.{module}:{config}",
        score_batch_path=f"spatial_jax.rewards.{module}:score_batch",
        reference_path=f"spatial_jax.reference.{reference}:score_batch",
    )


METHODS: dict[str, Method] = {
    "spatialcore": _method("spatialcore", "spatialcore", "SpatialCOREConfig", "spatialcore_torch"),
    "prosr": _method("prosr", "prosr", "ProSRConfig", "prosr_torch"),
    "spatialthinker": _method("spatialthinker", "spatialthinker", "SpatialThinkerConfig", "spatialthinker_torch"),
    "allospatial": _method("allospatial", "allospatial", "AlloSpatialConfig", "allospatial_torch"),
}


def get_method(name: str) -> Method:
    try:
        return METHODS[name]
    except KeyError:
        raise ConfigError(f"unknown method {name!r}; known: {sorted(METHODS)}") from None
