"""Tiny copies of published training sets, each in its authors' layout, written from the synthetic world's questions
and pictures (so the tiny model can read them). Where a layout detail is not fixed by the card or the authors'
loading code, the writer says so in a comment ("inferred"). Every writer returns (spec, the samples it wrote)."""

from __future__ import annotations

import io
import json
import zipfile
from pathlib import Path

import numpy as np
import pytest

from spatial_jax.data.sample import LETTERS, Sample
from spatial_jax.data.sources import open_spec
from spatial_jax.data.synthetic import SyntheticConfig, SyntheticSource

BLANK = np.zeros((8, 8, 3), np.uint8)  # a picture for rows where any will do


def row_error(spec: str, index: int = 0, **kw) -> str:
    """The one-line message reading row `index` of `spec` raises (open_spec's keywords in kw)."""
    with pytest.raises(ValueError) as e:
        open_spec(spec, **kw)[index]
    return str(e.value)


def write_zip(path: Path, members: dict[str, bytes | str]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as z:
        for name, data in members.items():
            z.writestr(name, data)
    return path


def samples(n: int, seed: int = 0) -> list[Sample]:
    return list(SyntheticSource(SyntheticConfig(seed=seed), "train", n))


def png(image: np.ndarray) -> bytes:
    from PIL import Image

    buf = io.BytesIO()
    Image.fromarray(image).save(buf, format="PNG")
    return buf.getvalue()


def lettered(s: Sample) -> str:
    return "\n".join(f"{LETTERS[k]}. {o}" for k, o in enumerate(s.options))


def text_question(s: Sample) -> str:
    """The question of `s` asked without its options, for a short text answer (SPEC section 10)."""
    return s.question + " Answer with the word."


def text_gold(s: Sample) -> str:
    """The gold option's text, written as a person would (capitalised, a full stop)."""
    return s.options[LETTERS.index(s.answer)].capitalize() + "."


def cot(s: Sample) -> str:
    """A completion for the SFT stage: SpatialThinker's, whose `<answer>(B) below</answer>` tag also states the gold."""
    return s.reference["spatialthinker"]


def _parquet(rows: list[dict], path: Path, row_group_size: int | None = None) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(rows), path, row_group_size=row_group_size)


def _jsonl(rows: list[dict], path: Path) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _save(image: np.ndarray, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(png(image))


def verl(root: Path, ss: list[Sample]):
    """geo3k.py's row shape; `extra_info.cot` is this test's addition (verl's RL rows hold no completion), named to
    the reader by the spec's `?reference=`."""
    rows = [{"data_source": "tiny_world", "prompt": [{"role": "user", "content": "<image>" + s.question + "\n"
                                                      + lettered(s) + " Think, then answer."}],
             "images": [{"bytes": png(s.image), "path": None}], "ability": "spatial",
             "reward_model": {"style": "rule", "ground_truth": s.answer},
             "extra_info": {"split": "train", "index": i, "answer": s.answer,
                            "question": s.question + "\n" + lettered(s), "cot": cot(s)}}
            for i, s in enumerate(ss)]
    if len(ss) > 1:  # verl's RLHFDataset takes a row with no images as a text prompt
        rows[-1]["images"] = []
        rows[-1]["prompt"][0]["content"] = rows[-1]["prompt"][0]["content"].removeprefix("<image>")
    _parquet(rows, root / "train.parquet")
    return f"verl:{root / 'train.parquet'}?reference=extra_info.cot"


def easyr1(root: Path, ss: list[Sample]):
    """JSON lines with image paths under an image_dir (EasyR1's data.image_dir); `<image>` marks the picture; the
    question in `problem`, as EasyR1's examples/config.yaml (prompt_key: problem) and hiyouga/geometry3k have it."""
    rows = []
    for i, s in enumerate(ss):
        _save(s.image, root / "media" / f"{i}.png")
        rows.append({"id": f"e{i}", "problem": "<image>" + s.question + "\n" + lettered(s), "answer": s.answer,
                     "images": [f"{i}.png"], "cot": cot(s)})
    if len(ss) > 1:  # the first row asks for a short text answer, as geometry3k-style sets do
        rows[0].update(problem="<image>" + text_question(ss[0]), answer=text_gold(ss[0]))
    _jsonl(rows, root / "train.jsonl")
    return f"easyr1:{root / 'train.jsonl'}?image_dir={root / 'media'}&reference=cot"


def trl(root: Path, ss: list[Sample]):
    """A conversational prompt with an image part and one embedded `image`; the gold in `solution` written as an
    answer tag around the option's text (inferred from trl's vision GRPO examples, whose sets carry `solution`)."""
    rows = [{"id": f"t{i}", "prompt": [{"role": "user", "content": [
                {"type": "image", "text": None}, {"type": "text", "text": s.question + "\n" + lettered(s)}]}],
             "image": {"bytes": png(s.image), "path": None},
             "solution": f"<answer>{s.options[LETTERS.index(s.answer)]}</answer>", "cot": cot(s)}
            for i, s in enumerate(ss)]
    if len(ss) > 1:  # TRL's vision sets keep a text gold in `solution` (a direction, an object name)
        rows[0]["prompt"][0]["content"][1]["text"] = text_question(ss[0])
        rows[0]["solution"] = f"<answer>{text_gold(ss[0])}</answer>"
    _parquet(rows, root / "data" / "train-00000-of-00001.parquet")
    return f"trl:{root}:train?reference=cot"


def stvqa_rows(ss: list[Sample]) -> list[dict]:
    """The card's features; the values' forms (`A. x` options, `(B) x` gold) are inferred (see stvqa7k.py)."""
    return [{"image_id": f"img{i}", "images": {"bytes": png(s.image), "path": f"img{i}.png"},
             "problem": s.question + "\n" + lettered(s) + "\nAnswer with the option's letter.",
             "question_only": s.question, "answer": cot(s), "answer_only": s.answer,
             "answer_text": s.options[LETTERS.index(s.answer)], "answer_option_text": s.answer_text,
             "answer_option_text_only": s.answer_text, "category": s.category, "level": "easy",
             "question_with_options": s.question + "\n" + lettered(s),
             "options": [f"{LETTERS[k]}. {o}" for k, o in enumerate(s.options)], "rating": 5}
            for i, s in enumerate(ss)]


def stvqa7k(root: Path, ss: list[Sample]):
    _parquet(stvqa_rows(ss), root / "data" / "train-00000-of-00001.parquet")
    _parquet(stvqa_rows(ss[:1]), root / "data" / "val-00000-of-00001.parquet")
    return f"stvqa7k:{root}:train"


def hf_disk(root: Path, ss: list[Sample]):
    """DatasetDict.save_to_disk: dataset_dict.json, and per split an Arrow stream file, state.json and
    dataset_info.json (written here with pyarrow as datasets writes them); the rows are STVQA-7K's."""
    import pyarrow as pa

    folder = root / "train"
    folder.mkdir(parents=True)
    table = pa.Table.from_pylist(stvqa_rows(ss))
    with pa.OSFile(str(folder / "data-00000-of-00001.arrow"), "wb") as sink, pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    (folder / "state.json").write_text(json.dumps({"_data_files": [{"filename": "data-00000-of-00001.arrow"}],
                                                   "_split": "train", "_format_type": None}))
    (folder / "dataset_info.json").write_text(json.dumps({"features": {}}))
    (root / "dataset_dict.json").write_text(json.dumps({"splits": ["train"]}))
    return f"hf-disk:{root}:train"


def omnispatial_train(root: Path, ss: list[Sample], task: str = "Perspective_Taking"):
    """The test zip's layout under one top folder (inferred for the training zip); `cot` is this test's addition."""
    root.mkdir(parents=True, exist_ok=True)
    records = [{"id": f"{i}_0", "question": s.question, "options": list(s.options),
                "answer": LETTERS.index(s.answer), "task_type": task, "sub_task_type": "Allocentric", "cot": cot(s)}
               for i, s in enumerate(ss)]
    path = root / "OmniSpatial-train.zip"
    with zipfile.ZipFile(path, "w") as z:
        z.writestr("OmniSpatial-train/data.json", json.dumps(records))
        for i, s in enumerate(ss):
            z.writestr(f"OmniSpatial-train/{task}/{i}.png", png(s.image))
    return f"omnispatial-train:{path}?reference=cot"


def mindcube_train(root: Path, ss: list[Sample]):
    """MindCube's record with two views per question (the second a mirror: any picture will do here); the file
    name raw/MindCube_train.jsonl is inferred. `cot` is this test's addition."""
    rows = []
    for i, s in enumerate(ss):
        names = [f"other_all_image/around/{i}_{v}.png" for v in range(2)]
        _save(s.image, root / names[0])
        _save(s.image[:, ::-1].copy(), root / names[1])
        inline = " ".join(f"{LETTERS[k]}. {o}" for k, o in enumerate(s.options))
        rows.append({"id": f"around_{i}", "question": f"{s.question} {inline}", "gt_answer": s.answer,
                     "images": names, "cot": cot(s)})
    _jsonl(rows, root / "raw" / "MindCube_train.jsonl")
    return f"mindcube-train:{root}?reference=cot"


def spar7m(root: Path, ss: list[Sample]):
    """LLaVA-style rows, images under the unpacked scene folders (paths inferred)."""
    rows = []
    for i, s in enumerate(ss):
        name = f"scannet/images/scene{i:04d}/0.png"
        _save(s.image, root / name)
        rows.append({"id": f"spar{i}", "image": name, "type": "position_matching",
                     "conversations": [{"from": "human", "value": "<image>\n" + s.question + "\n" + lettered(s)},
                                       {"from": "gpt", "value": cot(s)}]})
    _jsonl(rows, root / "spar_train.jsonl")
    return f"spar7m:{root / 'spar_train.jsonl'}"


def mp4(frames: list[np.ndarray], path: Path, fps: int = 2) -> None:
    import av

    path.parent.mkdir(parents=True, exist_ok=True)
    with av.open(str(path), "w") as out:
        stream = out.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = frames[0].shape[1], frames[0].shape[0], "yuv420p"
        for f in frames:
            out.mux(stream.encode(av.VideoFrame.from_ndarray(f, format="rgb24")))
        out.mux(stream.encode())


def vsi590k(root: Path, ss: list[Sample], frames: int = 4):
    """LLaVA-style rows with a video each (the picture held still for `frames` frames at 2 fps); the last question
    is a numeric one (how many objects), its gold a number. Paths and field names inferred."""
    rows = []
    for i, s in enumerate(ss):
        name = f"scannet/scene{i:04d}.mp4"
        mp4([s.image] * frames, root / name)
        numeric = i == len(ss) - 1
        human = "How many objects are in the room?" if numeric else s.question + "\n" + lettered(s)
        rows.append({"id": f"vsi{i}", "video": name, "question_type": "object_counting" if numeric
                     else "object_rel_direction_easy",
                     "conversations": [{"from": "human", "value": "<video>\n" + human},
                                       {"from": "gpt", "value": "2" if numeric else cot(s)}]})
    _jsonl(rows, root / "vsi_590k.jsonl")
    return f"vsi590k:{root / 'vsi_590k.jsonl'}"


WRITERS = {"verl": verl, "easyr1": easyr1, "trl": trl, "hf-disk": hf_disk, "stvqa7k": stvqa7k,
           "omnispatial-train": omnispatial_train, "mindcube-train": mindcube_train, "spar7m": spar7m,
           "vsi590k": vsi590k}


def write_all(root: Path, n: int = 4, seed: int = 0) -> dict[str, tuple[str, list[Sample]]]:
    """Every layout's copy under root/<layout>, n synthetic questions each: layout -> (spec, samples)."""
    ss = samples(n, seed)
    return {name: (write(root / name, ss), ss) for name, write in WRITERS.items()}
