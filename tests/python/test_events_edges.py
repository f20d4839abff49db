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


def test_iterator_body_awaiting_leaves_the_loop_idle():
    """An `async for` body that awaits (a shrink, a checkpoint) while one
    more event is pending: the loop thread stays idle (an outside breaker's
    find: the level-triggered reader woke the loop on every turn, 0.6-1.4 s
    of CPU in a 2 s await)."""
    out = run("py_events_spin.py")
    cpu = float(out.split("cpu ")[1].split()[0])
    assert cpu < 0.2, f"the loop thread spent {cpu:.3f} s of CPU in a 2 s await: {out}"


def test_ended_iterator_of_a_destroyed_comm_keeps_off_a_new_comms_fd():
    """Recovery inside `async for ev in a.events()`: destroy a, create b
    (its event fd may reuse a's number), watch b.events(), break out of a's
    loop: b's watcher still wakes (before, a's ending iterator removed the
    reader of the fd number, b's by then)."""
    for _ in range(2):
        out = run("py_events_fd_reuse.py")
        assert "-> HELD" in out, out



def test_create_again_after_a_lone_cancelled_create():
    """Rank 0's create is cancelled (asyncio.wait_for) before anyone came;
    then both ranks create the name once more: created (before, rank 0's
    retry landed back in the generation its cancel had poisoned and failed,
    and rank 1 waited out its timeout in the next one)."""
    out = run("py_create_after_cancel.py")
    assert "-> OK" in out, out
