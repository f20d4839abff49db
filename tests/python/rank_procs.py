"""Ranks as processes for the torch backend's tests (test_torch.py on
torch 1.13, test_torch2.py on torch 2.x): each rank runs a worker script
with its rank, the world size and a free port for torch's store, and prints
one JSON line last. Every wait is bounded; a rank still running when
another failed is killed."""

import json
import socket
import subprocess


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_ranks(argv, world, what, timeout=120, env=None, exits=None):
    """argv(rank, port) -> the command of that rank; returns each rank's
    last stdout line, parsed as JSON, by rank. `what` names the run in a
    failure's message. `exits`: {rank: exit status} for ranks expected not
    to exit 0 (e.g. -9: killed by SIGKILL, after printing its line)."""
    port = str(free_port())
    procs = [subprocess.Popen(argv(r, port), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env)
             for r in range(world)]
    results = []
    try:
        for r, p in enumerate(procs):
            out, err = p.communicate(timeout=timeout)
            want = (exits or {}).get(r, 0)
            assert p.returncode == want, (
                f"{what} rank {r} exit {p.returncode} (expected {want}):\n{err[-3000:]}")
            results.append(json.loads(out.strip().splitlines()[-1]))
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    return results
