"""Shrinking a comm to its survivors (collie_comm_shrink): Comm.shrink,
Comm.shrink_async and Comm.rank_map, mixed into Comm.

The survivors of a failed comm agree on the failed set through the store
and get a comm of the others, ranks renumbered in their old order. A rank
the others left out (it was slow, stopped, or came too late) gets
CollieNotMember, here and on its next post of the old comm. The old comm
stays the caller's to destroy. docs/faults.md ("Shrink") says what is
guaranteed.
"""

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
        try:
            await work
        except BaseException:
            work.cancel()
            raise
        h = c_void_p()
        check(lib.collie_comm_work_comm(work._h, byref(h)), "collie_comm_work_comm")
        return self._shrunk(h.value)

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
