"""One rank of test_torch2.py's scenario, run by the torch 2.x venv's Python:
    torch2_worker.py BACKEND RANK WORLD PORT
init_process_group(BACKEND), allreduce, broadcast, barrier,
destroy_process_group; prints one JSON line (what it saw) last."""

import json
import os
import sys
from datetime import timedelta

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import collie.torch  # noqa: E402,F401

backend, rank, world, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)

out = {
    "torch": torch.__version__,
    "capability": dist.Backend.backend_capability.get("collie"),
    "cpu_default": dist.Backend.default_device_backend_map.get("cpu"),
}
dist.init_process_group(backend, rank=rank, world_size=world, timeout=timedelta(seconds=30))
pg = dist.group.WORLD
out["backend"] = dist.get_backend()
out["default_type"] = str(pg._get_backend_name())
out["cpu_backend"] = type(pg._get_backend(torch.device("cpu"))).__name__
t = torch.arange(4, dtype=torch.float32) + rank
dist.all_reduce(t)
out["allreduce"] = t.tolist()
i = torch.tensor([rank + 1], dtype=torch.int64)
dist.all_reduce(i, op=dist.ReduceOp.MAX)
out["allreduce_max"] = i.tolist()
b = torch.full((3,), float(rank))
dist.broadcast(b, src=world - 1)
out["broadcast"] = b.tolist()
dist.barrier()
dist.destroy_process_group()
out["destroyed"] = not dist.is_initialized()
print(json.dumps(out), flush=True)
