"""rank 0 posts its creation of "cc2" (size 2)
alone, nobody comes, its await is cancelled (asyncio.wait_for: the
documented way to bound a re-create). Then both ranks create "cc2" again,
as docs/python.md's recover() would on its next try. Expected: the new
creation succeeds (every rank created again). Observed: it fails,
"generation 0 had already failed when this rank joined it": the cancelled
join used one of generation 0's slots, so the next create lands in the
poisoned generation. Prints each rank's result and "-> OK" or "-> FAILED"."""
import asyncio, os, sys
sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "python"))
import collie


async def main():
    eng = collie.Engine()
    srv = collie.StoreServer(eng)
    st = [collie.Store(eng, srv.address) for _ in range(2)]
    try:
        await asyncio.wait_for(collie.Comm.create_async(eng, st[0], 0, 2, name="cc2", create_timeout=20), 0.3)
    except asyncio.TimeoutError:
        print("rank 0's lone create cancelled")
    await asyncio.sleep(0.5)
    res = await asyncio.wait_for(asyncio.gather(
        *[collie.Comm.create_async(eng, st[r], r, 2, name="cc2", create_timeout=5) for r in range(2)],
        return_exceptions=True), 15)
    ok = True
    for r, c in enumerate(res):
        if isinstance(c, BaseException):
            ok = False
            print("rank %d: %r" % (r, c))
        else:
            print("rank %d: created" % r)
            await c.destroy_async()
    print("-> OK" if ok else "-> FAILED")
    for s in st:
        s.close()
    srv.close()
    await asyncio.sleep(0.3)
    eng.close()
    return 0 if ok else 1


sys.exit(asyncio.run(main()))
