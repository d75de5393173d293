"""verl's, EasyR1's and TRL's RL sets as users hold them beyond the tiny copies of test_data_sources.py: a folder of
split files with pictures beside them, each framework's own default keys (RLHFDataset's `prompt`, trl's `answer`
where a set names no `solution`, `images` beside `image`), renamed fields, and rows that break, each message read in
full. Row shapes from verl's examples/data_preprocess/geo3k.py, EasyR1's examples/config.yaml with RLHFDataset's
defaults, and trl's GRPO vision docs (see each reader's module doc)."""

from pathlib import Path

import layout_copies as L
import pytest

from spatial_jax.data.sources import open_spec

QUESTION = "Which object is nearer?\nA. the cube\nB. the ball"


def _row(fmt: str, picture: str | None, gold="A", **extra) -> dict:
    """One row of FMT with one picture (or none), as each framework's published sets write it."""
    if fmt == "verl":
        row = {"prompt": [{"role": "user", "content": ("<image>" if picture else "") + QUESTION}],
               "images": [picture] if picture else [], "reward_model": {"style": "rule", "ground_truth": gold}}
    elif fmt == "easyr1":
        row = {"problem": ("<image>" if picture else "") + QUESTION, "answer": gold,
               "images": [picture] if picture else []}
    else:
        row = {"prompt": QUESTION, "solution": gold, **({"image": picture} if picture else {})}
    return {**row, **extra}





@pytest.mark.parametrize("fmt", ["verl", "easyr1", "trl"])
def test_a_folder_of_splits_reads_the_split_named_its_pictures_beside_it(tmp_path, fmt):
    for name in ("a", "b"):
        L._save(L.BLANK, tmp_path / "img" / f"{name}.png")
    L._jsonl([_row(fmt, "img/a.png"), _row(fmt, None, gold="B")], tmp_path / "train.jsonl")
    test = L._jsonl([_row(fmt, "img/b.png", gold="B")], tmp_path / "test.jsonl")
    train = [(s.id, s.answer, s.image) for s in open_spec(f"{fmt}:{tmp_path}")]  # no split: train, as they default
    assert train == [(f"{fmt}-0", "A", str(tmp_path / "img/a.png")), (f"{fmt}-1", "B", None)]
    assert open_spec(f"{fmt}:{tmp_path}:train")[1].images == ()  # the text-only row
    for spec in (f"{fmt}:{tmp_path}:test", f"{fmt}:{test}"):
        (s,) = open_spec(spec)
        assert (s.id, s.question, s.options, s.answer, s.image) == (
            f"{fmt}-0", "Which object is nearer?", ("the cube", "the ball"), "B", str(tmp_path / "img/b.png"))


@pytest.mark.parametrize(("fmt", "field"), [("verl", "images[0]"), ("easyr1", "images[0]"), ("trl", "image")])
def test_a_missing_picture_is_named_unless_pictures_go_unchecked(tmp_path, fmt, field):
    f = L._jsonl([_row(fmt, "img/gone.png")], tmp_path / "train.jsonl")
    assert L.row_error(f"{fmt}:{f}") == f"{f}:1: field '{field}': image {tmp_path / 'img/gone.png'} does not exist"
    assert open_spec(f"{fmt}:{f}", check_images=False)[0].image == str(tmp_path / "img/gone.png")


@pytest.mark.parametrize(("fmt", "field"), [("verl", "reward_model.ground_truth"), ("easyr1", "answer"),
                                            ("trl", "solution")])
def test_a_gold_that_is_no_answer_names_the_framework_field(tmp_path, fmt, field):
    f = L._jsonl([_row(fmt, None, gold=["A"]), _row(fmt, None, gold="E")], tmp_path / "train.jsonl")
    assert L.row_error(f"{fmt}:{f}") == f"{f}:1: field '{field}' must be a string or an integer or a number, got ['A']"
    assert L.row_error(f"{fmt}:{f}", 1) == (
        f"{f}:2: field '{field}' = 'E' is none of the 2 options ['the cube', 'the ball']")


@pytest.mark.parametrize("fmt", ["verl", "easyr1", "trl"])
def test_renamed_id_category_and_reference_are_read_from_their_columns(tmp_path, fmt):
    f = L._jsonl([_row(fmt, None, uid="q7", kind="depth", why="<think>r</think> A")], tmp_path / "train.jsonl")
    s = open_spec(f"{fmt}:{f}?id=uid&category=kind&reference=why")[0]
    assert (s.id, s.category, set(s.reference.values())) == ("q7", "depth", {"<think>r</think> A"})
    plain = open_spec(f"{fmt}:{f}")[0]
    assert (plain.id, plain.reference) == (f"{fmt}-0", {})  # RL rows carry no completion unless one is named
    assert plain.category == ""  # no column names one


def test_verl_names_a_row_by_its_index_and_category_by_its_data_source(tmp_path):
    f = L._jsonl([_row("verl", None, data_source="geo3k", extra_info={"index": 12})], tmp_path / "train.jsonl")
    s = open_spec(f"verl:{f}")[0]
    assert (s.id, s.category) == ("12", "geo3k")


def test_easyr1_reads_rlhfdatasets_own_prompt_key_where_a_set_has_no_problem(tmp_path):
    """RLHFDataset's prompt_key defaults to `prompt`; EasyR1's config.yaml sets `problem`. A set written for the
    default reads without a key; a row holding both reads `problem`, and a named column wins over either."""
    f = L._jsonl([
        {"prompt": QUESTION, "answer": "A"},
        {"problem": "How far is it?", "prompt": QUESTION, "answer": "2"},
        {"q": "How far is it?", "prompt": QUESTION, "answer": "3"}], tmp_path / "train.jsonl")
    rows = open_spec(f"easyr1:{f}")
    assert [(s.question, s.answer) for s in rows[:2]] == [("Which object is nearer?", "A"), ("How far is it?", 2.0)]
    assert open_spec(f"easyr1:{f}?prompt=q")[2].question == "How far is it?"
    assert L.row_error(f"easyr1:{f}?prompt=q") == f"{f}:1: missing field 'q'"


def test_trl_reads_a_gold_named_answer_where_a_set_has_no_solution(tmp_path):
    f = L._jsonl([
        {"prompt": QUESTION, "answer": "B"},
        {"prompt": QUESTION, "solution": "A", "answer": "B"},
        {"prompt": QUESTION, "answer": ["B"]}], tmp_path / "train.jsonl")
    rows = open_spec(f"trl:{f}")
    assert [s.answer for s in rows[:2]] == ["B", "A"]
    assert L.row_error(f"trl:{f}", 2) == f"{f}:3: field 'answer' must be a string or an integer or a number, got ['B']"
    # a named column is read as named: no fallback to `answer`
    assert L.row_error(f"trl:{f}?answer=gold") == f"{f}:1: missing field 'gold'"


def test_trl_takes_images_before_image_and_either_may_be_renamed(tmp_path):
    for name in ("a", "b", "c"):
        L._save(L.BLANK, tmp_path / f"{name}.png")
    f = L._jsonl([
        {"prompt": QUESTION, "solution": "A", "images": ["a.png", "b.png"], "image": "c.png"},
        {"prompt": QUESTION, "solution": "A", "images": [], "image": "c.png"},
        {"prompt": QUESTION, "solution": "A", "pics": ["b.png"], "pic": "a.png"}], tmp_path / "train.jsonl")
    rows = open_spec(f"trl:{f}")
    assert rows[0].images == (str(tmp_path / "a.png"), str(tmp_path / "b.png"))
    assert rows[1].image == str(tmp_path / "c.png") and rows[2].images == () and rows[2].image is None
    assert open_spec(f"trl:{f}?images=pics")[2].image == str(tmp_path / "b.png")
    assert open_spec(f"trl:{f}?image=pic")[2].image == str(tmp_path / "a.png")
    (tmp_path / "b.png").unlink()
    assert L.row_error(f"trl:{f}") == f"{f}:1: field 'images[1]': image {tmp_path / 'b.png'} does not exist"


def _stvqa(tmp_path: Path, rows: list[dict]) -> str:
    """STVQA-7K's card features (hunarbatra/STVQA-7K), as JSON lines named by their split (the reader takes a
    folder's `<split>.jsonl` as it takes the Hub's `data/<split>-*.parquet`; the rows' types may differ here)."""
    L._save(L.BLANK, tmp_path / "p.png")
    base = {"images": "p.png", "question_only": "Which is nearer?", "options": ["A. the cube", "B. the ball"],
            "question_with_options": "Which is nearer?\nA. the cube\nB. the ball",
            "answer_option_text": "(B) the ball", "answer": "<answer>(B) the ball</answer>", "category": "depth"}
    L._jsonl([{**base, **r} for r in rows], tmp_path / "val.jsonl")
    return f"stvqa7k:{tmp_path}:val"


def test_stvqa7k_rows_that_break_name_file_row_and_field(tmp_path):
    spec = _stvqa(tmp_path, [{}, {"question_only": None}, {"options": "A. the cube"}, {"answer_option_text": 1.5},
                             {"images": None}, {"images": "gone.png"}, {"question_only": 5}, {"category": None}])
    f = tmp_path / "val.jsonl"
    s = open_spec(spec)[0]
    assert (s.id, s.question, s.options, s.answer, s.category, s.image) == (
        "stvqa7k-val-0", "Which is nearer?", ("the cube", "the ball"), "B", "depth", str(tmp_path / "p.png"))
    assert set(s.reference.values()) == {"<answer>(B) the ball</answer>"}  # SpatialThinker's completion
    assert [L.row_error(spec, k) for k in range(1, 7)] == [
        f"{f}:2: missing field 'question_only'",
        f"{f}:3: field 'options' must be a list of option texts, got 'A. the cube'",
        f"{f}:4: field 'answer_option_text' must be a string or an integer, got 1.5",
        f"{f}:5: missing field 'images'",
        f"{f}:6: field 'images': image {tmp_path / 'gone.png'} does not exist",
        f"{f}:7: field 'question_only' must be a string, got 5"]
    assert open_spec(spec)[7].category == ""  # a row with no category has none
    # the authors' baseline keys: options inside the question are split off, the list still gives them
    s = open_spec(spec + "?question=question_with_options&id=question_only")[0]
    assert (s.id, s.question, s.options) == ("Which is nearer?", "Which is nearer?", ("the cube", "the ball"))


@pytest.mark.parametrize("fmt", ["verl", "trl"])
def test_a_chat_prompt_is_read_from_its_last_user_turns_text_parts(tmp_path, fmt):
    parts = [{"type": "text", "text": "Which object is nearer?"}, {"type": "image", "text": None},
             {"type": "text", "text": None}, "a stray string", {"type": "text", "text": "\nA. the cube\nB. the ball"}]
    chat = [{"role": "system", "content": "You are helpful."}, {"role": "user", "content": "An earlier question"},
            {"role": "assistant", "content": "A"}, {"role": "user", "content": parts}]
    gold = {"reward_model": {"ground_truth": "B"}} if fmt == "verl" else {"solution": "B"}
    f = L._jsonl([
        {"prompt": chat, **gold}, {"prompt": chat[:1], **gold}, {"prompt": [{"role": "user", "content": 5}], **gold},
        {"prompt": {"role": "user", "content": QUESTION}, **gold}], tmp_path / "train.jsonl")
    s = open_spec(f"{fmt}:{f}")[0]
    # a picture's part between the question and its options does not join them
    assert (s.question, s.options, s.answer) == ("Which object is nearer?", ("the cube", "the ball"), "B")
    assert [L.row_error(f"{fmt}:{f}", k) for k in (1, 2)] == [
        f"{f}:2: field 'prompt' holds no user turn", f"{f}:3: field 'prompt': the user turn's content is no text"]
    assert L.row_error(f"{fmt}:{f}", 3).startswith(
        f"{f}:4: field 'prompt' must be a string or a list, got {{'content': ")


@pytest.mark.parametrize("fmt", ["verl", "easyr1"])
def test_a_video_row_reads_its_file_or_frames_and_names_a_missing_one(tmp_path, fmt):
    (tmp_path / "videos").mkdir()
    (tmp_path / "videos" / "clip.mp4").write_bytes(b"\0")  # decoded only when the row is encoded
    f = L._jsonl([_row(fmt, None, videos=["videos/clip.mp4"]), _row(fmt, None, videos=["videos/gone.mp4"])],
                 tmp_path / "train.jsonl")
    assert open_spec(f"{fmt}:{f}")[0].video.path == str(tmp_path / "videos/clip.mp4")
    assert L.row_error(f"{fmt}:{f}", 1) == f"{f}:2: field 'videos': video {tmp_path / 'videos/gone.mp4'} does not exist"


def test_stvqa7k_reads_its_train_split_where_none_is_named(tmp_path):
    _stvqa(tmp_path, [{}, {}])
    (tmp_path / "val.jsonl").rename(tmp_path / "train.jsonl")
    _stvqa(tmp_path, [{"category": "other"}])
    assert [(s.id, s.category) for s in open_spec(f"stvqa7k:{tmp_path}")] == [
        ("stvqa7k-train-0", "depth"), ("stvqa7k-train-1", "depth")]
