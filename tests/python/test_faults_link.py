"""A link down, from Python: two "hosts" (network namespaces joined by veth,
tests/chaos/chaos_netns.py), one rank on each, over TCP, the store on the
control link. The data link goes down: each rank sees the other
"peer_suspected" (heartbeats stop: 100 ms, suspect after 1.5 s) and
nothing worse (the other lives: not dead, and the comm is not faulted by
suspicion); the link back up, the other is "peer_back" and an allreduce is
right; the link down again, an allreduce posted across the cut fails by
its deadline with a fault whose ranks name only the other rank. Every
allreduce that returned OK has its bytes checked. Root
only (namespaces): skipped, saying why, elsewhere. Every wait is bounded;
the namespaces and the ranks go in the end."""

import json
import os
import secrets
import select
import subprocess
import sys
import time

import pytest

from conftest import ROOT

sys.path.insert(0, os.path.join(ROOT, "tests", "chaos"))
import chaos_netns  # noqa: E402

STORE = os.path.join(ROOT, "build", "bin", "collie-store")

RANK = r"""
import json, os, select, sys, time
sys.path.insert(0, os.path.join(sys.argv[1], "python"))
import numpy as np, collie

eng = collie.Engine()
comm = collie.Comm.from_env(eng, timeout=3.0)
me, other = comm.rank, 1 - comm.rank
x = np.full(4, me + 1, np.float32)
comm.allreduce(x).wait(20)
assert x[0] == 3.0, x  # the oracle
print("up", flush=True)
out = {"rank": me, "events": []}
fd = comm.event_fd()

def events_until(kind, bound_s):
    end = time.monotonic() + bound_s
    while time.monotonic() < end:
        select.select([fd], [], [], 0.1)
        while (ev := comm.pop_event()) is not None:
            out["events"].append([ev.kind, ev.rank])
            if ev.kind == kind:
                return True
    return False

out["suspected"] = events_until("peer_suspected", 15)  # the link goes down meanwhile
out["state"] = comm.health()[other].state
out["faulted_by_suspicion"] = comm.error() is not None
print("suspected-seen", flush=True)
out["back"] = events_until("peer_back", 15)  # the link comes back up meanwhile
y = np.full(4, me + 1, np.float32)
comm.allreduce(y).wait(20)  # back: the bytes are right
out["value_after_back"] = float(y[0])
print("back-seen", flush=True)
sys.stdin.readline()  # the link is down again
try:  # across the cut: its deadline (3 s) ends it
    comm.allreduce(np.ones(4, np.float32)).wait(20)
    out["err"] = None
except collie.CollieError as e:
    out["err"] = [type(e).__name__, e.kind, list(e.ranks)]
print(json.dumps(out), flush=True)
"""


def wait_line(p, text, timeout):
    end = time.monotonic() + timeout
    buf = ""
    while time.monotonic() < end:
        r, _, _ = select.select([p.stdout], [], [], 0.1)
        if r:
            line = p.stdout.readline()
            if not line:
                break
            buf += line
            if text in line:
                return buf
    raise AssertionError(f"no '{text}' within {timeout} s: {buf[-2000:]}")


def test_link_down_is_suspicion_then_back():
    why = chaos_netns.unavailable()
    if why:
        pytest.skip(f"network namespaces: {why}")
    if not os.path.exists(STORE):
        pytest.skip("build/bin/collie-store is not built")
    procs = []
    with chaos_netns.Hosts() as hosts:
        base = {k: v for k, v in os.environ.items() if not k.startswith("COLLIE_")}
        base["COLLIE_STORE_TOKEN"] = secrets.token_hex(16)
        store = subprocess.Popen(hosts.exec_prefix(0) + [STORE, "--port", "0", "--bind",
                                                         chaos_netns.CONTROL_ADDR[0]],
                                 env=base, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
                                 text=True)
        procs.append(store)
        try:
            line = wait_line(store, "listening on", 10)
            addr = line.strip().split()[-1]
            for r in range(2):
                env = dict(base, COLLIE_STORE_ADDR=addr, COLLIE_RANK=str(r),
                           COLLIE_WORLD_SIZE="2", COLLIE_CPU_TRANSPORT="tcp",
                           COLLIE_SOCKET_ADDR=chaos_netns.DATA_ADDR[r],
                           COLLIE_HEARTBEAT_MS="100", COLLIE_SUSPECT_MS="1500")
                procs.append(subprocess.Popen(hosts.exec_prefix(r) + [sys.executable, "-c", RANK,
                                                                      ROOT],
                                              env=env, stdin=subprocess.PIPE,
                                              stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                              text=True))
            for p in procs[1:]:
                wait_line(p, "up", 30)
            ok, err = hosts.data_link(False)
            assert ok, err
            for p in procs[1:]:
                wait_line(p, "suspected-seen", 30)
            ok, err = hosts.data_link(True)
            assert ok, err
            for p in procs[1:]:
                wait_line(p, "back-seen", 30)
            ok, err = hosts.data_link(False)
            assert ok, err
            for p in procs[1:]:
                p.stdin.write("down\n")
                p.stdin.flush()
            outs = []
            for p in procs[1:]:
                text, errs = p.communicate(timeout=40)
                assert p.returncode == 0, errs[-3000:]
                outs.append(json.loads(text.strip().splitlines()[-1]))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(10)
    for out in outs:
        other = 1 - out["rank"]
        assert out["suspected"] and ["peer_suspected", other] in out["events"], out
        assert out["state"] in ("suspected", "slow"), out
        assert out["faulted_by_suspicion"] is False, out
        assert not any(k in ("peer_dead", "peer_left") for k, _ in out["events"]), out
        name, kind, ranks = out["err"]
        assert kind in ("peer_stuck", "deadline"), out
        assert ranks in ([], [other]), out  # never this rank itself
        assert out["back"] and out["events"][-1] == ["peer_back", other], out
        assert out["value_after_back"] == 3.0, out
