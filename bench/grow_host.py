#!/usr/bin/env python3
"""grow_host.py - issue 33's grow target, measured: from the joiner's call
(its process already started, collie imported, its engine and store made)
to the grown comm's first allreduce done on every rank, 3 members + 1
joiner on this host. Target: 50 ms.

The members (python ranks of this file, --member) create a comm of 3
through the driver's store (the driver's process outlives them), run one
checked allreduce, post grow (blocking Comm.grow: it waits for a joiner),
then run a checked allreduce on the grown comm. The joiner (--joiner) says
"ready" and waits for "go" on stdin; the driver sends it 0.5 s after the
members said "up", and the joiner notes the time, calls Comm.join and runs
the checked allreduce. Each process prints "T done <ns>" (CLOCK_MONOTONIC).
A figure is the median (and max) over --runs runs of the slowest rank's
done minus the joiner's call. A run that fails is printed and not counted.
Every wait is bounded; every process is killed in the end.

Usage: bench/grow_host.py [--runs 10]
"""

import argparse
import os
import select
import statistics
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "python"))


def checked(comm, np):
    buf = np.full(4, comm.rank + 1, np.int32)
    comm.allreduce(buf).wait(10)
    want = comm.size * (comm.size + 1) // 2
    if not (buf == want).all():
        raise SystemExit("ERR wrong bytes %s want %d" % (buf.tolist(), want))


def rank_main(role, rank, name, addr):
    import numpy as np

    import collie

    eng = collie.Engine()
    store = collie.Store(eng, addr)
    if role == "--member":
        comm = collie.Comm(eng, store, rank, 3, name=name, timeout=30, create_timeout=30)
        checked(comm, np)
        print("up", rank, flush=True)
        big = comm.grow(timeout=20)
    else:
        print("ready", flush=True)
        if not select.select([sys.stdin], [], [], 30)[0]:
            raise SystemExit("ERR no go")
        sys.stdin.readline()
        print("T call", time.monotonic_ns(), flush=True)
        big = collie.Comm.join(eng, store, name, timeout=20)
    checked(big, np)
    print("T done", time.monotonic_ns(), flush=True)
    keep = (comm, big) if role == "--member" else (big,)  # noqa: F841 (no finaliser in the timing)
    time.sleep(1.0)  # the others finish their allreduce before this rank leaves
    os._exit(0)


def read_until(procs, want, bound_s):
    """Lines from procs until `want(lines)`; {proc index: [lines]}."""
    lines = {i: [] for i in range(len(procs))}
    until = time.monotonic() + bound_s
    fds = {p.stdout.fileno(): i for i, p in enumerate(procs)}
    while time.monotonic() < until and not want(lines):
        r, _, _ = select.select(list(fds), [], [], 0.2)
        for fd in r:
            ln = procs[fds[fd]].stdout.readline()
            if ln:
                lines[fds[fd]].append(ln.strip())
    return lines


def one_run(i, server):
    import collie  # noqa: F401

    name = "grb%d" % i
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    me = os.path.abspath(__file__)
    procs = []
    try:
        for r in range(3):
            procs.append(subprocess.Popen([sys.executable, me, "--member", str(r), name,
                                           server.address], stdout=subprocess.PIPE, text=True,
                                          env=env))
        procs.append(subprocess.Popen([sys.executable, me, "--joiner", "3", name, server.address],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                      env=env))
        got = read_until(procs, lambda ls: sum(1 for i in range(3) if any(
            x.startswith("up") for x in ls[i])) == 3 and any(x == "ready" for x in ls[3]), 60)
        if not any(x == "ready" for x in got[3]):
            return None, "not up: %s" % got
        time.sleep(0.5)  # idle; the members wait in grow
        procs[3].stdin.write("go\n")
        procs[3].stdin.flush()
        more = read_until(procs, lambda ls: all(any(x.startswith("T done") or x.startswith("ERR")
                                                    for x in ls[i]) for i in range(4)), 30)
        for k in more:
            got[k] += more[k]
        call = [int(x.split()[2]) for x in got[3] if x.startswith("T call")]
        done = [int(x.split()[2]) for k in range(4) for x in got[k] if x.startswith("T done")]
        if not call or len(done) != 4:
            return None, "incomplete: %s" % got
        return (max(done) - call[0]) / 1e6, None
    finally:
        for p in procs:
            try:
                p.wait(5)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(5)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--runs", type=int, default=10)
    a = ap.parse_args()
    import collie

    eng = collie.Engine()
    server = collie.StoreServer(eng)
    print("load average at the start: %.2f %.2f %.2f" % os.getloadavg(), flush=True)
    vals = []
    for i in range(a.runs):
        ms, bad = one_run(i, server)
        if bad:
            print("run %d not counted: %s" % (i, bad), flush=True)
        else:
            vals.append(ms)
    print("load average at the end: %.2f %.2f %.2f" % os.getloadavg(), flush=True)
    server.close()
    eng.close()
    if vals:
        print("\n| case | runs | joiner's call to every rank's first allreduce: median ms | max ms "
              "| target |\n|---|---|---|---|---|")
        print("| grow 3 -> 4 on one host | %d | %.1f | %.1f | <= 50 ms |" % (
            len(vals), statistics.median(vals), max(vals)))
        print("\neach run (ms, sorted): %s" % " ".join("%.1f" % v for v in sorted(vals)))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("--member", "--joiner"):
        rank_main(sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4])
    else:
        main()
