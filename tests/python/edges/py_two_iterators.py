"""Two `async for ev in comm.events()` on one comm (a monitor and a
recovery task) share its fd: the first event goes to one of them, which
ends; the other must still wake for the next (before the fix the second
add_reader replaced the first one's callback, and the second iterator's end
removed the reader: the first never woke again while events were pending).
Prints "-> HELD" or "-> HANG" (bounded by wait_for)."""
import asyncio, os, sys
from edges_world import World

async def main():
    w = World()
    comms = await w.comms("two_it")
    c0 = comms[0]
    got_a = []

    async def a():
        async for ev in c0.events():
            got_a.append(ev)
            return ev

    async def b():
        async for ev in c0.events():
            return ev  # ends: its finally removes the fd's reader

    ta = asyncio.ensure_future(a())
    await asyncio.sleep(0.05)
    tb = asyncio.ensure_future(b())
    await asyncio.sleep(0.05)
    await comms[2].destroy_async()  # c0: peer_left 2 (one of the two takes it and ends)
    done, _ = await asyncio.wait({ta, tb}, timeout=5, return_when=asyncio.FIRST_COMPLETED)
    assert done, "neither iterator got the first event"
    first = done.pop()
    print("b" if first is tb else "a", "got", first.result().kind)
    ta = tb if first is ta else ta  # the one still waiting
    await asyncio.sleep(0.2)
    await comms[1].destroy_async()  # c0: peer_left 1, pending for the other
    await asyncio.sleep(0.3)
    # more events are pending now? (peer_left, comm_faulted ...)
    fd = c0.event_fd()
    import select
    r, _, _ = select.select([fd], [], [], 0)
    print("fd readable (events pending):", bool(r))
    try:
        eva = await asyncio.wait_for(ta, 3)
        print("the other got", eva.kind, "-> HELD")
        rc = 0
    except asyncio.TimeoutError:
        print("the other never woke though events were pending -> HANG")
        rc = 1
    await c0.destroy_async()
    w.close()
    return rc

sys.exit(asyncio.run(main()))
