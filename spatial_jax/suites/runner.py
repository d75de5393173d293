"""The policy's responses to a benchmark's records, cached per checkpoint so an interrupted evaluation resumes.

Responses come from the same rollout layer as training (`collect`: tool turns for a method that uses them), with
the decoding the protocol states, each question laid out as its benchmark's protocol shows it (options and answer
instruction, layout.py) inside the method's own prompt, or, when the user asks for the "method"
layout, as the method's prompt shows a dataset's question (PROMPT_LAYOUTS). Each finished batch is appended to the
cache (one JSON line per record) before the next starts; a rerun with the same checkpoint and decoding reads the
cache and generates only what is missing.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from spatial_jax.data.jsonl import DuplicateKey, loads_unique, text_lines
from spatial_jax.data.pipeline import make_iterator
from spatial_jax.rollout.collect import ToolSettings, collect
from spatial_jax.rollout.config import SamplingConfig
from spatial_jax.suites import LAYOUTS, BenchRecord, to_sample
from spatial_jax.suites.layout import PROMPT_LAYOUTS


@dataclasses.dataclass(frozen=True)
class Decoding:
    temperature: float
    max_new_tokens: int
    max_tool_turns: int
    max_tool_tokens: int
    video_frames: int = 0
    seed: int = 0


class ResponseCache:
    """id -> response text of one benchmark under one checkpoint and decoding, kept as JSONL (written only by the
    process that owns it: the first host of a multi-host run)."""

    def __init__(self, path: Path, writes: bool = True):
        self.path, self.writes = path, writes
        self.responses: dict[str, str] = {}
        if path.is_file():
            for line in text_lines(path.read_text(encoding="utf-8")):
                try:
                    row = json.loads(line)
                    self.responses[str(row["id"])] = row["response"]
                except (json.JSONDecodeError, KeyError, TypeError):
                    continue  # a line cut short by the interruption: its record is generated again

    def add(self, items: list[tuple[str, str]]) -> None:
        self.responses.update(items)
        if not self.writes:
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "a", encoding="utf-8") as f:
            f.writelines(json.dumps({"id": rid, "response": text}) + "\n" for rid, text in items)


def cache_dir(run_dir: Path, checkpoint: str, method: str, decoding: Decoding, layout: str = "benchmark") -> Path:
    """One folder per checkpoint (stage and step), decoding, layout choice and the benchmarks' layouts: changing any
    of them (the prompt changes with a layout) starts a fresh cache."""
    layouts = {name: dataclasses.asdict(shown) for name, shown in LAYOUTS.items()}
    key = json.dumps({"method": method, **dataclasses.asdict(decoding), "layout": layout, "layouts": layouts},
                     sort_keys=True)
    return Path(run_dir) / "eval_cache" / f"{checkpoint}-{hashlib.sha256(key.encode()).hexdigest()[:10]}"


def generate(
    records: list[BenchRecord],
    cache: ResponseCache,
    *,
    model,
    tokenizer,
    method,
    reward_cfg,
    data_cfg,
    image_cfg,
    batch_size: int,
    decoding: Decoding,
    blank_fill: str = "mean",
    progress: Callable[[int], None] | None = None,
    layout: str = "benchmark",
) -> tuple[Mapping[str, str], list[str]]:
    """(id -> response for every record that has one, ids of records with no Sample form). Records already in the
    cache are not generated again. layout: one of PROMPT_LAYOUTS."""
    if layout not in PROMPT_LAYOUTS:
        raise ValueError(f"layout must be one of {PROMPT_LAYOUTS}, got {layout!r}")
    pending, skipped = [], []
    for r in records:
        if r.id in cache.responses:
            continue
        if r.answer_type == "text":
            skipped.append(r.id)
            continue
        pending.append(to_sample(r, decoding.video_frames, LAYOUTS[r.benchmark] if layout == "benchmark" else None))
    if pending:
        sampling = SamplingConfig(temperature=decoding.temperature, max_new_tokens=decoding.max_new_tokens,
                                  stop_token_ids=(tokenizer.im_end_id,), pad_token_id=tokenizer.pad_id)
        tools = ToolSettings(decoding.max_tool_turns, decoding.max_tool_tokens)
        batches = make_iterator(pending, tokenizer, data_cfg, method.prompt, batch_size, shuffle=False, num_epochs=1,
                                drop_remainder=False, image_cfg=image_cfg)
        for k, batch in enumerate(batches):
            got = collect(model, batch, tokenizer, method, reward_cfg, sampling, 1, decoding.seed + k, tools=tools,
                          blank_fill=blank_fill, image_cfg=image_cfg)
            cache.add([(s.id, r.completion) for s, r in zip(batch.records, got.rollouts)])
            if progress is not None:
                progress(len(batch.records))
    return {r.id: cache.responses[r.id] for r in records if r.id in cache.responses}, skipped


def read_predictions(path: Path) -> dict[str, str]:
    """A JSON object {id: response} or JSONL lines {"id": ..., "response": ...} (or one-pair {id: response})."""
    from spatial_jax.suites import BenchmarkError

    try:
        text = path.read_text(encoding="utf-8-sig")
    except (OSError, UnicodeDecodeError) as e:
        raise BenchmarkError(f"--predictions {path}: cannot read ({e})") from None
    try:
        obj: Any = loads_unique(text)
        lines = None
    except DuplicateKey as e:  # in the object of id -> response: an id given twice
        raise BenchmarkError(f"{path}: {e}") from None
    except json.JSONDecodeError:
        obj, lines = None, text_lines(text)
    out: dict[str, str] = {}
    if isinstance(obj, dict) and set(obj) == {"id", "response"}:  # a JSONL file of one line
        items = [(obj["id"], obj["response"], "line 1")]
    elif isinstance(obj, dict):
        items = [(k, v, "the object") for k, v in obj.items()]
    elif lines is not None:
        items = []
        for number, line in enumerate(lines, 1):
            if not line.strip():
                continue
            try:
                row = loads_unique(line)
            except DuplicateKey as e:
                raise BenchmarkError(f"{path}:{number}: {e}") from None
            except json.JSONDecodeError as e:
                raise BenchmarkError(f"{path}:{number}: not valid JSON ({e.msg})") from None
            if isinstance(row, dict) and "id" in row:
                if "response" not in row:
                    raise BenchmarkError(f"{path}:{number}: missing field 'response'")
                items.append((row["id"], row["response"], f"line {number}"))
            elif isinstance(row, dict) and len(row) == 1:
                items.extend((k, v, f"line {number}") for k, v in row.items())
            else:
                raise BenchmarkError(f"{path}:{number}: expected an object {{id, response}} or {{id: response}}")
    else:
        raise BenchmarkError(f"{path}: expected a JSON object of id -> response, or JSONL lines")
    for rid, response, where in items:
        if not isinstance(response, str):
            raise BenchmarkError(f"{path} {where}: the response of id {rid!r} must be a string")
        if str(rid) in out:
            raise BenchmarkError(f"{path} {where}: id {rid!r} is given twice")
        out[str(rid)] = response
    return out
