"""`async for ev in comm.events()` whose body awaits
something slow (a shrink, a checkpoint) while another event is pending makes
the event loop spin: the fd stays readable (level-triggered add_reader), the
reader callback sets the iterator's asyncio.Event on every loop turn, and
nothing pops. Measures the loop thread's CPU time while the body sleeps 2 s
with one event (peer_left 1) pending. Prints "cpu <s>"."""
import asyncio, os, sys, time
from edges_world import World


async def main():
    w = World()
    comms = await w.comms("spin")
    c0 = comms[0]
    res = {}

    async def consumer():
        async for ev in c0.events():
            if ev.kind == "peer_left":
                await comms[1].destroy_async()  # one more event (peer_left 1) now pending
                await asyncio.sleep(0.3)
                t0 = time.thread_time()
                await asyncio.sleep(2.0)  # the handler's slow part
                res["cpu"] = time.thread_time() - t0
                return

    t = asyncio.ensure_future(consumer())
    await asyncio.sleep(0.1)
    await comms[2].destroy_async()
    await asyncio.wait_for(t, 20)
    print("cpu %.3f" % res["cpu"], flush=True)
    await c0.destroy_async()
    w.close()


asyncio.run(main())
