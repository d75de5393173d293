"""tools/make_synthetic.py: a preview sheet, and one line (no traceback, status 2) for each argument it cannot use."""

import sys
from pathlib import Path

import pytest

sys.path.append(str(Path(__file__).resolve().parents[1] / "tools"))

import make_synthetic


def test_a_preview_is_written(tmp_path, capsys):
    assert make_synthetic.main(["--out", str(tmp_path), "--num", "2"]) == 0
    assert (tmp_path / "sheet.png").is_file() and "gold" in (tmp_path / "samples.txt").read_text()


@pytest.mark.parametrize("argv, message", [
    (["--num", "0"], "--num must lie in [1, 64], got 0"),  # a division by zero before
    (["--num", "100000000"], "--num must lie in [1, 64], got 100000000"),  # ran for hours
    (["--scale", "0"], "--scale must be >= 1"),
    (["--size", "4096", "--scale", "2"], "--size x --scale <= 4096 pixels"),
    (["--size", "5"], "--size: width must lie in [32, 4096], got 5"),
    (["--corrupt-fraction", "2"], "--corrupt-fraction: corrupt_fraction must lie in [0, 1], got 2.0"),
])
def test_argument_errors_are_one_line(argv, message, tmp_path, capsys):
    assert make_synthetic.main(["--out", str(tmp_path / "out"), *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("make_synthetic.py: configuration error: ") and message in err and err.count("\n") == 1
    assert not (tmp_path / "out").exists()
