"""OmniSpatial test set (qizekun/OmniSpatial, OmniSpatial-test.zip unzipped): `data.json` and one folder of PNGs per
task type. Follows the authors' vlms_eval/qwenvl_eval.py: record {id, question, options, answer (option index),
task_type, sub_task_type}; the image of id `N_k` is `<task_type>/N.png`; the table reports sub_task_type."""

from __future__ import annotations

from pathlib import Path

from spatial_jax.data.benchmarks.record import BenchRecord, Where, find_file, local_file, read_json_list
from spatial_jax.data.sample import LETTERS

NAME = "omnispatial"


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
        task_type = where.text(obj, "task_type")
        out.append(BenchRecord(
            benchmark=NAME, id=rid, question=where.text(obj, "question"), options=tuple(options),
            answer=LETTERS[answer], answer_type="choice", category=where.text(obj, "sub_task_type"),
            images=(local_file(base, f"{task_type}/{rid.split('_')[0]}.png", where, "id"),),
            extra={"task_type": task_type}, origin=str(where)))
    return out
