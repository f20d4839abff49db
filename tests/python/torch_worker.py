"""One rank of a torch.distributed scenario for test_torch.py:
    torch_worker.py SCENARIO BACKEND RANK WORLD PORT
prints one JSON line (the scenario's result) last."""

import json
import os
import sys
import threading
import time
from datetime import timedelta

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

import collie.torch  # noqa: E402,F401

scenario, backend, rank, world, port = sys.argv[1:6]
rank, world = int(rank), int(world)
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)


def init(name=backend, **kw):
    dist.init_process_group(name, rank=rank, world_size=world, timeout=timedelta(seconds=30), **kw)


def collectives():
    n, r = world, rank
    out = {}
    for dt in (torch.float32, torch.float64, torch.int32, torch.int64, torch.float16,
               torch.bfloat16, torch.int8, torch.uint8):
        t = torch.arange(4, dtype=dt) + r
        dist.all_reduce(t)
        out[f"allreduce_{dt}"] = t.tolist()
    t = torch.tensor([r + 1.0])
    dist.all_reduce(t, op=dist.ReduceOp.PRODUCT)
    out["prod"] = t.tolist()
    t = torch.tensor([r + 1.0])
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    out["max"] = t.tolist()
    t = torch.tensor([True, r == 0])
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    out["bool_min"] = t.tolist()
    t = torch.full((3,), float(r))
    dist.broadcast(t, src=n - 1)
    out["broadcast"] = t.tolist()
    t = torch.tensor([float(r + 1)])
    dist.reduce(t, dst=0)
    out["reduce_root"] = t.tolist() if r == 0 else None
    lst = [torch.zeros(2, dtype=torch.int64) for _ in range(n)]
    dist.all_gather(lst, torch.tensor([r, 10 * r]))
    out["all_gather"] = [x.tolist() for x in lst]
    flat = torch.zeros(2 * n)
    dist._all_gather_base(flat, torch.tensor([r, 10.0 * r]))
    out["all_gather_base"] = flat.tolist()
    lists = [[torch.zeros(1), torch.zeros(2)] for _ in range(n)]
    dist.all_gather_coalesced(lists, [torch.tensor([float(r)]), torch.tensor([1.0 * r, 2.0 * r])])
    out["all_gather_coalesced"] = [[x.tolist() for x in l] for l in lists]
    ts = [torch.tensor([float(r)]), torch.tensor([1.0, 2.0])]
    dist.all_reduce_coalesced(ts)
    out["all_reduce_coalesced"] = [x.tolist() for x in ts]
    g = [torch.zeros(1) for _ in range(n)] if r == 0 else None
    dist.gather(torch.tensor([r * 3.0]), g, dst=0)
    out["gather"] = [x.tolist() for x in g] if g else None
    s = torch.zeros(2)
    dist.scatter(s, [torch.tensor([float(p), p + 0.5]) for p in range(n)] if r == 1 else None, src=1)
    out["scatter"] = s.tolist()
    o = torch.zeros(1)
    dist.reduce_scatter(o, [torch.tensor([float(p + r)]) for p in range(n)])
    out["reduce_scatter"] = o.tolist()
    o = torch.zeros(2)
    dist._reduce_scatter_base(o, torch.arange(2.0 * n))
    out["reduce_scatter_base"] = o.tolist()
    o = torch.zeros(n)
    dist.all_to_all_single(o, torch.tensor([100.0 * r + p for p in range(n)]))
    out["all_to_all_single"] = o.tolist()
    # uneven: rank r sends p+1 rows to rank p
    ins = torch.cat([torch.full((p + 1, 2), float(10 * r + p)) for p in range(n)])
    o = torch.zeros((r + 1) * n, 2)
    dist.all_to_all_single(o, ins, output_split_sizes=[r + 1] * n,
                           input_split_sizes=[p + 1 for p in range(n)])
    out["all_to_all_uneven"] = o[:, 0].tolist()
    outs = [torch.zeros(r + 1) for _ in range(n)]
    dist.all_to_all(outs, [torch.full((p + 1,), float(r)) for p in range(n)])
    out["all_to_all"] = [x.tolist() for x in outs]
    if r == 0:
        dist.send(torch.tensor([42.0, 43.0]), dst=1, tag=5)
    elif r == 1:
        x = torch.zeros(2)
        dist.recv(x, src=0, tag=5)
        out["recv"] = x.tolist()
    # recv without src (recvAnysource): the sender's rank comes back
    if r == n - 1:
        dist.send(torch.tensor([float(r)]), dst=0, tag=6)
    elif r == 0:
        x = torch.zeros(1)
        out["recv_any"] = [dist.recv(x, tag=6), x.tolist()]
    w = dist.all_reduce(torch.ones(2), async_op=True)
    w.wait()
    out["is_completed"] = w.is_completed()
    dist.barrier()
    sub = dist.new_group([0, n - 1])
    if r in (0, n - 1):
        t = torch.tensor([1.0])
        dist.all_reduce(t, group=sub)
        out["subgroup"] = t.tolist()
    return out


def unsupported():
    out = {}
    for name, fn in (
        ("band", lambda: dist.all_reduce(torch.ones(2, dtype=torch.int32), op=dist.ReduceOp.BAND)),
        # (dist.all_reduce views complex tensors as real ones; the group itself refuses them)
        ("complex", lambda: dist.distributed_c10d._get_default_group().allreduce(
            [torch.ones(2, dtype=torch.complex64)])),
        ("bool_sum", lambda: dist.all_reduce(torch.ones(2, dtype=torch.bool))),
    ):
        try:
            fn()
            out[name] = "no error"
        except Exception as e:  # noqa: BLE001
            out[name] = f"{type(e).__name__}: {e}"
    dist.barrier()
    return out


def wait_timeout():
    # gloo's Work in torch 1.13: a finite timeout that passes raises and the
    # operation goes on; rank 1 joins late.
    out = {}
    if rank == 1:
        time.sleep(1.0)
    t = torch.tensor([rank + 1.0])
    w = dist.all_reduce(t, async_op=True)
    if rank == 0:
        try:
            w.wait(timeout=timedelta(milliseconds=100))
            out["first"] = "no error"
        except Exception as e:  # noqa: BLE001
            out["first"] = f"{type(e).__name__}: {str(e).splitlines()[0]}"
        out["completed_after_timeout"] = w.is_completed()
    w.wait()
    out["value"] = t.tolist()
    return out


def future():
    seen = {}

    def cb(fut):
        with open(f"/proc/self/task/{threading.get_native_id()}/comm") as f:
            seen["thread"] = f.read().strip()
        return fut.value()[0] * 2

    if rank == 1:
        time.sleep(0.2)  # the callback attaches before completion on rank 0
    t = torch.tensor([rank + 1.0])
    fut = dist.all_reduce(t, async_op=True).get_future().then(cb)
    res = fut.wait()
    dist.barrier()
    return {"value": res.tolist(), "thread": seen.get("thread")}


def names():
    # a rendezvous file per name: with env:// on one port, a rank that
    # re-inits first can reach its peer's previous TCPStore (torch 2.x, gloo
    # too: "1/2 clients joined")
    res = {}
    for n in ("COLLIE", "Collie", "collie"):
        init(n, init_method=f"file:///tmp/collie-names-{port}-{n}")
        t = torch.ones(1)
        dist.all_reduce(t)
        res[n] = [dist.get_backend(), t.item()]
        dist.destroy_process_group()
    return res


def options():
    # a failed init leaves torch's TCPStore behind: each attempt rendezvous
    # through a file of its own
    def init(pg_options, label):
        path = f"/tmp/collie-options-{port}-{label}"
        dist.init_process_group(backend, init_method=f"file://{path}", rank=rank,
                                world_size=world, pg_options=pg_options)

    res = {}
    for label, opts in (("unknown", {"colour": "blue"}), ("bad_policy", {"policy": "sometimes"}),
                        ("bad_type", 3)):
        try:
            init(opts, label)
            res[label] = "no error"
            dist.destroy_process_group()
        except Exception as e:  # noqa: BLE001
            res[label] = f"{type(e).__name__}: {e}"
    os.environ["COLLIE_BLOCKING_WAIT"] = "1"
    try:
        init(collie.torch.Options(policy="abort_comm"), "conflict")
        res["conflict"] = "no error"
        dist.destroy_process_group()
    except Exception as e:  # noqa: BLE001
        res["conflict"] = f"{type(e).__name__}: {e}"
    init({"policy": "blocking_wait"}, "agreeing")
    t = torch.ones(1)
    dist.all_reduce(t)
    res["agreeing"] = t.item()
    dist.destroy_process_group()
    return res


def counts():
    fds = len(os.listdir("/proc/self/fd"))
    threads = len(os.listdir("/proc/self/task"))
    return fds, threads


def cycles():
    import gc

    seen = []
    for i in range(11):
        init()
        t = torch.tensor([float(i)])
        dist.all_reduce(t)
        dist.barrier()
        assert t.item() == i * world, t
        dist.destroy_process_group()
        gc.collect()
        time.sleep(0.05)
        seen.append(counts())
    return {"counts": seen}


def ddp():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
    ddp_model = torch.nn.parallel.DistributedDataParallel(model, bucket_cap_mb=0.0001)
    opt = torch.optim.SGD(ddp_model.parameters(), lr=0.1)
    gen = torch.Generator().manual_seed(100 + rank)
    for _ in range(20):
        x = torch.randn(32, 8, generator=gen)
        y = torch.randn(32, 4, generator=gen)
        opt.zero_grad()
        torch.nn.functional.mse_loss(ddp_model(x), y).backward()
        opt.step()
    return {"params": [p.detach().double().flatten().tolist() for p in model.parameters()]}


def destroy_pending():
    # rank 0 destroys the group with a work of its own in flight (rank 1 never
    # posts): the work is aborted at once, not left to its 30 s deadline
    out = {}
    store = dist.distributed_c10d._get_default_store()  # rank 0 serves it: keep it up
    if rank == 1:
        store.set("worker1_ready", "1")  # init is over on rank 1: rank 0 may go on
        # stay (comm open) until rank 0 has seen its work fail, so the cause it
        # sees is its own destroy and never rank 1 leaving
        store.wait(["worker0_done"], timedelta(seconds=60))
        return out
    store.wait(["worker1_ready"])
    w = dist.all_reduce(torch.ones(4), async_op=True)
    t0 = time.monotonic()
    dist.destroy_process_group()
    out["destroy_s"] = time.monotonic() - t0
    try:
        w.wait()
        out["wait"] = "no error"
    except RuntimeError as e:
        out["wait"] = str(e)
    store.set("worker0_done", "1")
    time.sleep(0.5)  # rank 1 leaves first (its store client, then this server)
    return out


def exit_without_destroy():
    # works on tensors only the process group still holds (Python dropped
    # them), completed by wait() and so left for the completer thread to
    # release; then the process exits with the group up and that release
    # possibly still pending: it must not take the GIL while Python
    # finalizes (std::terminate), nor hang
    for _ in range(300):
        dist.all_reduce(torch.ones(64), async_op=True).wait()
    return {"done": True}


def _err(fn):
    """fn()'s error message ("ok" when it returns) and its seconds."""
    t0 = time.monotonic()
    try:
        fn()
        msg = "ok"
    except Exception as e:  # noqa: BLE001
        msg = str(e)
    return msg, time.monotonic() - t0


def _sync(what):
    store = dist.distributed_c10d._get_default_store()
    store.set(f"{what}{rank}", "1")
    store.wait([f"{what}{r}" for r in range(world)], timedelta(seconds=60))


def monitored():
    # the group's monitored_barrier, gloo's messages, at world size 3 as
    # test_torch2.py's scenario; torch 1.13's dist.monitored_barrier lets
    # only gloo through (by name) until collie.torch opens it
    from collie.torch._torch_gaps import allow_monitored_barrier

    out = {}
    world_pg = dist.distributed_c10d._get_default_group()
    long = timedelta(seconds=10)
    out["gate"] = _err(lambda: dist.monitored_barrier(timeout=long))[0]
    allow_monitored_barrier()
    allow_monitored_barrier()  # idempotent
    out["dist"] = _err(lambda: dist.monitored_barrier(timeout=long, wait_all_ranks=True))[0]
    out["pass"] = _err(lambda: world_pg.monitored_barrier(long))[0]
    out["pass_all"] = _err(lambda: world_pg.monitored_barrier(long, wait_all_ranks=True))[0]
    g = dist.new_group(list(range(world)))
    if rank != 1:
        out["missing"] = _err(lambda: g.monitored_barrier(timedelta(seconds=1)))
    _sync("a")
    g = dist.new_group(list(range(world)))
    if rank == 0:
        out["wait_all"] = _err(lambda: g.monitored_barrier(timedelta(seconds=0.5),
                                                           wait_all_ranks=True))
    _sync("b")
    g = dist.new_group(list(range(world)))
    if rank != 2:
        out["order"] = _err(lambda: g.monitored_barrier(timedelta(seconds=1)))
    _sync("c")
    g = dist.new_group(list(range(world)))
    if rank == 0:
        out["zero"] = _err(lambda: g.monitored_barrier(timedelta(seconds=0)))[0]
    _sync("d")
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)
    out["after"] = t.tolist()
    return out


def barrier_timeout():
    # a barrier only rank 0 joins, on a group with a 1 s timeout
    out = {}
    g = dist.new_group(list(range(world)), timeout=timedelta(seconds=1))
    if rank == 0:
        out["barrier"] = _err(lambda: dist.barrier(g))
    _sync("t")
    t = torch.full((2,), float(rank))
    dist.all_reduce(t)
    out["after"] = t.tolist()
    return out


def long_timeout():
    # a timeout over collie's limit (2^31-1 ms): gloo takes it, and so does
    # collie (no deadline), for the default group, a new group and
    # create_timeout alike
    out = {}
    days30 = timedelta(days=30)
    kw = {"pg_options": {"create_timeout": days30}} if backend == "collie" else {}
    dist.init_process_group(backend, init_method=f"file:///tmp/collie-long-{port}", rank=rank,
                            world_size=world, timeout=days30, **kw)
    t = torch.full((2,), float(rank + 1))
    dist.all_reduce(t)
    out["world"] = t.tolist()
    g = dist.new_group(list(range(world)), timeout=days30)
    t = torch.ones(1)
    dist.all_reduce(t, group=g)
    out["group"] = t.tolist()
    return out


def main():
    if scenario not in ("names", "options", "cycles", "long_timeout"):
        init()
    result = globals()[scenario]()
    if dist.is_initialized() and scenario not in ("destroy_pending", "exit_without_destroy"):
        dist.barrier()  # nobody leaves (and closes torch's store) while others still use it
        dist.destroy_process_group()
    print(json.dumps(result, default=str), flush=True)


main()
