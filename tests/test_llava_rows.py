"""LLaVA conversation rows (data/sources/conversation.py), as VSI-590K's JSON lines and a save_to_disk copy of a
LLaVA set hold them: `conversations` with a human and a gpt turn, `image` (one or a list) or `video`, `id`, and the
category column of the layout (VSI-590K's `question_type`); renamed fields; and each broken row named by file, row
and field, the whole message checked."""

from pathlib import Path

import layout_copies as L
import pytest
from test_hf_disk import save

from spatial_jax.data.sources import open_spec

ASK = "<image>\nWhich object is nearer?\nA. the cube\nB. the ball"


def _talk(human: str = ASK, gpt: str | None = "B") -> list[dict]:
    return [{"from": "human", "value": human}] + ([{"from": "gpt", "value": gpt}] if gpt is not None else [])




@pytest.fixture
def folder(tmp_path) -> Path:
    for name in ("a", "b"):
        L._save(L.BLANK, tmp_path / f"{name}.png")
    (tmp_path / "clip.mp4").write_bytes(b"\0")  # decoded only when the row is encoded
    return tmp_path


def test_rows_read_as_llava_holds_them(folder):
    f = L._jsonl([
        {"id": "v1", "question_type": "object_counting", "conversations": _talk(), "image": "a.png"},
        {"conversations": _talk("<image>\n<image>\nHow far apart are they?", "2.5"), "image": ["a.png", "b.png"]},
        {"conversations": _talk("<video>\nHow many chairs?", "3"), "video": "clip.mp4"},
        {"conversations": _talk("Is a cube round?", "No")}], folder / "rows.jsonl")  # LLaVA's text-only rows
    rows = open_spec(f"vsi590k:{f}")
    got = [(s.id, s.category, s.question, s.options, s.answer, s.image, s.images, s.video and s.video.path)
           for s in rows]
    assert got == [
        ("v1", "object_counting", "Which object is nearer?", ("the cube", "the ball"), "B", str(folder / "a.png"),
         (), None),
        ("vsi590k-1", "", "How far apart are they?", (), 2.5, None, (str(folder / "a.png"), str(folder / "b.png")),
         None),
        ("vsi590k-2", "", "How many chairs?", (), 3.0, None, (), str(folder / "clip.mp4")),
        ("vsi590k-3", "", "Is a cube round?", (), "No", None, (), None)]
    assert [set(s.reference.values()) for s in rows] == [{"B"}, {"2.5"}, {"3"}, {"No"}]  # the reply: the SFT target


def test_renamed_fields(folder):
    row = {"qid": "r", "kind": "depth", "chat": _talk(), "pic": "b.png", "cot": "<think>t</think> B",
           "clip": "clip.mp4", "conversations": _talk("ignored", "A")}
    f = L._jsonl([row, {**row, "cot": None}], folder / "rows.jsonl")
    s = open_spec(f"vsi590k:{f}?conversations=chat&id=qid&category=kind&image=pic&reference=cot")[0]
    assert (s.id, s.category, s.question, s.answer, s.image) == ("r", "depth", "Which object is nearer?", "B",
                                                                 str(folder / "b.png"))
    assert set(s.reference.values()) == {"<think>t</think> B"}
    assert open_spec(f"vsi590k:{f}?conversations=chat&reference=cot")[1].reference == {}  # named, and absent
    assert open_spec(f"vsi590k:{f}?conversations=chat&video=clip")[0].video.path == str(folder / "clip.mp4")


def test_broken_rows_name_file_row_and_field(folder):
    f = L._jsonl([
        {"conversations": _talk(gpt=None), "image": "a.png"},
        {"conversations": _talk(gpt="E"), "image": "a.png"},
        {"conversations": _talk(), "image": "gone.png"},
        {"conversations": _talk(), "image": ["a.png", "gone.png"]},
        {"conversations": _talk("<video>\nHow many?", "3"), "video": "gone.mp4"},
        {"conversations": "B", "image": "a.png"}], folder / "rows.jsonl")
    assert [L.row_error(f"vsi590k:{f}", k) for k in range(6)] == [
        f"{f}:1: field 'conversations' has no 'gpt' turn",
        f"{f}:2: field 'conversations[gpt]' = 'E' is none of the 2 options ['the cube', 'the ball']",
        f"{f}:3: field 'image': image {folder / 'gone.png'} does not exist",
        f"{f}:4: field 'image[1]': image {folder / 'gone.png'} does not exist",
        f"{f}:5: field 'video': video {folder / 'gone.mp4'} does not exist",
        f"{f}:6: field 'conversations' must be a list, got 'B'"]


def test_a_saved_llava_set_reads_the_same(folder):
    """A save_to_disk copy's relative pictures resolve in its split folder, or in data.columns image_dir."""
    saved = save(folder / "saved", [{"id": "s", "type": "depth", "conversations": _talk(), "image": "a.png"}])
    assert L.row_error(f"hf-disk:{saved}") == (
        f"{saved / 'data-00000-of-00001.arrow'} row 0: field 'image': image {saved / 'a.png'} does not exist")
    s = open_spec(f"hf-disk:{saved}?image_dir={folder}")[0]
    assert (s.id, s.category, s.answer, s.image) == ("s", "depth", "B", str(folder / "a.png"))
