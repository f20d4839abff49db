"""collie.torch's CUDA side on torch 2.x (docs/torch2.md), on a machine
without a GPU: a device map naming collie for "cuda" inits, CPU collectives
work (results checked), the CUDA side is not started until a CUDA op
(cuda_comm_handle() == 0), destroy works; the start a CUDA op makes fails
with a clear error (not a crash), the same error again later; the NCCL
plugin, loaded by collie in torch's process, maps torch's libnccl.so.2 and
libcudart, no second copy, and resolves ncclGetVersion to torch's
libnccl. torch itself refuses CUDA tensors here ("Found no NVIDIA
driver"), so a CUDA op cannot be posted: the start is driven through the
backend's _cuda_start, the path a first CUDA op takes. The lent-GPU check
(tests/gpu/torch2_cuda_check.py) skips cleanly here. Runs under any
Python; the ranks use the torch 2.x venv's (make torch2-venv, make torch2)."""

import json
import os
import subprocess

import pytest
from rank_procs import run_ranks

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
PYTHON = os.environ.get("COLLIE_TORCH2_PYTHON",
                        os.path.join(ROOT, "build", "torch2-venv", "bin", "python"))
EXT = os.path.join(ROOT, "build", "torch2", "_C.so")
PLUGIN = os.path.join(ROOT, "build", "lib", "libcollie_nccl.so")

if not os.path.exists(PYTHON):
    pytest.skip(f"no torch 2.x Python at {PYTHON} (make torch2-venv)", allow_module_level=True)
if not os.path.exists(EXT) and not os.environ.get("COLLIE_TORCH_EXT"):
    pytest.skip(f"the torch 2.x extension {EXT} is not built (make torch2)",
                allow_module_level=True)


def torch_has_gpu():
    r = subprocess.run([PYTHON, "-c", "import torch; print(torch.cuda.is_available())"],
                       capture_output=True, text=True, timeout=60)
    return r.stdout.strip() == "True"


@pytest.mark.parametrize("backend,cpu", [
    ("cpu:gloo,cuda:collie", "ProcessGroupGloo"),
    ("cpu:collie,cuda:collie", "ProcessGroupCollie"),
])
def test_lazy_cuda_side_without_gpu(backend, cpu):
    if not os.path.exists(PLUGIN):
        pytest.skip(f"collie's NCCL plugin {PLUGIN} is not built (CUDA/NCCL not found by make)")
    if torch_has_gpu():
        pytest.skip("this machine has a GPU: tests/gpu/torch2_cuda_check.py covers it")
    world = 2
    res = run_ranks(
        lambda r, port: [PYTHON, os.path.join(HERE, "torch2_cuda_worker.py"), backend, str(r),
                         str(world), port],
        world, backend, timeout=120)
    for r, out in enumerate(res):
        # the plugin is there: collie registered for both devices
        assert out["plugin"] == os.path.realpath(PLUGIN) or out["plugin"] == PLUGIN, out
        assert out["capability"] == ["cpu", "cuda"], out
        assert out["cuda_backend"] == "ProcessGroupCollie", out
        assert out["cpu_backend"] == cpu, out
        cpu_res = {"allreduce": [float(x * world + sum(range(world))) for x in range(4)],
                   "broadcast": [float(world - 1)] * 3,
                   "allgather": [[q, 10 * q] for q in range(world)]}
        assert out["before"] == cpu_res and out["after"] == cpu_res, (r, out)
        # the CPU comm was made at init; the CUDA comm only at a CUDA op
        assert out["cpu_comm"] is True
        assert out["cuda_comm_after_cpu_ops"] == 0, out
        assert out["plugin_mapped_before"] == [], out
        assert "Found no NVIDIA driver" in out["torch_cuda_tensor"], out
        # the first CUDA op's start: a clear error naming the device and
        # collie's reason; the second op fails the same way (no retry)
        e = out["start_errors"]
        assert e[0] == e[1], e
        assert e[0].startswith("collie: CUDA side: the process group's CUDA side (collie's NCCL "
                               "plugin) did not start on cuda:0: CollieBackendError: "), e
        assert "backend nccl failed to initialise: no CUDA device" in e[0], e
        assert "COLLIE_EBACKEND" in e[0], e
        assert out["cuda_comm_after_start"] == 0
        # collie loaded the plugin, which bound torch's libnccl and libcudart
        assert len(out["plugin_mapped"]) == 1, out
        site = os.path.realpath(out["torch_lib"])  # /proc/self/maps shows resolved paths
        assert len(out["libnccl"]) == 1, out
        assert out["libnccl"][0].startswith(os.path.join(site, "nvidia", "nccl", "lib")), out
        assert len(out["libcudart"]) == 1, out
        assert out["libcudart"][0].startswith(os.path.join(site, "nvidia")), out
        assert out["destroyed"] is True and out["cuda_comm_after_destroy"] == 0


RESOLVE = r"""
import ctypes, json, os, sys
import torch
plugin = sys.argv[1]
h = ctypes.CDLL(plugin, mode=os.RTLD_LOCAL)      # after torch, as collie loads it
addr = ctypes.cast(h.ncclGetVersion, ctypes.c_void_p).value  # dlsym in the plugin's scope


class DlInfo(ctypes.Structure):
    _fields_ = [("dli_fname", ctypes.c_char_p), ("dli_fbase", ctypes.c_void_p),
                ("dli_sname", ctypes.c_char_p), ("dli_saddr", ctypes.c_void_p)]


info = DlInfo()
libc = ctypes.CDLL(None)
assert libc.dladdr(ctypes.c_void_p(addr), ctypes.byref(info))
v = ctypes.c_int()
assert ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_int))(addr)(ctypes.byref(v)) == 0
maps = sorted({l.split()[-1] for l in open("/proc/self/maps") if "libnccl.so" in l})
print(json.dumps({"file": os.path.realpath(info.dli_fname.decode()), "version": v.value,
                  "maps": maps, "site": os.path.dirname(os.path.dirname(torch.__file__))}))
"""


# the plugin dlopen'ed into torch's process resolves ncclGetVersion in the
# libnccl.so.2 of torch's nvidia/nccl/lib (not CUDA_HOME's), the one copy mapped
def test_plugin_resolves_torch_libnccl():
    if not os.path.exists(PLUGIN):
        pytest.skip(f"collie's NCCL plugin {PLUGIN} is not built (CUDA/NCCL not found by make)")
    r = subprocess.run([PYTHON, "-c", RESOLVE, PLUGIN], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.strip().splitlines()[-1])
    nccl_dir = os.path.join(os.path.realpath(out["site"]), "nvidia", "nccl", "lib")
    assert out["file"].startswith(nccl_dir), out
    assert out["maps"] == [os.path.join(nccl_dir, "libnccl.so.2")], out
    assert out["version"] >= 20000, out  # NCCL 2.x (torch's, e.g. 23007)


# the lent-GPU check script skips cleanly without a GPU (and runs with one)
def test_gpu_check_script():
    r = subprocess.run([PYTHON, os.path.join(ROOT, "tests", "gpu", "torch2_cuda_check.py")],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (r.stdout[-2000:], r.stderr[-3000:])
    if torch_has_gpu():
        assert json.loads(r.stdout.strip().splitlines()[-1])["ok"] is True, r.stdout
    else:
        assert r.stdout.strip().splitlines()[-1] == "skipped: no CUDA device", r.stdout
