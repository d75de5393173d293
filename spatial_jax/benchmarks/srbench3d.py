"""3DSRBench (ccvl/3DSRBench): `3dsrbench_v1_vlmevalkit_circular.tsv`, the VLMEvalKit TSV with flip augmentation
and circular option orders, the file the authors name for reproducing their results. Columns: index, qid (the
8-character question id, `-flip` and `-N` suffixes for the flipped and rotated variants), question, A-D (empty when
a question has fewer options), answer (letter), category (one of the twelve subtypes, e.g. height_higher; any other
is an error), image (base64).

Layout: VLMEvalKit's multiple-choice prompt, which the authors' results are made with: the question, an "Options:"
line, `A. option` lines, and an instruction to pick one of them (in this project's words)."""

from __future__ import annotations

from pathlib import Path

from spatial_jax.benchmarks.layout import Layout
from spatial_jax.benchmarks.record import BenchRecord, Where, embedded_image, find_file, read_tsv

NAME = "3dsrbench"
# subtype -> main category, as the authors' result script groups them
MAIN = {
    "height_higher": "height", "location_above": "location", "location_closer_to_camera": "location",
    "location_next_to": "location", "orientation_in_front_of": "orientation", "orientation_on_the_left": "orientation",
    "orientation_viewpoint": "orientation", "multi_object_closer_to": "multi_object",
    "multi_object_facing": "multi_object", "multi_object_viewpoint_towards_object": "multi_object",
    "multi_object_parallel": "multi_object", "multi_object_same_direction": "multi_object",
}
LAYOUT = Layout(header="Options:", choice="Select the correct answer from the options above: its letter only.")


def load(root: Path) -> list[BenchRecord]:
    path = find_file(root, ("3dsrbench_v1_vlmevalkit_circular.tsv", "*circular*.tsv", "*.tsv"), NAME)
    out = []
    for number, row in read_tsv(path):
        where = Where(path, f"row {number}" + (f" (index {row.get('index')})" if row.get("index") else ""))
        where.category(row, "category", tuple(MAIN), NAME)
        for key in ("index", "question", "answer", "image", "A", "B"):
            if not row.get(key):
                raise where.error(f"missing field '{key}'")
        options = tuple(row[c] for c in "ABCD" if row.get(c) and row[c].lower() != "nan")
        answer = row["answer"].strip()
        if answer not in "ABCD"[: len(options)] or len(answer) != 1:
            raise where.error(f"field 'answer' = {answer!r} names none of the {len(options)} options")
        index = row["index"]
        out.append(BenchRecord(
            benchmark=NAME, id=index, question=row["question"], options=options, answer=answer,
            answer_type="choice", category=row["category"],
            images=(embedded_image(row["image"], where, "image"),),
            extra={"qid": row.get("qid") or None}, origin=str(where)))
    return out
