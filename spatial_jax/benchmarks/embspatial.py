"""EmbSpatial-Bench (Phineas476/EmbSpatial-Bench): `embspatial_bench.json`, a JSON list of {question_id, question,
answer_options (list), answer (option index), image (base64), relation, data_source}; the table reports the six
relations.

Layout: the question, then `A. option` lines, then an instruction to answer with the option's letter (this project's
words: the authors publish no prompt, only the README)."""

from __future__ import annotations

from pathlib import Path

from spatial_jax.benchmarks.layout import Layout
from spatial_jax.benchmarks.record import BenchRecord, Where, embedded_image, find_file, read_json_list
from spatial_jax.data.sample import LETTERS

NAME = "embspatial"
LAYOUT = Layout(choice="Answer with the letter of the correct option only.")


def load(root: Path) -> list[BenchRecord]:
    path = find_file(root, ("embspatial_bench.json",), NAME)
    out = []
    for i, obj in enumerate(read_json_list(path)):
        where = Where(path, f"record {i}" + (f" (question_id {obj.get('question_id')})" if isinstance(obj, dict)
                                             else ""))
        options = where.strings(obj, "answer_options")
        answer = where.field(obj, "answer", int)
        if not 0 <= answer < len(options):
            raise where.error(f"field 'answer' = {answer} is outside the {len(options)} options")
        out.append(BenchRecord(
            benchmark=NAME, id=where.ident(obj, "question_id"), question=where.text(obj, "question"),
            options=tuple(options), answer=LETTERS[answer], answer_type="choice",
            category=where.text(obj, "relation"), images=(embedded_image(where.field(obj, "image"), where, "image"),),
            extra={"data_source": obj.get("data_source") or ""}, origin=str(where)))
    return out
