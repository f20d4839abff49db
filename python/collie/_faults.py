"""Failure as data for Python: a fault's kind and rank set, peer health, and
the comm's event fd as an async iterator.

Design notes
- Fault mirrors collie_fault: `kind` and `view` as names ("peer_dead",
  "local"), `origin` (None when unknown) and `ranks` (a tuple, the suspects;
  `ranks_total` counts a set larger than collie lists). Exceptions of failed
  works and comms carry it as .fault, with .kind and .ranks as shortcuts.
- Health is a mixin of Comm: health(), fault(), event_fd(), pop_event() and
  `async for ev in comm.events()`, which watches the fd with the running
  loop's add_reader and never blocks it: one reader per loop, whose
  callback only wakes the iterators waiting on it (an asyncio.Event each);
  each iterator then pops (collie_comm_event_pop never blocks), so an
  event goes to one iterator. Destroy ends them first (_events_stop)
  before it closes the fd.
"""

import asyncio
from ctypes import byref, sizeof
from dataclasses import dataclass
from typing import Optional, Tuple

from . import _lib
from ._lib import lib
from .errors import INPROGRESS, OK, check

VIEWS = ("local", "peer", "agreed")


def _name(fn, value):
    return fn(value).decode()


@dataclass(frozen=True)
class Fault:
    """What broke and who: collie_fault."""

    status: int
    kind: str
    view: str
    origin: Optional[int]
    ranks: Tuple[int, ...]
    ranks_total: int

    @staticmethod
    def from_c(f):
        n = min(f.nranks, _lib.FAULT_RANKS)
        return Fault(
            status=f.status,
            kind=_name(lib.collie_fault_kind_name, f.kind),
            view=VIEWS[f.view] if 0 <= f.view < len(VIEWS) else "?",
            origin=None if f.origin < 0 else f.origin,
            ranks=tuple(f.ranks[i] for i in range(n)),
            ranks_total=f.nranks,
        )


def stats_fields(st):
    """The fault fields of a CommStats as Comm.stats() gives them: the root
    fault's kind by name, failed works by kind name (the kinds that
    occurred), the peers dead, suspected and left now, and the shrinks and
    grows in the comm's line."""
    return {
        "fault_kind": _name(lib.collie_fault_kind_name, st.fault_kind),
        "failed_by_kind": {
            _name(lib.collie_fault_kind_name, k): st.failed_by_kind[k]
            for k in range(1, _lib.FAULT_NUM_KINDS)
            if st.failed_by_kind[k]
        },
        "peers_dead": st.peers_dead,
        "peers_suspected": st.peers_suspected,
        "peers_left": st.peers_left,
        "shrinks": st.shrinks,
        "grows": st.grows,
    }


def work_fault(handle):
    """The Fault of a done, failed work handle (None if it succeeded)."""
    f = _lib.Fault(size=sizeof(_lib.Fault))
    if lib.collie_work_fault(handle, byref(f)) != OK or f.status == OK:
        return None
    return Fault.from_c(f)


@dataclass(frozen=True)
class PeerHealth:
    """One rank as this rank sees it: state ("alive", "slow", "suspected",
    "dead", "left", "self"), seconds since last heard from (None: never),
    the highest sequence number it is known to have reached."""

    rank: int
    state: str
    heard_ago: Optional[float]
    seq: int


@dataclass(frozen=True)
class Event:
    """A comm event: kind ("peer_dead", "peer_suspected", "peer_back",
    "peer_left", "comm_faulted", "excluded"), the rank (comm_faulted: the fault's
    origin, None unknown), status and fault kind (comm_faulted), when
    (time.monotonic_ns's clock) and how many were dropped before it."""

    kind: str
    rank: Optional[int]
    status: int
    fault_kind: str
    time_ns: int
    dropped: int


class Health:
    """Comm's failure-as-data methods (mixed into Comm)."""

    def fault(self):
        """The comm's root Fault, or None while healthy (collie_comm_fault)."""
        f = _lib.Fault(size=sizeof(_lib.Fault))
        check(lib.collie_comm_fault(self.handle, byref(f)), "fault")
        return None if f.status == OK else Fault.from_c(f)

    def health(self):
        """Every rank's PeerHealth, indexed by rank (collie_comm_health)."""
        n = self.size
        arr = (_lib.PeerHealth * n)()
        got = lib.collie_comm_health(self.handle, arr, n)
        if got < 0:
            check(got, "health")
        return [
            PeerHealth(
                rank=r,
                state=_name(lib.collie_peer_state_name, arr[r].state),
                heard_ago=None if arr[r].heard_ago_ms < 0 else arr[r].heard_ago_ms / 1000.0,
                seq=arr[r].seq,
            )
            for r in range(got)
        ]

    def event_fd(self):
        """The fd that is readable while events are pending (never read it)."""
        fd = lib.collie_comm_event_fd(self.handle)
        if fd < 0:
            check(fd, "event_fd")
        return fd

    def pop_event(self):
        """The oldest pending Event, or None. Never blocks."""
        ev = _lib.CommEvent(size=sizeof(_lib.CommEvent))
        st = lib.collie_comm_event_pop(self.handle, byref(ev))
        if st == INPROGRESS:
            return None
        check(st, "pop_event")
        return Event(
            kind=_name(lib.collie_event_kind_name, ev.kind),
            rank=None if ev.rank < 0 else ev.rank,
            status=ev.status,
            fault_kind=_name(lib.collie_fault_kind_name, ev.fault_kind),
            time_ns=ev.time_ns,
            dropped=ev.dropped,
        )

    async def events(self):
        """`async for ev in comm.events()`: the comm's events as they come,
        without a thread and without blocking the loop. Ends when the comm
        is destroyed or its engine closed (after the events already in).
        Several iterators share the comm's one queue: each
        event goes to one of them."""
        loop = asyncio.get_running_loop()
        fd = self.event_fd()
        ready = asyncio.Event()
        # one reader per loop for the fd, waking every iterator on it
        readers = self.__dict__.setdefault("_event_readers", {})
        if loop not in readers:
            waiting = set()
            readers[loop] = (fd, waiting)
            loop.add_reader(fd, lambda: [r.set() for r in list(waiting)])
        waiting = readers[loop][1]
        waiting.add(ready)
        try:
            while True:
                ev = self.pop_event() if self._h else None
                if ev is not None:
                    yield ev
                    continue
                if not self._h or self._engine._closed:  # nothing more can come
                    return
                ready.clear()
                await ready.wait()
        finally:
            waiting.discard(ready)
            if not waiting and readers.get(loop, (None, None))[1] is waiting:
                del readers[loop]
                loop.remove_reader(fd)

    def _events_stop(self):
        """Before destroy closes the fd: every events() iterator lets go of
        it (on its loop) and ends."""
        for loop, (fd, waiting) in self.__dict__.pop("_event_readers", {}).items():
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            wake = list(waiting)
            waiting.clear()
            if running is loop:
                loop.remove_reader(fd)
                for r in wake:
                    r.set()
            elif not loop.is_closed():
                loop.call_soon_threadsafe(loop.remove_reader, fd)
                for r in wake:
                    loop.call_soon_threadsafe(r.set)
