"""Tool turns as tokens, shared by multi-turn rollouts (rollout/multiturn.py) and SFT targets that use tools.

A tool turn, in the Qwen3 chat shape (the tool result as a user turn), is exactly

    <|im_end|> "\\n" <|im_start|> "user\\n<tool_response>\\n" [picture] {output} "\\n</tool_response>" <|im_end|> "\\n"
    <|im_start|> "assistant\\n"

with `<`/`>` in the output escaped (`&lt;`/`&gt;`) so it can neither close the response nor spell a control token,
and a picture (a tool that answers with one, `view_image`) written as a vision block of its image tokens and a line
break. A model that called a tool stops at `</tool_call>`; the turn then starts with the `<|im_end|>` it did not
write.

An SFT target that uses tools is a sequence of parts: model text (trained on) and `ToolTurn`s (the tool's output,
attended to but never trained on). A method registers a builder of such targets for its reference key
(`register_target`); the pipeline asks `sft_target` and encodes the parts with `encode_target`, so the SFT sequence
holds the same tokens a rollout would, and its loss mask is 1 on the model's own tokens only.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np

from spatial_jax.data.image_processing import num_image_tokens
from spatial_jax.data.sample import Sample
from spatial_jax.data.tokenizer import IMAGE_PAD, VISION_END, VISION_START

TOOL_TURN_PREFIX = "<|im_end|>\n<|im_start|>user\n<tool_response>\n"
TOOL_TURN_SUFFIX = "\n</tool_response><|im_end|>\n<|im_start|>assistant\n"


def escape_output(text: str) -> str:
    return text.replace("<", "&lt;").replace(">", "&gt;")


def picture_block(image_tokens: int) -> str:
    """A response's picture: a vision block of `image_tokens` pads and a line break."""
    return VISION_START + IMAGE_PAD * image_tokens + VISION_END + "\n"


def tool_turn_ids(tokenizer, output: str, max_tool_tokens: int | None, image_tokens: int = 0) -> list[int]:
    """The token ids of one tool turn carrying `output` and, when image_tokens > 0, a picture of that many tokens
    before it. With `max_tool_tokens` the output is cut so the turn fits; the wrapper and the picture must fit with
    at least one output token (ValueError otherwise)."""
    head, tail = tokenizer.encode(TOOL_TURN_PREFIX), tokenizer.encode(TOOL_TURN_SUFFIX)
    picture = tokenizer.encode(picture_block(image_tokens)) if image_tokens else []
    body = tokenizer.encode(escape_output(output))
    if max_tool_tokens is None:
        return head + picture + body + tail
    room = max_tool_tokens - len(head) - len(tail)
    if room < 1:
        raise ValueError(
            f"max_tool_tokens={max_tool_tokens} leaves no room for tool output: the tool turn's wrapper alone "
            f"takes {len(head) + len(tail)} tokens"
        )
    if len(picture) >= room:
        raise ValueError(f"a picture of {image_tokens} tokens does not fit max_tool_tokens={max_tool_tokens}")
    return head + picture + body[: room - len(picture)] + tail


@dataclasses.dataclass(frozen=True, eq=False)
class ToolTurn:
    """A tool's answer inside an SFT target: its text and, for a view, its picture (RGB uint8 [H, W, 3])."""

    output: str
    picture: np.ndarray | None = None


TargetPart = str | ToolTurn
Builder = Callable[[Sample], Sequence[TargetPart] | None]
_BUILDERS: dict[str, Builder] = {}


def register_target(reference_key: str, builder: Builder) -> None:
    """Makes `builder(sample)` the SFT target of the format with this reference key (None: the sample's own
    reference completion)."""
    if reference_key in _BUILDERS and _BUILDERS[reference_key] is not builder:
        raise ValueError(f"an SFT target builder is registered twice for {reference_key!r}")
    _BUILDERS[reference_key] = builder


def sft_target(sample: Sample, reference_key: str, method_targets: bool = True) -> tuple[TargetPart, ...] | None:
    """The registered builder's target for this sample (unless method_targets is False), else its reference
    completion as one model part, else None."""
    builder = _BUILDERS.get(reference_key) if method_targets else None
    parts = builder(sample) if builder is not None else None
    if parts is not None:
        return tuple(parts)
    text = sample.reference.get(reference_key)
    return None if text is None else (text,)


@dataclasses.dataclass(frozen=True)
class EncodedTarget:
    ids: list[int]  # the completion, closing <|im_end|> included
    loss: list[int]  # 1 on the model's tokens, 0 on tool turns
    pixel_values: list[np.ndarray]  # the tool pictures' patches, in order
    image_grid_thw: list[np.ndarray]  # [1, 3] each


def encode_target(parts: Sequence[TargetPart], tokenizer, image_cfg: Any, preprocess_fn: Callable) -> EncodedTarget:
    """Token ids, loss mask and pictures of a target; the completion ends with the model's `<|im_end|>`."""
    ids: list[int] = []
    loss: list[int] = []
    pixels, grids = [], []
    for part in parts:
        if isinstance(part, ToolTurn):
            n = 0
            if part.picture is not None:
                patches, grid = preprocess_fn([part.picture], image_cfg)
                grid = np.asarray(grid, np.int64).reshape(-1, 3)
                n = int(num_image_tokens(grid, image_cfg.merge_size).sum())
                pixels.append(np.asarray(patches, np.float32))
                grids.append(grid)
            turn = tool_turn_ids(tokenizer, part.output, None, image_tokens=n)
            ids += turn
            loss += [0] * len(turn)
        else:
            text = tokenizer.encode(part)
            ids += text
            loss += [1] * len(text)
    ids.append(tokenizer.im_end_id)
    loss.append(1)
    return EncodedTarget(ids, loss, pixels, grids)
