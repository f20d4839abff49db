"""collie.log_to_python: collie's lines reach logging.getLogger("collie")
with their level and fields; a progress thread never waits for the GIL to
log; a reader that falls behind costs dropped lines (reported), not a
stalled engine; off again, lines go back to stderr; a process exiting with
routing on and lines in flight exits cleanly."""

import ctypes
import logging
import os
import subprocess
import sys
import threading
import time

import pytest

import collie
from collie import _lib, _log
from conftest import ROOT, World

lib = _lib.lib


class Capture(logging.Handler):
    def __init__(self, block_first=None):
        super().__init__(logging.DEBUG)
        self.records, self.block_first = [], block_first
        self.cv = threading.Condition()

    def emit(self, record):
        if self.block_first is not None and not self.records:
            self.block_first.wait(20)  # a slow handler: the reader falls behind
        with self.cv:
            self.records.append(record)
            self.cv.notify_all()

    def wait_for(self, pred, timeout=10):
        with self.cv:
            assert self.cv.wait_for(lambda: any(pred(r) for r in self.records), timeout), [
                r.getMessage() for r in self.records]
            return next(r for r in self.records if pred(r))


@pytest.fixture
def capture():
    level = lib.collie_log_level_get()
    cap = Capture()
    log = logging.getLogger("collie")
    log.addHandler(cap)
    old, log.level = log.level, logging.DEBUG
    yield cap
    collie.log_to_python(False)
    log.removeHandler(cap)
    log.setLevel(old)
    lib.collie_set_log_level(level)


def aborted_line(r):
    return "test abort xyz" in r.getMessage()


def test_lines_reach_logging_with_level_and_fields(capture):
    collie.log_to_python(level="WARNING")
    t0 = time.time()
    w = World(2)
    try:
        w.comms[1].abort("test abort xyz")
        rec = capture.wait_for(aborted_line)
    finally:
        w.close()
    assert rec.name == "collie" and rec.levelno == logging.WARNING
    assert rec.collie_module == "comm" and rec.collie_comm == "w" and rec.collie_rank == 0
    assert rec.getMessage().startswith("comm: comm 'w' rank 0: rank 1 aborted the comm")
    assert t0 - 1 <= rec.created <= time.time() + 1
    assert rec.threadName == "collie-log"


def test_level_names_set_collies_level(capture):
    for level, want in (("DEBUG", 3), (logging.INFO, 2), ("warning", 1), (logging.ERROR, 0),
                        (logging.CRITICAL, 0)):
        collie.log_to_python(level=level)
        assert lib.collie_log_level_get() == want
    with pytest.raises(ValueError, match="no logging level"):
        collie.log_to_python(level="LOUD")
    with pytest.raises(TypeError, match="logging level"):
        collie.log_to_python(level=2.5)


def test_progress_thread_never_waits_for_the_gil(capture):
    """The main thread holds the GIL for 1.5 s (a C sleep through PyDLL, which
    keeps it) while the progress thread logs rank 1's abort and fails rank
    0's receive: the receive ends inside that window. A log handler taking
    the GIL on the progress thread would hold it to the window's end."""
    collie.log_to_python(level="WARNING")
    w = World(2)
    try:
        work = w.comms[0].recv(bytearray(8), 1, timeout=30)
        w.comms[1].abort("test abort xyz")
        t0 = time.monotonic_ns()
        ctypes.PyDLL(None).usleep(1_500_000)  # the GIL held throughout
        t1 = time.monotonic_ns()
        with pytest.raises(collie.CollieError):
            work.wait(10)
        end = work.info()["end_ns"]
        capture.wait_for(aborted_line)
    finally:
        w.close()
    assert end < t1 - 500_000_000, (end - t0) / 1e6


def test_reader_behind_drops_and_reports(capture):
    release = threading.Event()
    capture.block_first = release
    collie.log_to_python(level="INFO", capacity=2)
    w = World(2)  # engine, store and comm lines: more than 1 + 2
    try:
        release.set()
        rec = capture.wait_for(lambda r: "log lines dropped" in r.getMessage())
    finally:
        release.set()
        w.close()
    assert rec.levelno == logging.WARNING and int(rec.getMessage().split()[1]) >= 1


def test_off_again_lines_go_to_stderr(capture, capfd):
    collie.log_to_python(level="WARNING")
    collie.log_to_python(False)
    collie.log_to_python(False)  # idempotent
    w = World(2)
    try:
        w.comms[1].abort("test abort xyz")
        deadline = time.monotonic() + 10
        err = ""
        while "test abort xyz" not in err and time.monotonic() < deadline:
            time.sleep(0.05)
            err += capfd.readouterr().err
    finally:
        w.close()
    assert "test abort xyz" in err
    assert not any(aborted_line(r) for r in capture.records)


def test_stop_from_a_handler_then_on_again_routes(capture):
    """log_to_python(False) from a logging handler (the collie-log thread
    itself) stops the routing without joining itself (it raised 'cannot
    join current thread' and left the routing recorded as on, so on again
    was a no-op and the lines went to stderr); on again routes."""
    stop_error, first, done = [], threading.Event(), []

    class StopOnFirst(logging.Handler):
        def emit(self, rec):
            if not first.is_set():
                first.set()
                try:
                    collie.log_to_python(False)
                except Exception as e:  # noqa: BLE001 - reported below
                    stop_error.append(f"{type(e).__name__}: {e}")
                done.append(threading.current_thread().name)

    h = StopOnFirst()
    log = logging.getLogger("collie")
    log.addHandler(h)
    w = None
    try:
        collie.log_to_python(True, level="INFO")
        w = World(2, name="stopper")  # INFO lines: the handler stops routing on the first
        assert first.wait(10)
        collie.log_to_python(True)  # on again
        n = len(capture.records)
        w.comms[0].abort("test abort xyz")
        capture.wait_for(lambda r: aborted_line(r) and capture.records.index(r) >= n)
        assert not stop_error, stop_error
        assert done == ["collie-log"]
    finally:
        if w is not None:
            w.close()
        log.removeHandler(h)


EXITER = r"""
import logging, os, sys, threading
sys.path.insert(0, os.path.join(sys.argv[1], "python"))
sys.path.insert(0, os.path.join(sys.argv[1], "tests", "python"))
import numpy as np, collie
from conftest import World
logging.basicConfig(level=logging.DEBUG, stream=sys.stdout, format="%(name)s %(message)s")
collie.log_to_python(level="DEBUG")
w = World(2)
def spin(r):
    c = w.comms[r]
    while True:  # until the process exits
        c.allreduce(np.ones(4, np.float32)).wait(10)
for r in range(2):
    threading.Thread(target=spin, args=(r,), daemon=True).start()
w.comms[1].abort("exit mid-flight")  # lines from the progress thread as Python exits
print("exiting", flush=True)
"""


def test_exit_with_routing_on_and_lines_in_flight():
    for _ in range(3):
        p = subprocess.run([sys.executable, "-c", EXITER, ROOT], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, text=True, timeout=60,
                           env=dict(os.environ, COLLIE_LOG="debug"))
        assert p.returncode == 0, p.stderr[-3000:]
        assert "exiting" in p.stdout and "collie engine: pytest: started" in p.stdout, p.stdout[-2000:]


# log_to_python(True), then fork (a pre-fork server, a worker pool): the
# child's lines went into the parent's ring, whose reader thread is not in
# the child, and log_to_python(True) there was a no-op (an outside
# breaker's find). Now the child's lines reach stderr at once, and its
# logger once it routes again.
LOG_FORK = r"""
import json, logging, os, sys, time
sys.path.insert(0, os.path.join(sys.argv[1], "python"))
import collie
got = []
class H(logging.Handler):
    def emit(self, r):
        got.append(r.getMessage())
logging.getLogger("collie").addHandler(H())
logging.getLogger("collie").setLevel(logging.DEBUG)
def make_line(name):  # an engine's start is an INFO line naming it
    collie.Engine(name=name).close()
def lines(name):
    return [m for m in got if name in m and "started" in m]
collie.log_to_python(True, level="INFO")
make_line("parentengine")
time.sleep(0.5)
parent = lines("parentengine")
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    make_line("childstderr")  # routing was the parent's: stderr
    collie.log_to_python(True)  # routed again, in the child
    make_line("childrouted")
    time.sleep(0.5)
    os.write(w, json.dumps([lines("childstderr"), lines("childrouted")]).encode())
    collie.log_to_python(False)
    os._exit(0)
os.close(w)
os.waitpid(pid, 0)
child = json.loads(os.read(r, 1 << 20).decode())
print(json.dumps({"parent": parent, "child": child}))
collie.log_to_python(False)
"""


def test_log_routing_in_a_forked_child():
    import json
    env = {k: v for k, v in os.environ.items() if k != "COLLIE_LOG"}
    p = subprocess.run([sys.executable, "-c", LOG_FORK, ROOT], capture_output=True, text=True,
                       timeout=60, env=env)
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert len(out["parent"]) == 1, out
    assert out["child"][0] == [] and "childstderr" in p.stderr, (out, p.stderr[-2000:])
    assert len(out["child"][1]) == 1, out
