"""Failure as data from Python: a killed rank is an exception whose .kind is
"peer_dead" and .ranks names it, a "peer_dead" event from `async for ev in
comm.events()` on every survivor (the loop never blocked meanwhile), health
says "dead"; a rank that destroys its comm is "left", not dead; a stopped
rank's deadline names it, and an idle one is "peer_suspected" then
"peer_back" once resumed; an application abort is "app_abort" here and
"peer_abort" (from rank 0) there. Ranks are processes (Comm.from_env), the
store outlives them (a StoreServer in this process). Every wait is bounded;
every child is killed in the end."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import collie
from conftest import ROOT

RANK = r"""
import asyncio, json, os, sys, time
sys.path.insert(0, os.path.join(sys.argv[1], "python"))
import numpy as np, collie

scenario = sys.argv[2]
eng = collie.Engine()
comm = collie.Comm.from_env(eng, timeout=float(os.environ.get("OP_TIMEOUT", "30")))
n = comm.size
x = np.full(4, comm.rank + 1, np.float32)
comm.allreduce(x).wait(10)
assert x[0] == n * (n + 1) / 2, x  # the oracle: every OK work's bytes
out = {"rank": comm.rank}

def report():
    print(json.dumps(out), flush=True)

if scenario == "kill":
    victim = n - 1
    print("up", flush=True)
    if comm.rank == victim:
        time.sleep(60)  # SIGKILLed by the test
        sys.exit(3)

    async def main():
        lag = 0.0
        stop = False

        async def ticker():  # the loop's own timer: how long was it blocked?
            nonlocal lag
            while not stop:
                t = time.monotonic()
                await asyncio.sleep(0.001)
                lag = max(lag, time.monotonic() - t - 0.001)

        tick = asyncio.create_task(ticker())
        async def first_dead():
            async for ev in comm.events():
                if ev.kind == "peer_dead":
                    return ev
        ev = await asyncio.wait_for(first_dead(), 10)
        out["event"] = [ev.kind, ev.rank, ev.time_ns]
        stop = True
        await tick
        out["lag_ms"] = lag * 1000
        h = comm.health()
        out["health"] = [p.state for p in h]
        f = comm.fault()
        out["fault"] = [f.kind, list(f.ranks), f.view, f.origin] if f else None
        try:
            await comm.allreduce_async(np.ones(4, np.float32))
            out["post"] = "ok"
        except collie.CollieError as e:
            out["post"] = [type(e).__name__, e.kind, list(e.ranks)]
    asyncio.run(main())
    report()
elif scenario == "leave":
    if comm.rank == n - 1:
        comm.destroy()
        print("left", flush=True)
        time.sleep(60)  # killed by the test once the others reported
        sys.exit(0)
    t_end = time.monotonic() + 10
    while time.monotonic() < t_end and comm.health()[n - 1].state != "left":
        time.sleep(0.005)
    out["health"] = [p.state for p in comm.health()]
    evs = []
    while (ev := comm.pop_event()) is not None:
        evs.append([ev.kind, ev.rank])
    out["events"] = evs
    out["error"] = comm.error() is not None
    report()
elif scenario == "stop":
    if comm.rank == n - 1:
        print("stopping", flush=True)
        os.kill(os.getpid(), 19)  # SIGSTOP: resumed (and killed) by the test
        sys.exit(0)
    w = comm.allreduce(np.ones(4, np.float32))
    try:
        w.wait(30)
        out["err"] = None
    except collie.CollieError as e:
        out["err"] = [type(e).__name__, e.kind, list(e.ranks)]
    report()
elif scenario == "mismatch":
    count = 4 if comm.rank == 0 else 8
    try:
        comm.allreduce(np.ones(count, np.float32)).wait(30)
        out["err"] = None
    except collie.CollieError as e:
        out["err"] = [type(e).__name__, e.kind, list(e.ranks)]
    f = comm.fault()
    out["fault"] = [f.kind, list(f.ranks)] if f else None
    report()
elif scenario == "stop_resume":
    victim = n - 1
    linked = comm.rank != victim and comm.health()[victim].heard_ago is not None
    print("up", int(linked), flush=True)
    if comm.rank == victim:
        sys.stdin.readline()  # "cont": stopped and resumed by the test meanwhile
    else:
        async def main():
            evs, states = [], []

            async def follow():  # linked: until rank 3 is back; else nothing comes
                async for ev in comm.events():
                    evs.append([ev.kind, ev.rank, ev.time_ns])
                    states.append(comm.health()[victim].state)
                    if ev.kind == "peer_suspected":
                        print("suspected", flush=True)
                    if ev.kind == "peer_back":
                        return

            if linked:
                await asyncio.wait_for(follow(), 20)
            out["events"], out["states"] = evs, states
            out["error"] = comm.error() is not None  # slow is never punished
        asyncio.run(main())
    y = np.full(4, comm.rank + 1, np.float32)
    comm.allreduce(y).wait(20)  # rank 3 is back: the bytes are right
    out["value"] = float(y[0])
    out["late_events"] = []
    while (ev := comm.pop_event()) is not None:
        out["late_events"].append([ev.kind, ev.rank])
    out["health"] = [p.state for p in comm.health()]
    report()
elif scenario == "abort":
    if comm.rank == 0:
        comm.abort("the operator")
    try:  # refused at the post (rank 0), or failed by the notice (rank 1)
        comm.allreduce(np.ones(4, np.float32)).wait(30)
        out["err"] = None
    except collie.CollieError as e:
        f = e.fault
        out["err"] = [type(e).__name__, e.kind, list(e.ranks), f.origin if f else None]
    report()
"""


def run(scenario, n=4, env=None, act=None, timeout=60):
    srv_eng = collie.Engine()
    srv = collie.StoreServer(srv_eng, "127.0.0.1", 0)
    addr = f"127.0.0.1:{srv.port}"
    procs = []
    try:
        for r in range(n):
            e = dict(os.environ, COLLIE_STORE_ADDR=addr, COLLIE_RANK=str(r),
                     COLLIE_WORLD_SIZE=str(n), **(env or {}))
            procs.append(subprocess.Popen([sys.executable, "-c", RANK, ROOT, scenario], env=e,
                                          stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                          stderr=subprocess.PIPE, text=True))
        if act:
            act(procs)
        results = {}
        deadline = time.monotonic() + timeout
        for r, p in enumerate(procs):
            if r == n - 1 and scenario not in ("abort", "mismatch"):
                continue  # the victim
            out, err = p.communicate(timeout=max(1, deadline - time.monotonic()))
            assert p.returncode == 0, f"rank {r} exit {p.returncode}:\n{err[-3000:]}"
            results[r] = json.loads(out.strip().splitlines()[-1])
        return results
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
        srv.close()
        srv_eng.close()


def wait_line(p, text, timeout=30):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = p.stdout.readline()
        if not line:
            break
        if text in line:
            return
    raise AssertionError(f"no '{text}' from the victim")


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_killed_rank_is_peer_dead_everywhere(transport):
    def kill_last(procs):
        wait_line(procs[-1], "up")
        time.sleep(0.3)  # the survivors are in their event loops
        procs[-1].send_signal(signal.SIGKILL)

    res = run("kill", env={"COLLIE_CPU_TRANSPORT": transport}, act=kill_last)
    for r, out in res.items():
        assert out["event"][:2] == ["peer_dead", 3], out
        assert out["health"][3] == "dead" and out["health"][r] == "self", out
        kind, ranks = out["fault"][0], out["fault"][1]
        # the survivor's own view or the first failed rank's: the dead rank alone
        assert kind == "peer_dead" and ranks == [3], out
        assert out["post"][0] == "CollieAborted" and out["post"][1] == "peer_dead", out
        assert out["post"][2] == [3], out
        assert out["lag_ms"] < 100, out  # generous here; bench/faults_events.py measures


def test_a_rank_that_destroys_its_comm_left():
    def kill_after_left(procs):
        wait_line(procs[-1], "left")

    res = run("leave", act=kill_after_left)
    for r, out in res.items():
        assert out["health"][3] == "left", out
        assert ["peer_left", 3] in out["events"], out
        assert ["peer_dead", 3] not in out["events"], out
        assert out["error"] is False, out


def test_a_stopped_rank_is_named_by_the_deadline():
    def resume_later(procs):
        wait_line(procs[-1], "stopping")

    res = run("stop", env={"OP_TIMEOUT": "2"}, act=resume_later)
    for r, out in res.items():
        name, kind, ranks = out["err"]
        assert name in ("CollieTimeout", "CollieAborted"), out
        assert kind in ("peer_stuck", "deadline"), out
        assert ranks == [3], out


@pytest.mark.parametrize("transport", ["auto", "tcp"])
def test_a_stopped_rank_is_suspected_then_back(transport):
    """Heartbeats every 100 ms, suspected after 1.5 s of silence: rank 3
    SIGSTOPped after a second of idling is suspected (an event from
    comm.events()) by every survivor linked to it, by none without a link,
    the comm never faults; SIGCONT: peer_back, and the next allreduce is
    right."""
    t = {}

    def stop_and_resume(procs):
        ups = []
        for p in procs:
            line = p.stdout.readline()
            assert line.startswith("up"), line
            ups.append(line.split()[1] == "1")
        time.sleep(1.0)  # idle: heartbeats keep everyone alive
        t["stop"] = time.monotonic_ns()
        procs[-1].send_signal(signal.SIGSTOP)
        for p, linked in zip(procs[:-1], ups[:-1]):
            if linked:
                wait_line(p, "suspected", timeout=10)
        time.sleep(0.2)
        t["cont"] = time.monotonic_ns()
        procs[-1].send_signal(signal.SIGCONT)
        procs[-1].stdin.write("cont\n")
        procs[-1].stdin.flush()

    # the suspect bound is 15 heartbeats: a loaded machine's late heartbeat
    # is not a silence
    env = {"COLLIE_CPU_TRANSPORT": transport, "COLLIE_HEARTBEAT_MS": "100",
           "COLLIE_SUSPECT_MS": "1500"}
    res = run("stop_resume", env=env, act=stop_and_resume)
    nlinked = 0
    for r, out in res.items():
        assert out["value"] == 10.0, out
        assert out["error"] is False and out["late_events"] == [], out
        assert out["health"][3] == "alive", out
        if not out["events"]:
            continue  # no link to rank 3: nothing to judge
        nlinked += 1
        (k1, r1, t1), (k2, r2, t2) = out["events"]
        assert [k1, r1, k2, r2] == ["peer_suspected", 3, "peer_back", 3], out
        assert out["states"][0] == "suspected", out
        assert 0.75 <= (t1 - t["stop"]) / 1e9 < 5.0, (out, t)
        assert t2 >= t["cont"], (out, t)
    assert nlinked >= 1, res


def test_abort_is_data_on_both_sides():
    res = run("abort", n=2)
    name0, kind0, ranks0, _ = res[0]["err"]
    assert name0 == "CollieAborted" and kind0 == "app_abort" and ranks0 == [], res
    name1, kind1, ranks1, origin1 = res[1]["err"]
    assert name1 == "CollieAborted" and kind1 == "peer_abort" and ranks1 == [], res
    assert origin1 == 0, res


def test_fault_objects_without_a_fault():
    eng = collie.Engine()
    srv = collie.StoreServer(eng, "127.0.0.1", 0)
    st = collie.Store(eng, f"127.0.0.1:{srv.port}")
    c = collie.Comm(eng, st, 0, 1, name="alone")
    try:
        assert c.fault() is None
        assert c.error() is None
        assert [p.state for p in c.health()] == ["self"]
        assert c.pop_event() is None
        assert c.event_fd() >= 0
        x = np.ones(2, np.float32)
        w = c.allreduce(x)
        assert w.wait(5) and w.fault is None
    finally:
        c.close()
        st.close()
        srv.close()
        eng.close()


def test_mismatched_counts_name_both_ranks():
    res = run("mismatch", n=2)
    for r, out in res.items():
        assert out["fault"] == ["mismatch", [0, 1]], out
        name, kind, ranks = out["err"]
        assert name in ("CollieProtocolError", "CollieAborted"), out
        assert kind == "mismatch" and ranks == [0, 1], out
