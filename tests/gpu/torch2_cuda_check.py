"""CUDA tensors through collie.torch on a lent GPU machine (torch 2.x).

    python tests/gpu/torch2_cuda_check.py [REPORT.json]

World size 1 (one process, a FileStore): init_process_group("cpu:collie,
cuda:collie"); checks that the CUDA side is not started before the first
CUDA op and is after it; runs CUDA-tensor allreduce (sum, max, avg),
broadcast, allgather (list and all_gather_into_tensor), reduce_scatter_tensor,
all_to_all_single, reduce, barrier(device_ids=[0]), an async allreduce on a
side stream whose work.wait() orders that stream (result read after work on
it), work.get_future(), is_completed(); a CPU allreduce on the same group;
the libnccl.so.2 files mapped (must be one, torch's). Every result is
compared with what torch computes locally. Prints one JSON line last (also
written to REPORT.json when given); exit 0 when every check passed, 1
otherwise. Without torch 2.x or without a CUDA device it prints
"skipped: ..." and exits 0.

The extension must be built against this torch (make torch2
TORCH2_PYTHON=$(which python), or COLLIE_TORCH_EXT=...), and
libcollie_nccl.so must be where collie looks (beside libcollie, or
COLLIE_PLUGIN_PATH).
"""

import json
import os
import sys
import tempfile
import time
import traceback
from datetime import timedelta

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))

import torch  # noqa: E402

if int(torch.__version__.split(".")[0]) < 2:
    print(f"skipped: torch {torch.__version__} (collie's CUDA side needs torch 2.x)")
    sys.exit(0)
if not torch.cuda.is_available():
    print("skipped: no CUDA device")
    sys.exit(0)

import torch.distributed as dist  # noqa: E402

import collie.torch  # noqa: E402

report = {
    "torch": torch.__version__,
    "torch_cuda": torch.version.cuda,
    "device": torch.cuda.get_device_name(0),
    "nccl_plugin": collie.torch.nccl_plugin(),
    "capability": dist.Backend.backend_capability.get("collie"),
    "checks": {},
}
checks = report["checks"]


def check(name, fn):
    t0 = time.monotonic()
    try:
        fn()
        checks[name] = {"ok": True}
    except Exception as e:  # noqa: BLE001 - reported, not hidden
        checks[name] = {"ok": False, "error": f"{type(e).__name__}: {e}",
                        "trace": traceback.format_exc()[-1500:]}
    checks[name]["s"] = round(time.monotonic() - t0, 4)


def same(got, want):
    if not torch.equal(got.cpu(), want.cpu()):
        raise AssertionError(f"got {got.cpu().tolist()[:8]}..., want {want.cpu().tolist()[:8]}...")


dev = torch.device("cuda", 0)
torch.cuda.set_device(dev)
store_file = tempfile.mktemp(prefix="collie-torch2-cuda-")
dist.init_process_group("cpu:collie,cuda:collie", init_method=f"file://{store_file}", rank=0,
                        world_size=1, timeout=timedelta(seconds=60))
pg = dist.group.WORLD
be = pg._get_backend(dev)
report["cuda_backend"] = type(be).__name__
report["cuda_comm_before_first_cuda_op"] = be.cuda_comm_handle()
n = 1 << 16


def allreduce():
    for op, want in ((dist.ReduceOp.SUM, 1), (dist.ReduceOp.MAX, 1), (dist.ReduceOp.AVG, 1)):
        x = torch.arange(n, device=dev, dtype=torch.float32)
        dist.all_reduce(x, op=op)  # world size 1: the input back
        same(x, torch.arange(n, dtype=torch.float32) * want)
    h = torch.ones(n, device=dev, dtype=torch.bfloat16)
    dist.all_reduce(h)
    same(h, torch.ones(n, dtype=torch.bfloat16))


def broadcast():
    x = torch.full((n,), 7, device=dev, dtype=torch.int64)
    dist.broadcast(x, src=0)
    same(x, torch.full((n,), 7, dtype=torch.int64))


def allgather():
    x = torch.arange(n, device=dev, dtype=torch.float32) + 3
    parts = [torch.zeros(n, device=dev)]
    dist.all_gather(parts, x)
    same(parts[0], x)
    out = torch.zeros(n, device=dev)
    dist.all_gather_into_tensor(out, x)
    same(out, x)


def reduce_scatter():
    x = torch.arange(n, device=dev, dtype=torch.float32)
    out = torch.zeros(n, device=dev)
    dist.reduce_scatter_tensor(out, x)
    same(out, x)


def alltoall():
    x = torch.arange(n, device=dev, dtype=torch.float32)
    out = torch.zeros(n, device=dev)
    dist.all_to_all_single(out, x)
    same(out, x)


def reduce():
    x = torch.arange(n, device=dev, dtype=torch.float32)
    dist.reduce(x, dst=0)
    same(x, torch.arange(n, dtype=torch.float32))


def barrier():
    dist.barrier(device_ids=[0])


def stream_order():
    # a side stream: the collective is enqueued on it (torch's current
    # stream), wait() makes it wait, the kernel after reads the result
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        x = torch.ones(n, device=dev) * 5
        w = dist.all_reduce(x, async_op=True)
        w.wait()
        y = x * 2
    s.synchronize()
    same(y, torch.full((n,), 10.0))
    fut = w.get_future()
    fut.wait()
    if not w.is_completed():
        raise AssertionError("is_completed() is false after the future completed")
    res = fut.value()
    same(res[0], torch.full((n,), 5.0))


def cpu_on_same_group():
    x = torch.arange(8, dtype=torch.float32)
    dist.all_reduce(x)
    same(x, torch.arange(8, dtype=torch.float32))


for name, fn in (("allreduce", allreduce), ("broadcast", broadcast), ("allgather", allgather),
                 ("reduce_scatter_tensor", reduce_scatter), ("all_to_all_single", alltoall),
                 ("reduce", reduce), ("barrier_device_ids", barrier),
                 ("stream_order_and_future", stream_order), ("cpu_allreduce", cpu_on_same_group)):
    check(name, fn)
report["cuda_comm_after"] = be.cuda_comm_handle() != 0
report["libnccl"] = collie.torch.nccl_libraries()
report["one_libnccl"] = len(report["libnccl"]) == 1
dist.destroy_process_group()
report["ok"] = (all(c["ok"] for c in checks.values()) and report["one_libnccl"]
                and report["cuda_comm_before_first_cuda_op"] == 0 and report["cuda_comm_after"])
line = json.dumps(report)
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as f:
        f.write(line + "\n")
print(line, flush=True)
sys.exit(0 if report["ok"] else 1)
