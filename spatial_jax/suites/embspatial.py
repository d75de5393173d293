"""EmbSpatial-Bench (Phineas476/EmbSpatial-Bench): `embspatial_bench.json`, a JSON list of {question_id, question,
answer_options (list), answer (option index), image (base64), relation, data_source}; the table reports the six
relations.

Layout: the question, then `A. option` lines, then an instruction to answer with the option's letter (this project's
words: the authors publish no prompt, only the README).

EmbSpatial-Bench. No official scorer exists to follow: the authors' repository (mengfeidu/EmbSpatial-Bench)
holds a README and figures, no evaluation code. The README names two ways to evaluate the multiple-choice questions,
generation and likelihood; this scorer is the generation one (a model that answers in text), and no other authors'
code for it is in this project's reference index (third-party ports exist, e.g. lmms-eval's; they are not the
authors'). The prediction is the project's letter rule (extract.choice_letter), right when it equals the gold
option's letter. Overall: every question counts once; rows: the six spatial relations."""

from __future__ import annotations

from pathlib import Path

from spatial_jax.data.sample import LETTERS
from spatial_jax.suites.extract import choice_letter
from spatial_jax.suites.layout import Layout
from spatial_jax.suites.record import BenchRecord, Where, embedded_image, find_file, read_json_list
from spatial_jax.suites.table import Cell, Table, by_category

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


VARIANTS = ("letter",)


def score(record: BenchRecord, response: str, variant: str) -> tuple[float, str | None]:
    pred = choice_letter(response, len(record.options))
    return float(pred == record.answer), pred


def tabulate(records: list[BenchRecord], scores: list[float], variant: str) -> Table:
    return Table(NAME, variant, by_category([r.category for r in records], scores), Cell.of(scores),
                 "accuracy over all questions (each counts once)")
