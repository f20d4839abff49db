"""Work handles, asyncio, buffer lifetime, error policies and the store
from Python."""

import asyncio
import gc
import time
import weakref

import numpy as np
import pytest

import collie
from conftest import World


def until(pred, timeout=5.0, what="condition"):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if pred():
            return
        time.sleep(0.005)
    raise AssertionError(f"{what} not reached in {timeout} s")


def test_work_test_wait_result_info(world2):
    c0, c1 = world2.comms
    x0, x1 = np.ones(4, np.float32), np.full(4, 2, np.float32)
    w0 = c0.allreduce(x0)
    assert w0.test() is False
    assert w0.wait(0.05) is False  # the wait gives up, the work goes on
    assert w0.status == 1 and w0.exception() is None
    w1 = c1.allreduce(x1)
    assert w0.wait(10) is True and w1.wait(10) is True
    assert w0.test() is True and w0.status == 0
    assert w0.result() is x0 and x0.tolist() == [3] * 4
    info = w0.info()
    assert info["op"] == "allreduce" and info["bytes"] == 16 and info["end_ns"] >= info["post_ns"]
    assert w0.cancel() is False  # already done
    assert "pending" not in repr(w0)


def test_wait_timeout_validation(world2):
    w = world2.comms[0].barrier()
    with pytest.raises(ValueError, match="timeout"):
        w.wait(-1)
    world2.comms[1].barrier().wait(10)
    assert w.wait(10)


def test_cancel_fails_the_work_with_cancelled():
    w = World(2, policy="none")
    try:
        work = w.comms[0].allreduce(np.ones(2, np.float32))
        assert work.cancel() is True
        with pytest.raises(collie.CollieCancelled):
            work.wait(10)
    finally:
        w.close()


def test_post_timeout_raises_collie_timeout_with_message():
    w = World(2, policy="none")
    try:
        t0 = time.monotonic()
        with pytest.raises(collie.CollieTimeout, match="deadline|timed out") as ei:
            w.comms[0].allreduce(np.ones(2, np.float32), timeout=0.2).wait()
        assert time.monotonic() - t0 < 5
        assert isinstance(ei.value, TimeoutError) and ei.value.status == -3
        assert ei.value.name == "COLLIE_ETIMEDOUT" and "allreduce" in ei.value.message
    finally:
        w.close()


def test_asyncio_resolves_from_the_completion_queue(world2):
    async def main():
        async def rank(r):
            x = np.full(4, r + 1.0)
            out = await world2.comms[r].allreduce_async(x)
            work = world2.comms[r].barrier()
            await work  # a Work is awaitable too
            return out

        return await asyncio.wait_for(asyncio.gather(rank(0), rank(1)), 10)

    outs = asyncio.run(main())
    assert [o.tolist() for o in outs] == [[3.0] * 4] * 2


def test_asyncio_failure_raises_the_collie_exception():
    w = World(2, policy="none")
    try:

        async def main():
            return await w.comms[0].recv_async(np.zeros(1, np.int8), peer=1, timeout=0.2)

        with pytest.raises(collie.CollieTimeout):
            asyncio.run(asyncio.wait_for(main(), 10))
    finally:
        w.close()


def test_dropped_work_keeps_its_buffer_until_completion(world2):
    c0, c1 = world2.comms
    x = np.ones(1 << 16, np.float32)
    ref = weakref.ref(x)
    c0.allreduce(x)  # the Work is dropped at once
    del x
    gc.collect()
    assert ref() is not None, "the buffer was freed while collie may write it"
    y = np.ones(1 << 16, np.float32)
    c1.allreduce(y).wait(10)
    assert y[0] == 2
    # rank 0's completion is reaped by the next call on the engine
    until(lambda: (world2.engine.reap(), ref() is None)[1], what="buffer released after completion")


def test_many_works_in_flight_and_dropped(world2):
    c0, c1 = world2.comms
    for _ in range(2000):
        c0.allreduce(np.ones(4, np.int32))
        c1.allreduce(np.ones(4, np.int32))
    last = [c.barrier() for c in (c0, c1)]
    assert all(w.wait(30) for w in last)
    # a wait can see a work done before the progress thread has queued it
    # for reaping (the waiter may have driven it itself): reap, bounded
    until(lambda: (world2.engine.reap(), not world2.engine._pending)[1], what="every work reaped")
    assert c0.stats()["completed"] == 2001


@pytest.mark.parametrize("policy", ["abort_comm", "blocking_wait", "none"])
def test_policies(policy):
    w = World(2, name="p", policy=policy)
    try:
        c0, c1 = w.comms
        with pytest.raises(collie.CollieTimeout):
            c0.allreduce(np.ones(2, np.float32), timeout=0.2).wait(10)
        if policy == "none":  # only the work failed: new posts are accepted
            assert c0.barrier() is not None and c1.barrier() is not None
            return
        assert isinstance(c0.error(), collie.CollieTimeout)
        with pytest.raises(collie.CollieAborted):  # refused at once, by the post itself
            c0.barrier()
        if policy == "abort_comm":  # the peer is told
            until(lambda: c1.error() is not None, what="peer abort")
            assert "rank 0" in str(c1.error()) or "timed out" in str(c1.error())
        else:  # blocking_wait: nothing happens in the background
            time.sleep(0.3)
            assert c1.error() is None
    finally:
        w.close()


def test_bad_policy_and_options_are_errors():
    eng = collie.Engine()
    try:
        with pytest.raises(ValueError, match="policy: 'sometimes' is not one of"):
            collie.Comm(eng, None, 0, 1, policy="sometimes")
        with pytest.raises(ValueError, match="timeout"):
            collie.Comm(eng, None, 0, 1, timeout=0.0001)
        with pytest.raises(TypeError, match="store: a collie.Store"):
            collie.Comm(eng, "127.0.0.1:1", 0, 1)
        srv = collie.StoreServer(eng)
        st = collie.Store(eng, srv.address)
        with pytest.raises(collie.CollieInvalidArgument, match="rank"):
            collie.Comm(eng, st, 3, 2)
        st.close()
        srv.close()
    finally:
        eng.close()


def test_abort_split_new_group_stats(world3):
    def body(r, c):
        c.barrier().wait(10)
        sub = c.split(color=r % 2, key=-r)
        grp = c.new_group([2, 0])
        res = (sub.size, sub.rank, grp.rank if grp else None)
        x = np.full(1, r, np.int64)
        sub.allreduce(x).wait(10)
        res += (int(x[0]),)
        if grp:
            grp.destroy()
        sub.destroy()
        return res

    out = world3.each(body)
    assert out[0] == (2, 1, 1, 2) and out[2] == (2, 0, 0, 2) and out[1] == (1, 0, None, 1)
    st = world3.comms[0].stats()
    assert st["completed"] == 1 and st["status"] == 0 and "latency" in st
    world3.comms[1].abort("test abort")
    assert isinstance(world3.comms[1].error(), collie.CollieAborted)
    assert "test abort" in str(world3.comms[1].error())


def test_store_calls():
    eng = collie.Engine()
    srv = collie.StoreServer(eng, token="tok")
    st = collie.Store(eng, srv.address, token="tok", timeout=5)
    try:
        st.set("a", b"1")
        assert st.get("a") == b"1"
        assert st.add("n", 5) == 5 and st.add("n", -2) == 3
        assert st.compare_set("a", b"1", b"2") == b"2"
        assert st.compare_set("a", b"x", b"3") == b"2"
        assert st.check(["a", "n"]) and not st.check(["nope"])
        st.wait(["a"])
        st.append("a", "yz")
        assert st.get("a") == b"2yz"
        st.multi_set({"k1": b"v1", "k2": "v2"})
        assert st.multi_get(["k1", "k2"]) == [b"v1", b"v2"]
        view = st.prefix("pre/")
        view.set("x", b"in view")
        assert st.get("pre/x") == b"in view"
        assert st.num_keys() == 5
        assert st.delete("k1") and not st.delete("k1")
        assert st.delete_prefix("pre/") == 1
        st.barrier("b", 1)
        with pytest.raises(collie.CollieTimeout):
            st.get("missing", timeout=0.1)
        with pytest.raises(TypeError, match="key: str or bytes"):
            st.set(3, b"x")
        with pytest.raises(ValueError, match="NUL"):
            st.set("a\0b", b"x")
        bad = collie.Store(eng, srv.address, token="wrong", timeout=1)
        with pytest.raises(collie.CollieError):
            bad.get("a")
        bad.close()
        view.close()
    finally:
        st.close()
        srv.close()
        eng.close()


def test_engine_close_fails_pending_works():
    w = World(2, policy="none")
    work = w.comms[0].allreduce(np.ones(2, np.float32))
    w.engine.close()
    with pytest.raises(collie.CollieError):
        work.wait(10)
    with pytest.raises(collie.CollieClosed):
        w.comms[0].barrier()
    del work
    gc.collect()
