"""health_rank.py - one rank of bench/health_netns.py: join the comm from the
environment (COLLIE_STORE_ADDR, COLLIE_RANK, COLLIE_WORLD_SIZE), run one
allreduce (its bytes checked), say "up <rank> <linked to the victim>", then
print every event of the comm's fd as it is popped:
"EV <kind> <rank> <seen ns> <popped ns>" (CLOCK_MONOTONIC, as the driver's
time.monotonic_ns). The victim (argv[2]) only waits to be killed or
stopped. Bounded: it exits after argv[3] seconds whatever happens."""

import os
import select
import sys
import time

sys.path.insert(0, os.path.join(sys.argv[1], "python"))
import numpy as np  # noqa: E402

import collie  # noqa: E402

victim, life_s = int(sys.argv[2]), float(sys.argv[3])
eng = collie.Engine()
comm = collie.Comm.from_env(eng, timeout=30.0)
n = comm.size
x = np.full(4, comm.rank + 1, np.float32)
comm.allreduce(x).wait(20)
assert x[0] == n * (n + 1) / 2, x  # the oracle
linked = comm.rank != victim and comm.health()[victim].heard_ago is not None
print("up", comm.rank, int(linked), flush=True)
end = time.monotonic() + life_s
if comm.rank == victim:
    while time.monotonic() < end:
        time.sleep(0.5)  # killed or stopped by the driver
    sys.exit(0)
fd = comm.event_fd()
while time.monotonic() < end:
    r, _, _ = select.select([fd], [], [], 0.5)
    if not r:
        continue
    while (ev := comm.pop_event()) is not None:
        print("EV", ev.kind, ev.rank, ev.time_ns, time.monotonic_ns(), flush=True)
