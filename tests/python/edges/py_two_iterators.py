"""Two `async for ev in comm.events()` on one comm (a monitor and a
recovery task): the second add_reader replaces the first one's callback on
the same fd, and when the second iterator ends its finally removes the
reader: the first never wakes again while events are pending (a hang,
bounded here by wait_for)."""
import asyncio, os, sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "python"))
import collie

async def main():
    eng = collie.Engine()
    srv = collie.StoreServer(eng)
    st = [collie.Store(eng, srv.address) for _ in range(3)]
    comms = await asyncio.gather(*[collie.Comm.create_async(eng, st[r], r, 3, name="two_it", timeout=10)
                                   for r in range(3)])
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
    await comms[2].destroy_async()  # c0: peer_left 2 (b takes it and ends)
    evb = await asyncio.wait_for(tb, 5)
    print("b got", evb.kind)
    await asyncio.sleep(0.2)
    await comms[1].destroy_async()  # c0: peer_left 1, pending for a
    await asyncio.sleep(0.3)
    # more events are pending now? (peer_left, comm_faulted ...)
    fd = c0.event_fd()
    import select
    r, _, _ = select.select([fd], [], [], 0)
    print("fd readable (events pending):", bool(r))
    try:
        eva = await asyncio.wait_for(ta, 3)
        print("a got", eva.kind, "-> HELD")
        rc = 0
    except asyncio.TimeoutError:
        print("a never woke though events were pending -> HANG")
        rc = 1
    await c0.destroy_async()
    for s in st:
        s.close()
    srv.close()
    eng.close()
    return rc

sys.exit(asyncio.run(main()))
