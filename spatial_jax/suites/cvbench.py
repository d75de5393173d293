"""CV-Bench (nyu-visionx/CV-Bench). The card's current files are `test_2d.parquet` and `test_3d.parquet` (images
embedded) with `test_2d.jsonl` and `test_3d.jsonl` for an `img/` folder (the repository's build_img.py rebuilds it);
copies made before the card's "separate out '2d' and '3d' splits" commit hold one `test.parquet` or `test.jsonl`.
Either layout reads: the single file when present, else both split files (parquet before JSONL). Records {idx, type
(2D/3D), task (Count, Relation, Depth, Distance), question, choices (list), answer ("(A)"), source (ADE20K, COCO,
Omni3D), image or filename}; a source or task that is none of the card's is an error.

Layout: the card's prompt: the question, an invitation to choose, and `(A) option` lines (restated here), then an
instruction to answer with the option's letter.

CV-Bench, scored as Cambrian's evaluation code scores it (cambrian-mllm/cambrian): `eval/eval/coco/coco_test.py`
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

from pathlib import Path

from spatial_jax.suites.extract import choice_letter
from spatial_jax.suites.layout import Layout
from spatial_jax.suites.record import (
    BenchmarkError,
    BenchRecord,
    Where,
    embedded_image,
    find_file,
    local_file,
    read_jsonl,
    read_parquet,
)
from spatial_jax.suites.table import Cell, Table, by_category, mean_of

NAME = "cvbench"
SOURCES = ("ADE20K", "COCO", "Omni3D")
TASKS = ("Count", "Relation", "Depth", "Distance")
LAYOUT = Layout(option="({label}) {text}", header="Choose from these options:",
                choice="Answer with the letter of the correct option only.")
# One file, or the 2D and 3D halves; the first layout found wins.
LAYOUTS = (("test.parquet",), ("test_2d.parquet", "test_3d.parquet"), ("test.jsonl",),
           ("test_2d.jsonl", "test_3d.jsonl"))


def files(root: Path) -> list[Path]:
    root = Path(root)
    if root.is_file():
        return [root]
    for layout in LAYOUTS:
        found = [root / name for name in layout if (root / name).is_file()]
        if found:
            return found
    find_file(root, tuple(name for layout in LAYOUTS for name in layout), NAME)  # raises, naming what it sought
    raise BenchmarkError(f"{NAME}: no copy under {root}")


def _read(path: Path) -> list[BenchRecord]:
    rows = ([(f"line {n}", obj) for n, obj in read_jsonl(path)] if path.suffix == ".jsonl"
            else [(f"row {i}", row) for i, row in enumerate(read_parquet(path))])
    out = []
    for what, row in rows:
        where = Where(path, what + (f" (idx {row.get('idx')})" if isinstance(row, dict) else ""))
        choices = where.strings(row, "choices")
        answer = where.text(row, "answer").strip()
        letter = answer.strip("()")[:1]
        if not (answer.startswith("(") and letter in "ABCDEF"[: len(choices)]):
            raise where.error(f"field 'answer' = {answer!r} is no '(letter)' of the {len(choices)} choices")
        if path.suffix == ".jsonl":
            image = local_file(path.parent, where.text(row, "filename"), where, "filename")
        else:
            image = embedded_image(where.field(row, "image"), where, "image")
        out.append(BenchRecord(
            benchmark=NAME, id=where.ident(row, "idx"), question=where.text(row, "question"),
            options=tuple(choices), answer=letter, answer_type="choice",
            category=where.category(row, "source", SOURCES, NAME), images=(image,),
            extra={"task": where.category(row, "task", TASKS, NAME), "type": where.text(row, "type")},
            origin=str(where)))
    return out


def load(root: Path) -> list[BenchRecord]:
    out = [r for path in files(root) for r in _read(path)]
    seen: dict[str, str] = {}
    for r in out:
        if r.id in seen:
            raise BenchmarkError(f"{r.origin}: idx {r.id} repeats {seen[r.id]}; predictions could not tell them apart")
        seen[r.id] = r.origin
    return out


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
