"""Every collective and send/recv of the Python package, on numpy arrays,
torch CPU tensors and bytes-like buffers, checked against values computed
here; argument errors raised before collie sees the call."""

import array

import numpy as np
import pytest

import collie

NP_TYPES = [np.int8, np.uint8, np.int32, np.int64, np.float16, np.float32, np.float64]


@pytest.mark.parametrize("dt", NP_TYPES)
def test_allreduce_every_numpy_dtype(world3, dt):
    def body(r, c):
        x = np.arange(5).astype(dt) + r
        out = np.zeros(5, dt)
        c.allreduce(x, out).wait()
        inplace = np.full(5, r + 1, dt)
        c.allreduce(inplace, op="max").wait()
        return out, inplace

    for out, inplace in world3.each(body):
        np.testing.assert_array_equal(out, (np.arange(5) * 3 + 3).astype(dt))
        np.testing.assert_array_equal(inplace, np.full(5, 3, dt))


@pytest.mark.parametrize("op,want", [("sum", 6), ("prod", 6), ("min", 1), ("max", 3), ("avg", 2)])
def test_reductions(world3, op, want):
    outs = world3.each(lambda r, c: c.allreduce(np.full(3, r + 1, np.float64), op=op).result())
    for o in outs:
        np.testing.assert_array_equal(o, np.full(3, want, np.float64))


def test_torch_tensors_bfloat16_and_inplace(world2):
    torch = pytest.importorskip("torch")

    def body(r, c):
        t = torch.full((2, 3), float(r + 1), dtype=torch.bfloat16)
        c.allreduce(t).wait()
        g = torch.zeros(4, dtype=torch.int64)
        c.allgather(torch.tensor([r, 10 + r]), g).wait()
        return t, g

    for t, g in world2.each(body):
        assert torch.equal(t, torch.full((2, 3), 3.0, dtype=torch.bfloat16))
        assert g.tolist() == [0, 10, 1, 11]


def test_rooted_and_shuffling_collectives(world3):
    n = 3

    def body(r, c):
        res = {}
        b = np.full(4, r, np.int32)
        c.broadcast(b, root=1).wait()
        res["bcast"] = b
        red = np.zeros(2, np.int64)
        c.reduce(np.array([r, 1], np.int64), red, op="sum", root=2).wait()
        res["reduce"] = red
        g = np.zeros(2 * n, np.float32) if r == 0 else None
        c.gather(np.array([r, r * 10], np.float32), g, root=0).wait()
        res["gather"] = g
        s_out = np.zeros(2, np.int32)
        src = np.arange(2 * n, dtype=np.int32) if r == 1 else None
        c.scatter(src, s_out, root=1).wait()
        res["scatter"] = s_out
        rs = np.zeros(2, np.int32)
        c.reduce_scatter(np.arange(2 * n, dtype=np.int32), rs).wait()
        res["reduce_scatter"] = rs
        a2a = np.zeros(n, np.int64)
        c.alltoall(np.array([100 * r + p for p in range(n)], np.int64), a2a).wait()
        res["alltoall"] = a2a
        c.barrier().wait()
        return res

    for r, res in enumerate(world3.each(body)):
        assert res["bcast"].tolist() == [1] * 4
        if r == 2:
            assert res["reduce"].tolist() == [3, 3]
        if r == 0:
            assert res["gather"].tolist() == [0, 0, 1, 10, 2, 20]
        assert res["scatter"].tolist() == [2 * r, 2 * r + 1]
        assert res["reduce_scatter"].tolist() == [3 * 2 * r, 3 * (2 * r + 1)]
        assert res["alltoall"].tolist() == [100 * p + r for p in range(n)]


def test_v_collectives(world3):
    counts = [1, 0, 3]

    def body(r, c):
        out = np.full(10, -1, np.int32)
        # rank 1's block is empty: its displacement may point anywhere
        c.allgatherv(np.full(counts[r], r + 1, np.int32), out, counts, displs=[0, 50, 5]).wait()
        # alltoallv: rank r sends p+1 elements valued 10r+p to rank p
        send_counts = [p + 1 for p in range(3)]
        send = np.concatenate([np.full(p + 1, 10 * r + p, np.int64) for p in range(3)])
        recv_counts = [r + 1] * 3
        recv = np.zeros(3 * (r + 1), np.int64)
        c.alltoallv(send, send_counts, recv, recv_counts).wait()
        return out, recv

    for r, (out, recv) in enumerate(world3.each(body)):
        assert out.tolist() == [1, -1, -1, -1, -1, 3, 3, 3, -1, -1]
        assert recv.tolist() == sum(([10 * p + r] * (r + 1) for p in range(3)), [])


def test_send_recv_and_tags(world2):
    def body(r, c):
        if r == 0:
            a = c.send(np.arange(4, dtype=np.float32), peer=1, tag=7)
            b = c.send(np.full(4, 9, np.float32), peer=1, tag=8)
            a.wait(), b.wait()
            return None
        x, y = np.zeros(4, np.float32), np.zeros(4, np.float32)
        wy = c.recv(y, peer=0, tag=8)
        wx = c.recv(x, peer=0, tag=7)
        return wx.result(), wy.result()

    _, (x, y) = world2.each(body)
    assert x.tolist() == [0, 1, 2, 3] and y.tolist() == [9] * 4


def test_recv_from_any_source(world3):
    def body(r, c):
        if r > 0:
            c.send(np.full(2, r, np.int32), peer=0, tag=4).wait()
            return None
        got = []
        for _ in range(2):
            x = np.zeros(2, np.int32)
            w = c.recv(x, tag=4)  # peer=None: any source
            w.wait()
            got.append((w.source, x.tolist()))
        return sorted(got)

    got = world3.each(body)[0]
    assert got == [(1, [1, 1]), (2, [2, 2])]


def test_bytes_like_buffers(world2):
    def body(r, c):
        ba = bytearray([r + 1] * 4)
        c.allreduce(ba).wait()  # uint8
        arr = array.array("i", [r, 2 * r])
        c.allreduce(arr).wait()  # int32
        mv = memoryview(bytearray(16)).cast("d")
        c.allgather(array.array("d", [r + 0.5]), mv).wait()
        snd = bytes([r]) * 2
        out = bytearray(4)
        c.allgather(snd, out).wait()  # a read-only send buffer is fine
        return bytes(ba), arr.tolist(), mv.tolist(), bytes(out)

    for ba, arr, mv, out in world2.each(body):
        assert ba == bytes([3] * 4) and arr == [1, 2] and mv == [0.5, 1.5]
        assert out == bytes([0, 0, 1, 1])


def test_argument_errors_name_the_problem(world2):
    c = world2.comms[0]
    with pytest.raises(TypeError, match="complex128 is not a type collie"):
        c.allreduce(np.zeros(2, np.complex128))
    with pytest.raises(ValueError, match="not C-contiguous"):
        c.allreduce(np.zeros((4, 4), np.float32)[:, 1])
    ro = np.zeros(4, np.float32)
    ro.flags.writeable = False
    with pytest.raises(ValueError, match="read-only"):
        c.allreduce(ro)
    with pytest.raises(ValueError, match="holds 3 elements, the call writes 8"):
        c.allgather(np.zeros(4, np.float32), np.zeros(3, np.float32))
    with pytest.raises(TypeError, match="different types"):
        c.allreduce(np.zeros(4, np.float32), np.zeros(4, np.float64))
    with pytest.raises(ValueError, match="not a collie reduction"):
        c.allreduce(np.zeros(4, np.float32), op="xor")
    with pytest.raises(TypeError, match="not a buffer"):
        c.allreduce("text")
    with pytest.raises(TypeError, match="read-only memoryview; pass bytes or a bytearray"):
        c.send(memoryview(b"abcd"), peer=1)
    with pytest.raises(collie.CollieInvalidArgument, match="root 5 is not a rank"):
        c.broadcast(np.zeros(1, np.int8), root=5)
    with pytest.raises(collie.CollieInvalidArgument, match="peer 0 must be another rank"):
        c.send(np.zeros(1, np.int8), peer=0)
    with pytest.raises(ValueError, match="counts has 3 entries, the comm 2"):
        c.allgatherv(np.zeros(1, np.int8), np.zeros(3, np.int8), [1, 1, 1])
    with pytest.raises(ValueError, match="recv_displs has 1 entries, the comm 2"):
        c.alltoallv(np.zeros(2, np.int8), [1, 1], np.zeros(2, np.int8), [1, 1], recv_displs=[0])
    with pytest.raises(ValueError, match="allgatherv out: holds 3 elements, the call writes 6"):
        c.allgatherv(np.zeros(1, np.int8), np.zeros(3, np.int8), [1, 1], displs=[0, 5])
    with pytest.raises(TypeError, match="cuda tensor|CUDA"):
        c.cuda_allreduce(np.zeros(2, np.float32))
    torch = pytest.importorskip("torch")
    with pytest.raises(TypeError, match="complex64"):
        c.allreduce(torch.zeros(2, dtype=torch.complex64))
    with pytest.raises(ValueError, match="not contiguous"):
        c.allreduce(torch.zeros(4, 4).t())
    # nothing was posted by any of these
    assert c.stats()["posted"] == 0
