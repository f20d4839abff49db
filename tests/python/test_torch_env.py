"""torch's env:// under collie-run (issue 31): collie-run gives torch a
rendezvous of its own (MASTER_ADDR/MASTER_PORT, a port held for the job,
not collie's store, which is COLLIE_STORE_ADDR), so
init_process_group(init_method="env://") works with gloo and with collie,
and an allreduce gives every rank the sum."""

import os
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch", reason="python3-torch is not installed")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
RUN = os.path.join(ROOT, "build", "bin", "collie-run")
EXT = os.path.join(ROOT, "build", "python", "_C.so")

RANK = r"""
import os, sys
from datetime import timedelta
import torch, torch.distributed as dist
backend = sys.argv[1]
if backend == "collie":
    import collie.torch  # registers the backend
store_port = os.environ["COLLIE_STORE_ADDR"].rsplit(":", 1)[1]
assert os.environ["MASTER_PORT"] != store_port, "MASTER_PORT is collie's store"
dist.init_process_group(backend, init_method="env://", timeout=timedelta(seconds=30))
r, n = dist.get_rank(), dist.get_world_size()
assert r == int(os.environ["RANK"]) and n == int(os.environ["WORLD_SIZE"])
t = torch.full((5,), float(r + 1))
dist.all_reduce(t)
assert t.tolist() == [n * (n + 1) / 2] * 5, t.tolist()
dist.barrier()
dist.destroy_process_group()
print(f"envok {r} {n} {t[0].item()}")
"""


@pytest.mark.parametrize("backend", ["gloo", "collie"])
def test_env_init_under_collie_run(backend):
    if not os.path.exists(RUN):
        pytest.skip("collie-run is not built (make)")
    if backend == "collie" and not os.path.exists(EXT):
        pytest.skip("the torch extension is not built (make python)")
    env = dict(os.environ, PYTHONPATH=os.path.join(ROOT, "python"))
    for k in ("MASTER_ADDR", "MASTER_PORT", "COLLIE_STORE_ADDR", "COLLIE_STORE_TOKEN"):
        env.pop(k, None)
    p = subprocess.run([RUN, "-n", "2", "--timeout", "90", "--", sys.executable, "-c", RANK,
                        backend], capture_output=True, text=True, env=env, timeout=120)
    assert p.returncode == 0, f"exit {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    for r in range(2):
        assert f"[{r}] envok {r} 2 3.0" in p.stdout, p.stdout + p.stderr
