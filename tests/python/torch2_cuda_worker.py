"""One rank of test_torch2_cuda.py, run by the torch 2.x venv's Python:
    torch2_cuda_worker.py BACKEND RANK WORLD PORT
init_process_group(BACKEND) (a device map naming collie for "cuda") on a
machine without a GPU: CPU collectives (results reported), the collie
backend's CUDA side not started (cuda_comm_handle() == 0), torch's refusal
of a CUDA tensor, the CUDA side started as the first CUDA op would
(_cuda_start: the error, twice), CPU collectives again, the libraries the
NCCL plugin brought (/proc/self/maps), destroy_process_group. Prints one
JSON line last."""

import json
import os
import sys
from datetime import timedelta

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import collie.torch  # noqa: E402

backend, rank, world, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]


def cpu_ops():
    t = torch.arange(4, dtype=torch.float32) + rank
    dist.all_reduce(t)
    b = torch.full((3,), float(rank))
    dist.broadcast(b, src=world - 1)
    parts = [torch.zeros(2, dtype=torch.int64) for _ in range(world)]
    dist.all_gather(parts, torch.tensor([rank, 10 * rank]))
    dist.barrier()
    return {"allreduce": t.tolist(), "broadcast": b.tolist(),
            "allgather": [p.tolist() for p in parts]}


def mapped(name):
    with open("/proc/self/maps") as f:
        return sorted({line.split()[-1] for line in f if name in line.split()[-1]})


out = {"capability": dist.Backend.backend_capability.get("collie"),
       "plugin": collie.torch.nccl_plugin()}
dist.init_process_group(backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                        world_size=world, timeout=timedelta(seconds=30))
pg = dist.group.WORLD
cuda_be = pg._get_backend(torch.device("cuda"))
cpu_be = pg._get_backend(torch.device("cpu"))
out["cuda_backend"] = type(cuda_be).__name__
out["cpu_backend"] = type(cpu_be).__name__
out["before"] = cpu_ops()
out["cuda_comm_after_cpu_ops"] = cuda_be.cuda_comm_handle()
out["cpu_comm"] = cuda_be.comm_handle() != 0
try:
    torch.zeros(1, device="cuda")
    out["torch_cuda_tensor"] = "made"
except RuntimeError as e:
    out["torch_cuda_tensor"] = str(e)
out["plugin_mapped_before"] = mapped("libcollie_nccl.so")
errors = []
for _ in range(2):
    try:
        cuda_be._cuda_start(0)
        errors.append("started")
    except RuntimeError as e:
        errors.append(str(e))
out["start_errors"] = errors
out["cuda_comm_after_start"] = cuda_be.cuda_comm_handle()
out["after"] = cpu_ops()
out["plugin_mapped"] = mapped("libcollie_nccl.so")
out["libnccl"] = collie.torch.nccl_libraries()
out["libcudart"] = mapped("libcudart.so")
out["torch_lib"] = os.path.dirname(os.path.dirname(torch.__file__))  # site-packages
dist.destroy_process_group()
out["destroyed"] = not dist.is_initialized()
out["cuda_comm_after_destroy"] = cuda_be.cuda_comm_handle()
print(json.dumps(out), flush=True)
