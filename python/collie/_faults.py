"""Failure as data for Python: a fault's kind and rank set, peer health, and
the comm's event fd as an async iterator.

Design notes
- Fault mirrors collie_fault: `kind` and `view` as names ("peer_dead",
  "local"), `origin` (None when unknown) and `ranks` (a tuple, the suspects;
  `ranks_total` counts a set larger than collie lists). Exceptions of failed
  works and comms carry it as .fault, with .kind and .ranks as shortcuts.
- Health is a mixin of Comm: health(), fault(), event_fd(), pop_event() and
  `async for ev in comm.events()`, which watches the fd with the running
  loop's add_reader and never blocks it: one reader per loop
  (_LoopReader), armed only while an iterator waits and removed as it
  fires, whose callback only wakes the iterators waiting on it (an
  asyncio.Event each); each iterator then pops (collie_comm_event_pop never
  blocks), so an event goes to one iterator, and a body that awaits with
  events pending leaves the loop idle. Destroy ends them first
  (_events_stop) before it closes the fd. Each reader watches its own dup
  of the fd, closed when it stops: a destroy from another thread closes
  the comm's fd before the loop runs stop(), and a new comm may hold that
  number by then.
"""

import asyncio
import os
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


class _LoopReader:
    """The comm's event fd watched on one loop for the events() iterators
    waiting there. Armed only while one waits and removed as it fires: the
    fd stays readable until someone pops, and a reader left on it would
    wake the loop on every turn while an iterator's body awaits. stop()
    (destroy) ends it for good, so an ending iterator never touches the fd
    number again (a new comm may hold it by then)."""

    def __init__(self, loop, fd):
        # its own duplicate of the comm's fd: destroy closes the comm's,
        # possibly before stop() runs on this loop, and the number may be a
        # new comm's by then; this one stays ours until stop or release
        self.loop, self.fd = loop, os.dup(fd)
        self.waiting = set()
        self.armed = self.stopped = False

    def arm(self):
        if not self.armed and not self.stopped:
            self.loop.add_reader(self.fd, self._fire)
            self.armed = True

    def disarm(self):
        if self.armed:
            self.loop.remove_reader(self.fd)
            self.armed = False

    def _fire(self):
        self.disarm()
        for r in list(self.waiting):
            r.set()

    def release(self):
        self.disarm()
        if not self.stopped:
            self.stopped = True
            os.close(self.fd)

    def stop(self):
        self.release()
        for r in list(self.waiting):
            r.set()


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
        readers = self.__dict__.setdefault("_event_readers", {})
        reader = readers.get(loop)
        if reader is None:
            reader = readers[loop] = _LoopReader(loop, self.event_fd())
        ready = asyncio.Event()
        reader.waiting.add(ready)
        try:
            while True:
                ev = self.pop_event() if self._h else None
                if ev is not None:
                    yield ev
                    continue
                if not self._h or self._engine._closed or reader.stopped:
                    return  # nothing more can come
                ready.clear()
                reader.arm()
                await ready.wait()
        finally:
            reader.waiting.discard(ready)
            if not reader.waiting and not reader.stopped:
                if readers.get(loop) is reader:
                    del readers[loop]
                reader.release()

    def _events_stop(self):
        """Before destroy closes the fd: every events() iterator lets go of
        it (on its loop) and ends."""
        for loop, reader in self.__dict__.pop("_event_readers", {}).items():
            try:
                running = asyncio.get_running_loop()
            except RuntimeError:
                running = None
            if running is loop:
                reader.stop()
            elif not loop.is_closed():
                loop.call_soon_threadsafe(reader.stop)
