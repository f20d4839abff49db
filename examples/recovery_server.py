"""recovery_server.py — an asyncio server answers every request while one of
its ranks is SIGKILLed: the survivors shrink to a comm of themselves and
serve on at once, then take the replacement back (grow) when collie-run has
started it again. The event loop never blocks on any of it.

    PYTHONPATH=python build/bin/collie-run -n 4 --restarts 1 --timeout 60 -- /usr/bin/python3 examples/recovery_server.py

The server: rank 0 is the front end. A client task there sends requests
(RECOVERY_REQUESTS, default 200, one every RECOVERY_INTERVAL_S, default 4 ms)
and awaits each reply: every request is answered or refused with a reason,
none is lost. For each request rank 0 broadcasts a header (what to do, the
request id) and every rank adds its share in an allreduce; every rank checks
the sum against the value it must have (the oracle: every result that
returned OK is checked).

The fault: in its first life the last rank SIGKILLs itself with its share of
request RECOVERY_KILL_AT (default 60) in flight. Then
  1. every survivor's awaited collective fails; the exception says what
     broke and who (e.kind, e.ranks). A task reading `comm.events()` sees
     the same as events (peer_dead, comm_faulted) and times the recovery;
  2. every survivor awaits comm.shrink_async(): one comm of the survivors,
     ranks renumbered in their old order (rank 0 stays the front end), and
     rank 0 sends the failed request again on it: serving goes on within
     milliseconds;
  3. the survivors post grow_async() at once and serve on meanwhile;
     collie-run restarts the killed rank (COLLIE_RESTART_COUNT=1), which
     awaits Comm.join_async(engine, None, "srv"): its old rank, from
     COLLIE_RANK;
  4. once rank 0's grow is done its next header says SWITCH: every member
     awaits its own grow (done within milliseconds) and all move to the
     grown comm, where the replacement waits for its first header.
The other way is to destroy the comm and create it again with every rank
(destroy_async + create_async: examples/asyncio_recovery.py); it serves
nothing until the replacement has started, where shrink serves on. The same
server in C with blocking calls: examples/elastic_server.c.

Each rank measures its loop's worst stall (a task sleeping 1 ms again and
again, from its first comm to its end) and prints it. Every wait is bounded
(collectives by OP_S, shrink and grow by their timeouts, a queued request by
REQUEST_S, the whole program by RUN_S) and the program exits non-zero when a
result is wrong, a request is lost or a recovery step fails. Without
--restarts (with --keep-going) nobody comes back: the grow ends after
RECOVERY_GROW_S (default 30) s and the server goes on with three ranks.
The last line of every rank is a JSON summary.
"""

import asyncio
import json
import os
import signal
import sys
import time
import traceback

try:
    import collie
except ImportError:  # run from the source tree
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import collie

import numpy as np

NAME = "srv"  # the comm's family: what a replacement joins by
COUNT = 1024  # int64 elements per request
SERVE, SWITCH, STOP = 0, 1, 2  # what a header says
OP_S = 10.0  # a collective's deadline (a fault is seen long before)
SHRINK_S = 10.0
REQUEST_S = 5.0  # a request waiting longer than this is refused
AFTER = 20  # answered on the latest comm before the client stops
RUN_S = 50.0


class Failed(Exception):
    """What this example checks went wrong: the process exits 1."""


def env_num(name, dflt):
    v = os.environ.get(name)
    return type(dflt)(v) if v else dflt


def share(rank, rid):
    """What `rank` adds to request `rid`."""
    return (rank + 1) * np.arange(1, COUNT + 1, dtype=np.int64) + rid


def expected(size, rid):
    """The sum of every rank's share, for a comm of `size` ranks."""
    return np.arange(1, COUNT + 1, dtype=np.int64) * (size * (size + 1) // 2) + size * rid


class StallProbe:
    """The loop's worst stall: a task sleeps 1 ms again and again and records
    how much later than that it woke."""

    def __init__(self):
        self.worst_s = 0.0
        self._task = asyncio.ensure_future(self._run())

    async def _run(self):
        loop = asyncio.get_running_loop()
        while True:
            t = loop.time()
            await asyncio.sleep(0.001)
            self.worst_s = max(self.worst_s, loop.time() - t - 0.001)

    async def stop(self):
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        return self.worst_s * 1000


class Request:
    def __init__(self, rid):
        self.id = rid
        self.arrived = time.monotonic()
        self.reply = asyncio.get_running_loop().create_future()

    def answer(self, value):
        self.reply.set_result(("answered", value, time.monotonic() - self.arrived))

    def refuse(self, why):
        print(f"rank 0: request {self.id} refused: {why}", flush=True)
        self.reply.set_result(("refused", why, time.monotonic() - self.arrived))


class Server:
    def __init__(self, comm, me, kill_at):
        self.comm = comm  # the comm requests run on
        self.me = me  # COLLIE_RANK: this process's name in the logs
        self.kill_at = kill_at  # the request this process dies in, or None
        self.grow = None  # a grow_async task on self.comm, or None
        self.since_change = 0  # steps served since the comm last changed
        self.shrinks = self.grows = self.verified = 0
        self.fault_ns = None  # when the first fault event came (monotonic ns)
        self.recovery_ms = self.regrow_ms = None
        self.stopping = False
        self._tasks = []  # event readers and background destroys
        self.watch(comm)

    def log(self, msg):
        print(f"rank {self.me}: {msg}", flush=True)

    def watch(self, comm):
        self._tasks.append(asyncio.ensure_future(self._events(comm)))

    async def _events(self, comm):
        async for ev in comm.events():  # ends when the comm is destroyed
            if ev.kind == "peer_dead":
                self.log(f"event peer_dead: rank {ev.rank} of '{comm.name}'")
            elif ev.kind == "comm_faulted":
                self.log(f"event comm_faulted: '{comm.name}' failed ({ev.fault_kind})")
            if ev.kind in ("peer_dead", "comm_faulted"):
                if self.fault_ns is None:
                    self.fault_ns = ev.time_ns  # time.monotonic_ns's clock

    def retire(self, comm):
        self._tasks.append(asyncio.ensure_future(comm.destroy_async()))

    async def step(self, op, rid):
        """One step, the same on every rank: rank 0's header, then for SERVE
        the request's allreduce, its sum checked. Returns (op, rid, answer)."""
        hdr = await self.comm.broadcast_async(np.array([op, rid], np.int64), root=0, timeout=OP_S)
        op, rid = int(hdr[0]), int(hdr[1])
        if op != SERVE:
            return op, rid, None
        work = self.comm.allreduce(share(self.comm.rank, rid), timeout=OP_S)
        if rid == self.kill_at:  # the fault: die with this rank's share in flight
            self.log(f"SIGKILL myself in request {rid}")
            os.kill(os.getpid(), signal.SIGKILL)
        out = await work
        if not np.array_equal(out, expected(self.comm.size, rid)):
            raise Failed(f"rank {self.me}: request {rid}: wrong sum on {self.comm.size} ranks")
        self.verified += 1
        return op, rid, int(out[-1])

    async def recover(self, err):
        """A collective failed: shrink to the survivors, post a grow for the
        replacement and serve on meanwhile."""
        t0 = time.monotonic_ns()
        self.log(f"{type(err).__name__} (kind {err.kind}, ranks {list(err.ranks)}): shrinking")
        if self.grow is not None:  # a grow on the comm that failed: it cannot happen now
            self.grow.cancel()
            self.grow = None
        old = self.comm
        try:
            self.comm = await asyncio.wait_for(old.shrink_async(timeout=SHRINK_S), SHRINK_S + 5)
        except collie.CollieNotMember as e:
            raise Failed(f"rank {self.me}: the others left me out: {e}")
        self.retire(old)  # its destroy runs on collie's thread; nothing waits for it
        if self.comm.rank_map()[0] != 0:
            raise Failed(f"rank {self.me}: the front end (rank 0) is gone: nobody to serve")
        self.shrinks += 1
        self.since_change = 0
        self.watch(self.comm)
        self.grow = asyncio.ensure_future(self.comm.grow_async(timeout=env_num("RECOVERY_GROW_S", 30.0)))
        self.grow.add_done_callback(lambda t: t.cancelled() or t.exception())  # read below, or never
        self.recovery_ms = (time.monotonic_ns() - (self.fault_ns or t0)) / 1e6
        self.log(
            f"shrunk to rank {self.comm.rank} of {self.comm.size} ('{self.comm.name}'), "
            f"serving again {self.recovery_ms:.1f} ms after the fault; grow posted"
        )

    async def switch(self):
        """The header said SWITCH: move to the grown comm."""
        big = await asyncio.wait_for(self.grow, OP_S)  # rank 0's is done: ours within ms
        self.grow = None
        self.retire(self.comm)
        self.comm = big
        self.grows += 1
        self.since_change = 0
        self.watch(big)
        after = ""
        if self.fault_ns is not None:
            self.regrow_ms = (time.monotonic_ns() - self.fault_ns) / 1e6
            after = f", {self.regrow_ms:.0f} ms after the fault"
        self.log(f"grown to rank {big.rank} of {big.size} ('{big.name}'){after}")

    async def next_step(self, requests, again):
        """Rank 0: what the next header says, and the request it serves."""
        if self.grow is not None and self.grow.done():
            if not self.grow.cancelled() and self.grow.exception() is None:
                return SWITCH, None
            self.log(f"no replacement came ({self.grow.exception()}): serving on {self.comm.size} ranks")
            self.grow = None
        if self.stopping:
            return STOP, None
        if again is not None:
            return SERVE, again
        while True:
            req = await asyncio.wait_for(requests.get(), REQUEST_S)
            if req is None:  # the client is done
                self.stopping = True
                return STOP, None
            waited = time.monotonic() - req.arrived
            if waited <= REQUEST_S:
                return SERVE, req
            req.refuse(f"waited {waited:.1f} s in the queue (the bound is {REQUEST_S} s)")

    async def serve(self, requests=None):
        """Rank 0 (`requests`: its queue) says what each step is; the others
        follow its headers. Ends with the STOP step."""
        again = None  # rank 0: the request whose step failed: it runs once more
        while True:
            op, req = SERVE, None
            if self.comm.rank == 0:
                op, req = await self.next_step(requests, again)
            try:
                op, rid, value = await self.step(op, req.id if req else 0)
            except collie.CollieError as e:
                if req is not None and req is again:
                    req.refuse(f"failed on two comms, last: {e}")
                    again = None
                elif req is not None:
                    again = req
                await self.recover(e)
                continue
            again = None
            self.since_change += 1
            if req is not None:
                req.answer(value)
            elif op == SWITCH:
                await self.switch()
            elif op == STOP:
                return

    async def close(self):
        if self.grow is not None:  # never switched to: withdraw
            self.grow.cancel()
            await asyncio.gather(self.grow, return_exceptions=True)
        self.retire(self.comm)
        await asyncio.wait_for(asyncio.gather(*self._tasks, return_exceptions=True), OP_S)


async def client(server, requests, n, interval_s):
    """Rank 0's client: sends at least n requests, one per interval, and on
    until the server has served AFTER on a comm no grow is pending for;
    then waits for every reply."""
    sent = []
    while len(sent) < n or server.grow is not None or server.since_change < AFTER:
        if len(sent) >= 100 * n:
            raise Failed("client: the server never settled")
        req = Request(len(sent) + 1)
        sent.append(req)
        requests.put_nowait(req)
        await asyncio.sleep(interval_s)
    requests.put_nowait(None)
    done, lost = await asyncio.wait([r.reply for r in sent], timeout=2 * REQUEST_S + OP_S)
    replies = [r.reply.result() for r in sent if r.reply.done()]
    return {
        "sent": len(sent),
        "answered": sum(1 for r in replies if r[0] == "answered"),
        "refused": sum(1 for r in replies if r[0] == "refused"),
        "lost": len(lost),
        "worst_reply_ms": round(max((r[2] for r in replies), default=0.0) * 1000, 1),
    }


async def main():
    me, world = int(os.environ["COLLIE_RANK"]), int(os.environ["COLLIE_WORLD_SIZE"])
    life = int(os.environ.get("COLLIE_RESTART_COUNT", "0"))  # collie-run --restarts counts
    # the victim is the last rank: its replacement asks for its old rank
    # (COLLIE_RANK), which no survivor holds after the shrink renumbered them
    kill_at = env_num("RECOVERY_KILL_AT", 60) if life == 0 and me == world - 1 and me != 0 else None
    summary = {"rank": me, "life": life}
    with collie.Engine(name=f"srv{me}") as engine:
        if life == 0:  # store=None: collie-run's store, rank and size
            comm = await asyncio.wait_for(
                collie.Comm.create_async(engine, name=NAME, timeout=OP_S, create_timeout=30), 35
            )
        else:  # a replacement: join the running comm at the members' next grow
            grow_s = env_num("RECOVERY_GROW_S", 30.0)
            comm = await asyncio.wait_for(collie.Comm.join_async(engine, None, NAME, timeout=grow_s), grow_s + 5)
            print(f"rank {me}: joined as rank {comm.rank} of {comm.size} ('{comm.name}')", flush=True)
        probe = StallProbe()
        server = Server(comm, me, kill_at)
        if comm.rank == 0:
            requests = asyncio.Queue()
            cl = asyncio.ensure_future(
                client(server, requests, env_num("RECOVERY_REQUESTS", 200), env_num("RECOVERY_INTERVAL_S", 0.004))
            )
            await server.serve(requests)
            summary.update(await cl)
        else:
            await server.serve()
        await server.close()
        summary["worst_stall_ms"] = round(await probe.stop(), 2)
    summary.update(
        verified=server.verified,
        shrinks=server.shrinks,
        grows=server.grows,
        recovery_ms=server.recovery_ms and round(server.recovery_ms, 1),
        regrow_ms=server.regrow_ms and round(server.regrow_ms, 1),
    )
    print(f"rank {me}: verified {server.verified} results; worst loop stall {summary['worst_stall_ms']:.2f} ms",
          flush=True)
    if "sent" in summary:
        print(f"rank 0: served: {summary['sent']} requests: {summary['answered']} answered, "
              f"{summary['refused']} refused, {summary['lost']} lost; {server.shrinks} shrinks, "
              f"{server.grows} grows; worst reply {summary['worst_reply_ms']} ms", flush=True)
    print(json.dumps(summary), flush=True)
    if summary.get("lost"):
        raise Failed(f"{summary['lost']} requests lost")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(asyncio.run(asyncio.wait_for(main(), RUN_S)))
    except Failed as e:
        print(f"recovery_server: FAILED: {e}", flush=True)
        sys.exit(1)
    except asyncio.TimeoutError:  # a bounded wait ran out (the whole run: RUN_S)
        traceback.print_exc()
        print("recovery_server: a deadline passed", flush=True)
        sys.exit(1)
