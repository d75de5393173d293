"""The benchmark scripts' output guard (spatial_jax/cli/script_guard.py) at its edges, beside the scripts' own tests in
test_bench_outputs.py: a file that does not read as text or as JSON is never taken for the script's own, the flag named
in each refusal, the text exactly as written (one final newline), a new file in new folders, an empty folder claimed,
and the marks written and read as UTF-8 whatever the locale (the tables hold "±")."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

import spatial_jax
from spatial_jax.cli.script_guard import check_own_output, claim_folder, write_own
from spatial_jax.config import ConfigError

PACKAGE_ROOT = Path(spatial_jax.__file__).resolve().parents[1]  # the child imports the spatial_jax this test did


def test_a_file_that_does_not_read_is_not_the_scripts_own(tmp_path):
    binary = tmp_path / "t.md"
    binary.write_bytes(b"<!-- written_by mine.py -->\n\xff\xfe")  # the mark, then bytes that are not UTF-8
    broken = tmp_path / "r.json"
    broken.write_text('{"written_by": "mine.py", ', encoding="utf-8")  # the mark, cut off
    for path in (binary, broken):
        with pytest.raises(ConfigError, match=f"{path} exists and was not written by mine.py: name a new file"):
            check_own_output(path, "--out", "mine.py")
    assert binary.read_bytes().endswith(b"\xff\xfe") and broken.read_text().endswith(", ")


def test_each_refusal_names_its_flag(tmp_path):
    with pytest.raises(ConfigError, match="^--report is empty: name the file to write$"):
        check_own_output("", "--report", "mine.py")
    theirs = tmp_path / "t.md"
    theirs.write_text("| a |\n")
    with pytest.raises(ConfigError, match=f"^--out {theirs} exists"):
        write_own(theirs, "| b |", "mine.py")
    with pytest.raises(ConfigError, match=f"^--json {theirs} exists"):
        write_own(theirs, "| b |", "mine.py", flag="--json")


def test_the_text_is_written_as_given_with_one_final_newline_in_new_folders(tmp_path):
    md = tmp_path / "a" / "b" / "t.md"
    write_own(md, "| a |  X\n\n\n", "mine.py")  # the text's own last characters stay; extra newlines go
    assert md.read_text(encoding="utf-8") == "<!-- written_by mine.py -->\n| a |  X\n"
    js = tmp_path / "c" / "d" / "r.json"
    write_own(js, {"rows": [1]}, "mine.py")
    assert json.loads(js.read_text(encoding="utf-8")) == {"written_by": "mine.py", "rows": [1]}
    assert sorted(p.name for p in md.parent.iterdir()) == ["t.md"]  # no partial file left beside it


def test_an_empty_folder_that_exists_is_claimed(tmp_path):
    empty = tmp_path / "out"
    empty.mkdir()
    assert claim_folder(empty, "--out", "mine.py") == empty
    assert (empty / ".written_by").read_text(encoding="utf-8") == "mine.py\n"


def test_marks_round_trip_between_a_utf8_and_an_ascii_locale(tmp_path):
    """Written here (a UTF-8 locale), then rerun under the C locale with UTF-8 mode and locale coercion off (the
    locale's encoding is ASCII), then here again: a table with "±" and an owner outside ASCII are recognised and
    replaced in both, and the folder's mark too."""
    owner, table, again = "bench-±.py", "| 0.5 ± 0.1 |", "| 0.6 ± 0.1 |"
    write_own(tmp_path / "t.md", table, owner)
    (claim_folder(tmp_path / "runs", "--out", owner) / "run").mkdir()
    # the program's text in ASCII (ascii() escapes), since the command line itself is read in the locale's encoding
    program = f"""
from pathlib import Path
from spatial_jax.cli.script_guard import check_own_output, claim_folder, write_own
out, owner = Path({ascii(str(tmp_path))}), {ascii(owner)}
check_own_output(out / "t.md", "--out", owner)
write_own(out / "t.md", {ascii(again)}, owner)
claim_folder(out / "runs", "--out", owner)
(claim_folder(out / "more", "--out", owner) / "run").mkdir()
"""
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "PYTHONCOERCECLOCALE": "0", "PYTHONUTF8": "0",
           "PYTHONPATH": str(PACKAGE_ROOT)}
    done = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr[-2000:]
    assert (tmp_path / "t.md").read_text(encoding="utf-8") == f"<!-- written_by {owner} -->\n{again}\n"
    check_own_output(tmp_path / "t.md", "--out", owner)
    assert claim_folder(tmp_path / "more", "--out", owner) == tmp_path / "more"
