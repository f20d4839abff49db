"""Recovery inside an `async for ev in a.events()`
body: on an event, destroy comm a and create comm b (b's event fd takes a's
closed fd number), start a monitor on b.events(), then leave the loop. The
ending iterator of a still holds a's readers dict (which _events_stop popped
but did not empty) and calls loop.remove_reader(<that number>): it removes
b's reader, and b's monitor never wakes though b's events are pending.
Prints "-> HELD" or "-> HANG" (bounded)."""
import asyncio, os, select, sys
from edges_world import World


async def main():
    w = World()
    a = await w.comms("fda")
    fda = a[0].event_fd()
    state = {}

    async def monitor(comm):
        async for ev in comm.events():
            return ev

    async def recovery():
        async for ev in a[0].events():
            # recover: a new comm for everyone, then a monitor on it
            await asyncio.gather(*[c.destroy_async() for c in a])
            b = await w.comms("fdb")
            state["b"] = b
            state["fdb"] = b[0].event_fd()
            state["mon"] = asyncio.ensure_future(monitor(b[0]))
            await asyncio.sleep(0.1)  # the monitor is waiting on b's fd
            break
        # the iterator of a has ended here (its finally ran)

    t = asyncio.ensure_future(recovery())
    await asyncio.sleep(0.1)
    a[2].abort("rank 2 gives up")  # a[0]: comm_faulted (peer_abort)
    await asyncio.wait_for(t, 30)
    await asyncio.sleep(0.2)
    b = state["b"]
    print("fd of a", fda, "fd of b", state["fdb"], flush=True)
    await b[2].destroy_async()  # b[0]: peer_left 2
    await asyncio.sleep(0.5)
    r, _, _ = select.select([state["fdb"]], [], [], 0)
    print("b's fd readable (events pending):", bool(r), flush=True)
    rc = 0
    try:
        ev = await asyncio.wait_for(state["mon"], 3)
        print("monitor got", ev.kind, "-> HELD")
    except asyncio.TimeoutError:
        print("monitor of b never woke though its events were pending -> HANG")
        rc = 1
    for c in b[:2]:
        await c.destroy_async()
    w.close()
    return rc


sys.exit(asyncio.run(main()))
