"""The bad-row policy's own parts (spatial_jax/data/screen.py), fed the messages the readers really write: how a fault
is named for counting, where the share limit lies, what "fail" and "skip" each do, and the screened view that later
readers take."""

from __future__ import annotations

import pytest

from spatial_jax.data import screen as S
from spatial_jax.data.sample import DatasetError, Sample


def _row(i, sid=None, origin=None, bad=""):
    s = Sample(sid or f"q{i}", None, "Where?", ("left", "right"), "A",
               origin=f"/data/copy/train.jsonl:{i + 1}" if origin is None else origin)
    s.meta["bad"] = bad
    return s


class Rows(list):
    """A source as a reader gives it: reading row `i` may itself fail (a row that does not parse)."""

    files = ("/data/copy/train.jsonl",)

    def __getitem__(self, i):
        row = super().__getitem__(i)
        if isinstance(row, DatasetError):
            raise row
        return row


def _check(sample):
    if sample.meta["bad"]:
        raise sample.error(sample.meta["bad"])


@pytest.mark.parametrize("message, expected", [
    ("/d/train.jsonl:4: duplicate id 'q1', first at /d/train.jsonl:1", "duplicate id"),
    ("/d/train.jsonl:7: missing field 'answer'", "field answer"),
    ("/d/train.parquet row 12: field 'images[3]' is not an image", "field images"),
    ("/d/a.zip:data.json record 2: field 'options[0][1]' is empty", "field options"),
    ("/d/g/data/train-00000-of-00001.parquet row 0: embedded image of 32x24 = 768 pixels, over "
     "data.max_image_pixels = 700", "embedded image of NxN = N pixels, over data.max_image_pixels = N"),
    ("/d/train.jsonl:3: 239 tokens (prompt and pictures; 239 in the prompt) do not fit the largest of "
     "data.bucket_lengths, 220: add a longer bucket or drop the row", "N tokens (prompt and pictures"),
    ("/d/train.jsonl:9: image /d/media/9.png does not exist: extract scannet.tar.gz", "image <path> does not exist"),
    ("/d/train.jsonl:2: " + "x" * 200, "x" * 80),
    ("/d/train.jsonl:2: ", "unreadable row"),
    ("sample q7: the gold 'B' names option B, 'right', not the gold text 'left'", "sample qN"),
])
def test_a_fault_is_counted_by_its_field_or_first_clause(message, expected):
    assert S.reason(DatasetError(message)) == expected


def test_the_first_location_only_is_taken_off():
    # a message whose text holds a second `name:N: ` is cut at its first colon, not stripped twice
    assert S.reason(DatasetError("/d/t.jsonl:5: see /d/u.jsonl:6: as well")) == "see <path>"
    assert S.reason(DatasetError("no location  here;  then more")) == "no location here"


def test_fail_raises_the_first_bad_row():
    rows = Rows([_row(0), _row(1, bad="missing field 'answer'"), _row(2, bad="other")])
    with pytest.raises(DatasetError, match=r"^/data/copy/train.jsonl:2: missing field 'answer'$"):
        S.screen(rows, _check, "fail", 1.0)
    with pytest.raises(DatasetError, match="data.bad_rows must be one of"):
        S.screen(rows, _check, "drop", 1.0)


def test_skip_counts_by_reason_remembers_the_rows_and_keeps_their_messages():
    rows = Rows([_row(0), _row(1, bad="missing field 'answer'"), DatasetError("/data/copy/train.jsonl:3: not JSON"),
                 _row(3), _row(4, sid="q0"), _row(5, bad="missing field 'answer'")])
    errors = []
    key = ("spec", (), 0)
    reasons = S.screen(rows, _check, "skip", 0.7, key=key, errors=errors)
    assert reasons == {"field answer": 2, "not JSON": 1, "duplicate id": 1}
    assert errors[2] == "/data/copy/train.jsonl:5: duplicate id 'q0', first at /data/copy/train.jsonl:1"
    assert len(errors) == 4 and errors[0] == "/data/copy/train.jsonl:2: missing field 'answer'"
    view = S.screened(rows, key)
    assert [s.id for s in view] == ["q0", "q3"] and len(view) == 2 and view.files == rows.files
    assert view[-1].id == "q3" and [s.id for s in view[0:2]] == ["q0", "q3"]
    with pytest.raises(IndexError):
        view[2]
    assert S.screened(rows, ("another spec", (), 0)) is rows  # nothing screened under that key: the source itself


def test_a_row_without_an_origin_is_named_by_its_position_in_a_duplicate():
    rows = Rows([_row(0, origin=""), _row(1, sid="q0")])
    errors = []
    S.screen(rows, _check, "skip", 1.0, errors=errors)
    assert errors == ["/data/copy/train.jsonl:2: duplicate id 'q0', first at row 0"]
    assert S.screen(rows, _check, "skip", 1.0, unique_ids=False) == {}  # a mixture may draw a row twice


def test_the_share_limit_refuses_only_above_it():
    rows = Rows([_row(i, bad="missing field 'answer'" if i < 2 else "") for i in range(8)])
    assert S.screen(rows, _check, "skip", 0.25) == {"field answer": 2}  # 2 of 8 is the limit itself
    with pytest.raises(DatasetError) as e:
        S.screen(rows, _check, "skip", 0.2)
    assert str(e.value) == ("2 of 8 rows are bad (25.00%), over data.max_bad_share = 0.2; by reason: "
                            "{'field answer': 2}; the first: /data/copy/train.jsonl:1: missing field 'answer'")
    clean = Rows([_row(i) for i in range(3)])
    assert S.screen(clean, _check, "skip", 0.0, key=("clean",)) == {}
    assert S.screened(clean, ("clean",)) is clean  # nothing dropped: the source itself
