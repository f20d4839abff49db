"""One rank of a test_torch2_break.py scenario (fresh-eyed breakage
reproducers for collie.torch on torch 2.x), run by the torch 2.x venv's
Python:  torch2_break_worker.py RANK WORLD PORT SCENARIO
Prints one JSON line (what it saw) last. Every wait is bounded."""

import gc
import json
import os
import sys
import time
import weakref
from datetime import timedelta

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import collie.torch  # noqa: E402,F401

rank, world, port, scenario = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
cpu = torch.device("cpu")


def err(fn):
    """fn()'s error as 'Type: message' ("ok" when it returns)."""
    try:
        fn()
        return "ok"
    except Exception as e:  # noqa: BLE001
        return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


def init(timeout_s=10):
    store = dist.TCPStore("127.0.0.1", port, world, rank == 0, timedelta(seconds=30))
    dist.init_process_group("collie", store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=timeout_s))
    return store


def sync(store, what):
    store.set(f"{what}{rank}", "1")
    store.wait([f"{what}{r}" for r in range(world)], timedelta(seconds=30))


def bad_batch():
    """A batch_isend_irecv whose op collie refuses at the post (a uint32
    tensor: 'not supported by collie'). torch's _coalescing_manager has no
    try/finally, so collie's endCoalescing never comes."""
    peer = (rank + 1) % world
    return err(lambda: dist.batch_isend_irecv(
        [dist.P2POp(dist.isend, torch.zeros(2, dtype=torch.uint32), peer)]))


def batch_after_failed_batch():
    store = init()
    res = {"bad": bad_batch()}
    sync(store, "a")
    peer = (rank + 1) % world
    got = torch.full((4,), -1.0)

    def good():
        ws = dist.batch_isend_irecv([dist.P2POp(dist.isend, torch.full((4,), float(rank)), peer),
                                     dist.P2POp(dist.irecv, got, (rank - 1) % world)])
        for w in ws:
            w.wait(timedelta(seconds=10))

    res["good"] = err(good)
    res["got"] = got.tolist()
    sync(store, "b")
    dist.destroy_process_group()
    return res


def abort_after_failed_batch():
    store = init()
    res = {"bad": bad_batch()}
    sync(store, "a")
    res["abort"] = err(lambda: dist.distributed_c10d._abort_process_group())
    res["initialized_after_abort"] = dist.is_initialized()
    if dist.is_initialized():
        dist.destroy_process_group()
    return res


def works_kept_after_failed_batch():
    """After the failed batch every later op's Work (and its tensors) is kept
    in the backend's coalescing list: a broadcast tensor dropped after its
    wait is never freed (compared with the same before the failed batch)."""
    store = init()

    def dropped_tensor_freed():
        t = torch.ones(1 << 16)
        ref = weakref.ref(t)
        dist.broadcast(t, src=0)  # waited (synchronous op)
        del t
        gc.collect()
        return ref() is None

    res = {"freed_before": dropped_tensor_freed(), "bad": bad_batch()}
    sync(store, "a")
    res["freed_after"] = dropped_tensor_freed()
    sync(store, "b")
    dist.destroy_process_group()
    return res


def monitored_barrier_dead_rank():
    """World size 3: rank 2 is SIGKILLed after a first allreduce; ranks 0
    and 1 then enter dist.monitored_barrier (rank 1 on time). The point of
    the barrier is to name the rank that did not come: rank 2."""
    import signal

    store = init(30)
    dist.all_reduce(torch.ones(2))
    sync(store, "a")
    if rank == 2:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.5)  # collie has seen rank 2 go
    return {"mb": err(lambda: dist.monitored_barrier(timeout=timedelta(seconds=20))),
            "mb_all": err(lambda: dist.monitored_barrier(timeout=timedelta(seconds=20),
                                                          wait_all_ranks=True))}


def abort_during_split():
    """Rank 0 enters split_group, rank 1 never does (it holds for 20 s);
    1 s in, another thread of rank 0 calls torch's abort on the group's
    backend. The group's timeout is 10 s."""
    import threading

    store = init(10)
    dist.barrier()
    res = {}
    if rank == 0:
        be = dist.group.WORLD._get_backend(cpu)
        t0 = time.monotonic()

        def abort_later():
            time.sleep(1.0)
            a0 = time.monotonic()
            be.abort()
            res["abort_s"] = round(time.monotonic() - a0, 2)

        th = threading.Thread(target=abort_later, daemon=True)
        th.start()
        res["split"] = err(lambda: dist.split_group(split_ranks=[[0, 1]],
                                                    timeout=timedelta(seconds=5)))
        res["split_s"] = round(time.monotonic() - t0, 2)
        th.join(60)
    store.set(f"done{rank}", "1")
    if rank == 1:
        store.wait(["done0"], timedelta(seconds=60))
    return res


def mixed_coalescing_then_allreduce():
    """_coalescing_manager(device=cpu) around an all_reduce and an
    all_gather_into_tensor: torch refuses the mix after the body (before
    endCoalescing). Then a second manager around a broadcast, then a plain
    dist.all_reduce of ones, whose sum must be the world size."""
    from torch.distributed.distributed_c10d import _coalescing_manager

    store = init()
    res = {}
    a, o, i = torch.ones(2), torch.zeros(2 * world), torch.ones(2)

    def mixed():
        with _coalescing_manager(device=cpu):
            dist.all_reduce(a)
            dist.all_gather_into_tensor(o, i)

    res["mixed"] = err(mixed)
    res["mixed_values"] = [a.tolist(), o.tolist()]  # checked where torch took the mix (2.11)
    s, m = torch.ones(2), torch.full((2,), float(rank))

    def mixed_ops():  # SUM then MAX: torch would run both with SUM
        with _coalescing_manager(device=cpu):
            dist.all_reduce(s)
            dist.all_reduce(m, op=dist.ReduceOp.MAX)

    res["mixed_ops"] = err(mixed_ops)
    res["mixed_ops_values"] = [s.tolist(), m.tolist()]
    sync(store, "a")
    b = torch.full((2,), float(rank))

    def again():
        with _coalescing_manager(device=cpu):
            dist.broadcast(b, src=0)

    res["again"] = err(again)
    sync(store, "b")
    t = torch.ones(3)
    res["allreduce"] = err(lambda: dist.all_reduce(t))
    res["sum"] = t.tolist()
    sync(store, "c")
    dist.destroy_process_group()
    return res


SCENARIOS = {
    "mixed_coalescing_then_allreduce": mixed_coalescing_then_allreduce,
    "abort_during_split": abort_during_split,
    "monitored_barrier_dead_rank": monitored_barrier_dead_rank,
    "batch_after_failed_batch": batch_after_failed_batch,
    "abort_after_failed_batch": abort_after_failed_batch,
    "works_kept_after_failed_batch": works_kept_after_failed_batch,
}

t0 = time.monotonic()
out = SCENARIOS[scenario]()
out["seconds"] = round(time.monotonic() - t0, 2)
print(json.dumps(out), flush=True)
