"""A collie (or gloo) group is made and destroyed in this process, the
process forks, and the child makes a new world-size-1 group with a 5 s
timeout (test_torch2.py; the torch 2.x venv's Python). Prints one JSON
line: what the child returned (or its exit status when it did not end in
time)."""

import json
import os
import sys
import time
from datetime import timedelta

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

backend = sys.argv[1]
if backend == "collie":
    import collie.torch  # noqa: E402,F401


def one():
    dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1,
                            timeout=timedelta(seconds=5))
    t = torch.ones(3)
    dist.all_reduce(t)
    dist.destroy_process_group()
    return t.tolist()


res = {"parent": one()}
r, w = os.pipe()
pid = os.fork()
if pid == 0:
    os.close(r)
    try:
        out = one()
    except Exception as e:  # noqa: BLE001
        out = f"{type(e).__name__}: {e}"[:300]
    os.write(w, json.dumps(out).encode())
    os._exit(0)
os.close(w)
t0 = time.time()
while time.time() - t0 < 30:
    done, status = os.waitpid(pid, os.WNOHANG)
    if done:
        res["child"] = json.loads(os.read(r, 65536).decode() or "null")
        break
    time.sleep(0.1)
else:
    os.kill(pid, 9)
    os.waitpid(pid, 0)
    res["child"] = "still running after 30 s (killed)"
res["child_s"] = round(time.time() - t0, 1)
print(json.dumps(res))
