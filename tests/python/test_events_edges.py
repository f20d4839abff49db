"""events() at its edges, found by a review (each failed before its fix):
two iterators on one comm share its fd (both wake; the second's end does
not strand the first), and an iterator ends once the comm's engine is
closed (its comm_faulted event is out first) or the comm destroyed while a
peer's abort races it. The scenarios are scripts in tests/python/edges/
(each bounds its own waits); this runs them and reads their verdicts."""

import os
import subprocess
import sys

HERE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "edges")


def run(script):
    p = subprocess.run([sys.executable, os.path.join(HERE, script)], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 0, p.stdout + p.stderr
    return p.stdout


def test_two_iterators_share_the_fd():
    out = run("py_two_iterators.py")
    assert "-> HELD" in out and "HANG" not in out, out


def test_iterators_end_with_the_engine_and_with_destroy():
    out = run("py_events_end.py")
    assert "destroy vs abort: 0/10 iterators did not end" in out, out
    assert "engine close: ended" in out and "'comm_faulted'" in out, out
