"""interrupts.raising(): a signal that arrives where Python cannot raise it (a garbage-collection callback, as jax's
_xla_gc_callback was seen to swallow SIGINT at the RL stage's start: the job ran on and ended with status 0 and an
"Exception ignored" traceback) is kept silently and raised at the next check() or where raising() ends."""

from __future__ import annotations

import gc
import os
import signal
import sys

import pytest

from spatial_jax.interrupts import Interrupted, check, raising


class _SignalsInDel:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)
        for _ in range(1000):  # the handler runs at the next bytecode boundary, inside this __del__
            pass


def _lost_signal():
    _SignalsInDel()
    gc.collect()


def test_a_signal_dropped_as_unraisable_is_raised_at_the_next_check(capsys):
    seen = []
    with pytest.raises(Interrupted) as e, raising():
        _lost_signal()
        seen.append("ran on")  # the job goes on where the signal could not be raised...
        check()
        seen.append("after check")
    assert seen == ["ran on"] and e.value.status == 130  # ...to the next check
    assert capsys.readouterr().err == ""  # no "Exception ignored" traceback


def test_a_dropped_signal_is_raised_where_raising_ends_and_not_after(capsys):
    with pytest.raises(Interrupted), raising():
        _lost_signal()
    check()  # nothing left over for a later context
    with raising():
        check()
    assert capsys.readouterr().err == ""


def test_other_unraisable_errors_still_reach_the_hook():
    got = []
    before = sys.unraisablehook
    sys.unraisablehook = got.append
    try:
        class Fails:
            def __del__(self):
                raise ValueError("kept")

        with raising():
            Fails()
            gc.collect()
    finally:
        sys.unraisablehook = before
    assert [type(u.exc_value) for u in got] == [ValueError]
