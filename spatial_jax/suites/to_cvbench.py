"""A dataset's multiple-choice image questions written as a CV-Bench copy: the card's `test_2d.jsonl` beside an
`img/` folder, the layout spatial_jax/suites/cvbench.py reads. `spatial-jax eval --benchmark cvbench` then evaluates
the questions `spatial-jax eval` evaluates as a dataset (the synthetic world's held-out ones, say), so the two can be
compared question by question.

Each sample becomes one 2D record {idx, type "2D", task, question, choices, answer "(X)", source, filename}: idx its
position, task its category as CV-Bench names the task (TASKS), its image saved as PNG (lossless: the pixels the
dataset holds). CV-Bench names the dataset each 2D image came from (ADE20K or COCO) and refuses any other; a converted
image comes from neither, so the caller names the one its records are filed under: it names the table's row and
nothing else (both are scored alike). `sample_id` keeps the sample's id (a field the loader does not read).
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from pathlib import Path

from spatial_jax.data.sample import Sample
from spatial_jax.suites.cvbench import SOURCES
from spatial_jax.suites.record import BenchmarkError

# the dataset's category -> CV-Bench's 2D task of the same kind of question
TASKS = {"relative_position": "Relation", "counting": "Count"}
TWO_D = tuple(s for s in SOURCES if s != "Omni3D")
FILE = "test_2d.jsonl"


def record(sample: Sample, idx: int, source: str) -> dict:
    """The CV-Bench row of one sample (its image written separately, as `filename`)."""
    where = sample.origin or f"sample {sample.id!r}"
    if sample.image is None or sample.answer_type != "choice":
        raise BenchmarkError(f"{where}: only single-image multiple-choice questions have a CV-Bench record")
    if sample.category not in TASKS:
        raise BenchmarkError(f"{where}: category {sample.category!r} has no CV-Bench task; convertible: "
                             f"{sorted(TASKS)}")
    if len(sample.options) > 6:  # CV-Bench answers are (A) to (F)
        raise BenchmarkError(f"{where}: {len(sample.options)} options, CV-Bench's answers name at most 6")
    task = TASKS[sample.category]
    return {"idx": idx, "type": "2D", "task": task, "question": sample.question, "choices": list(sample.options),
            "answer": f"({sample.answer})", "source": source,
            "filename": f"img/2D/{task.lower()}/{source.lower()}_{idx}.png", "sample_id": sample.id}


def write(samples: Iterable[Sample], out: str | Path, source: str = "COCO") -> int:
    """Writes `out`/test_2d.jsonl and its images; `out` must not hold a copy yet. Returns the number of records."""
    from PIL import Image

    if source not in TWO_D:
        raise BenchmarkError(f"source {source!r} is none of CV-Bench's 2D sources {list(TWO_D)}")
    out = Path(out)
    if (out / FILE).exists():
        raise BenchmarkError(f"{out / FILE} exists; write the copy to a new folder")
    rows = []
    for idx, sample in enumerate(samples):
        row = record(sample, idx, source)
        image = out / row["filename"]
        image.parent.mkdir(parents=True, exist_ok=True)
        Image.fromarray(sample.load_images()[0]).save(image)
        rows.append(row)
    (out / FILE).write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return len(rows)


__all__ = ["FILE", "TASKS", "record", "write"]
