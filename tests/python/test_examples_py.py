"""The Python examples, run as their users run them: examples/recovery_server.py
under collie-run with the command docs/python.md gives ("Recovering from a
fault (asyncio)"), a rank SIGKILLed and restarted: every request answered or
refused, none lost, the survivors shrink and grow back, every rank's results
checked by the example itself, the loop's worst stall printed and small; and
with --keep-going (nobody comes back) the server goes on with three ranks.
examples/asyncio_recovery.py (destroy + create) is run by test_recover.py."""

import json
import os
import re
import shlex
import subprocess
import sys

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXAMPLE = "examples/recovery_server.py"
# the command as docs/python.md and the example's docstring give it
COMMAND = ("PYTHONPATH=python build/bin/collie-run -n 4 --restarts 1 --timeout 60 -- "
           "/usr/bin/python3 examples/recovery_server.py")
# "never blocks the loop" on a loaded 2-core machine: the example measures a
# few ms; a blocking shrink, grow or destroy would stall it for 100s of ms
STALL_BOUND_MS = 200


def _run(command, env_extra=None):
    """Run `command` (leading VAR=value words set the environment;
    /usr/bin/python3 -> this interpreter) in the source tree; the output and
    every rank's JSON summary (its last line), by rank."""
    words = shlex.split(command)
    env = dict(os.environ, **(env_extra or {}))
    while words and re.match(r"^[A-Z_]+=", words[0]):
        k, v = words.pop(0).split("=", 1)
        env[k] = v
    argv = [sys.executable if a in ("python3", "/usr/bin/python3") else a for a in words]
    for k in ("COLLIE_STORE_ADDR", "COLLIE_RANK", "COLLIE_WORLD_SIZE", "COLLIE_RESTART_COUNT"):
        env.pop(k, None)
    p = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=90, env=env)
    out = p.stdout
    summaries = {}
    for line in out.splitlines():
        body = line.split("] ", 1)[-1]
        if body.startswith("{"):
            s = json.loads(body)
            summaries[s["rank"]] = s
    return p, out, summaries


def _why(p):
    return f"exit {p.returncode}\n--- stdout\n{p.stdout[-4000:]}\n--- stderr\n{p.stderr[-3000:]}"


def test_the_docs_give_the_command_the_test_runs():
    with open(os.path.join(ROOT, "docs", "python.md")) as f:
        docs = f.read()
    section = docs.split("## Recovering from a fault (asyncio)", 1)
    assert len(section) == 2, "docs/python.md has no 'Recovering from a fault (asyncio)' section"
    assert COMMAND in section[1]
    with open(os.path.join(ROOT, EXAMPLE)) as f:
        assert COMMAND in f.read()


def test_recovery_server_shrinks_serves_and_grows():
    p, out, s = _run(COMMAND)
    assert p.returncode == 0, _why(p)
    assert "[3] rank 3: SIGKILL myself in request 60" in out, _why(p)
    assert "collie-run: restarting rank 3" in p.stderr, _why(p)
    # the fault seen on the failed work (kind and ranks: a survivor that
    # learnt it from a peer's abort before its own link told it may say
    # peer_abort) and as events
    kinds = re.findall(r"\[\d\] rank \d: Collie\w+ \(kind (\w+), ranks (\[[\d, ]*\])\): shrinking", out)
    assert len(kinds) == 3 and ("peer_dead", "[3]") in kinds, _why(p)
    assert all(k in (("peer_dead", "[3]"), ("peer_abort", "[]")) for k in kinds), kinds
    assert "event peer_dead: rank 3 of 'srv'" in out, _why(p)
    for r in (0, 1, 2):
        assert f"[{r}] rank {r}: event comm_faulted: 'srv' failed" in out, _why(p)
        assert f"[{r}] rank {r}: shrunk to rank {r} of 3" in out, _why(p)
        assert f"[{r}] rank {r}: grown to rank {r} of 4" in out, _why(p)
        assert (s[r]["shrinks"], s[r]["grows"]) == (1, 1), s
        assert 0 <= s[r]["recovery_ms"] < 10000 and s[r]["recovery_ms"] <= s[r]["regrow_ms"], s
    assert "[3] rank 3: joined as rank 3 of 4" in out, _why(p)
    assert s[3]["life"] == 1
    m = re.search(r"\[0\] rank 0: served: (\d+) requests: (\d+) answered, (\d+) refused, (\d+) lost; "
                  r"1 shrinks, 1 grows", out)
    assert m, _why(p)
    sent, answered, refused, lost = map(int, m.groups())
    assert sent >= 200 and lost == 0 and answered + refused == sent, m.group(0)
    # the request in flight at the kill runs again on the shrunk comm
    assert refused == 0, _why(p)
    # every rank checked the sums of what it served (the oracle); the
    # replacement served on the grown comm
    for r in (0, 1, 2):
        assert s[r]["verified"] >= sent - 2, s
    assert s[3]["verified"] >= 20, s
    for r in range(4):
        assert f"[{r}] rank {r}: verified {s[r]['verified']} results; worst loop stall" in out
        assert s[r]["worst_stall_ms"] < STALL_BOUND_MS, s


def test_recovery_server_serves_on_when_nobody_comes_back():
    command = COMMAND.replace("--restarts 1", "--keep-going")
    p, out, s = _run(command, {"RECOVERY_GROW_S": "2"})
    assert p.returncode == 128 + 9, _why(p)  # collie-run: rank 3 was SIGKILLed
    assert sorted(s) == [0, 1, 2], _why(p)
    assert "[0] rank 0: no replacement came" in out, _why(p)
    m = re.search(r"\[0\] rank 0: served: (\d+) requests: (\d+) answered, 0 refused, 0 lost; 1 shrinks, 0 grows",
                  out)
    assert m and int(m.group(2)) == int(m.group(1)), _why(p)
    for r in (0, 1, 2):
        assert (s[r]["shrinks"], s[r]["grows"]) == (1, 0), s
        assert s[r]["worst_stall_ms"] < STALL_BOUND_MS, s
