"""shrink_rank.py - one rank of bench/shrink_netns.py.

  argv: ROOT MODE VICTIM LIFE_S
  MODE  shrink    on the comm's first comm_faulted or peer_dead event,
                  Comm.shrink() and a first allreduce on the new comm
        recreate  what an application does without shrink: on the first
                  peer_dead event, destroy the comm, create one of the
                  survivors (a new name, ranks renumbered) through the
                  store, and a first allreduce on it

Joins a comm of COLLIE_WORLD_SIZE ranks through the store at
COLLIE_STORE_ADDR (collie-store: shrink needs a store that outlives the
ranks), runs one allreduce (its bytes checked), says "up <rank>", then
waits on the comm's event fd. Rank VICTIM only waits to be killed. The
driver may kill another rank while the shrink runs: a shrink that fails
with EABORTED is tried again, and a first allreduce that fails on the new
comm shrinks the new comm (both bounded: MAX_TRIES).

Lines (times: CLOCK_MONOTONIC ns, as the driver's time.monotonic_ns):
  "up <rank>"
  "SH <rank> <ns>"            entering shrink (or destroy): the driver's
                              cue for a second kill
  "T <phase> <ns>"            event (collie's time_ns of the first event),
                              popped, then shrink: shrunk (again: a
                              shrink after a failed try, then shrunk);
                              recreate: destroyed, created; both: done
  "RETRY <what> <error>"      a shrink or first allreduce failed, tried again
  "DONE <rank> <size> <sum> <want> <tries>"  the first allreduce's bytes
                              (every element) and the sum they must have
  "ERR <text>"                it gave up
Bounded: it exits after LIFE_S seconds whatever happens.
"""

import os
import select
import sys
import time

sys.path.insert(0, os.path.join(sys.argv[1], "python"))
import numpy as np  # noqa: E402

import collie  # noqa: E402

MAX_TRIES = 4
COUNT = 4  # int32 elements of every allreduce
# every comm made stays referenced until the rank exits: a Comm dropped
# would be destroyed by its finaliser, which blocks the caller (a failed
# comm's destroy waits for its delayed transport close, ~20 ms) and would
# land inside the measured time
keep = []
mode, victim, life_s = sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
end = time.monotonic() + life_s
now = time.monotonic_ns


def say(*words):
    print(*words, flush=True)


def linger():
    while time.monotonic() < end:
        time.sleep(0.5)  # killed by the driver
    sys.exit(0)


def checked_allreduce(comm, value, members):
    """An allreduce of `value` on comm, its bytes against the members' sum."""
    buf = np.full(COUNT, value, np.int32)
    comm.allreduce(buf).wait(10)
    want = sum(o + 1 for o in members)
    if not (buf == want).all():
        say("ERR wrong bytes", buf.tolist(), "want", want)
        linger()
    return int(buf[0]), want


def first_event(comm, kinds):
    """(collie's time_ns of the first event, the first event of `kinds`)."""
    fd = comm.event_fd()
    first = None
    while time.monotonic() < end:
        r, _, _ = select.select([fd], [], [], 0.5)
        if not r:
            continue
        while (ev := comm.pop_event()) is not None:
            first = first or ev.time_ns
            if ev.kind in kinds:
                return first, ev
    say("ERR no event")
    sys.exit(1)


def shrink(comm, rank):
    """Shrink until a new comm's first allreduce is done; (comm, members,
    sum, want, tries). members: the old ranks of the new comm, by new rank."""
    cur, members = comm, list(range(comm.size))
    for tries in range(1, MAX_TRIES + 1):
        if tries > 1:
            say("T again", now())
        try:
            new = cur.shrink(timeout=10)
            keep.append(new)
        except collie.CollieAborted as e:  # a member died while the new comm was made
            say("RETRY shrink", str(e).replace("\n", " "))
            continue
        say("T shrunk", now())
        kept = [None] * new.size
        for old, nr in enumerate(new.rank_map()):
            if nr is not None:
                kept[nr] = members[old]
        members = kept
        try:
            got, want = checked_allreduce(new, rank + 1, members)
            return new, members, got, want, tries
        except collie.CollieError as e:  # a member died after the new comm was made
            say("RETRY allreduce", str(e).replace("\n", " "))
            cur = new
    say("ERR gave up after %d tries" % MAX_TRIES)
    linger()


def recreate(eng, store, comm, rank, dead):
    """Destroy, create the survivors' comm, its first allreduce."""
    comm.destroy()  # blocking, as collie_comm_destroy
    say("T destroyed", now())
    members = [r for r in range(comm_size) if r != dead]
    new = collie.Comm(eng, store, members.index(rank), len(members), name="shb.re",
                      timeout=30, create_timeout=10)
    keep.append(new)
    say("T created", now())
    got, want = checked_allreduce(new, rank + 1, members)
    return new, members, got, want, 1


eng = collie.Engine()
store = collie.Store(eng)  # COLLIE_STORE_ADDR, COLLIE_STORE_TOKEN
rank, comm_size = int(os.environ["COLLIE_RANK"]), int(os.environ["COLLIE_WORLD_SIZE"])
comm = collie.Comm(eng, store, rank, comm_size, name="shb", timeout=30, create_timeout=30)
keep.append(comm)
checked_allreduce(comm, rank + 1, range(comm_size))
say("up", rank)
if rank == victim:
    linger()
kinds = ("comm_faulted", "peer_dead") if mode == "shrink" else ("peer_dead",)
first_ns, ev = first_event(comm, kinds)
t = now()
say("T event", first_ns)
say("T popped", t)
say("SH", rank, t)
if mode == "shrink":
    new, members, got, want, tries = shrink(comm, rank)
else:
    new, members, got, want, tries = recreate(eng, store, comm, rank, ev.rank)
say("T done", now())
say("DONE", rank, new.size, got, want, tries)
linger()
