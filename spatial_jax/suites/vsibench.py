"""VSI-Bench (nyu-visionx/VSI-Bench): the question table (`test.parquet`, parquet shards, or `test.jsonl`) with
{id, dataset, scene_name, question_type, question, options (list, null for numeric questions), ground_truth}, and
the videos unzipped as `<dataset>/<scene_name>.mp4`, as the authors' lmms_eval/tasks/vsibench/utils.py reads them.
The tiny split: the AlloSpatial paper (Sec. 4.1, "Datasets") calls it "the official Tiny split of VSI-Bench" with 392
questions, but names no file, card or selection rule, and no tiny VSI-Bench split is in this project's reference
index; so the loader reads a table of VSI-Bench's own fields whose file name contains `tiny` (the 392 is not
enforced, as nothing says how the split is distributed).

Layout: the authors' lmms_eval task: the question, an "Options:" line and the options as given (`A. left`), then
its post-prompt (restated here): the option's letter directly, or a single word or number for a numeric question.

VSI-Bench (and its tiny split), scored as the authors' lmms_eval/tasks/vsibench/utils.py
(vision-x-nyu/thinking-in-space) scores it, quirks included.

The prediction is the response's first space-separated token with trailing periods stripped, then whitespace
(so "B.\\n" keeps its period and misses, "3 meters" reads 3). Multiple choice: that token equals the gold letter,
case-insensitive. Numeric: the token as a float, scored by MRA over thresholds 0.50:0.95:0.05
(|pred - gt| / gt <= 1 - threshold); a token that is no number ("3m", "Answer:") scores 0. Table: the mean per
question type, where object_rel_direction_{easy,medium,hard} merge into object_rel_direction as the sum of the
three means over 3 (a missing one adds 0, and the merged row is always present); overall: the unweighted mean of
the rows."""

from __future__ import annotations

from pathlib import Path

from spatial_jax.suites.extract import mra
from spatial_jax.suites.layout import Layout
from spatial_jax.suites.record import (
    BenchmarkError,
    BenchRecord,
    Where,
    find_file,
    local_file,
    read_jsonl,
    read_parquet,
)
from spatial_jax.suites.table import Cell, Table, by_category, mean_of

CHOICE_TYPES = ("object_rel_direction_easy", "object_rel_direction_medium", "object_rel_direction_hard",
                "object_rel_distance", "route_planning", "obj_appearance_order")
NUMERIC_TYPES = ("object_abs_distance", "object_counting", "object_size_estimation", "room_size_estimation")
LAYOUT = Layout(header="Options:", choice="Answer directly with the letter of the correct option.",
                number="Answer with a single word or number.")


def _rows(path: Path) -> list[tuple[str, dict]]:
    if path.suffix == ".jsonl":
        return [(f"line {n}", obj) for n, obj in read_jsonl(path)]
    return [(f"row {i}", row) for i, row in enumerate(read_parquet(path))]


def _load(path: Path, name: str) -> list[BenchRecord]:
    base = path.parent.parent if path.parent.name in ("data", "tiny") else path.parent
    out = []
    for what, row in _rows(path):
        where = Where(path, what + (f" (id {row.get('id')})" if isinstance(row, dict) else ""))
        qtype = where.text(row, "question_type")
        truth = where.field(row, "ground_truth", (str, int, float))
        video = local_file(base, f"{where.text(row, 'dataset')}/{where.text(row, 'scene_name')}.mp4", where,
                           "scene_name")
        if qtype in NUMERIC_TYPES:
            try:
                answer: str | float = float(truth)
            except ValueError:
                raise where.error(f"field 'ground_truth' = {truth!r} of numeric type {qtype} is no number") from None
            kind, options = "number", ()
        elif qtype in CHOICE_TYPES:
            options = tuple(where.strings(row, "options"))
            kind, answer = "choice", str(truth).strip()
        else:
            raise where.error(f"field 'question_type' = {qtype!r} is none of VSI-Bench's question types")
        out.append(BenchRecord(
            benchmark=name, id=where.ident(row, "id"), question=where.text(row, "question"),
            options=tuple(_strip_letter(o) for o in options), answer=answer, answer_type=kind, category=qtype,
            video=video, extra={"options_as_given": list(options), "ground_truth": str(truth)}, origin=str(where)))
    return out


def _strip_letter(option: str) -> str:
    """VSI-Bench writes options as `A. text`; the record keeps the text (letters follow the order)."""
    return option[3:] if len(option) > 2 and option[1] == "." and option[0].isalpha() else option


def load(root: Path) -> list[BenchRecord]:
    return _load(find_file(root, ("test.parquet", "test-*.parquet", "data/test-*.parquet", "test.jsonl"), "vsibench"),
                 "vsibench")


def load_tiny(root: Path) -> list[BenchRecord]:
    try:
        path = find_file(root, ("*tiny*.parquet", "*tiny*.jsonl", "tiny/*.parquet"), "vsibench-tiny")
    except BenchmarkError as e:
        raise BenchmarkError(f"{e}; the tiny split is a table of VSI-Bench's fields named *tiny*") from None
    return _load(path, "vsibench-tiny")


VARIANTS = ("thinking_in_space",)
DIRECTIONS = ("object_rel_direction_easy", "object_rel_direction_medium", "object_rel_direction_hard")
ORDER = ("object_counting", "object_abs_distance", "object_size_estimation", "room_size_estimation",
         "object_rel_distance", "object_rel_direction", "route_planning", "obj_appearance_order")


def token(response: str) -> str:
    return response.split(" ")[0].rstrip(".").strip()


def _float(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


def score(record: BenchRecord, response: str, variant: str) -> tuple[float, str]:
    pred = token(response)
    if record.category in CHOICE_TYPES:
        return float(pred.lower() == str(record.answer).lower()), pred
    value = _float(pred)
    return (0.0 if value is None else mra(value, float(record.answer))), pred


def tabulate(records: list[BenchRecord], scores: list[float], variant: str) -> Table:
    cells = by_category([r.category for r in records], scores)
    parts = [cells.pop(d, Cell(0.0, 0.0, 0)) for d in DIRECTIONS]
    cells["object_rel_direction"] = mean_of(parts)
    rows = {k: cells[k] for k in ORDER if k in cells}
    rows.update({k: v for k, v in cells.items() if k not in rows})
    return Table(records[0].benchmark if records else "vsibench", variant, rows, mean_of(list(rows.values())),
                 "unweighted mean over the question types (relative direction merged from its three levels)")
