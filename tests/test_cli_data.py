"""spatial_jax/cli/data.py (`spatial-jax data show` / `data check`) pinned in full on a JSONL source holding each kind
of row users bring: a multiple-choice question on one picture with boxes, a scene and an SFT target; a count over two
views; a text question with no picture and a completion per method; a video as listed frames, one as an MP4 file and
one as a Matroska file with sound whose header holds no frame count. show's JSON and line forms, check's counts (kinds,
categories, pictures, the longest row against the largest bucket, RL or SFT encoding), its failing rows and its
exit status under data.bad_rows=fail and skip, an empty source, a mixture's repeated ids, and the arguments."""

from __future__ import annotations

import argparse
import json
from fractions import Fraction
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from spatial_jax.cli import data as cli_data
from spatial_jax.cli import main
from spatial_jax.data.pipeline import open_source
from spatial_jax.data.sample import DatasetError

SCENE = {"objects": [{"id": "green_square.2", "bbox": [11, 9, 17, 15]}, {"id": "blue_circle.4", "bbox": [9, 0, 15, 6]}],
         "relationships": [{"subject": "green_square.2", "predicate": "below", "object": "blue_circle.4"}]}
TARGET = ("<think>\nCentres: green square (599, 536), blue circle (536, 151). The y gap dominates: the green square is "
          "below the blue circle.\n</think>\nB")


def _png(path: Path, width: int, height: int, seed: int = 0) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    pixels = np.random.default_rng(seed).integers(0, 255, (height, width, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(path)
    return str(path.relative_to(path.parents[1]))


def _video(path: Path, frames: int, width: int = 32, height: int = 24, fps: int = 2) -> str:
    """A clip as a camera writes it (MPEG-4 part 2); Matroska stores no frame count in its header."""
    import av

    with av.open(str(path), "w") as out:
        stream = out.add_stream("mpeg4", rate=fps)
        stream.width, stream.height, stream.pix_fmt = width, height, "yuv420p"
        rng = np.random.default_rng(frames)
        for _ in range(frames):
            frame = rng.integers(0, 255, (height, width, 3), dtype=np.uint8)
            out.mux(stream.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        out.mux(stream.encode())
    return path.name


def _video_with_sound(path: Path, frames: int) -> str:
    """A Matroska clip with an audio track, as a phone records it: the header holds no frame count."""
    import av

    with av.open(str(path), "w") as out:
        video, audio = out.add_stream("mpeg4", rate=2), out.add_stream("aac", rate=8000)
        video.width, video.height, video.pix_fmt = 32, 24, "yuv420p"
        for k in range(frames):
            frame = np.full((24, 32, 3), 40 * k, np.uint8)
            out.mux(video.encode(av.VideoFrame.from_ndarray(frame, format="rgb24")))
        out.mux(video.encode())
        for k in range(8):
            sound = av.AudioFrame.from_ndarray(np.zeros((1, 1024), np.float32), format="fltp", layout="mono")
            sound.sample_rate, sound.pts = 8000, 1024 * k
            out.mux(audio.encode(sound))
        out.mux(audio.encode())
    return path.name


def _rows(root: Path) -> list[dict]:
    return [
        {"id": "rel-0", "image": _png(root / "img" / "rel-0.png", 32, 24), "category": "relative_position",
         "question": "Where is the green square relative to the blue circle?",
         "options": ["above", "below", "left", "right"], "answer": "B",
         "gt_boxes": [{"bbox_2d": [464, 425, 739, 658], "label": "green square", "validity": 0.387},
                      {"bbox_2d": [406, 21, 666, 281], "label": "blue circle", "validity": 0.9866}],
         "scene": SCENE, "reference": {"spatialcore": TARGET}},
        {"id": "count-1", "images": [_png(root / "img" / "count-1a.png", 40, 30, 1),
                                     _png(root / "img" / "count-1b.png", 20, 16, 2)],
         "question": "How many chairs are there in the two views together?", "answer": 3.0, "answer_type": "number",
         "category": "object_counting", "reference": {"spatialcore": "</think>\n3", "prosr": "</think>\n3"}},
        {"id": "text-2", "question": "Ist der Stuhl größer als der Tisch?", "answer": "ja", "answer_type": "text",
         "reference": {"spatialcore": "</think>\nja", "prosr": "Der Stuhl ist größer.\n</think>\nja"}},
        {"id": "move-3", "video": {"frames": [_png(root / "img" / f"move-3-{k}.png", 24, 16, 10 + k) for k in range(3)],
                                   "fps": 2}, "question": "How far did the camera move, in metres?", "answer": 2.5,
         "answer_type": "number", "category": "camera_displacement"},
        {"id": "dir-4", "video": {"path": _video(root / "dir-4.mp4", 4)}, "category": "object_rel_direction_easy",
         "question": "Standing by the door and facing the bed, is the lamp to the left or the right?",
         "options": ["left", "right"], "answer": "A"},
        {"id": "dir-5", "video": {"path": _video_with_sound(root / "dir-5.mkv", 5), "fps": 1.5},
         "category": "object_rel_direction_easy", "question": "Is the sofa to the left or the right of the TV?",
         "options": ["left", "right"], "answer": "B"},
    ]


def _write(path: Path, rows: list[dict]) -> str:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows), encoding="utf-8")
    return str(path)


@pytest.fixture
def source(tmp_path) -> str:
    return _write(tmp_path / "train.jsonl", _rows(tmp_path))


def _show(capsys, *argv) -> list[str]:
    assert main(["data", "show", *argv]) == 0
    out, err = capsys.readouterr()
    assert err == ""
    return out.splitlines()


def _check(capsys, *argv) -> tuple[int, list[str], str]:
    rc = main(["data", "check", *argv])
    out, err = capsys.readouterr()
    return rc, out.splitlines(), err


# --- show -----------------------------------------------------------------------------------------------------------

def _view(id_, question, options, answer, answer_type, category, reference, images, video, **extra) -> dict:
    return {"id": id_, "question": question, "options": options, "answer": answer, "answer_type": answer_type,
            "category": category, "reference": reference, "images": images, "video": video, **extra}


VIEWS = [
    _view("rel-0", "Where is the green square relative to the blue circle?", ["above", "below", "left", "right"], "B",
          "choice", "relative_position", TARGET, [{"width": 32, "height": 24}], None,
          gt_boxes=[{"bbox_2d": [464.0, 425.0, 739.0, 658.0], "label": "green square", "validity": 0.387},
                    {"bbox_2d": [406.0, 21.0, 666.0, 281.0], "label": "blue circle", "validity": 0.9866}],
          scene=SCENE),
    # a number gold that is whole is shown as an integer; two methods' equal completions are one target
    _view("count-1", "How many chairs are there in the two views together?", [], 3, "number", "object_counting",
          "</think>\n3", [{"width": 40, "height": 30}, {"width": 20, "height": 16}], None),
    # different completions per method: the mapping
    _view("text-2", "Ist der Stuhl größer als der Tisch?", [], "ja", "text", "",
          {"spatialcore": "</think>\nja", "prosr": "Der Stuhl ist größer.\n</think>\nja"}, [], None),
    _view("move-3", "How far did the camera move, in metres?", [], 2.5, "number", "camera_displacement", None, [],
          {"frames": 3, "fps": 2}),
    # a file's frame rate read from it; its frame count from the header, or its video frames counted (not the
    # sound's) where the header has none
    _view("dir-4", "Standing by the door and facing the bed, is the lamp to the left or the right?", ["left", "right"],
          "A", "choice", "object_rel_direction_easy", None, [], {"frames": 4, "fps": 2.0}),
    _view("dir-5", "Is the sofa to the left or the right of the TV?", ["left", "right"], "B", "choice",
          "object_rel_direction_easy", None, [], {"frames": 5, "fps": 1.5}),
]

LINES = [
    "rel-0: 'Where is the green square relative to the blue circle?' A. above | B. below | C. left | D. right -> B "
    "(images [32x24])",
    "count-1: 'How many chairs are there in the two views together?'  -> 3 (images [40x30, 20x16])",
    "text-2: 'Ist der Stuhl größer als der Tisch?'  -> ja (images [])",
    "move-3: 'How far did the camera move, in metres?'  -> 2.5 (video 3 frames)",
    "dir-4: 'Standing by the door and facing the bed, is the lamp to the left or the right?' A. left | B. right -> A "
    "(video 4 frames)",
    "dir-5: 'Is the sofa to the left or the right of the TV?' A. left | B. right -> B (video 5 frames)",
]


def test_show_json_gives_every_field_of_every_row(source, capsys):
    """One object per row, keys in this order, text as written (no \\u escapes)."""
    assert _show(capsys, source, "-n", "10", "--json") == [json.dumps(v, ensure_ascii=False) for v in VIEWS]


def test_show_lines_default_to_five_rows(source, capsys):
    assert _show(capsys, source) == LINES[:5]
    assert _show(capsys, source, "-n", "6") == LINES
    assert _show(capsys, source, "-n", "1") == LINES[:1]
    assert _show(capsys, source, "-n", "0") == []


def test_show_refuses_a_negative_count(source, capsys):
    assert main(["data", "show", source, "-n", "-1"]) == 2
    assert capsys.readouterr() == ("", "spatial-jax data: configuration error: -n must be >= 0, got -1\n")


def test_show_names_a_picture_or_video_that_cannot_be_read(tmp_path, capsys):
    rows = _rows(tmp_path)
    (tmp_path / "img" / "cut.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")  # a download cut short
    (tmp_path / "cut.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42 cut short")
    images = _write(tmp_path / "images.jsonl", [rows[1], dict(rows[0], image="img/cut.png")])
    videos = _write(tmp_path / "videos.jsonl", [dict(rows[4], video={"path": "cut.mp4"})])
    assert main(["data", "show", images]) == 1
    assert capsys.readouterr() == (LINES[1] + "\n", f"spatial-jax data: {images}:2: image {tmp_path}/img/cut.png: "
                                                    "Truncated File Read\n")
    assert main(["data", "show", videos, "--json"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith(f"spatial-jax data: {videos}:1: video {tmp_path}/cut.mp4: cannot be read (")
    assert err.endswith(f"Invalid data found when processing input: '{tmp_path}/cut.mp4')\n")


class _Stream:
    def __init__(self, average_rate, guessed_rate):
        self.frames, self.average_rate, self.guessed_rate = 0, average_rate, guessed_rate


class _Container:
    """What PyAV reports for a clip whose frame rate FFmpeg could not average (or not even guess): its 3 frames
    decoded, the header's count 0."""

    def __init__(self, stream):
        self.streams = argparse.Namespace(video=[stream])

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False

    def decode(self, stream):
        assert stream is self.streams.video[0]
        return iter(range(3))


@pytest.mark.parametrize("average,guessed,fps", [(Fraction(25), Fraction(2), 25.0),
                                                 (None, Fraction(30000, 1001), 30000 / 1001), (None, None, None)])
def test_a_files_frame_rate_averaged_else_guessed_else_unknown(tmp_path, monkeypatch, average, guessed, fps):
    import av

    from spatial_jax.data.sample import Sample, Video

    (tmp_path / "clip.mp4").write_bytes(b"")
    monkeypatch.setattr(av, "open", lambda path: _Container(_Stream(average, guessed)))
    sample = Sample(id="v0", image=None, question="Which way did the camera turn?", options=("left", "right"),
                    answer="A", video=Video(path=str(tmp_path / "clip.mp4")))
    view = cli_data._video(sample)
    assert view == {"frames": 3, "fps": fps} and type(view["fps"]) is type(fps)


def test_check_called_alone_encodes_for_rl_and_refuses_repeated_ids(tmp_path, capsys):
    """check()'s defaults, for a caller with a source and a job in hand."""
    from spatial_jax.cli.job_config import load_job

    source = open_source(_geometry(tmp_path))
    assert cli_data.check(source, load_job(None, [])) == 1
    out = capsys.readouterr().out.splitlines()
    assert json.loads(out[0])["tokens"] == {"longest": 207, "largest_bucket": 1024, "mode": "rl"}  # the 400x300 picture
    assert out[1:] == [f"FAIL {tmp_path / 'g.jsonl'}:3: duplicate id 'g0', first at {tmp_path / 'g.jsonl'}:1",
                       f"FAIL {tmp_path / 'g.jsonl'}:5: duplicate id 'g2', first at {tmp_path / 'g.jsonl'}:4"]


def test_row_view_of_embedded_pictures():
    """Layouts that embed pictures (parquet, Arrow) hold arrays: width is the second axis, height the first."""
    from spatial_jax.data.sample import Sample

    sample = Sample(id="emb-0", image=None, question="Which is nearer the camera?", options=("the cup", "the mug"),
                    answer="A", images=(np.zeros((24, 32, 3), np.uint8), np.zeros((10, 6, 3), np.uint8)))
    assert cli_data.row_view(sample) == _view("emb-0", "Which is nearer the camera?", ["the cup", "the mug"], "A",
                                              "choice", "", None, [{"width": 32, "height": 24},
                                                                   {"width": 6, "height": 10}], None)


def test_plain_numbers():
    assert [(x, type(x)) for x in map(cli_data._plain, [3.0, 2.5, -0.0, 1e3, 7])] == [
        (3, int), (2.5, float), (0, int), (1000, int), (7, int)]


def test_show_reads_a_layouts_renamed_column_and_a_mixtures_seed(tmp_path, capsys):
    """--column renames a layout's field (EasyR1 rows asking in `query`, not `problem`); --seed draws a mixture."""
    _png(tmp_path / "media" / "0.png", 30, 20)
    (tmp_path / "g.jsonl").write_text(json.dumps({"id": "g0", "query": "<image>Find x, in centimetres.",
                                                  "answer": "12", "images": ["0.png"]}) + "\n")
    spec = f"easyr1:{tmp_path / 'g.jsonl'}?image_dir={tmp_path / 'media'}"
    rows = _show(capsys, spec, "--column", "question=query")
    assert rows == ["g0: 'Find x, in centimetres.'  -> 12 (images [30x20])"]
    assert main(["data", "show", spec]) == 1
    assert capsys.readouterr().err == f"spatial-jax data: {tmp_path / 'g.jsonl'}:1: missing field 'problem'\n"

    one = _write(tmp_path / "one.jsonl", [{"id": f"q{i}", "question": f"How many cups, {i}?", "answer": i + 1,
                                           "answer_type": "number"} for i in range(4)])
    mix = f"mix:1*{one}|1*{one}"
    drawn = {seed: [line.split(":")[0] for line in _show(capsys, mix, "-n", "8", "--seed", seed)]
             for seed in ("0", "1")}
    assert _show(capsys, mix, "-n", "8") == _show(capsys, mix, "-n", "8", "--seed", "0")
    assert sorted(drawn["0"]) == sorted(drawn["1"]) == sorted([f"q{i}" for i in range(4)] * 2)
    assert drawn["0"] != drawn["1"]


# --- check ----------------------------------------------------------------------------------------------------------

COUNTS = ('{"rows": 6, "ok": 6, "failed": 0, "multiple-choice": 3, "numeric": 2, "text": 1, "text-only": 1, '
          '"categories": {"(none)": 1, "camera_displacement": 1, "object_counting": 1, "object_rel_direction_easy": 2, '
          '"relative_position": 1}, "tokens": {"longest": %d, "largest_bucket": %d, "mode": "rl"}}')


def test_check_counts_rows_with_the_jobs_encoding(source, capsys):
    """The default job (the tests clear the main job's path: TrainConfig's defaults, buckets up to 1024); the longest
    row (two views) 250 tokens as its preflight counts them; categories sorted, a row without one under "(none)"."""
    assert _check(capsys, source) == (0, [COUNTS % (250, 1024)], "")


def test_check_takes_a_jobs_config_and_overrides(source, capsys):
    """The main job's config (buckets up to 384); ProSR's prompt is longer (314 tokens), its largest bucket 416;
    key=value as train takes them."""
    assert _check(capsys, "--config", "configs/tiny_cpu.toml", source) == (0, [COUNTS % (250, 384)], "")
    assert _check(capsys, "--config", "configs/prosr_prior_cpu.toml", source) == (0, [COUNTS % (314, 416)], "")
    assert _check(capsys, source, "data.bucket_lengths=[512,2048]") == (0, [COUNTS % (250, 2048)], "")


SFT = ('{"rows": 6, "ok": 3, "failed": 3, "multiple-choice": 1, "numeric": 1, "text": 1, "text-only": 1, '
       '"categories": {"(none)": 1, "object_counting": 1, "relative_position": 1}, '
       '"tokens": {"longest": 265, "largest_bucket": 1024, "mode": "sft"}')


def _sft_fails(path) -> list[str]:
    return [f"FAIL {path}:{k}: SFT needs a reference completion under 'spatialcore'" for k in (4, 5, 6)]


def test_check_sft_fails_the_rows_without_a_target(source, capsys):
    """--sft encodes each row's target too (265 tokens): the three video rows have none. Only the rows read are
    counted by kind and category."""
    assert _check(capsys, "--sft", source) == (1, [SFT + "}", *_sft_fails(source)],
                                               "spatial-jax data check: 3 of 6 rows fail\n")


def test_check_skip_counts_the_rows_training_skips(source, capsys):
    rc, out, err = _check(capsys, "--sft", source, "data.bad_rows=skip", "data.max_bad_share=0.5")
    assert (rc, out) == (0, [SFT + ', "skipped": {"SFT needs a reference completion under \'spatialcore\'": 3}}',
                             *_sft_fails(source)])
    assert err == "spatial-jax data check: training skips 3 of 6 rows (data.bad_rows=skip)\n"


def _geometry(root: Path) -> str:
    """EasyR1 rows (geometry3k's shape) as a scrape leaves them: an id repeated twice and a picture over the pixel
    bound; the reader of a layout does not check ids, the screen does."""
    for i, (w, h) in enumerate([(30, 20), (400, 300), (24, 24)]):
        _png(root / "media" / f"{i}.png", w, h, i)
    rows = [{"id": "g0", "problem": "<image>Find x, in centimetres.", "answer": "12", "images": ["0.png"]},
            {"id": "g1", "problem": "<image>Find the area of the triangle.", "answer": "24", "images": ["1.png"]},
            {"id": "g0", "problem": "<image>Find x, in centimetres.", "answer": "12", "images": ["0.png"]},
            {"id": "g2", "problem": "<image>Find y.", "answer": "5", "images": ["2.png"]},
            {"id": "g2", "problem": "<image>Find y.", "answer": "5", "images": ["2.png"]}]
    _write(root / "g.jsonl", rows)
    return f"easyr1:{root / 'g.jsonl'}?image_dir={root / 'media'}"


def test_check_an_id_twice_is_a_bad_row_and_reasons_count_most_common_first(tmp_path, capsys):
    spec, path = _geometry(tmp_path), tmp_path / "g.jsonl"
    counts = ('{"rows": 5, "ok": 2, "failed": 3, "multiple-choice": 0, "numeric": 2, "text": 0, "text-only": 0, '
              '"categories": {"(none)": 2}, "tokens": {"longest": 204, "largest_bucket": 1024, "mode": "rl"}')
    fails = [f"FAIL {path}:2: image {tmp_path}/media/1.png: 400x300 = 120000 pixels, over data.max_image_pixels = "
             "10000", f"FAIL {path}:3: duplicate id 'g0', first at {path}:1",
             f"FAIL {path}:5: duplicate id 'g2', first at {path}:4"]
    assert _check(capsys, spec, "data.max_image_pixels=10000") == (
        1, [counts + "}", *fails], "spatial-jax data check: 3 of 5 rows fail\n")
    assert _check(capsys, spec, "data.max_image_pixels=10000", "data.bad_rows=skip", "data.max_bad_share=0.9") == (
        0, [counts + ', "skipped": {"duplicate id": 2, "image <path>": 1}}', *fails],
        "spatial-jax data check: training skips 3 of 5 rows (data.bad_rows=skip)\n")


def test_check_a_mixture_may_repeat_ids(tmp_path, capsys):
    """A mixture draws the same rows more than once by design."""
    spec = _geometry(tmp_path)
    rc, out, err = _check(capsys, f"mix:1*{spec}|1*{spec}", "data.max_image_pixels=1000000")
    assert (rc, json.loads(out[0])["rows"], json.loads(out[0])["failed"], out[1:], err) == (0, 10, 0, [], "")


def test_check_skip_over_the_share_is_refused(source, capsys):
    """Over data.max_bad_share (1% by default) training refuses the source: nothing is skipped, status 1."""
    rc, out, err = _check(capsys, "--sft", source, "data.bad_rows=skip")
    assert (rc, out) == (1, [SFT + ', "skipped": {}}', *_sft_fails(source)])
    assert err == ("spatial-jax data check: 3 of 6 rows are bad (50.00%), over data.max_bad_share = 0.01; by reason: "
                   "{\"SFT needs a reference completion under 'spatialcore'\": 3}; the first: "
                   f"{source}:4: SFT needs a reference completion under 'spatialcore'\n")


def test_check_refuses_an_empty_source(tmp_path, capsys):
    (tmp_path / "empty.jsonl").write_text("")
    empty = ('{"rows": 0, "ok": 0, "failed": 0, "multiple-choice": 0, "numeric": 0, "text": 0, "text-only": 0, '
             '"categories": {}, "tokens": {"longest": 0, "largest_bucket": 1024, "mode": "rl"}}')
    assert _check(capsys, str(tmp_path / "empty.jsonl")) == (
        1, [empty], "spatial-jax data check: the source holds no row; training refuses it\n")


def test_check_one_line_per_failing_row(tmp_path, capsys):
    """A message over several lines (a picture's reader may write them) is one FAIL line."""
    rows = _rows(tmp_path)
    (tmp_path / "img" / "cut.png").write_bytes(b"\x89PNG\r\n\x1a\n truncated")
    path = _write(tmp_path / "cut.jsonl", [dict(rows[0], image="img/cut.png"), rows[1]])
    assert _check(capsys, path)[1][1:] == [f"FAIL {path}:1: image {tmp_path}/img/cut.png: Truncated File Read"]


# --- the arguments --------------------------------------------------------------------------------------------------

def _help(*path: str) -> str:
    parser = argparse.ArgumentParser(prog="spatial-jax data")
    cli_data.add_arguments(parser)
    for name in path:
        (sub,) = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        parser = sub.choices[name]
    return parser.format_help()


def test_help_pinned(monkeypatch):
    monkeypatch.setenv("COLUMNS", "100")
    assert _help() == ("usage: spatial-jax data [-h] {show,check} ...\n\npositional arguments:\n  {show,check}\n"
                       "    show        print the first rows as training reads them\n"
                       "    check       read every row and picture; count them and list the failing rows\n\n"
                       "options:\n  -h, --help    show this help message and exit\n")
    assert _help("show") == (
        "usage: spatial-jax data show [-h] [--column FIELD=COLUMN] [--seed SEED] [-n N] [--json] spec\n\n"
        "print the first rows as training reads them\n\npositional arguments:\n"
        "  spec                  data source: a JSONL path, FORMAT:PATH[:split] or mix:W*SPEC|W*SPEC\n\noptions:\n"
        "  -h, --help            show this help message and exit\n  --column FIELD=COLUMN\n"
        "                        rename a layout's field (data.columns), repeatable\n"
        "  --seed SEED           a mixture's draw (data.seed)\n  -n N                  rows to show (default 5)\n"
        "  --json                one JSON object per row\n")
    assert _help("check") == (
        "usage: spatial-jax data check [-h] [--column FIELD=COLUMN] [--seed SEED] [--config CONFIG] [--sft]\n"
        "                              spec [key=value ...]\n\n"
        "read every row and picture; count them and list the failing rows\n\npositional arguments:\n"
        "  spec                  data source: a JSONL path, FORMAT:PATH[:split] or mix:W*SPEC|W*SPEC\n"
        "  key=value             config overrides as train takes them, e.g. data.bad_rows=skip\n\noptions:\n"
        "  -h, --help            show this help message and exit\n  --column FIELD=COLUMN\n"
        "                        rename a layout's field (data.columns), repeatable\n"
        "  --seed SEED           a mixture's draw (data.seed)\n"
        "  --config CONFIG       the job whose encoding and data settings apply (default: the main job, as\n"
        "                        train)\n"
        "  --sft                 encode each row's SFT target too, as SFT batches do\n")


def test_an_action_is_required(capsys):
    with pytest.raises(SystemExit) as e:
        main(["data"])
    assert e.value.code == 2
    assert capsys.readouterr().err.endswith("spatial-jax data: error: the following arguments are required: action\n")


def test_a_source_that_cannot_be_opened_is_one_line(tmp_path, capsys):
    with pytest.raises(DatasetError):
        open_source(str(tmp_path / "missing.jsonl"))
    assert main(["data", "check", str(tmp_path / "missing.jsonl")]) == 1
