"""The scripts' shared setup: one engine, a store server and a store
client per rank in this process, and comms of n ranks made together
(create_async), torn down in order by close()."""
import asyncio
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "..", "python"))
import collie  # noqa: E402


class World:
    def __init__(self, n=3):
        self.eng = collie.Engine()
        self.srv = collie.StoreServer(self.eng)
        self.st = [collie.Store(self.eng, self.srv.address) for _ in range(n)]

    async def comms(self, name, n=3, timeout=10):
        return await asyncio.gather(*[collie.Comm.create_async(self.eng, self.st[r], r, n, name=name,
                                                               timeout=timeout)
                                      for r in range(n)])

    def close(self):
        for s in self.st:
            s.close()
        self.srv.close()
        self.eng.close()
