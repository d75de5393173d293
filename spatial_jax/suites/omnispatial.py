"""OmniSpatial test set (qizekun/OmniSpatial, OmniSpatial-test.zip unzipped): `data.json` and one folder of PNGs per
task type. Follows the authors' vlms_eval/qwenvl_eval.py: record {id, question, options, answer (option index),
task_type, sub_task_type}; the image of id `N_k` is `<task_type>/N.png`; the table reports sub_task_type.

The same `id` occurs under different task types in the real `data.json` (the authors file each question's image
under `<task_type>/`), so a record is keyed `<task_type>_<id>`, as prediction files key it.

Layout (qwenvl_eval.py and vlms_eval/system_prompts.py): the question, then one `A. option` line per option; the
answer instruction is their "direct" format's (reply with the letter alone), the one whose official extraction
(`--variant direct`) reads a final answer that is the letter alone.

OmniSpatial, scored as the authors' vlms_eval/qwenvl_eval.py (qizekun/OmniSpatial) scores it.

Variant "re" (their default eval_type): the last match of `Answer\\s*:\\s*([A-D])\\b`, case-insensitive, is the
prediction, "A" when nothing matches; it must equal the gold letter exactly, so a lower-case "answer: b" is wrong
and a response without an "Answer:" line counts as "A". Variant "direct": the response's first character,
upper-cased (the variant a policy's final answer, the letter alone, is scored with: its layout asks for that).
Overall: every question counts once (their Total); groups: the four task types; rows: the ten
sub-task types in their blank_stats order. (They average five repeats of the whole set; one response per id
here.)"""

from __future__ import annotations

import re
from pathlib import Path

from spatial_jax.data.sample import LETTERS
from spatial_jax.suites.layout import Layout
from spatial_jax.suites.record import BenchRecord, Where, find_file, local_file, read_json_list
from spatial_jax.suites.table import Cell, Table, by_category

NAME = "omnispatial"
SUB_TASK_TYPES = ("Manipulation", "Motion_Analysis", "Traffic_Analysis", "Localization", "Geospatial_Strategy",
                  "Pattern_Recognition", "Geometric_Reasoning", "Egocentric", "Allocentric", "Hypothetical")
TASK_TYPES = ("Dynamic_Reasoning", "Spatial_Interaction", "Complex_Logic", "Perspective_Taking")
LAYOUT = Layout(choice="Answer with the letter of the correct option only (A-{last}), nothing else.")


def load(root: Path) -> list[BenchRecord]:
    path = find_file(root, ("data.json",), NAME)
    base = path.parent
    out = []
    for i, obj in enumerate(read_json_list(path)):
        where = Where(path, f"record {i}" + (f" (id {obj.get('id')})" if isinstance(obj, dict) else ""))
        rid = where.ident(obj, "id")
        options = where.strings(obj, "options")
        answer = where.field(obj, "answer", int)
        if not 0 <= answer < len(options):
            raise where.error(f"field 'answer' = {answer} is outside the {len(options)} options")
        task_type = where.category(obj, "task_type", TASK_TYPES, NAME)
        out.append(BenchRecord(
            benchmark=NAME, id=f"{task_type}_{rid}", question=where.text(obj, "question"), options=tuple(options),
            answer=LETTERS[answer], answer_type="choice",
            category=where.category(obj, "sub_task_type", SUB_TASK_TYPES, NAME),
            images=(local_file(base, f"{task_type}/{rid.split('_')[0]}.png", where, "id"),),
            extra={"task_type": task_type}, origin=str(where)))
    return out


VARIANTS = ("re", "direct")
ANSWER_VARIANT = "direct"  # a policy's final answer is the letter alone, as the direct format asks
_PATTERN = re.compile(r"Answer\s*:\s*([A-D])\b", re.IGNORECASE)


def score(record: BenchRecord, response: str, variant: str) -> tuple[float, str]:
    if variant == "direct":
        pred = response.strip().upper()[:1]
    else:
        hits = _PATTERN.findall(response)
        pred = hits[-1] if hits else "A"
    return float(pred == record.answer), pred


def tabulate(records: list[BenchRecord], scores: list[float], variant: str) -> Table:
    cats = [r.category for r in records]
    groups = {t: Cell.of([s for r, s in zip(records, scores) if r.extra["task_type"] == t]) for t in TASK_TYPES
              if any(r.extra["task_type"] == t for r in records)}
    return Table(NAME, variant, by_category(cats, scores, SUB_TASK_TYPES), Cell.of(scores),
                 "accuracy over all questions (each counts once)", groups)
