"""asyncio_recovery.py — an asyncio server keeps answering through a killed
rank: the fault is seen, the comm destroyed and created again, and the
event loop never stops for any of it.

    build/bin/collie-run -n 4 --restarts 1 -- python3 examples/asyncio_recovery.py

Every rank is an asyncio program: a "request" task runs allreduces (each
result checked) while a heartbeat task sleeps 1 ms again and again and
records how late the loop woke it (the loop's lag: what a client of this
server would wait on top of its own request). In its first life the victim
rank (ASYNC_RECOVERY_VICTIM, default 2) posts allreduce number
ASYNC_RECOVERY_KILL_AT (default 30) and SIGKILLs itself with it in flight.
The survivors:
  1. see the fault on the awaited allreduce (ColliePeerError or
     CollieAborted naming the root cause);
  2. `await comm.destroy_async()`: the destroy's bounded waits run on
     collie's progress thread;
  3. `await Comm.create_async(...)` with the same name: the new
     generation's rendezvous waits for the victim, which collie-run starts
     again; asyncio.wait_for bounds it (ASYNC_RECOVERY_CREATE_S, default
     20 s): past it the create is cancelled (the task's cancel cancels the
     C work: the ranks waiting in the same rendezvous fail at once with
     CollieCancelled naming this one) and the rank says so and exits 3;
  4. run ASYNC_RECOVERY_AFTER (default 50) more allreduces, checked.
Without --restarts nobody comes back: with ASYNC_RECOVERY_CREATE_S=1 the
survivors' creates are cancelled after 1 s, and the loop never blocked.

A process knows which life it is in from the store counter
"asyncrec/lives/<rank>" (the store lives in collie-run, so it outlives any
rank). The last line of every rank is one JSON object: the phase times in
ms, the loop's largest lag in each phase ("lag_ms": "startup" = making the
engine and store, with blocking calls, and the first create; "steady" =
serving, which includes detecting the fault; "recovery" = from the fault
seen to the comm ready again (destroy and re-create); "after"), and
"result": "recovered", "gave_up" or "victim".
"""

import asyncio
import json
import os
import signal
import sys
import time

try:
    import collie
except ImportError:  # run from the source tree
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "python"))
    import collie

import numpy as np

COUNT = 256
NAME = "asyncrec"


def env_int(name, dflt):
    v = os.environ.get(name)
    return int(v) if v else dflt


class Heartbeat:
    """The loop's lag: a task sleeping 1 ms again and again. A lag is
    charged to every phase that was current while it lasted (a blocking
    call that spans a phase change shows in both)."""

    def __init__(self):
        self._phases = ["startup"]  # engine, store and first create: before serving
        self.lag = {}
        self._stop = False

    @property
    def phase(self):
        return self._phases[-1]

    @phase.setter
    def phase(self, name):
        self._phases.append(name)

    async def run(self):
        loop = asyncio.get_running_loop()
        while not self._stop:
            t = loop.time()
            del self._phases[:-1]  # the phases this sleep lives through, from here
            await asyncio.sleep(0.001)
            late = (loop.time() - t - 0.001) * 1000
            for ph in self._phases:
                if late > self.lag.get(ph, 0.0):
                    self.lag[ph] = late

    def stop(self):
        self._stop = True


def expected(rank_count, it):
    # rank r contributes (r + 1) * (j + 1) + it at element j
    j = np.arange(1, COUNT + 1, dtype=np.int64)
    return (j * rank_count * (rank_count + 1) // 2 + rank_count * it).astype(np.int32)


async def allreduce_checked(comm, it):
    x = ((comm.rank + 1) * np.arange(1, COUNT + 1, dtype=np.int64) + it).astype(np.int32)
    out = await comm.allreduce_async(x)
    if not np.array_equal(out, expected(comm.size, it)):  # the oracle: every OK result checked
        raise SystemExit(f"rank {comm.rank}: allreduce {it} returned wrong bytes")


# the bench's comparison (bench/asyncio_recovery.py): the blocking forms,
# which stop the loop for as long as they take
BLOCKING = os.environ.get("ASYNC_RECOVERY_BLOCKING") == "1"


async def create(engine, store, rank, size, bound_s):
    if BLOCKING:
        return collie.Comm(engine, store, rank, size, name=NAME, timeout=30, create_timeout=60)
    return await asyncio.wait_for(
        collie.Comm.create_async(engine, store, rank, size, name=NAME, timeout=30, create_timeout=60),
        bound_s,
    )


async def main():
    rank, size = int(os.environ["COLLIE_RANK"]), int(os.environ["COLLIE_WORLD_SIZE"])
    victim = env_int("ASYNC_RECOVERY_VICTIM", 2)
    kill_at = env_int("ASYNC_RECOVERY_KILL_AT", 30)
    after = env_int("ASYNC_RECOVERY_AFTER", 50)
    create_s = float(os.environ.get("ASYNC_RECOVERY_CREATE_S", "20"))
    report = {"rank": rank, "ms": {}}
    hb = Heartbeat()
    beat = asyncio.ensure_future(hb.run())
    with collie.Engine(name=f"rank{rank}") as engine, collie.Store(engine) as store:
        life = store.add(f"asyncrec/lives/{rank}", 1)
        t0 = time.monotonic()
        comm = await create(engine, store, rank, size, create_s)
        report["ms"]["first_create"] = (time.monotonic() - t0) * 1000
        hb.phase = "steady"
        it = 0
        if life == 1:  # the first life: serve until the fault
            try:
                while it < 100000:
                    if rank == victim and it == kill_at:  # its real share, in flight when it dies
                        comm.allreduce(((rank + 1) * np.arange(1, COUNT + 1) + it).astype(np.int32))
                        os.kill(os.getpid(), signal.SIGKILL)
                    await allreduce_checked(comm, it)
                    it += 1
            except collie.CollieError as e:
                t_fault = time.monotonic()
                hb.phase = "recovery"
                report["fault"] = type(e).__name__
                print(f"rank {rank}: fault after {it} allreduces: {e}", flush=True)
            t1 = time.monotonic()
            if BLOCKING:
                comm.destroy()
            else:
                await comm.destroy_async()
            report["ms"]["destroy"] = (time.monotonic() - t1) * 1000
            t2 = time.monotonic()
            try:
                comm = await create(engine, store, rank, size, create_s)
            except (asyncio.TimeoutError, collie.CollieError) as e:
                # our bound passed (the create is cancelled), or another
                # survivor gave up first: its cancel fails this generation
                # for every rank at once (CollieCancelled naming it)
                report["ms"]["gave_up_after"] = (time.monotonic() - t2) * 1000
                report["gave_up"] = type(e).__name__
                await asyncio.sleep(0.05)  # the cancelled create's cleanup runs meanwhile
                hb.stop()
                await beat
                report["lag_ms"] = hb.lag
                report["result"] = "gave_up"
                print(f"rank {rank}: nobody came back within {create_s} s: creation cancelled", flush=True)
                print(json.dumps(report), flush=True)
                return 3
            report["ms"]["create"] = (time.monotonic() - t2) * 1000
            report["ms"]["fault_to_ready"] = (time.monotonic() - t_fault) * 1000
            hb.phase = "after"
            print(f"rank {rank}: comm '{comm.name}' generation {comm.generation} ready again", flush=True)
        for k in range(after):
            await allreduce_checked(comm, 1000 + k)
        await comm.destroy_async()
        hb.stop()
        await beat
        report["lag_ms"] = hb.lag
        report["result"] = "victim" if life > 1 else "recovered"
        print(f"rank {rank}: recovered", flush=True)
        print(json.dumps(report), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main()))
