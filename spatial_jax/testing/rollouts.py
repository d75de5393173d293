"""Synthetic SpatialCORE/ProSR rollouts (with token entropies and offsets) for tests and benchmarks.

Tokenisation is digit-aware like Qwen's: every digit is its own token; words, whitespace runs and single
punctuation marks are the other tokens. Entropies are drawn per token kind.
"""

from __future__ import annotations

import re

import numpy as np

from spatial_jax.records import BlankRollout, GTBox, Rollout, TokenTrace

_TOKEN = re.compile(r"\d|[A-Za-z]+|\s+|[^\w\s]|_")
OBJECTS = ("black sedan", "traffic light", "man", "red car", "tree", "dog", "blue gear", "gray vehicle",
           "woman in red", "lamp", "girl", "white truck")
FILLER = ("the", "object", "is", "left", "of", "right", "behind", "so", "we", "compare", "positions", "and")


def tokenize(text: str) -> list[tuple[int, int]]:
    """[start, end) offsets of digit-aware tokens covering `text`."""
    return [(m.start(), m.end()) for m in _TOKEN.finditer(text)]


def token_entropies(text: str, offsets, rng: np.random.Generator, digit_scale: float = 1.0,
                    nan_rate: float = 0.0) -> list[float]:
    """Digits: U(0, ln 10 * digit_scale) (sometimes exactly 0); other tokens: U(0, 4); a few NaN at nan_rate."""
    out = []
    for s, e in offsets:
        if text[s:e].isdigit():
            h = 0.0 if rng.random() < 0.1 else float(rng.uniform(0.0, np.log(10.0) * digit_scale))
        else:
            h = float(rng.uniform(0.0, 4.0))
        out.append(float("nan") if rng.random() < nan_rate else h)
    return out


def _box(rng: np.random.Generator, near=None) -> list[int]:
    if near is not None and rng.random() < 0.7:
        jit = rng.integers(-60, 61, size=4)
        b = [int(np.clip(c + d, 0, 1000)) for c, d in zip(near, jit)]
    else:
        x1, y1 = rng.integers(0, 900, size=2)
        w, h = rng.integers(1, 400, size=2)
        b = [int(x1), int(y1), int(min(1000, x1 + w)), int(min(1000, y1 + h))]
    if rng.random() < 0.05:
        b[0], b[2] = b[2], b[0]  # an invalid (inverted) box now and then
    return b


def _reasoning(rng: np.random.Generator, n_words: int) -> str:
    return " ".join(rng.choice(FILLER, size=n_words)) + "."


def rollout(rng: np.random.Generator, idx: int, group: str | None = None, with_blank: bool = False) -> Rollout:
    """One random rollout: up to 3 pseudo-GT boxes, up to 3 predicted box lines, assorted tails and gold forms."""
    n_opt = int(rng.integers(2, 5))
    options = tuple(f"{chr(65 + i)}. {rng.choice(OBJECTS)} on the {rng.choice(FILLER)}" for i in range(n_opt))
    gold_i = int(rng.integers(0, n_opt))
    gold_form = rng.integers(0, 4)
    answer = [chr(65 + gold_i), options[gold_i], f"({chr(65 + gold_i)}) x", gold_i][gold_form]
    gt = []
    for _ in range(int(rng.integers(0, 4))):
        gt.append(GTBox(bbox=tuple(float(c) for c in _box(rng)), label=str(rng.choice(OBJECTS)),
                        validity=float(np.round(rng.uniform(0.3, 1.0), 3))))
    lines = []
    for _ in range(int(rng.integers(0, 4))):
        ref = gt[int(rng.integers(0, len(gt)))] if gt and rng.random() < 0.8 else None
        label = ref.label if ref is not None and rng.random() < 0.6 else str(rng.choice(OBJECTS))
        if rng.random() < 0.2:
            label += " ahead"
        b = _box(rng, None if ref is None else ref.bbox)
        lines.append(f'{{"bbox_2d": [{b[0]}, {b[1]}, {b[2]}, {b[3]}], "label": "{label}"}}')
    letter = chr(65 + (gold_i if rng.random() < 0.5 else int(rng.integers(0, n_opt))))
    tail_kind = rng.random()
    if tail_kind < 0.8:
        tail = f"\n</think>\n{letter}"
    elif tail_kind < 0.88:
        tail = ""  # truncated
    elif tail_kind < 0.94:
        tail = f"\n</think>\nThe answer is {letter}."
    else:
        tail = f"\n</think>\n</think>\n{letter}"
    body = "\n".join(lines + ["We have the positions of the relevant objects. Let's think.",
                              _reasoning(rng, int(rng.integers(3, 40)))])
    completion = body + tail
    offsets = tokenize(completion)
    trace = TokenTrace(entropies=tuple(token_entropies(completion, offsets, rng, nan_rate=0.01)),
                       offsets=tuple(offsets))
    blank = None
    if with_blank:
        b_letter = letter if rng.random() < 0.6 else chr(65 + int(rng.integers(0, n_opt)))
        b_completion = _reasoning(rng, int(rng.integers(3, 40))) + (f"\n</think>\n{b_letter}" if rng.random() < 0.9
                                                                   else "")
        b_off = tokenize(b_completion)
        blank = BlankRollout(completion=b_completion, trace=TokenTrace(
            entropies=tuple(token_entropies(b_completion, b_off, rng, nan_rate=0.01)), offsets=tuple(b_off)))
    return Rollout(id=str(idx), completion=completion, question=f"Where is the {rng.choice(OBJECTS)}?",
                   options=options, answer=answer, gt_boxes=tuple(gt), trace=trace, blank=blank, group=group)


def rollouts(n: int, seed: int = 0, group_size: int = 4, with_blank: bool = False) -> list[Rollout]:
    """n rollouts in groups of `group_size` (one prompt per group, as GRPO samples them)."""
    rng = np.random.default_rng(seed)
    return [rollout(rng, i, group=str(i // group_size), with_blank=with_blank) for i in range(n)]


def to_json(ro: Rollout) -> dict:
    """The JSONL form `spatial-jax score` reads (NaN entropies become null)."""
    def ent(xs):
        return [None if x != x else x for x in xs]

    obj = dict(id=ro.id, completion=ro.completion, question=ro.question, options=list(ro.options),
               answer=ro.answer, gt_boxes=[dict(bbox_2d=list(g.bbox), label=g.label, validity=g.validity)
                                           for g in ro.gt_boxes],
               token_entropies=ent(ro.trace.entropies), token_offsets=[list(o) for o in ro.trace.offsets])
    if ro.group is not None:
        obj["group"] = ro.group
    if ro.blank is not None:
        obj["blank"] = dict(completion=ro.blank.completion, token_entropies=ent(ro.blank.trace.entropies),
                            token_offsets=[list(o) for o in ro.blank.trace.offsets])
    return obj
