"""The package's cuda_* forms on the CPU double of CUDA and NCCL
(build/tests/cuda_double, built by `make tests`): two rank processes with
LD_LIBRARY_PATH at the double and the backend "cpu:tcp,cuda:nccl" run every
cuda_* call on device memory from the double's cudaMalloc - as CUDA array
objects (__cuda_array_interface__) and as raw pointers with count/dtype - on
a stream of their own, then check the results copied back to the host. No
GPU is involved: what this shows is the package's side (pointers, counts,
dtypes, streams, works), not NCCL's."""

import json
import os
import subprocess
import sys

import pytest

import collie
from conftest import ROOT

DOUBLE = os.path.join(ROOT, "build", "tests", "cuda_double")

RANK = r"""
import asyncio, ctypes, json, os, sys
sys.path.insert(0, os.path.join(sys.argv[1], "python"))
import numpy as np, collie

rt = ctypes.CDLL("libcudart.so.13")
assert hasattr(rt, "cltest_cuda_double"), "LD_LIBRARY_PATH did not bring the CUDA double"
H2D, D2H = 1, 2


class Dev:
    # device memory from cudaMalloc, seen through __cuda_array_interface__
    def __init__(self, n, dtype=np.float32):
        self.dtype, self.n = np.dtype(dtype), n
        p = ctypes.c_void_p()
        assert rt.cudaMalloc(ctypes.byref(p), ctypes.c_size_t(max(1, n * self.dtype.itemsize))) == 0
        self.ptr = p.value

    @property
    def __cuda_array_interface__(self):
        return {"shape": (self.n,), "typestr": self.dtype.str, "data": (self.ptr, False),
                "version": 3}

    def put(self, a):
        a = np.ascontiguousarray(a, self.dtype)
        assert a.size == self.n
        assert rt.cudaMemcpy(ctypes.c_void_p(self.ptr), a.ctypes.data_as(ctypes.c_void_p),
                             ctypes.c_size_t(a.nbytes), H2D) == 0
        return self

    def get(self):
        a = np.empty(self.n, self.dtype)
        assert rt.cudaMemcpy(a.ctypes.data_as(ctypes.c_void_p), ctypes.c_void_p(self.ptr),
                             ctypes.c_size_t(a.nbytes), D2H) == 0
        return a


eng = collie.Engine()
r = int(os.environ["COLLIE_RANK"])
assert rt.cudaSetDevice(r) == 0
comm = collie.Comm.from_env(eng, backend="cpu:tcp,cuda:nccl", device=r, timeout=30)
n, size = 8, comm.size
s = ctypes.c_void_p()
assert rt.cudaStreamCreate(ctypes.byref(s)) == 0
stream = s.value
done = []


def run(name, work, check):
    work.wait(20)
    assert rt.cudaStreamSynchronize(ctypes.c_void_p(stream)) == 0
    check()
    done.append(name)


base = np.arange(n, dtype=np.float32)
x = Dev(n).put(base + r)
run("allreduce", comm.cuda_allreduce(x, stream=stream),
    lambda: np.testing.assert_array_equal(x.get(), sum(base + q for q in range(size))))

y = Dev(n, np.int64).put(np.full(n, 7 if r == 1 else 0))
run("broadcast (raw pointer)",
    comm.cuda_broadcast(y.ptr, root=1, stream=stream, count=n, dtype="int64"),
    lambda: np.testing.assert_array_equal(y.get(), np.full(n, 7)))

src, dst = Dev(n).put(base * (r + 1)), Dev(n).put(np.zeros(n))
def check_reduce():
    if r == 0:
        np.testing.assert_array_equal(dst.get(), base * sum(q + 1 for q in range(size)))
run("reduce", comm.cuda_reduce(src, dst, op="sum", root=0, stream=stream), check_reduce)

src = Dev(n).put(np.full(n, r))
out = Dev(n * size).put(np.zeros(n * size))
run("allgather", comm.cuda_allgather(src, out, stream=stream),
    lambda: np.testing.assert_array_equal(out.get(), np.repeat(np.arange(size), n)))

out2 = Dev(n * size).put(np.zeros(n * size))
run("allgather (raw pointers)",
    comm.cuda_allgather(src.ptr, out2.ptr, stream=stream, count=n, dtype="float32"),
    lambda: np.testing.assert_array_equal(out2.get(), np.repeat(np.arange(size), n)))

big = Dev(n * size).put(np.arange(n * size) + r)
part = Dev(n).put(np.zeros(n))
run("reduce_scatter", comm.cuda_reduce_scatter(big, part, stream=stream),
    lambda: np.testing.assert_array_equal(
        part.get(), sum(np.arange(n * size) + q for q in range(size))[r * n:(r + 1) * n]))

a2a_in = Dev(n * size).put(np.arange(n * size) + 100 * r)
a2a_out = Dev(n * size).put(np.zeros(n * size))
expect = np.concatenate([np.arange(r * n, (r + 1) * n) + 100 * q for q in range(size)])
run("alltoall", comm.cuda_alltoall(a2a_in, a2a_out, stream=stream),
    lambda: np.testing.assert_array_equal(a2a_out.get(), expect))

g_out = Dev(n * size).put(np.zeros(n * size)) if r == 0 else None
def check_gather():
    if r == 0:
        np.testing.assert_array_equal(g_out.get(), np.repeat(np.arange(size), n))
run("gather", comm.cuda_gather(src, g_out, root=0, stream=stream), check_gather)

sc_in = Dev(n * size).put(np.repeat(np.arange(size) * 3, n)) if r == 0 else None
sc_out = Dev(n).put(np.zeros(n))
run("scatter", comm.cuda_scatter(sc_in, sc_out, root=0, stream=stream),
    lambda: np.testing.assert_array_equal(sc_out.get(), np.full(n, 3 * r)))

run("barrier", comm.cuda_barrier(stream=stream), lambda: None)

counts = [q + 1 for q in range(size)]
v_in = Dev(counts[r]).put(np.full(counts[r], r + 1))
v_out = Dev(sum(counts)).put(np.zeros(sum(counts)))
run("allgatherv", comm.cuda_allgatherv(v_in, v_out, counts, stream=stream),
    lambda: np.testing.assert_array_equal(
        v_out.get(), np.concatenate([np.full(c, q + 1) for q, c in enumerate(counts)])))

# rank r sends q + 1 elements to rank q, of value 10 * r + q
send_counts = [q + 1 for q in range(size)]
recv_counts = [r + 1] * size
t_in = Dev(sum(send_counts)).put(
    np.concatenate([np.full(c, 10 * r + q) for q, c in enumerate(send_counts)]))
t_out = Dev(sum(recv_counts)).put(np.zeros(sum(recv_counts)))
run("alltoallv", comm.cuda_alltoallv(t_in, send_counts, t_out, recv_counts, stream=stream),
    lambda: np.testing.assert_array_equal(
        t_out.get(), np.concatenate([np.full(r + 1, 10 * q + r) for q in range(size)])))

p2p = Dev(n).put(np.full(n, 42.0) if r == 0 else np.zeros(n))
w = comm.cuda_send(p2p, 1, stream=stream) if r == 0 else comm.cuda_recv(p2p, 0, stream=stream)
run("send/recv", w, lambda: np.testing.assert_array_equal(p2p.get(), np.full(n, 42.0)))


async def main():
    z = Dev(n).put(np.ones(n))
    await comm.cuda_allreduce_async(z, stream=stream)
    rt.cudaStreamSynchronize(ctypes.c_void_p(stream))
    np.testing.assert_array_equal(z.get(), np.full(n, float(size)))
    done.append("allreduce (asyncio)")

asyncio.run(main())

# argument errors name what is wrong before collie sees the call
errors = []
for call in (lambda: comm.cuda_allreduce(np.ones(4, np.float32), stream=stream),
             lambda: comm.cuda_broadcast(x.ptr, stream=stream),
             lambda: comm.cuda_allreduce(x, stream="s"),
             lambda: comm.cuda_allreduce(x, count=n + 1, stream=stream)):
    try:
        call()
        errors.append("accepted")
    except (TypeError, ValueError) as e:
        errors.append(str(e))
comm.close()
eng.close()
print(json.dumps({"done": done, "errors": errors}), flush=True)
"""


def test_cuda_forms_on_the_cuda_double():
    if not os.path.exists(os.path.join(DOUBLE, "libcudart.so.13")):
        pytest.skip("the CUDA double is not built (make tests)")
    with collie.Engine() as eng, collie.StoreServer(eng) as srv:
        env = dict(os.environ, COLLIE_STORE_ADDR=srv.address, COLLIE_WORLD_SIZE="2",
                   LD_LIBRARY_PATH=DOUBLE)
        procs = [
            subprocess.Popen([sys.executable, "-c", RANK, ROOT], env=dict(env, COLLIE_RANK=str(r)),
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for r in range(2)
        ]
        try:
            outs = []
            for r, p in enumerate(procs):
                out, err = p.communicate(timeout=120)
                assert p.returncode == 0, f"rank {r} exit {p.returncode}:\n{err[-3000:]}"
                outs.append(json.loads(out.strip().splitlines()[-1]))
        finally:
            for p in procs:
                if p.poll() is None:
                    p.kill()
                    p.wait(10)
    ops = ["allreduce", "broadcast (raw pointer)", "reduce", "allgather",
           "allgather (raw pointers)", "reduce_scatter", "alltoall", "gather", "scatter", "barrier",
           "allgatherv", "alltoallv", "send/recv", "allreduce (asyncio)"]
    for out in outs:
        assert out["done"] == ops
        e = out["errors"]
        assert "is no CUDA buffer" in e[0], e
        assert "needs count= and dtype=" in e[1], e
        assert e[2].startswith("stream:"), e
        assert "count=9 but the array holds 8" in e[3], e
