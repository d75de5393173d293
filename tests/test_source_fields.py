"""What every layout reader shares (data/sources/fields.py), fed as the published copies write their fields: the
`data.columns` entries a config gives, a question with its `<image>` markers and options listed one per line or
inline, options written `A. left` or `left`, golds written as a letter, `(B)`, `B. text`, an answer tag, the option's
own text, a number or a short text, pictures embedded as bytes, as paths or as zip members, videos as a file or
frames. Each result is pinned whole, and each refusal by its full one-line message naming file, row and field."""

import re
from pathlib import Path

import layout_copies as L
import numpy as np
import pytest

from spatial_jax.data.sample import DatasetError, Video
from spatial_jax.data.sources import fields as F
from spatial_jax.data.sources.rows import Row, ZipFiles

ROW = Row({}, "train.jsonl:3", 2)
OPTIONS = ("the cube", "the ball", "the cone")


def refusal(fn, *args, **kw) -> str:
    with pytest.raises(DatasetError) as e:
        fn(*args, **kw)
    return str(e.value)


# --- data.columns and Context ---------------------------------------------------------------------------------------


def test_columns_entries_become_a_dict_trimmed_split_at_the_first_equals_sign():
    assert F.parse_columns(["question=problem", " image_dir = /data/img ", "reference=extra.cot=v2"]) == {
        "question": "problem", "image_dir": "/data/img", "reference": "extra.cot=v2"}
    assert F.parse_columns([]) == {}


@pytest.mark.parametrize("entry", ["question", "=problem", "question=", " =problem", "question= ", 7])
def test_a_columns_entry_that_is_no_key_value_is_refused_naming_it(entry):
    assert refusal(F.parse_columns, ["answer=solution", entry]) == (
        f"data.columns entry {entry!r} must read field=column")


def test_context_renames_resolves_media_and_takes_the_copys_folder(tmp_path):
    ctx = F.Context({"question": "problem"}, base=tmp_path)
    assert (ctx.col("question", "prompt"), ctx.col("answer", "solution")) == ("problem", "solution")
    assert ctx.media_root == tmp_path
    assert F.Context({"image_dir": "/data/img"}, base=tmp_path).media_root == Path("/data/img")
    (tmp_path / "train.jsonl").write_text("{}\n")
    assert ctx.beside(tmp_path / "train.jsonl") == F.Context({"question": "problem"}, base=tmp_path)
    assert ctx.beside(str(tmp_path)).base == tmp_path  # a folder stands for itself
    assert F.Context() == F.Context({}, Path("."), True, None, "")


# --- questions and options -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("text, question", [
    ("<image>\nWhich object is nearer?", "Which object is nearer?"),
    ("<image><image>\nWhich view shows the chair?", "Which view shows the chair?"),
    ("Which is left of the cube?\n<image>", "Which is left of the cube?"),
    ("<video>\t \nHow many chairs?  ", "How many chairs?"),
    ("Look at <image> the room.", "Look atthe room."),  # the spaces around a marker go with it
    ("How far is <img> the cone?", "How far is <img> the cone?"),
])
def test_markers_are_dropped_with_their_spaces_and_line_break(text, question):
    assert F.strip_markers(text) == question


@pytest.mark.parametrize("text, split", [
    ("Which object is nearer?\nA. the cube\nB. the ball\nC. the cone",
     ("Which object is nearer?", OPTIONS)),
    ("Which object is nearer?\nOptions:\n(A) the cube\n(B) the ball", ("Which object is nearer?", OPTIONS[:2])),
    ("Which object is nearer?\nchoices :\nA) the cube  \nB: the ball", ("Which object is nearer?", OPTIONS[:2])),
    # lines after the lettered run (an instruction, a letter out of order) are no options
    ("Which object is nearer?\nA. the cube\nB. the ball\nD. the cone\nAnswer with the letter.",
     ("Which object is nearer?", OPTIONS[:2])),
    # a line lettered B before the A line belongs to the question
    ("B. is the room.\nWhich object is nearer?\nA. the cube\nB. the ball",
     ("B. is the room.\nWhich object is nearer?", OPTIONS[:2])),
    ("A. the cube\nB. the ball", ("", OPTIONS[:2])),
    ("A: the cube\nB: the ball", ("", OPTIONS[:2])),  # a colon is no inline option mark: read by lines
    ("Which object is nearer? A. the cube B. the ball C. the cone", ("Which object is nearer?", OPTIONS)),
    ("Which object is nearer? Options: (A) the cube (B) the ball", ("Which object is nearer?", OPTIONS[:2])),
    ("A. the cube B. the ball", ("", OPTIONS[:2])),
    # an inline run stops at the first letter out of order; what follows stays with the last option
    ("Which object is nearer? A. the cube B. the ball D. the cone", ("Which object is nearer?", ("the cube",
                                                                      "the ball D. the cone"))),
    ("Which object is nearer?\nA. the cube", ("Which object is nearer?\nA. the cube", ())),
    ("Which object is nearer? B. the ball C. the cone", ("Which object is nearer? B. the ball C. the cone", ())),
    ("  How far is the cone from the cube?\n", ("How far is the cone from the cube?", ())),
    ("Which is nearer, a. the cube or b. the ball?", ("Which is nearer, a. the cube or b. the ball?", ())),
])
def test_a_question_that_lists_its_options_is_split_from_them(text, split):
    assert F.split_options(text) == split


def test_options_written_lettered_or_plain_become_their_texts():
    raw = ["A. left", "(B) right", "C: above", " D)  below ", "behind", "U.S. flag", "E.g.left"]
    assert F.option_texts(ROW, raw, "options") == ("left", "right", "above", "below", "behind", "U.S. flag",
                                                   "E.g.left")
    assert F.option_texts(ROW, ("A. left",), "choices") == ("left",)


@pytest.mark.parametrize("raw, shown", [("A. left B. right", "'A. left B. right'"), (["left", 2], "['left', 2]"),
                                        (None, "None")])
def test_options_that_are_no_list_of_texts_are_refused(raw, shown):
    assert refusal(F.option_texts, ROW, raw, "options") == (
        f"train.jsonl:3: field 'options' must be a list of option texts, got {shown}")


# --- golds ---------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("raw, letter", [
    ("B", "B"), ("(B)", "B"), ("B.", "B"), ("(B).", "B"), ("B. the ball", "B"), ("B: The ball.", "B"),
    ("B the ball", "B"), ("(C) the cone", "C"), ("<answer>(B) the ball</answer>", "B"),
    ("<think>the ball is in front</think> <answer> B </answer>", "B"),
    ("<think>The ball is in front.</think>\n<answer>\n(B) the ball\n</answer>", "B"),
    ("the ball", "B"), ("The  Ball.", "B"), ("  the cone\n", "C"), ("A", "A"),
])
def test_a_choice_gold_is_the_letter_it_writes_or_the_option_it_reads(raw, letter):
    assert F.gold(ROW, raw, OPTIONS, "answer") == (letter, "choice")


def test_a_numeric_gold_among_options_is_compared_by_value_never_as_an_index():
    counts = ("2", "3", "4.5")
    assert F.gold(ROW, 3, counts, "answer") == ("B", "choice")
    assert F.gold(ROW, "3.0", counts, "answer") == ("B", "choice")
    assert F.gold(ROW, 4.5, counts, "answer") == ("C", "choice")
    assert F.gold(ROW, "<answer>2</answer>", counts, "answer") == ("A", "choice")
    # 1 is no option's text: an index would have read it as B
    assert refusal(F.gold, ROW, 1, OPTIONS, "answer") == (
        "train.jsonl:3: field 'answer' = 1 is none of the 3 options ['the cube', 'the ball', 'the cone']")


@pytest.mark.parametrize("raw, message", [
    ("D", "field 'ans' = 'D' is none of the 3 options ['the cube', 'the ball', 'the cone']"),
    ("b", "field 'ans' = 'b' is none of the 3 options ['the cube', 'the ball', 'the cone']"),
    ("the sphere", "field 'ans' = 'the sphere' is none of the 3 options ['the cube', 'the ball', 'the cone']"),
    (True, "field 'ans' = True is none of the 3 options ['the cube', 'the ball', 'the cone']"),
    (None, "field 'ans' = None is none of the 3 options ['the cube', 'the ball', 'the cone']"),
    (["B"], "field 'ans' = ['B'] is none of the 3 options ['the cube', 'the ball', 'the cone']"),
    ("B. the cube", "field 'ans' = 'B. the cube' names option B, which reads 'the ball'"),
    ("<answer>(C) the ball</answer>", "field 'ans' = '(C) the ball' names option C, which reads 'the cone'"),
])
def test_a_choice_gold_naming_no_option_or_the_wrong_one_is_refused(raw, message):
    assert refusal(F.gold, ROW, raw, OPTIONS, "ans") == "train.jsonl:3: " + message


def test_a_true_false_or_null_gold_is_no_option_even_where_an_option_reads_so():
    """JSON's true and null are no answers: options written "True" / "None" are not matched by their spelling."""
    assert refusal(F.gold, ROW, True, ("True", "False"), "answer") == (
        "train.jsonl:3: field 'answer' = True is none of the 2 options ['True', 'False']")
    assert refusal(F.gold, ROW, None, ("None", "1", "2"), "answer") == (
        "train.jsonl:3: field 'answer' = None is none of the 3 options ['None', '1', '2']")
    assert F.gold(ROW, "True", ("True", "False"), "answer") == ("A", "choice")


def test_a_number_matches_an_option_that_writes_it_with_stray_full_stops():
    """Scraped options carry typos ("3.."): no number, but written as the gold is once the full stops go."""
    assert F.gold(ROW, 3, ("2..", "3..", "4.."), "answer") == ("B", "choice")
    assert F.gold(ROW, "4..", ("2", "3", "4"), "answer") == ("C", "choice")


def test_a_gold_that_several_options_read_cannot_say_which():
    options = ("left", "right", "Left.", "up")
    assert refusal(F.gold, ROW, "LEFT", options, "solution") == (
        "train.jsonl:3: field 'solution' = 'LEFT' is the text of options A, C, which read the same; the gold cannot "
        "say which")
    assert refusal(F.gold, ROW, 2, ("2", "2.0"), "solution") == (
        "train.jsonl:3: field 'solution' = 2 is the text of options A, B, which read the same; the gold cannot say "
        "which")


@pytest.mark.parametrize("raw, expected", [
    (3, (3.0, "number")), (-2.5, (-2.5, "number")), ("2.5", (2.5, "number")), (" 12 ", (12.0, "number")),
    ("<answer>4.2</answer>", (4.2, "number")), ("1e3", (1000.0, "number")),
    ("left", ("left", "text")), ("<answer> Left. </answer>", ("Left.", "text")), ("x" * 200, ("x" * 200, "text")),
])
def test_a_gold_without_options_is_a_number_or_a_short_text(raw, expected):
    got = F.gold(ROW, raw, (), "answer")
    assert got == expected and type(got[0]) is type(expected[0])


@pytest.mark.parametrize("raw, message", [
    ("", "field 'answer' = '' is no answer (an option, a number or a short text)"),
    ("<answer> </answer>", "field 'answer' = '' is no answer (an option, a number or a short text)"),
    (None, "field 'answer' = None is no answer (an option, a number or a short text)"),
    (True, "field 'answer' = True is no answer (an option, a number or a short text)"),
    ({"value": 3}, "field 'answer' = {'value': 3} is no answer (an option, a number or a short text)"),
    (0, "field 'answer' = 0: a numeric gold must be finite and non-zero (MRA divides by it)"),
    ("0.0", "field 'answer' = '0.0': a numeric gold must be finite and non-zero (MRA divides by it)"),
    ("nan", "field 'answer' = 'nan': a numeric gold must be finite and non-zero (MRA divides by it)"),
    (float("inf"), "field 'answer' = inf: a numeric gold must be finite and non-zero (MRA divides by it)"),
    ("y" * 201, "field 'answer' = '" + "y" * 12 + "..." + "y" * 13 + "' is a text of 201 characters; a text gold is "
                "a short answer of at most 200 (SPEC section 10); no reward scores free text"),
])
def test_a_gold_without_options_that_is_no_answer_is_refused(raw, message):
    assert refusal(F.gold, ROW, raw, (), "answer") == "train.jsonl:3: " + message


# --- pictures and videos -------------------------------------------------------------------------------------------

RED = np.zeros((4, 6, 3), np.uint8)
RED[..., 0] = 200


def test_an_embedded_picture_is_decoded_from_a_hub_struct_or_raw_bytes():
    ctx = F.Context()
    for value in ({"bytes": L.png(RED), "path": "red.png"}, L.png(RED), bytearray(L.png(RED))):
        got = F.media(ROW, value, "images[0]", ctx)
        assert got.dtype == np.uint8 and np.array_equal(got, RED)


def test_a_grey_or_transparent_picture_is_decoded_to_rgb():
    import io

    from PIL import Image

    grey = io.BytesIO()
    Image.fromarray(np.full((2, 3), 90, np.uint8)).save(grey, format="PNG")
    assert np.array_equal(F.decode(ROW, grey.getvalue(), "image"), np.full((2, 3, 3), 90, np.uint8))
    rgba = np.dstack([RED, np.full((4, 6), 128, np.uint8)])
    assert np.array_equal(F.decode(ROW, L.png(rgba), "image"), RED)
    # what a picture is called where its caller does not say
    message = refusal(F.decode, ROW, b"GIF89a broken", "images[0]")
    assert re.fullmatch(r"train\.jsonl:3: field 'images\[0\]': the embedded image cannot be decoded \(.+\)", message)


@pytest.mark.parametrize("data, what", [(b"not a picture", "image"), (L.png(RED)[:40], "video frame")])
def test_embedded_bytes_that_are_no_picture_are_refused(data, what):
    message = refusal(F.media, ROW, data, "images[1]", F.Context(), what)
    assert re.fullmatch(rf"train\.jsonl:3: field 'images\[1\]': the embedded {what} cannot be decoded \(.+\)",
                        message), message


def test_an_embedded_picture_too_large_to_decode_is_refused_not_decoded():
    """A PNG whose header claims 20000 x 20000 pixels: PIL refuses it as a decompression bomb (no OSError)."""
    import struct
    import zlib

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

    bomb = (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", struct.pack(">IIBBBBB", 20000, 20000, 8, 0, 0, 0, 0))
            + chunk(b"IDAT", zlib.compress(b"\0" * 4)) + chunk(b"IEND", b""))
    assert refusal(F.media, ROW, {"bytes": bomb, "path": None}, "image", F.Context()) == (
        "train.jsonl:3: field 'image': the embedded image cannot be decoded (Image size (400000000 pixels) exceeds "
        "limit of 178956970 pixels, could be decompression bomb DOS attack.)")


def test_a_picture_path_resolves_against_the_copy_or_image_dir(tmp_path):
    L._save(RED, tmp_path / "media" / "0.png")
    ctx = F.Context(base=tmp_path / "media")
    assert F.media(ROW, "0.png", "image", ctx) == str(tmp_path / "media" / "0.png")
    assert F.media(ROW, {"bytes": None, "path": "0.png"}, "image", ctx) == str(tmp_path / "media" / "0.png")
    assert F.media(ROW, "0.png", "image", F.Context({"image_dir": str(tmp_path / "media")}, tmp_path)) == str(
        tmp_path / "media" / "0.png")
    absolute = str(tmp_path / "media" / ".." / "media" / "0.png")  # an absolute path may climb: it names its file
    assert F.media(ROW, absolute, "image", F.Context(base=tmp_path / "elsewhere")) == absolute
    # pictures left unchecked: a path is only resolved
    assert F.media(ROW, "9.png", "image", F.Context(base=tmp_path, check=False)) == str(tmp_path / "9.png")


def test_a_picture_path_that_is_missing_climbs_out_or_is_empty_is_refused(tmp_path):
    (tmp_path / "sub").mkdir()
    ctx = F.Context(base=tmp_path)
    assert refusal(F.media, ROW, "9.png", "images[2]", ctx) == (
        f"train.jsonl:3: field 'images[2]': image {tmp_path / '9.png'} does not exist")
    assert refusal(F.media, ROW, "sub", "video", ctx, "video") == (
        f"train.jsonl:3: field 'video': video {tmp_path / 'sub'} is a folder, not a file")
    assert refusal(F.media, ROW, "../other/0.png", "image", F.Context(base=tmp_path, check=False)) == (
        f"train.jsonl:3: field 'image': image path '../other/0.png' leaves the folder it is relative to "
        f"({tmp_path}); give an absolute path or data.columns image_dir")
    for value, shown in (("", "''"), (None, "None"), (3, "3"), ({"bytes": b"", "path": ""}, "''"),
                         ({"bytes": None, "path": None}, "None")):
        assert refusal(F.media, ROW, value, "image", ctx, "video frame") == (
            f"train.jsonl:3: field 'image' holds no video frame (bytes or a path), got {shown}")


def test_a_picture_is_read_from_its_archive_under_the_members_folder(tmp_path):
    archive = L.write_zip(tmp_path / "copy.zip", {"data/img/0.png": L.png(RED), "img/1.png": b"broken"})
    ctx = F.Context(members=ZipFiles(archive), prefix="data/")
    assert np.array_equal(F.media(ROW, "img/0.png", "image", ctx), RED)
    assert np.array_equal(F.media(ROW, "/img/0.png", "image", ctx), RED)  # a leading slash is the archive's root
    assert refusal(F.media, ROW, "img/1.png", "image", ctx) == (
        f"train.jsonl:3: field 'image': {archive} has no member data/img/1.png")
    # a path climbing out of the archive's folder is no member: it is refused as a path
    assert refusal(F.media, ROW, "../img/1.png", "image", ctx) == (
        "train.jsonl:3: field 'image': image path '../img/1.png' leaves the folder it is relative to (.); give an "
        "absolute path or data.columns image_dir")
    message = refusal(F.media, ROW, "img/1.png", "images[1]", F.Context(members=ZipFiles(archive)), "video frame")
    assert re.fullmatch(r"train\.jsonl:3: field 'images\[1\]': the embedded video frame cannot be decoded \(cannot "
                        r"identify image file <_io\.BytesIO object at 0x[0-9a-f]+>\)", message), message


def test_one_picture_or_a_list_names_each_by_its_place(tmp_path):
    for k in range(2):
        L._save(RED, tmp_path / f"{k}.png")
    ctx = F.Context(base=tmp_path)
    assert F.media_list(ROW, "0.png", "image", ctx) == (str(tmp_path / "0.png"),)
    assert F.media_list(ROW, ["0.png", "1.png"], "images", ctx) == (str(tmp_path / "0.png"), str(tmp_path / "1.png"))
    assert F.media_list(ROW, ("1.png",), "images", ctx) == (str(tmp_path / "1.png"),)
    assert refusal(F.media_list, ROW, ["0.png", "2.png"], "images", ctx) == (
        f"train.jsonl:3: field 'images[1]': image {tmp_path / '2.png'} does not exist")
    assert refusal(F.media_list, ROW, "2.png", "image", ctx) == (
        f"train.jsonl:3: field 'image': image {tmp_path / '2.png'} does not exist")
    assert refusal(F.media_list, ROW, [], "images", ctx) == "train.jsonl:3: field 'images' lists no image"
    assert refusal(F.media_list, ROW, (), "images", ctx) == "train.jsonl:3: field 'images' lists no image"


def test_a_video_is_its_file_or_its_frames_at_two_a_second(tmp_path):
    (tmp_path / "clip.mp4").write_bytes(b"\0")
    for k in range(3):
        L._save(RED, tmp_path / f"f{k}.png")
    ctx = F.Context(base=tmp_path)
    clip = Video(path=str(tmp_path / "clip.mp4"))
    assert F.video(ROW, "clip.mp4", "video", ctx) == clip
    assert F.video(ROW, ["clip.mp4"], "video", ctx) == clip  # a one-file list is that file
    frames = tuple(str(tmp_path / f"f{k}.png") for k in range(3))
    assert F.video(ROW, ["f0.png", "f1.png", "f2.png"], "video", ctx) == Video(frames=frames, fps=2.0)
    assert F.video(ROW, ("f0.png", "f1.png"), "video", F.Context({"video_fps": "1.5"}, tmp_path)) == Video(
        frames=frames[:2], fps=1.5)
    one = F.video(ROW, [{"bytes": L.png(RED)}], "video", ctx)  # one embedded frame is a frame, not a file
    assert one.fps == 2.0 and len(one.frames) == 1 and np.array_equal(one.frames[0], RED)


def test_a_video_that_is_missing_or_has_no_frame_rate_is_refused(tmp_path):
    L._save(RED, tmp_path / "f0.png")
    ctx = F.Context(base=tmp_path)
    assert refusal(F.video, ROW, "clip.mp4", "video", ctx) == (
        f"train.jsonl:3: field 'video': video {tmp_path / 'clip.mp4'} does not exist")
    assert refusal(F.video, ROW, ["f0.png", "f1.png"], "frames", ctx) == (
        f"train.jsonl:3: field 'frames[1]': video frame {tmp_path / 'f1.png'} does not exist")
    for raw, shown in (([], "[]"), ((), "()"), (None, "None"), (3, "3")):
        assert refusal(F.video, ROW, raw, "video", ctx) == (
            f"train.jsonl:3: field 'video' must be a video file or a list of frame files, got {shown}")
    for fps in ("fast", "0", "-2"):
        assert refusal(F.video, ROW, ["f0.png", "f0.png"], "video", F.Context({"video_fps": fps}, tmp_path)) == (
            f"train.jsonl:3: field 'video' lists frames, and data.columns video_fps = {fps!r} is no positive number "
            "of frames a second")


# --- the Sample ----------------------------------------------------------------------------------------------------


def test_a_rows_sample_carries_its_fields_and_names_its_row(tmp_path):
    s = F.sample(ROW, sid=7, question="Which object is nearer?", options=OPTIONS[:2], answer="(B) the ball",
                 answer_field="solution", pictures=("a.png",), category="depth", reference="<answer>B</answer>",
                 meta={"source": "tiny"})
    assert (s.id, s.image, s.images, s.video, s.question, s.options, s.answer, s.answer_type, s.category,
            s.meta, s.origin) == ("7", "a.png", (), None, "Which object is nearer?", OPTIONS[:2], "B", "choice",
                                  "depth", {"source": "tiny"}, "train.jsonl:3")
    assert s.reference == {"spatialcore": "<answer>B</answer>", "prosr": "<answer>B</answer>",
                           "spatialthinker": "<answer>B</answer>", "allospatial": "<answer>B</answer>"}
    views = F.sample(ROW, sid="v1", question="How far apart are they?", options=(), answer="2.5",
                     answer_field="answer", pictures=("a.png", "b.png"))
    assert (views.id, views.image, views.images, views.options, views.answer, views.answer_type, views.category,
            views.reference, views.meta, views.video) == ("v1", None, ("a.png", "b.png"), (), 2.5, "number", "",
                                                          {}, {}, None)
    clip = Video(path="clip.mp4")
    text = F.sample(ROW, sid=0, question="Which way is the door?", options=(), answer="left", answer_field="answer",
                    clip=clip, reference="")
    assert (text.image, text.images, text.video, text.answer, text.answer_type, text.reference) == (
        None, (), clip, "left", "text", {})


def test_a_sample_the_row_cannot_make_is_refused_naming_the_row():
    assert refusal(F.sample, ROW, sid=0, question="q", options=OPTIONS, answer="D", answer_field="label") == (
        "train.jsonl:3: field 'label' = 'D' is none of the 3 options ['the cube', 'the ball', 'the cone']")
    assert refusal(F.sample, ROW, sid=0, question="q", options=(), answer="left", answer_field="answer",
                   pictures=("a.png",), clip=Video(path="clip.mp4")) == (
        "train.jsonl:3: a sample has at most one of 'image', 'images' or 'video', got ['image', 'video']")
