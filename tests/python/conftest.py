"""Fixtures for the collie Python package's tests: a world of ranks as
threads of this process (one engine, one store server), every wait
bounded."""

import os
import sys
import threading

import pytest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))

import collie  # noqa: E402

JOIN_S = 60


class World:
    def __init__(self, n, name="w", **opts):
        self.n = n
        self.engine = collie.Engine(name="pytest")
        self.server = collie.StoreServer(self.engine)
        self.stores = [collie.Store(self.engine, self.server.address) for _ in range(n)]
        self.comms = [None] * n
        run(n, lambda r: self.comms.__setitem__(
            r, collie.Comm(self.engine, self.stores[r], r, n, name=name, timeout=10, **opts)))

    def each(self, fn):
        """fn(rank, comm) on every rank at once; returns the results by rank."""
        return run(self.n, lambda r: fn(r, self.comms[r]))

    def close(self):
        for c in self.comms:
            if c is not None:
                c.destroy()
        for s in self.stores:
            s.close()
        self.server.close()
        self.engine.close()


def run(n, fn):
    """fn(r) for r in range(n) in threads, bounded; re-raises the first error."""
    out, errs = [None] * n, [None] * n

    def body(r):
        try:
            out[r] = fn(r)
        except BaseException as e:  # noqa: BLE001 - reported below
            errs[r] = e

    ts = [threading.Thread(target=body, args=(r,), daemon=True) for r in range(n)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(JOIN_S)
        if t.is_alive():
            raise TimeoutError(f"a rank thread did not finish in {JOIN_S} s")
    for e in errs:
        if e is not None:
            raise e
    return out


@pytest.fixture
def world2():
    w = World(2)
    yield w
    w.close()


@pytest.fixture
def world3():
    w = World(3)
    yield w
    w.close()
