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


def test_interrupted_keeps_its_signal_and_place_through_at_and_pickling():
    """The exception's args are (signum, where), so it pickles (a worker's interrupt reaching its parent)."""
    import pickle

    e = Interrupted(signal.SIGTERM)
    assert (e.signum, e.where, str(e), e.status) == (signal.SIGTERM, "", "interrupted", 143)
    at = e.at(" at step 5; rerun to resume")
    assert (at.signum, at.where, str(at)) == (signal.SIGTERM, " at step 5; rerun to resume",
                                                "interrupted at step 5; rerun to resume")
    back = pickle.loads(pickle.dumps(at))
    assert (back.signum, back.where, back.args) == (signal.SIGTERM, at.where, (signal.SIGTERM, at.where))


def test_raising_restores_the_handlers_and_hook_it_found():
    """Each signal's handler before (a Python one, or SIG_DFL for one set outside Python) is back on exit, and the
    handler put its predecessor back before raising: a second signal while the job cleans up does what it did."""
    mine = []

    def handler(signum, frame):
        mine.append(signum)

    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    was, hook = sys.unraisablehook, [].append  # a hook of this test's own, whatever an earlier test left
    try:
        sys.unraisablehook = hook
        signal.signal(signal.SIGINT, handler)
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        with pytest.raises(Interrupted) as e, raising():
            assert signal.getsignal(signal.SIGINT) is not handler and sys.unraisablehook is not hook
            os.kill(os.getpid(), signal.SIGTERM)
            for _ in range(1000):
                pass
        assert e.value.signum == signal.SIGTERM and e.value.status == 143
        assert signal.getsignal(signal.SIGINT) is handler and signal.getsignal(signal.SIGTERM) is signal.SIG_IGN
        assert sys.unraisablehook is hook
        with raising():
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(1000):
                pass
            raise AssertionError("not raised")
    except Interrupted:
        assert signal.getsignal(signal.SIGINT) is handler
        os.kill(os.getpid(), signal.SIGINT)  # raising() is over: the handler found before gets it
        for _ in range(1000):
            pass
        assert mine == [signal.SIGINT]
    finally:
        sys.unraisablehook = was
        for s, handler_before in before.items():
            signal.signal(s, handler_before)


def test_a_handler_set_outside_python_comes_back_as_the_default(monkeypatch):
    before = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    monkeypatch.setattr(signal, "getsignal", lambda s: None)
    set_to = []
    real = signal.signal
    monkeypatch.setattr(signal, "signal", lambda s, h: set_to.append((s, h)) or real(s, h))
    try:
        with raising():
            pass
    finally:
        for s, was in before.items():
            real(s, was)
    assert set_to[-2:] == [(signal.SIGINT, signal.SIG_DFL), (signal.SIGTERM, signal.SIG_DFL)]


def test_outside_the_main_thread_raising_changes_nothing():
    import threading

    seen = []

    def run():
        with raising():
            seen.append((signal.getsignal(signal.SIGINT), sys.unraisablehook))

    t = threading.Thread(target=run)
    t.start()
    t.join()
    assert seen == [(signal.getsignal(signal.SIGINT), sys.unraisablehook)]


@pytest.mark.parametrize("status,left", [(130, "os._exit"), (143, "os._exit"), (0, "sys.exit"), (1, "sys.exit"),
                                         (2, "sys.exit"), (137, "sys.exit")])
def test_the_command_leaves_at_once_after_a_signal(status, left, monkeypatch):
    """Issue 55 item 1: after SIGINT / SIGTERM (130 / 143) the process skips the interpreter's teardown, which
    segfaulted; every other status goes through sys.exit as usual."""
    import spatial_jax.cli as cli

    flushed, exits = [], []
    monkeypatch.setattr(cli, "main", lambda: status)
    monkeypatch.setattr(cli.os, "_exit", lambda code: exits.append(("os._exit", code)))
    monkeypatch.setattr(cli.sys.stdout, "flush", lambda: flushed.append("stdout"))
    monkeypatch.setattr(cli.sys.stderr, "flush", lambda: flushed.append("stderr"))
    try:
        cli.entry()
    except SystemExit as e:
        exits.append(("sys.exit", e.code))
    assert exits[0] == (left, status)
    assert flushed == (["stdout", "stderr"] if left == "os._exit" else [])
