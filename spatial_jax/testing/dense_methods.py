"""Test-only method plug-ins with a dense reward: `dense_<method>` for each registered method.

A random policy earns the same reward on every rollout of the real methods, so every advantage is 0 and an RL step
moves nothing: a test of resume, sharding or the loss would compare no-ops. `dense_<method>` is `<method>` (its
prompt format, blank-image or tool rollouts, scorer and reward components) with one dense term added to its reward:
the share of the completion's characters that are ASCII letters, which differs between the rollouts of a group, so
advantages, gradients and updates are non-zero from the first step.

The registry is passed in (this package sits below methods/): tests register the plug-ins for their own duration
with `registered(spatial_jax.methods)`; a process a test starts runs RUNNER, which registers them for good and then
runs the `spatial-jax` command on its arguments.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Iterator
from types import ModuleType

PREFIX = "dense_"

# `python -c RUNNER train key=value ...`: the `spatial-jax` command with the dense methods registered
RUNNER = ("import sys; import spatial_jax.methods as m; from spatial_jax.testing import dense_methods as d; "
          "d.register_all(m); from spatial_jax.cli import main; sys.exit(main(sys.argv[1:]))")


def letter_share(text: str) -> float:
    """The dense term: share of `text`'s characters that are ASCII letters (0 for an empty completion)."""
    return sum(c.isascii() and c.isalpha() for c in text) / len(text) if text else 0.0


def with_dense_reward(base):
    """`base` (a methods.Method) with reward = its reward + letter_share(completion), reported as `dense` too."""

    def score_batch(rollouts, cfg):
        scores = base.score_batch(rollouts, cfg)
        return [dict(s, dense=letter_share(r.completion), reward=s["reward"] + letter_share(r.completion))
                for r, s in zip(rollouts, scores)]

    return dataclasses.replace(base, name=PREFIX + base.name, score_batch=score_batch)


def register_all(methods: ModuleType) -> list[str]:
    """Registers `dense_<name>` for every method of `methods` (spatial_jax.methods) that has none; returns the new
    names."""
    new = [with_dense_reward(m) for name, m in list(methods.METHODS.items())
           if not name.startswith(PREFIX) and PREFIX + name not in methods.METHODS]
    for m in new:
        methods.register(m)
    return [m.name for m in new]


@contextlib.contextmanager
def registered(methods: ModuleType) -> Iterator[None]:
    """The dense methods registered for the duration (other tests see the registry as it was)."""
    names = register_all(methods)
    try:
        yield
    finally:
        for name in names:
            methods.METHODS.pop(name, None)
