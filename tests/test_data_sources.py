"""Published training sets read as their authors publish them (spatial_jax/data/sources): every layout's tiny copy
(tests/layout_copies.py, which says where a layout detail was inferred) shows its questions, options, gold and
pictures as written; a broken row of each kind is named by file, row and field; rows stream through the grain
pipeline (sharded, resumable); a mixture is drawn per seed; and one `train` run takes 2 SFT + 2 GRPO steps over
every layout at once, with the published trees and zips beside them (one run, so the compiled programs are shared:
its two batches of 16 per stage hold every readable row between them)."""

import json
import zipfile
from pathlib import Path

import layout_copies as L
import numpy as np
import pytest

from spatial_jax.cli import main
from spatial_jax.data import pipeline as P
from spatial_jax.data.image_processing import ImageProcessingConfig
from spatial_jax.data.prompts import THINK_BOXES
from spatial_jax.data.sample import DatasetError
from spatial_jax.data.sources import Mixture, open_spec, parse_spec
from spatial_jax.data.sources.rows import JsonLines, ParquetRows

IMG = ImageProcessingConfig(min_pixels=32 * 32, max_pixels=96 * 96)


@pytest.fixture(scope="module")
def copies(tmp_path_factory):
    return L.write_all(tmp_path_factory.mktemp("copies"), n=2)


def _show(spec, capsys, n=2):
    assert main(["data", "show", spec, "-n", str(n), "--json"]) == 0
    return [json.loads(line) for line in capsys.readouterr().out.splitlines()]


def _digest(paths_before):
    return {p: p.stat().st_mtime_ns for p in paths_before}


# layout -> the two rows' ids and categories, from the field each layout's authors name them by (the reader's
# module doc), or the place of the row where the layout has no id
NAMES = {"verl": (["0", "1"], ["tiny_world"] * 2), "easyr1": (["e0", "e1"], [""] * 2), "trl": (["t0", "t1"], [""] * 2),
         "hf-disk": (["stvqa7k-train-0", "stvqa7k-train-1"], ["relative_position", "counting"]),
         "stvqa7k": (["stvqa7k-train-0", "stvqa7k-train-1"], ["relative_position", "counting"]),
         "omnispatial-train": (["Perspective_Taking_0_0", "Perspective_Taking_1_0"], ["Allocentric"] * 2),
         "mindcube-train": (["around_0", "around_1"], ["around"] * 2),
         "spar7m": (["spar0", "spar1"], ["position_matching"] * 2),
         "vsi590k": (["vsi0", "vsi1"], ["object_rel_direction_easy", "object_counting"])}


@pytest.mark.parametrize("layout", list(L.WRITERS))
def test_show_gives_each_row_as_the_copy_holds_it(layout, copies, capsys):
    spec, samples = copies[layout]
    root = Path(parse_spec(spec).path)
    folder = root if root.is_dir() else root.parent
    files = sorted(p for p in folder.rglob("*") if p.is_file())
    before = _digest(files)
    rows = _show(spec, capsys)
    assert len(rows) == 2
    assert ([r["id"] for r in rows], [r["category"] for r in rows]) == NAMES[layout]
    for row, s in zip(rows, samples):
        numeric = layout == "vsi590k" and row is rows[-1]
        text = layout in ("easyr1", "trl") and row is rows[0]  # the writers' short text answer
        assert row["question"] == ("How many objects are in the room?" if numeric else L.text_question(s) if text
                                   else s.question)
        assert row["options"] == ([] if numeric or text else list(s.options))
        assert row["answer"] == (2 if numeric else L.text_gold(s) if text else s.answer)
        assert row["answer_type"] == ("number" if numeric else "text" if text else "choice")
        assert row["reference"] == ("2" if numeric else L.cot(s))  # the copy's completion, the SFT target
        if layout == "vsi590k":
            assert row["images"] == [] and row["video"] == {"frames": 4, "fps": 2.0}
        elif layout == "verl" and row is rows[-1]:  # the writer's text-only row
            assert row["images"] == [] and row["video"] is None
        else:
            assert row["images"] == [{"width": 96, "height": 96}] * (2 if layout == "mindcube-train" else 1)
            assert row["video"] is None
    assert sorted(p for p in folder.rglob("*") if p.is_file()) == files and _digest(files) == before  # no writes


def test_data_check_counts_rows(copies, capsys):
    assert main(["data", "check", copies["vsi590k"][0]]) == 0
    counts = json.loads(capsys.readouterr().out.splitlines()[0])
    assert counts == {"rows": 2, "ok": 2, "failed": 0, "multiple-choice": 1, "numeric": 1, "text": 0, "text-only": 0,
                      "categories": {"object_counting": 1, "object_rel_direction_easy": 1},
                      "tokens": {"longest": 253, "largest_bucket": 1024, "mode": "rl"}}  # a video's 2 frames


def _rewrite_jsonl(path: Path, row: int, change) -> None:
    rows = [json.loads(x) for x in path.read_text().splitlines()]
    change(rows[row])
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _rewrite_parquet(path: Path, row: int, change) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = pq.read_table(path).to_pylist()
    change(rows[row])
    pq.write_table(pa.Table.from_pylist(rows), path)


def test_check_names_each_broken_row_by_file_row_and_field(tmp_path, capsys):
    """One broken row of each kind, in the layout where it is likeliest, each named by file, row and field."""
    ss = L.samples(2)
    cases = []
    spec = L.stvqa7k(tmp_path / "st", ss)  # an answer that is no option
    f = tmp_path / "st/data/train-00000-of-00001.parquet"
    _rewrite_parquet(f, 1, lambda r: r.update(answer_option_text="(E) nowhere"))
    cases.append((spec, f"{f} row 1: field 'answer_option_text' = '(E) nowhere' is none of the 4 options"))
    spec = L.verl(tmp_path / "verl", ss)  # a missing field
    f = tmp_path / "verl/train.parquet"
    _rewrite_parquet(f, 0, lambda r: r.update(reward_model={"style": "rule", "ground_truth": None}))
    cases.append((spec, f"{f} row 0: missing field 'reward_model.ground_truth'"))
    spec = L.easyr1(tmp_path / "e", ss)  # an image file that is not there
    (tmp_path / "e/media/1.png").unlink()
    cases.append((spec, f"{tmp_path / 'e/train.jsonl'}:2: field 'images[0]': image {tmp_path / 'e/media/1.png'} "
                        "does not exist"))
    spec = L.trl(tmp_path / "t", ss)  # an embedded image that cannot be decoded
    f = tmp_path / "t/data/train-00000-of-00001.parquet"
    _rewrite_parquet(f, 0, lambda r: r.update(image={"bytes": b"not a png", "path": None}))
    cases.append((spec, f"{f} row 0: field 'image': the embedded image cannot be decoded"))
    spec = L.omnispatial_train(tmp_path / "o", ss)  # an archive member that is missing
    z = tmp_path / "o/OmniSpatial-train.zip"
    with zipfile.ZipFile(z) as src:
        kept = {n: src.read(n) for n in src.namelist() if not n.endswith("/1.png")}
    with zipfile.ZipFile(z, "w") as out:
        for n, data in kept.items():
            out.writestr(n, data)
    cases.append((spec, f"{z}:OmniSpatial-train/data.json record 1: field 'id': {z} has no member "
                        "OmniSpatial-train/Perspective_Taking/1.png"))
    spec = L.vsi590k(tmp_path / "v", ss)  # a video that cannot be read
    (tmp_path / "v/scannet/scene0000.mp4").write_bytes(b"\0" * 64)
    cases.append((spec, f"{tmp_path / 'v/vsi_590k.jsonl'}:1: video {tmp_path / 'v/scannet/scene0000.mp4'}"))
    spec = L.mindcube_train(tmp_path / "m", ss)  # a missing gold
    f = tmp_path / "m/raw/MindCube_train.jsonl"
    _rewrite_jsonl(f, 1, lambda r: r.pop("gt_answer"))
    cases.append((spec, f"{f}:2: missing field 'gt_answer'"))
    spec = L.spar7m(tmp_path / "s", ss)  # a gold whose letter names one option and whose text another's
    f = tmp_path / "s/spar_train.jsonl"
    options = "\n".join(f"{k}. {o}" for k, o in zip("ABCD", ss[0].options))
    _rewrite_jsonl(f, 0, lambda r: r.update(conversations=[
        {"from": "human", "value": "<image>\nWhere is it?\n" + options},
        {"from": "gpt", "value": f"(A) {ss[0].options[1]}"}]))
    cases.append((spec, f"{f}:1: field 'conversations[gpt]' = '(A) {ss[0].options[1]}' names option A, which reads "
                        f"'{ss[0].options[0]}'"))
    for spec, expected in cases:
        assert main(["data", "check", spec]) == 1, spec
        out = capsys.readouterr().out.splitlines()
        counts = json.loads(out[0])
        assert counts["rows"] == 2 and counts["failed"] == 1, (spec, counts)
        assert len(out) == 2 and out[1].startswith(f"FAIL {expected}"), (out[1], expected)
    # training refuses the same rows before anything compiles (the trainer's preflight reads every row)
    from spatial_jax import config as C
    from spatial_jax.rl.config import TrainConfig
    from spatial_jax.rl.train import open_inputs

    cfg = C.load(TrainConfig, None, [f"run_dir={tmp_path / 'run'}", f"data.train={cases[0][0]}", "sft.steps=0"])
    with pytest.raises(DatasetError, match=f"data.train: {f'{tmp_path}/st/data/train-00000-of-00001.parquet row 1'}"):
        open_inputs(cfg)


def test_unknown_format_and_spec_forms(tmp_path):
    with pytest.raises(DatasetError, match=r"unknown data format 'parket' .*known: jsonl, synthetic, verl, easyr1, "
                                           r"trl, hf-disk, stvqa7k, omnispatial-train, mindcube-train, spar7m, "
                                           r"vsi590k, mix"):
        open_spec("parket:/data/x")
    assert parse_spec("data/stvqa_7k.jsonl").format == "jsonl"
    assert parse_spec("stvqa7k:/d/STVQA-7K:val") == parse_spec("stvqa7k:/d/STVQA-7K:val")
    s = parse_spec("stvqa7k:/d/STVQA-7K:val?question=question_with_options&answer=answer_option_text_only")
    assert (s.path, s.split, s.columns) == ("/d/STVQA-7K", "val", ("question=question_with_options",
                                                                   "answer=answer_option_text_only"))
    assert parse_spec("omnispatial-train:/d/OmniSpatial-train.zip").split == ""
    with pytest.raises(DatasetError, match="does not exist"):
        open_spec(f"verl:{tmp_path / 'missing.parquet'}")
    with pytest.raises(DatasetError, match="unknown fields \\['qestion'\\]"):
        open_spec(f"verl:{tmp_path}", columns=("qestion=x",))
    with pytest.raises(DatasetError, match="WEIGHT\\*SPEC"):
        open_spec(f"mix:1*verl:{tmp_path}|-1*verl:{tmp_path}")


def test_columns_rename_a_layouts_fields(copies, capsys):
    """The authors' plain-GRPO baseline reads question_with_options / answer_option_text_only: the options inside
    the question are split off, the gold read from the other column."""
    spec, samples = copies["stvqa7k"]
    rows = _show(spec.replace(":train", ":val") + "?question=question_with_options&answer=answer_option_text_only",
                 capsys, n=5)
    assert [(r["question"], r["options"], r["answer"]) for r in rows] == [
        (samples[0].question, list(samples[0].options), samples[0].answer)]


def test_rows_stream_by_line_and_row_group(tmp_path):
    f = tmp_path / "x.jsonl"
    f.write_bytes(b'\xef\xbb\xbf{"a": 1}\r\n\n  \n{"a": 2}\n{"a": 3}')
    rows = JsonLines(f)
    assert [r.data["a"] for r in rows] == [1, 2, 3] and [r.where for r in rows] == [f"{f}:1", f"{f}:4", f"{f}:5"]
    L._parquet([{"k": i} for i in range(10)], tmp_path / "p.parquet", row_group_size=3)
    table = ParquetRows([tmp_path / "p.parquet"])
    order = np.random.default_rng(0).permutation(10)
    assert [table[int(i)].data["k"] for i in order] == list(order) and len(table._cache) <= 2
    # grain reads with 16 threads by default: rows are positional reads, the row-group cache is locked
    import grain

    L._jsonl([{"k": i, "pad": "x" * (i % 50)} for i in range(2000)], tmp_path / "many.jsonl")
    L._parquet([{"k": i} for i in range(2000)], tmp_path / "many.parquet", row_group_size=100)
    for rows in (JsonLines(tmp_path / "many.jsonl"), ParquetRows([tmp_path / "many.parquet"])):
        ds = grain.MapDataset.source(rows).shuffle(seed=1).to_iter_dataset(grain.ReadOptions(num_threads=16))
        assert sorted(r.data["k"] for r in ds) == list(range(2000))


def test_a_layout_streams_through_the_pipeline_sharded_and_resumable(tmp_path):
    """Two processes read disjoint blocks of each batch, and a restored iterator state yields the same batch."""
    from spatial_jax.data.tokenizer import build_tokenizer

    tok = build_tokenizer()
    ss = L.samples(8)
    spec = L.spar7m(tmp_path, ss)
    data = P.DataConfig(train=spec, eval=spec, bucket_lengths=(256, 512))
    whole = P.train_iterator(data, tok, THINK_BOXES, 4, image_cfg=IMG)
    first = [r.id for r in next(whole).records]
    halves = [P.train_iterator(data, tok, THINK_BOXES, 4, image_cfg=IMG, process=k, processes=2) for k in (0, 1)]
    assert [r.id for h in halves for r in next(h).records] == first
    state = whole.get_state()
    want = [r.id for r in next(whole).records]
    again = P.train_iterator(data, tok, THINK_BOXES, 4, image_cfg=IMG)
    again.set_state(state)
    assert [r.id for r in next(again).records] == want


def test_mixture_is_drawn_per_seed_with_its_weights(tmp_path):
    a = L.easyr1(tmp_path / "a", L.samples(12, seed=1))
    b = L.spar7m(tmp_path / "b", L.samples(4, seed=2))
    spec = f"mix:3*{a}|1*{b}"
    ids = [[s.id for s in open_spec(spec, seed=seed)] for seed in (0, 0, 1)]
    assert ids[0] == ids[1] != ids[2]
    assert len(ids[0]) == 16 and sum(i.startswith("spar") for i in ids[0]) == 4  # 3:1
    assert isinstance(open_spec(spec), Mixture)
    # resumable: a restored grain iterator position continues the same draw
    import grain

    ONE = grain.ReadOptions(num_threads=0, prefetch_buffer_size=1)  # as DataIterator reads by default

    def ids_of(it, n):
        return [next(it).id for _ in range(n)]

    it = iter(grain.MapDataset.source(open_spec(spec, seed=1)).shuffle(seed=1).repeat(None).to_iter_dataset(ONE))
    ids_of(it, 7)
    state, want = it.get_state(), ids_of(it, 12)
    again = iter(grain.MapDataset.source(open_spec(spec, seed=1)).shuffle(seed=1).repeat(None).to_iter_dataset(ONE))
    again.set_state(state)
    assert ids_of(again, 12) == want


@pytest.mark.slow
def test_train_runs_sft_and_grpo_steps_on_every_layout(tmp_path):
    """2 SFT + 2 GRPO steps of the tiny model over one mixture of all 9 copies (2 rows each: verl's second row is
    text-only, EasyR1's and TRL's first rows have text golds), SPAR-7M's extracted tree, MindCube's data.zip,
    OmniSpatial's training zip (a list question, options drawn in the image; tests/test_spar7m_tree.py and
    tests/test_layout_archives.py cite these layouts) and an EasyR1 copy of text-only rows with text golds and one
    row without its gold (data.bad_rows=skip): the 32 good rows shuffled fill the 2 GRPO batches of 16, so every
    readable row of every layout is trained on; SFT reads the copies that hold a completion or name one with
    `?reference=` (the zips hold none); then an evaluation whose one batch mixes text-only and image rows."""
    import grain
    from test_data_second_pass import text_only_copy
    from test_layout_archives import mindcube_zip, omnispatial_zip
    from test_spar7m_tree import write_tree

    from spatial_jax import config as C
    from spatial_jax.rl.config import TrainConfig
    from spatial_jax.rl.train import train

    copies = {name: spec for name, (spec, _) in L.write_all(tmp_path / "copies", n=2).items()}
    copies["spar"] = f"spar7m:{write_tree(tmp_path / 'copies' / 'spar')}"
    copies["mc"] = f"mindcube-train:{mindcube_zip(tmp_path / 'copies' / 'mc', L.samples(2))}"
    copies["omni.zip"] = f"omnispatial-train:{omnispatial_zip(tmp_path / 'copies' / 'omni.zip', L.samples(3, 1))}"
    copies["text"] = text_only_copy(tmp_path / "copies" / "text", bad=True)  # its row t2 has no gold
    # each part weighted by its rows, so the mixture draws them all (grain's mix ends where a part runs out)
    parts = {name: f"{len(open_spec(spec))}*{spec}" for name, spec in copies.items()}
    mix = "mix:" + "|".join(parts.values())
    sft_mix = "mix:" + "|".join(part for name, part in parts.items() if name not in ("mc", "omni.zip"))
    cfg = C.load(TrainConfig, None, [
        f"run_dir={tmp_path / 'run'}", "sft.steps=2", "sft.batch_size=16", "rl.steps=2", "rl.prompts_per_step=16",
        "rl.group_size=2", "rl.sampling.max_new_tokens=8", "eval.after_sft=false", "eval.after_rl=true",
        "eval.batch_size=4", f"data.sft_train={sft_mix}", f"data.train={mix}", f"data.eval={copies['text']}",
        "tensorboard=false", "progress=false", "data.bucket_lengths=[256,512,1024]", "export_hf=false",
        "data.bad_rows=skip", "data.max_bad_share=0.25", "policy.min_pixels=1024", "policy.max_pixels=3136"])
    result = train(cfg)
    assert result["skipped_rows"] == {key: {"field answer": 1} for key in ("data.sft_train", "data.train", "data.eval")}
    assert result["after_rl"]["n"] == 4
    source, good = open_spec(mix, seed=cfg.data.seed), P.data_source(cfg.data, mix)  # without the screened row
    read = list(grain.MapDataset.source(good).shuffle(seed=cfg.data.seed)[:32])  # as train_iterator orders them
    root = f"{tmp_path / 'copies'}/"
    layouts = [s.origin[len(root):].split("/")[0].split(":")[0] for s in read]
    assert len(source) == 33 and len(good) == 32 and set(layouts) == set(copies)
    for stage in ("sft", "rl"):
        rows = [json.loads(x) for x in (tmp_path / "run" / stage / "metrics.jsonl").read_text().splitlines()]
        assert [r["step"] for r in rows] == [1, 2] and all(np.isfinite(r["loss"]) for r in rows)
        assert rows[0]["data/skipped_rows"] == 1 and rows[0]["data/skipped/field answer"] == 1


WEIRD = [None, 0, 7, -1, 2.5, True, "", "x", "Z", "<image>", [], [1], ["a", "b"], {}, {"bytes": 3}, {"path": 5},
         {"from": "gpt"}, "(B) x", "1e400"]


def test_no_row_or_file_ends_in_a_traceback(tmp_path, capsys):
    """Each field of a valid row of the JSON-lines layouts replaced by an odd value, and files of the other layouts
    that are no such file: `data check` answers 0 or 1 with one line per failing row, never a traceback."""
    ss = L.samples(1)
    rng = np.random.default_rng(0)
    for name in ("easyr1", "mindcube-train", "spar7m", "vsi590k"):
        spec = L.WRITERS[name](tmp_path / name, ss)
        path = next(p for p in (tmp_path / name).rglob("*.jsonl"))
        good = json.loads(path.read_text().splitlines()[0])
        rows = []
        for key in good:
            for value in rng.choice(np.array(WEIRD, dtype=object), 6, replace=False):
                rows.append({**good, key: value})
            rows.append({k: v for k, v in good.items() if k != key})
        rows += [[good], "row", 5, None]
        path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        assert main(["data", "check", spec]) == 1
        out = capsys.readouterr().out.splitlines()
        assert all(line.startswith(f"FAIL {path}:") for line in out[1:]) and len(out) > 1
    garbage = tmp_path / "garbage"
    garbage.mkdir()
    for suffix in (".parquet", ".zip", ".jsonl", ".json", ".arrow"):
        (garbage / f"x{suffix}").write_bytes(bytes(rng.integers(0, 256, 200, dtype=np.uint8)))
    (garbage / "state.json").write_text('{"_data_files": [{"filename": "x.arrow"}]}')
    for spec in (f"verl:{garbage / 'x.parquet'}", f"omnispatial-train:{garbage / 'x.zip'}", f"trl:{garbage / 'x.json'}",
                 f"easyr1:{garbage / 'x.jsonl'}", f"hf-disk:{garbage}", f"stvqa7k:{garbage}:train",
                 f"mix:1*verl:{garbage / 'x.parquet'}|1*easyr1:{garbage / 'x.jsonl'}"):
        assert main(["data", "check", spec]) == 1, spec
        err = capsys.readouterr().err
        assert err.startswith("spatial-jax data") and "Traceback" not in err, (spec, err)


def test_tools_read_a_layout_and_never_write_into_the_copy(tmp_path, capsys):
    """filter-sft (as pseudo-gt, corrupt and to-cvbench) takes a spec; an output inside the copy's folder is refused
    before anything is written."""
    from spatial_jax.data.jsonl import read_jsonl

    spec = L.stvqa7k(tmp_path / "st", L.samples(3))
    kept = tmp_path / "out" / "kept.jsonl"
    assert main(["filter-sft", "--input", spec, "--output", str(kept), "--method-key", "spatialthinker",
                 "--report", str(tmp_path / "r.json")]) == 0
    assert len(read_jsonl(kept)) == json.loads((tmp_path / "r.json").read_text())["kept"]
    inside = tmp_path / "st" / "data" / "kept.jsonl"
    assert main(["filter-sft", "--input", spec, "--output", str(inside)]) == 2
    assert f"--output {inside} lies inside the copy" in capsys.readouterr().err and not inside.exists()
    assert main(["to-cvbench", "--data", f"mix:1*{spec}|1*{spec}", "--out", str(tmp_path / "st" / "cv")]) == 2
    assert not (tmp_path / "st" / "cv").exists()


def test_a_layouts_digest_follows_its_rows_not_its_place(tmp_path):
    """What a checkpoint and a pseudo-GT output record of their data: a changed row changes it, a moved copy or
    another split's file does not (a JSONL file keeps its own SHA-256, as recorded before layouts existed)."""
    import shutil

    from spatial_jax.data.sources import spec_digest
    from spatial_jax.digests import sha256

    ss = L.samples(3)
    spec = L.stvqa7k(tmp_path / "a", ss)
    first = spec_digest(spec)
    shutil.copytree(tmp_path / "a", tmp_path / "b")
    assert spec_digest(spec.replace(str(tmp_path / "a"), str(tmp_path / "b"))) == first
    assert spec_digest(spec.replace(":train", ":val")) != first
    _rewrite_parquet(tmp_path / "b" / "data" / "val-00000-of-00001.parquet", 0, lambda r: r.update(rating=1))
    assert spec_digest(spec.replace(str(tmp_path / "a"), str(tmp_path / "b"))) == first
    _rewrite_parquet(tmp_path / "a" / "data" / "train-00000-of-00001.parquet", 1, lambda r: r.update(answer_only="D"))
    assert spec_digest(spec) != first
    mixed = spec_digest(f"mix:1*{spec}|2*{spec}")
    assert mixed != spec_digest(f"mix:2*{spec}|1*{spec}")
    assert spec_digest("synthetic:train:8") is None
    (tmp_path / "rows.jsonl").write_text("{}\n")
    assert spec_digest(str(tmp_path / "rows.jsonl")) == sha256(tmp_path / "rows.jsonl")


def test_spec_digest_is_the_formula_recorded_runs_hold(tmp_path):
    """Checkpoints and pseudo-GT outputs hold the digest and a resume compares it: its formula is pinned here (an
    edit of it would make every recorded run look like other data): format, split and the spec's columns in order,
    then each row file of the split by name and SHA-256 in name order; a mixture hashes its parts' weights and
    digests in order."""
    import hashlib

    from spatial_jax.data.sources import spec_digest
    from spatial_jax.digests import sha256

    root = tmp_path / "st"
    spec = L.stvqa7k(root, L.samples(2)) + "?question=question_only&id=category"
    files = sorted((root / "data").glob("train-*.parquet"))
    (root / "data" / "train-00001-of-00002.parquet").write_bytes(files[0].read_bytes())  # a second row file
    files = sorted((root / "data").glob("train-*.parquet"))
    h = hashlib.sha256(b"stvqa7k:train?question=question_only&id=category")
    for f in files:
        h.update(f"{f.name}:{sha256(f)}\n".encode())
    assert len(files) == 2 and spec_digest(spec) == h.hexdigest()
    rows = tmp_path / "rows.jsonl"
    rows.write_text("{}\n")
    mixed = f"mix:1*{spec}|2.5*{rows}"
    parts = f"1.0*{h.hexdigest()}|2.5*{sha256(rows)}"
    assert spec_digest(mixed) == hashlib.sha256(parts.encode()).hexdigest()
