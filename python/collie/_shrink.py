"""Shrinking a comm to its survivors and growing it again: Comm.shrink,
shrink_async and rank_map (collie_comm_shrink), Comm.grow, grow_async,
and the classmethods Comm.join and join_async (collie_comm_grow/join),
mixed into Comm.

The survivors of a failed comm agree on the failed set through the store
and get a comm of the others, ranks renumbered in their old order. A rank
the others left out (it was slow, stopped, or came too late) gets
CollieNotMember, here and on its next post of the old comm. The old comm
stays the caller's to destroy. A new process joins a running comm by the
name it was first created with (Comm.join) while its members grow (every
member calls grow). docs/faults.md ("Shrink", "Grow") says what is
guaranteed.
"""

import os
from ctypes import byref, c_int, c_void_p, pointer, sizeof

from . import _lib
from ._engine import timeout_ms
from .errors import check


lib = _lib.lib


def _shrink_opts(timeout, opts, child_opts):
    so = _lib.ShrinkOpts(sizeof(_lib.ShrinkOpts), timeout_ms(timeout, "timeout"), None)
    co = None
    if opts:
        co = child_opts(opts)
        so.comm = pointer(co)
    return so, co  # co: kept alive with so


def _grow_opts(count, rank, timeout, opts, child_opts):
    if count is not None and (not isinstance(count, int) or not 1 <= count <= 4096):
        raise ValueError(f"count: {count!r} (joiners to take: 1 to 4096)")
    if rank is not None and (not isinstance(rank, int) or not 0 <= rank < 2**31):
        raise ValueError(f"rank: {rank!r} (a rank from 0 to 2**31-1, or None: any)")
    go = _lib.GrowOpts(sizeof(_lib.GrowOpts), count or 1, timeout_ms(timeout, "timeout"), None,
                       -1 if rank is None else rank)
    co = None
    if opts:
        co = child_opts(opts)
        go.comm = pointer(co)
    return go, co  # co: kept alive with go


class Shrink:
    """Comm's shrink methods (mixed into Comm)."""

    def shrink(self, timeout=None, **opts):
        """A comm of the survivors (collie_comm_shrink); every surviving rank
        calls it once it learns of a fault (an event, a failed work). Blocks,
        bounded by `timeout` seconds (None: the comm's create timeout); from
        an event loop use shrink_async. `opts` are the new comm's (backend,
        timeout, create_timeout, policy, device; the rest: this comm's).
        Raises CollieNotMember if the others left this rank out,
        CollieError(ESTATE) on a healthy comm."""
        so, _keep = _shrink_opts(timeout, opts, self._child_opts_of)
        h = c_void_p()
        check(lib.collie_comm_shrink(self.handle, byref(so), byref(h)), "collie_comm_shrink")
        return self._shrunk(h.value)

    async def shrink_async(self, timeout=None, **opts):
        """`new = await comm.shrink_async()`: shrink() without blocking the
        event loop (collie_comm_shrink_post; the agreement runs on collie's
        progress thread). Cancelling the await cancels the shrink; a comm it
        made is destroyed in the background."""
        so, _keep = _shrink_opts(timeout, opts, self._child_opts_of)
        work = self._engine.post(
            "collie_comm_shrink_post", lib.collie_comm_shrink_post, (self.handle, byref(so)), None, owner=self
        )
        return self._shrunk(await _taken(work))

    def rank_map(self):
        """For a comm made by shrink: the old comm's ranks, each with its new
        rank here or None (left out): a list indexed by old rank."""
        n = lib.collie_comm_rank_map(self.handle, None, 0)
        if n < 0:
            check(n, "collie_comm_rank_map")
        arr = (c_int * n)()
        got = lib.collie_comm_rank_map(self.handle, arr, n)
        if got < 0:
            check(got, "collie_comm_rank_map")
        return [None if arr[r] < 0 else arr[r] for r in range(n)]

    def grow(self, count=1, timeout=None, **opts):
        """A comm of this one's members and `count` joiners (Comm.join), the
        joiners ranked after the members (collie_comm_grow). Every member
        calls it; it blocks until the joiners came and the new comm's links
        are made, bounded by `timeout` (None: the comm's create timeout).
        From an event loop use grow_async."""
        go, _keep = _grow_opts(count, None, timeout, opts, self._child_opts_of)
        h = c_void_p()
        check(lib.collie_comm_grow(self.handle, byref(go), byref(h)), "collie_comm_grow")
        return self._shrunk(h.value)

    async def grow_async(self, count=1, timeout=None, **opts):
        """`new = await comm.grow_async()`: grow() without blocking the loop."""
        go, _keep = _grow_opts(count, None, timeout, opts, self._child_opts_of)
        work = self._engine.post(
            "collie_comm_grow_post", lib.collie_comm_grow_post, (self.handle, byref(go)), None, owner=self
        )
        return self._shrunk(await _taken(work))

    @classmethod
    def join(cls, engine, store, name="world", rank=None, timeout=None, **opts):
        """A new process joins the running comm first created as `name`, at
        the members' next grow: `rank` asks for one (None: the lowest free
        one; a member's rank is refused). store=None: connect to
        COLLIE_STORE_ADDR and ask for COLLIE_RANK (a rank collie-run
        --restarts started again). Blocks, bounded by `timeout`."""
        store, own, rank = _joiner_store(engine, store, rank)
        go, _keep = _grow_opts(None, rank, timeout, opts, cls._child_opts_of)
        h = c_void_p()
        st = lib.collie_comm_join(engine.handle, store.handle, str(name).encode(), byref(go), byref(h))
        if st != 0 and own is not None:
            own.close()
        check(st, "collie_comm_join")
        return _joined(cls, engine, store, own, h.value)

    @classmethod
    async def join_async(cls, engine, store, name="world", rank=None, timeout=None, **opts):
        """`comm = await Comm.join_async(engine, store, name)`: join() without
        blocking the loop; cancelling the await withdraws."""
        store, own, rank = _joiner_store(engine, store, rank)
        go, _keep = _grow_opts(None, rank, timeout, opts, cls._child_opts_of)
        try:
            work = engine.post(
                "collie_comm_join_post",
                lib.collie_comm_join_post,
                (engine.handle, store.handle, str(name).encode(), byref(go)),
                None,
                owner=store,
            )
            h = await _taken(work)
        except BaseException:
            if own is not None:
                own.close()
            raise
        return _joined(cls, engine, store, own, h)


def _joiner_store(engine, store, rank):
    """store None: a Store on COLLIE_STORE_ADDR (the comm's own) and, unless
    given, the rank COLLIE_RANK."""
    if store is not None:
        return store, None, rank
    from .store import Store  # no cycle at import time

    addr = os.environ.get("COLLIE_STORE_ADDR")
    if not addr:
        raise ValueError("join: store=None needs COLLIE_STORE_ADDR (collie-run sets it)")
    if rank is None and os.environ.get("COLLIE_RANK"):
        rank = int(os.environ["COLLIE_RANK"])
    own = Store(engine, addr)
    return own, own, rank


def _joined(cls, engine, store, own, h):
    comm = cls(engine, store, None, None, _handle=h)
    comm._own_store = own  # closed with the comm
    return comm


async def _taken(work):
    """Await a shrink/grow/join work and take the comm it made (a handle);
    cancelling the await cancels the work (what it made is destroyed)."""
    try:
        await work
    except BaseException:
        work.cancel()
        raise
    h = c_void_p()
    check(lib.collie_comm_work_comm(work._h, byref(h)), "collie_comm_work_comm")
    return h.value
