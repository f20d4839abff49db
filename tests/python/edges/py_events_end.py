"""events() iterator ends? (a) the engine closed from another task while
an iterator waits; (b) destroy_async racing a peer's abort; (c) the
iterator on a comm destroyed from another thread."""
import asyncio, os, sys, threading, time
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "python"))
import collie

async def world(eng, srv, n, name):
    st = [collie.Store(eng, srv.address) for _ in range(n)]
    cs = await asyncio.gather(*[collie.Comm.create_async(eng, st[r], r, n, name=name, timeout=10)
                                for r in range(n)])
    return st, cs

async def drain(c, out):
    async for ev in c.events():
        out.append(ev.kind)
    out.append("END")

async def scen_engine_close():
    eng = collie.Engine(); srv = collie.StoreServer(collie.Engine())
    st, cs = await world(eng, srv, 2, "ec")
    got = []
    t = asyncio.ensure_future(drain(cs[0], got))
    await asyncio.sleep(0.1)
    eng.close()
    try:
        await asyncio.wait_for(t, 3)
        res = "ended"
    except asyncio.TimeoutError:
        res = "HANG (iterator never ended after engine.close())"
    print("engine close:", res, got, "fault:", cs[0].fault())
    for c in cs:
        c.destroy()

async def scen_destroy_vs_abort(i):
    eng = collie.Engine(); srv = collie.StoreServer(eng)
    st, cs = await world(eng, srv, 3, f"da{i}")
    got = []
    t = asyncio.ensure_future(drain(cs[0], got))
    await asyncio.sleep(0.05)
    cs[1].abort("racing")
    if i % 2: await asyncio.sleep(0.001 * (i % 5))
    r0 = await asyncio.wait_for(cs[0].destroy_async(), 10)
    try:
        await asyncio.wait_for(t, 3); ok = True
    except asyncio.TimeoutError:
        ok = False
    for c in cs[1:]:
        await asyncio.wait_for(c.destroy_async(), 10)
    for s in st: s.close()
    srv.close(); eng.close()
    return ok, r0, got

async def scen_thread_destroy():
    eng = collie.Engine(); srv = collie.StoreServer(eng)
    st, cs = await world(eng, srv, 2, "td")
    got = []
    t = asyncio.ensure_future(drain(cs[0], got))
    await asyncio.sleep(0.05)
    th = threading.Thread(target=cs[0].destroy); th.start()
    try:
        await asyncio.wait_for(t, 5); res = "ended"
    except asyncio.TimeoutError:
        res = "HANG"
    th.join(10)
    print("destroy from a thread:", res, got)
    cs[1].destroy()
    for s in st: s.close()
    srv.close(); eng.close()

async def main():
    await scen_thread_destroy()
    bad = 0
    for i in range(10):
        ok, r0, got = await scen_destroy_vs_abort(i)
        if not ok: bad += 1
        if i < 3 or not ok: print("destroy_async vs abort", i, ok, r0, got)
    print("destroy vs abort: %d/10 iterators did not end" % bad)
    await scen_engine_close()

asyncio.run(main())
