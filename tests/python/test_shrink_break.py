"""Attempts to break Comm.grow / Comm.join from Python (issue 33). Each test
is a finding and fails against the library as it stands.

- count and rank go into C ints through ctypes, which truncates silently:
  grow(count=2**32 + 1) grows by ONE joiner, join(rank=2**32 + 2) asks for
  rank 2. Either should raise ValueError naming the bad value.
- join_async's docstring: "cancelling the await withdraws". It does not: the
  cancelled joiner's ticket stays live, the members' next grow gives it a
  rank and fails at its deadline, and a live joiner that came after it is
  not taken.
"""

import asyncio

import numpy as np
import pytest

import collie

from test_recover import Bench
from test_shrink import _world


def test_grow_count_beyond_c_int_is_refused():
    b = Bench(2)
    try:
        comms = _world(b, 2, "pybkcount")
        js = collie.Store(b.engine, b.server.address)

        async def main():
            return await asyncio.wait_for(
                asyncio.gather(
                    *(c.grow_async(count=2**32 + 1, timeout=3) for c in comms),
                    collie.Comm.join_async(b.engine, js, "pybkcount", timeout=3),
                    return_exceptions=True,
                ),
                20,
            )

        got = asyncio.run(main())
        print("grow(count=2**32+1):", got)
        for g in got:
            if isinstance(g, collie.Comm):
                g.destroy()
        for c in comms:
            c.destroy()
        js.close()
        # 4294967297 joiners is not 1 joiner: refused before anything ran
        assert all(isinstance(g, ValueError) for g in got[:2]), got
    finally:
        b.close()


def test_join_rank_beyond_c_int_is_refused():
    b = Bench(2)
    try:
        comms = _world(b, 2, "pybkrank")
        js = collie.Store(b.engine, b.server.address)

        async def main():
            return await asyncio.wait_for(
                asyncio.gather(
                    *(c.grow_async(timeout=3) for c in comms),
                    collie.Comm.join_async(b.engine, js, "pybkrank", rank=2**32 + 2, timeout=3),
                    return_exceptions=True,
                ),
                20,
            )

        got = asyncio.run(main())
        print("join(rank=2**32+2):", got)
        for g in got:
            if isinstance(g, collie.Comm):
                g.destroy()
        for c in comms:
            c.destroy()
        js.close()
        assert isinstance(got[2], ValueError), got
    finally:
        b.close()


def test_join_async_cancelled_withdraws():
    b = Bench(2)
    try:
        comms = _world(b, 2, "pybkjc")
        js = [collie.Store(b.engine, b.server.address) for _ in range(2)]

        async def main():
            first = asyncio.ensure_future(collie.Comm.join_async(b.engine, js[0], "pybkjc", timeout=10))
            await asyncio.sleep(0.2)  # its ticket taken, waiting for an answer
            first.cancel()
            with pytest.raises(asyncio.CancelledError):
                await first
            return await asyncio.wait_for(
                asyncio.gather(
                    *(c.grow_async(timeout=1.5) for c in comms),
                    collie.Comm.join_async(b.engine, js[1], "pybkjc", timeout=1.5),
                    return_exceptions=True,
                ),
                20,
            )

        got = asyncio.run(main())
        print("after a cancelled joiner:", got)
        for g in got:
            if isinstance(g, collie.Comm):
                g.destroy()
        for c in comms:
            c.destroy()
        for s in js:
            s.close()
        assert all(isinstance(g, collie.Comm) for g in got), got
    finally:
        b.close()
