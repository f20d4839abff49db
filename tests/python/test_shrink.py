"""Shrinking to the survivors from Python (issue 33): Comm.shrink_async keeps
the loop running (the loop's own timer) and gives every survivor one comm
of the others (sizes, ranks, rank_map, an allreduce's bytes), the blocking
shrink down to one rank, a healthy comm refused (CollieStateError), and a
rank that never came told it is out (CollieNotMember, here and on its
next post). Ranks live in one process; process death: tests/test_shrink_kids.c."""

import asyncio
import time

import numpy as np
import pytest

import collie

from test_recover import LAG_BOUND_S, Bench, LagProbe


def _wait_left(comm, rank, bound_s=5.0):
    until = time.monotonic() + bound_s
    while time.monotonic() < until:
        if comm.health()[rank].state == "left":
            return
        time.sleep(0.001)
    raise AssertionError(f"rank {rank} never seen left")


def _world(b, n, name, timeout=None):
    async def make():
        return await asyncio.gather(
            *(collie.Comm.create_async(b.engine, b.stores[r], r, n, name=name, timeout=timeout) for r in range(n))
        )

    comms = asyncio.run(asyncio.wait_for(make(), 30))
    works = [c.allreduce(np.ones(1, np.int32)) for c in comms]
    for w in works:
        w.wait(10)
    return comms


def test_shrink_async_keeps_the_loop_running():
    b = Bench(4)
    try:
        comms = _world(b, 4, "pyshr")
        comms[3].destroy()
        for r in range(3):
            _wait_left(comms[r], 3)

        async def main():
            probe = LagProbe().start()
            new = await asyncio.wait_for(asyncio.gather(*(c.shrink_async() for c in comms[:3])), 30)
            works = [n.allreduce(np.array([r + 1], np.int32)) for r, n in enumerate(new)]
            outs = await asyncio.wait_for(asyncio.gather(*works), 10)
            lag = await probe.stop()
            return new, outs, lag

        new, outs, lag = asyncio.run(main())
        print(f"largest loop lag through the shrink: {lag * 1000:.2f} ms")
        assert lag < LAG_BOUND_S
        for r, n in enumerate(new):
            assert (n.size, n.rank) == (3, r)
            assert n.rank_map() == [0, 1, 2, None]
            assert n.name == f"pyshr.shr{comms[r].generation}"
            assert outs[r].tolist() == [1 + 2 + 3]  # the oracle
            assert (n.stats()["shrinks"], n.stats()["grows"]) == (1, 0)
            f = comms[r].fault()
            assert f.view == "agreed" and list(f.ranks) == [3]
        for n in new:
            n.destroy()
        for c in comms[:3]:
            c.destroy()
    finally:
        b.close()


def test_shrink_to_one_and_refusals():
    b = Bench(2)
    try:
        comms = _world(b, 2, "pyshr1")
        with pytest.raises(collie.CollieStateError, match="healthy"):
            comms[0].shrink()
        with pytest.raises(collie.CollieStateError, match="not made by a shrink"):
            comms[0].rank_map()
        with pytest.raises(TypeError, match="unknown option"):
            comms[0].shrink(colour=3)
        comms[1].destroy()
        _wait_left(comms[0], 1)
        alone = comms[0].shrink(timeout=5)
        assert (alone.size, alone.rank) == (1, 0)
        assert alone.rank_map() == [0, None]
        assert alone.allreduce(np.array([7], np.int32)).result(10).tolist() == [7]
        alone.destroy()
        comms[0].destroy()
    finally:
        b.close()


def test_absent_rank_is_told_it_is_out():
    b = Bench(3)
    try:
        comms = _world(b, 3, "pyshr2")
        comms[2].destroy()
        _wait_left(comms[0], 2)
        # rank 1 never calls: rank 0's shrink ends at its deadline without it
        new = comms[0].shrink(timeout=0.3)
        assert (new.size, new.rank_map()) == (1, [0, None, None])
        until = time.monotonic() + 5
        while time.monotonic() < until and comms[1].pop_event() is None:
            time.sleep(0.001)
        with pytest.raises(collie.CollieNotMember, match="left out"):
            comms[1].allreduce(np.ones(1, np.int32))
        with pytest.raises(collie.CollieNotMember):
            comms[1].shrink()
        new.destroy()
        comms[0].destroy()
        comms[1].destroy()
    finally:
        b.close()


def test_grow_and_join_async_after_shrink():
    """4 ranks, rank 3 leaves, the others shrink, a replacement joins by the
    family name asking for rank 3 while they grow: 4 again, the loop running."""
    b = Bench(4)
    try:
        comms = _world(b, 4, "pygrow")
        comms[3].destroy()
        for r in range(3):
            _wait_left(comms[r], 3)
        joiner_store = collie.Store(b.engine, b.server.address)

        async def main():
            probe = LagProbe().start()
            small = await asyncio.wait_for(asyncio.gather(*(c.shrink_async() for c in comms[:3])), 30)
            grown = await asyncio.wait_for(
                asyncio.gather(
                    *(s.grow_async() for s in small),
                    collie.Comm.join_async(b.engine, joiner_store, "pygrow", rank=3),
                ),
                30,
            )
            outs = await asyncio.wait_for(
                asyncio.gather(*(g.allreduce(np.array([g.rank + 1], np.int32)) for g in grown)), 10
            )
            lag = await probe.stop()
            return small, grown, outs, lag

        small, grown, outs, lag = asyncio.run(main())
        print(f"largest loop lag through shrink and grow: {lag * 1000:.2f} ms")
        assert lag < LAG_BOUND_S
        assert [(g.size, g.rank) for g in grown] == [(4, 0), (4, 1), (4, 2), (4, 3)]
        assert all(o.tolist() == [1 + 2 + 3 + 4] for o in outs)  # the oracle
        with pytest.raises(ValueError, match="count"):
            small[0].grow(count=0)
        with pytest.raises(ValueError, match="rank"):
            collie.Comm.join(b.engine, joiner_store, "pygrow", rank=-3)
        for c in grown + small + comms[:3]:
            c.destroy()
        joiner_store.close()
    finally:
        b.close()


def test_join_from_the_environment(monkeypatch):
    """store=None: the joiner connects to COLLIE_STORE_ADDR and asks for
    COLLIE_RANK, as a rank collie-run --restarts started again does."""
    b = Bench(2)
    try:
        comms = _world(b, 2, "pyjoinenv")
        monkeypatch.setenv("COLLIE_STORE_ADDR", b.server.address)
        monkeypatch.setenv("COLLIE_RANK", "2")

        async def main():
            return await asyncio.wait_for(
                asyncio.gather(*(c.grow_async() for c in comms), collie.Comm.join_async(b.engine, None, "pyjoinenv")),
                30,
            )

        grown = asyncio.run(main())
        assert [(g.size, g.rank) for g in grown] == [(3, 0), (3, 1), (3, 2)]
        works = [g.allreduce(np.array([g.rank + 1], np.int32)) for g in grown]
        assert all(w.result(10).tolist() == [6] for w in works)
        monkeypatch.delenv("COLLIE_STORE_ADDR")
        with pytest.raises(ValueError, match="COLLIE_STORE_ADDR"):
            collie.Comm.join(b.engine, None, "pyjoinenv")
        for c in grown + comms:
            c.destroy()
    finally:
        b.close()


def test_dropping_a_comm_never_blocks():
    """The last reference to a comm dropped (as `comm = comm.shrink()` does
    to the old one) posts its destroy and returns: here the store is gone,
    so the destroy's store steps wait out their bounds (the blocking form
    takes over a second) on collie's thread, not in the collector."""
    b = Bench(2)
    try:
        comms = _world(b, 2, "pydrop")
        b.server.close()
        c0 = comms[0]
        comms[0] = None
        t0 = time.monotonic()
        del c0
        dropped = time.monotonic() - t0
        t0 = time.monotonic()
        comms[1].destroy()
        blocking = time.monotonic() - t0
        print(f"dropping the comm took {dropped * 1000:.2f} ms, destroy() {blocking * 1000:.0f} ms")
        assert dropped < 0.5
    finally:
        b.close()
