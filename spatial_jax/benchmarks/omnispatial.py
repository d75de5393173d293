"""OmniSpatial test set (qizekun/OmniSpatial, OmniSpatial-test.zip unzipped): `data.json` and one folder of PNGs per
task type. Follows the authors' vlms_eval/qwenvl_eval.py: record {id, question, options, answer (option index),
task_type, sub_task_type}; the image of id `N_k` is `<task_type>/N.png`; the table reports sub_task_type.

The same `id` occurs under different task types in the real `data.json` (the authors file each question's image
under `<task_type>/`), so a record is keyed `<task_type>_<id>`, as prediction files key it.

Layout (qwenvl_eval.py and vlms_eval/system_prompts.py): the question, then one `A. option` line per option; the
answer instruction is their "direct" format's (reply with the letter alone), the one whose official extraction
(`--variant direct`) reads a final answer that is the letter alone."""

from __future__ import annotations

from pathlib import Path

from spatial_jax.benchmarks.layout import Layout
from spatial_jax.benchmarks.record import BenchRecord, Where, find_file, local_file, read_json_list
from spatial_jax.data.sample import LETTERS

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
