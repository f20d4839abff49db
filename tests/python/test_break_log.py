"""Breakage reproducers for collie.log_to_python (a fresh-eyed tester's
findings, issue 31); xfail with what happens instead."""

import logging
import threading

import pytest

import collie
from collie import _lib, _log
from conftest import World

lib = _lib.lib


@pytest.mark.xfail(strict=True, reason="log_to_python(False) from a logging handler (the "
                   "collie-log thread) raises 'cannot join current thread' after detaching the "
                   "handler and stopping the thread, with _state still set: log_to_python(True) "
                   "is then a no-op and collie's lines go to stderr for good")
def test_log_to_python_stop_from_a_handler_then_on_again_routes():
    old_level = lib.collie_log_level_get()
    log = logging.getLogger("collie")
    seen, stop_error, first = [], [], threading.Event()

    class StopOnFirst(logging.Handler):
        def emit(self, rec):
            seen.append(rec.getMessage())
            if not first.is_set():
                first.set()
                try:
                    collie.log_to_python(False)
                except Exception as e:  # noqa: BLE001
                    stop_error.append(f"{type(e).__name__}: {e}")

    h = StopOnFirst()
    log.addHandler(h)
    old, log.level = log.level, logging.DEBUG
    w = None
    try:
        collie.log_to_python(True, level="INFO")
        w = World(2, name="stopper")  # INFO lines: the handler stops routing on the first
        assert first.wait(10)
        collie.log_to_python(True)  # on again
        n = len(seen)
        w.comms[0].abort("break31 abort line")
        deadline = threading.Event()
        for _ in range(50):
            if any("break31 abort line" in m for m in seen[n:]):
                break
            deadline.wait(0.1)
        # observed: stop_error == ['RuntimeError: cannot join current thread'] and
        # the abort's lines on stderr, none in logging
        assert not stop_error, stop_error
        assert any("break31 abort line" in m for m in seen[n:]), seen
    finally:
        if w is not None:
            w.close()
        collie.log_to_python(False)
        _log._state = None
        log.removeHandler(h)
        log.setLevel(old)
        lib.collie_set_log_level(old_level)
