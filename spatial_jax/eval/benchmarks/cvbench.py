"""CV-Bench, scored as Cambrian's evaluation code scores it (cambrian-mllm/cambrian): `eval/eval/coco/coco_test.py`
for the 2D questions (the ADE20K scorer `eval/eval/ade/` holds no test script in this project's reference index; the
COCO one, which names its output after ADE, is used for both 2D sources) and `eval/eval/omni/omni_test.py` for the
3D (Omni3D) questions. Extraction ("cambrian", the default): lower-case and strip the response; for each of
"answer is", "answer is:", "answer:" in turn, when it occurs keep what follows its last occurrence; strip, drop
trailing "." (3D: trailing ".", ":" and ","), one leading "(" pass and trailing ")"; keep the first character. A 2D
response is right when that equals the gold letter (lower case); a 3D one also when it equals the gold option's text
verbatim (so a one-character option such as "3" counts). Accuracy per source, as each script's overall. The card
(nyu-visionx/CV-Bench README) combines them: 2D = the mean of the ADE20K and COCO accuracies, 3D = the Omni3D
accuracy, overall = the mean of 2D and 3D. "letter": the project's letter rule (extract.choice_letter). Rows: the
three sources, then the four tasks."""

from __future__ import annotations

from spatial_jax.benchmarks.cvbench import SOURCES, TASKS
from spatial_jax.benchmarks.record import BenchRecord
from spatial_jax.eval.benchmarks.extract import choice_letter
from spatial_jax.eval.benchmarks.table import Cell, Table, by_category, mean_of

NAME = "cvbench"
VARIANTS = ("cambrian", "letter")
_KEYWORDS = ("answer is", "answer is:", "answer:")


def cambrian_answer(text: str, three_d: bool) -> str:
    text = text.lower().strip()
    for keyword in _KEYWORDS:
        if keyword in text:
            text = text.split(keyword)[-1]
    text = text.strip().rstrip(".:," if three_d else ".").lstrip("(").rstrip(")")
    return text[:1]


def score(record: BenchRecord, response: str, variant: str) -> tuple[float, str | None]:
    if variant == "letter":
        pred = choice_letter(response, len(record.options))
        return float(pred == record.answer), pred
    three_d = record.category == "Omni3D"
    pred = cambrian_answer(response, three_d)
    gold_text = record.options["ABCDEF".index(record.answer)]
    return float(pred == record.answer.lower() or (three_d and pred == gold_text)), pred or None


def tabulate(records: list[BenchRecord], scores: list[float], variant: str) -> Table:
    sources = by_category([r.category for r in records], scores, SOURCES)
    tasks = by_category([r.extra["task"] for r in records], scores, TASKS)
    groups = {}
    two_d = [sources[s] for s in ("ADE20K", "COCO") if s in sources]
    if two_d:
        groups["2D"] = mean_of(two_d)
    if "Omni3D" in sources:
        groups["3D"] = sources["Omni3D"]
    overall = mean_of(list(groups.values())) if groups else Cell.of([])
    return Table(NAME, variant, {**sources, **{f"task {k}": v for k, v in tasks.items()}}, overall,
                 "mean of 2D (mean of ADE20K and COCO) and 3D (Omni3D)", groups)
