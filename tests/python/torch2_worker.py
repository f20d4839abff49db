"""One rank of a test_torch2.py scenario, run by the torch 2.x venv's Python:
    torch2_worker.py BACKEND RANK WORLD PORT [SCENARIO]
SCENARIO (default "basic"): init_process_group(BACKEND), allreduce,
broadcast, barrier, destroy_process_group. The others are in SCENARIOS
below. Prints one JSON line (what it saw) last.

Before collie.torch is imported, COLLIE_TEST_PLUGIN_FIRST=1 registers a
dummy plugin (so collie is not the first of Backend._plugins), and
COLLIE_TEST_TORCH211_DEFAULT=1 replaces torch's choice of a device map's
default backend type (2.15's _get_default_backend_type_for_backend_config)
with torch 2.11's, restated in torch211_default_type below (pytorch#178756)."""

import json
import os
import sys
import time
from datetime import timedelta

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "python"))

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402

c10d = dist.distributed_c10d
BackendType = dist.ProcessGroup.BackendType


def torch211_default_type(backend_config, device_id=None):
    """torch 2.11's default backend type for a device-map group
    (_new_process_group_helper, restated; pytorch#178756): NCCL when the
    map names nccl; else, when any plugin is registered, CUSTOM only when
    the first key of Backend._plugins is one of the map's backend names
    (the keys are upper case, the map's names lower case), else left
    unset (UNDEFINED); GLOO when no plugin is registered at all."""
    names = backend_config.device_backend_map.values()
    if "nccl" in names:
        return BackendType.NCCL
    if dist.Backend._plugins:
        first = next(iter(dist.Backend._plugins))
        return BackendType.CUSTOM if first in names else BackendType.UNDEFINED
    return BackendType.GLOO


if os.environ.get("COLLIE_TEST_PLUGIN_FIRST") == "1":
    dist.Backend.register_backend("dummyfirst", lambda *a: None, devices=["cpu"])
if os.environ.get("COLLIE_TEST_TORCH211_DEFAULT") == "1":
    c10d._get_default_backend_type_for_backend_config = torch211_default_type

import collie.torch  # noqa: E402,F401

backend, rank, world, port = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
scenario = sys.argv[5] if len(sys.argv) > 5 else "basic"


def basic():
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
    return out


def counts():
    """Open fds and threads of this process."""
    return len(os.listdir("/proc/self/fd")), len(os.listdir("/proc/self/task"))


def cycles():
    """10 init_process_group / destroy_process_group cycles in one process,
    each on its own prefix of one TCPStore: every cycle's allreduce is
    right; fds and threads do not grow after the first cycle."""
    store = dist.TCPStore("127.0.0.1", int(port), world, rank == 0, timedelta(seconds=30))
    res = {"sums": [], "counts": []}
    for c in range(10):
        dist.init_process_group(backend, store=dist.PrefixStore(f"cycle{c}", store), rank=rank,
                                world_size=world, timeout=timedelta(seconds=30))
        t = torch.full((4,), float(rank + c))
        dist.all_reduce(t)
        res["sums"].append(t.tolist())
        pg = dist.group.WORLD._get_backend(torch.device("cpu"))
        res.setdefault("names", []).append(pg.name())
        dist.destroy_process_group()
        res["counts"].append(counts())
    res["initialized"] = dist.is_initialized()
    return res


def pending(how):
    """A receive no one sends to is pending when the group is torn down
    (destroy_process_group, or torch's abort): its wait fails at once naming
    why; a second shutdown/abort is a no-op; a new group works after."""
    import time

    store = dist.TCPStore("127.0.0.1", int(port), world, rank == 0, timedelta(seconds=30))
    dist.init_process_group(backend, store=dist.PrefixStore("a", store), rank=rank,
                            world_size=world, timeout=timedelta(seconds=60))
    res = {}
    pg = dist.group.WORLD
    be = pg._get_backend(torch.device("cpu"))
    res["name"] = be.name()
    dist.barrier()
    try:
        res["seq"] = pg._get_sequence_number_for_group()
    except RuntimeError as e:  # torch 2.11's ProcessGroup asks gloo/nccl/ucc only
        assert "does not yet support sequence numbers" in str(e), e
        res["seq"] = pg._get_backend(torch.device("cpu"))._get_sequence_number_for_group()
    work = dist.irecv(torch.zeros(2), src=(rank + 1) % world, tag=77)
    # every rank's receive is posted before any rank tears down: a rank
    # that posts after a peer's abort reached it is refused at the post
    # (abort propagation), not left pending (synced on torch's store, not
    # on the comm being torn down)
    store.set(f"posted{rank}", "1")
    store.wait([f"posted{r}" for r in range(world)], timedelta(seconds=30))
    t0 = time.monotonic()
    if how == "abort":
        dist.distributed_c10d._abort_process_group()
    else:
        dist.destroy_process_group()
    try:
        work.wait()
        res["wait"] = "ok"
    except Exception as e:  # noqa: BLE001
        res["wait"] = str(e)
    res["wait_s"] = time.monotonic() - t0
    be.shutdown()  # idempotent, also after an abort
    be.abort()
    try:
        be.allreduce([torch.ones(1)]).wait()
        res["post_after"] = "ok"
    except Exception as e:  # noqa: BLE001
        res["post_after"] = str(e)
    store.set(f"done{rank}", "1")  # no rank tears its next group down early
    store.wait([f"done{r}" for r in range(world)], timedelta(seconds=30))
    dist.init_process_group(backend, store=dist.PrefixStore("b", store), rank=rank,
                            world_size=world, timeout=timedelta(seconds=30))
    t = torch.ones(3)
    dist.all_reduce(t)
    res["after"] = t.tolist()
    dist.destroy_process_group()
    return res


def coalesced():
    """torch's _coalescing_manager: all_gather_into_tensor and
    reduce_scatter_tensor go to collie's *_into_tensor_coalesced forms (one
    collie op each), all_reduce to allreduce_coalesced; with a device, torch
    calls startCoalescing/endCoalescing around a broadcast."""
    from torch.distributed.distributed_c10d import _coalescing_manager

    store = dist.TCPStore("127.0.0.1", int(port), world, rank == 0, timedelta(seconds=30))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=30))
    res = {}
    ins = [torch.arange(n, dtype=torch.float32) + 10 * rank for n in (1, 3)]
    outs = [torch.zeros(world * t.numel()) for t in ins]
    with _coalescing_manager():
        for o, i in zip(outs, ins):
            dist.all_gather_into_tensor(o, i)
    res["allgather"] = [o.tolist() for o in outs]
    rins = [torch.arange(world * n, dtype=torch.float32) * (rank + 1) for n in (2, 1)]
    routs = [torch.zeros(t.numel() // world) for t in rins]
    with _coalescing_manager(async_ops=True) as cm:
        for o, i in zip(routs, rins):
            dist.reduce_scatter_tensor(o, i)
    cm.wait()
    res["reduce_scatter"] = [o.tolist() for o in routs]
    ars = [torch.full((2,), float(rank)), torch.full((1,), 1.0)]
    with _coalescing_manager():
        for t in ars:
            dist.all_reduce(t)
    res["allreduce"] = [t.tolist() for t in ars]
    b = torch.full((1,), float(rank))
    with _coalescing_manager(device=torch.device("cpu")):
        dist.broadcast(b, src=0)
    res["start"] = b.tolist()
    dist.barrier()
    dist.destroy_process_group()
    return res


def _err(fn):
    """fn()'s error message ("ok" when it returns), and its seconds."""
    import time

    t0 = time.monotonic()
    try:
        fn()
        msg = "ok"
    except Exception as e:  # noqa: BLE001
        msg = str(e)
    return msg, time.monotonic() - t0


def _store_world():
    store = dist.TCPStore("127.0.0.1", int(port), world, rank == 0, timedelta(seconds=30))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=30))
    return store


def _sync(store, what):
    store.set(f"{what}{rank}", "1")
    store.wait([f"{what}{r}" for r in range(world)], timedelta(seconds=60))


def monitored():
    """dist.monitored_barrier on a collie group (gloo's semantics, world
    size 3): all ranks pass (also wait_all_ranks); rank 1 missing: rank 0
    names it, rank 2 raises naming rank 0; wait_all_ranks names every
    missing rank; the first missing rank in order; rank 0's own timeout of
    0; a subgroup; then the world group still computes right. Each failure
    case on a fresh group (a rank that skipped a monitored barrier is out
    of step with its peers on that group, as with gloo)."""
    store = _store_world()
    res = {}
    ones = torch.ones(10) * rank
    for _ in range(3):
        dist.all_reduce(ones)
    pg_cpu = dist.group.WORLD._get_backend(torch.device("cpu"))
    res["pass"] = _err(lambda: dist.monitored_barrier(timeout=timedelta(seconds=10)))[0]
    res["pass_all"] = _err(lambda: dist.monitored_barrier(timeout=timedelta(seconds=10),
                                                           wait_all_ranks=True))[0]
    # the group's own call without a timeout: the comm's
    res["pass_default"] = _err(lambda: pg_cpu.monitored_barrier())[0]
    g = dist.new_group(list(range(world)))
    if rank != 1:
        res["missing"] = _err(lambda: dist.monitored_barrier(g, timedelta(seconds=1)))
    _sync(store, "a")
    g = dist.new_group(list(range(world)))
    if rank == 0:
        res["wait_all"] = _err(lambda: dist.monitored_barrier(g, timedelta(seconds=0.5),
                                                               wait_all_ranks=True))
    _sync(store, "b")
    g = dist.new_group(list(range(world)))
    if rank != 2:
        res["order"] = _err(lambda: dist.monitored_barrier(g, timedelta(seconds=1)))
    _sync(store, "c")
    g = dist.new_group(list(range(world)))
    if rank == 0:
        res["zero"] = _err(lambda: g.monitored_barrier(timedelta(seconds=0)))[0]
    _sync(store, "d")
    sub = dist.new_group([0, 1])
    if rank != 1:
        res["sub"] = _err(lambda: dist.monitored_barrier(sub, timedelta(seconds=0.5)))[0]
    _sync(store, "e")
    # torch's abort from another thread while rank 1 waits for rank 0's
    # reply (rank 0 never comes): the barrier fails at once naming it
    g = dist.new_group(list(range(world)))
    if rank == 1:
        import threading

        threading.Timer(0.5, g._get_backend(torch.device("cpu")).abort).start()
        res["aborted"] = _err(lambda: dist.monitored_barrier(g, timedelta(seconds=20)))
    _sync(store, "f")
    t = torch.full((3,), float(rank + 1))
    dist.all_reduce(t)
    res["after"] = t.tolist()
    dist.destroy_process_group()
    return res


def barrier_timeout():
    """A barrier only rank 0 joins, on a group whose timeout is 1 s: its
    error says "Timed out" (torch's suite matches " (Timed out|closed|
    timeout) "), no sooner than the timeout; an allreduce on the world
    group still computes right."""
    store = _store_world()
    res = {}
    g = dist.new_group(list(range(world)), timeout=timedelta(seconds=1))
    if rank == 0:
        res["barrier"] = _err(lambda: dist.barrier(g))
        res["allreduce"] = _err(lambda: dist.all_reduce(torch.ones(2), group=g))[0]
    _sync(store, "t")
    t = torch.full((2,), float(rank))
    dist.all_reduce(t)
    res["after"] = t.tolist()
    dist.destroy_process_group()
    return res


def anysource():
    """dist.recv / dist.irecv without src (recvAnysource): every other rank
    sends rank 0 two tensors filled with its rank; rank 0 receives them from
    any source and gets each sender's rank, the values matching it."""
    _store_world()
    res = {}
    if rank == 0:
        got = []
        for _ in range(world - 1):
            t = torch.full((5,), -1, dtype=torch.int64)
            src = dist.recv(t, tag=3)
            got.append([src, t.tolist()])
            t = torch.full((5,), -1, dtype=torch.int64)
            w = dist.irecv(t, tag=3)
            w.wait()
            got.append([w._source_rank(), t.tolist()])
        res["got"] = got
    else:
        dist.send(torch.full((5,), rank, dtype=torch.int64), dst=0, tag=3)
        dist.send(torch.full((5,), rank, dtype=torch.int64), dst=0, tag=3)
    dist.barrier()
    dist.destroy_process_group()
    return res


def extras():
    """torch 2.x's Backend extras on a collie group, world size 3: the
    backend's options (name, timeout); split_group (collie_comm_split; the
    group's order given, rank 1 alone); gather_single (gather_into_tensor);
    _coalescing_manager with a device (startCoalescing/endCoalescing: one
    Work for every op in between) and batch_isend_irecv through it."""
    from torch.distributed.distributed_c10d import _coalescing_manager

    store = _store_world()
    res = {}
    cpu = torch.device("cpu")
    pg = dist.group.WORLD
    be = pg._get_backend(cpu)
    dist.barrier()
    # what this torch lacks is said as "absent: ..." (torch 2.11: the
    # backend's options property, gather_single, split_group of a group
    # without a bound device)
    if hasattr(be, "options"):
        res["options"] = [be.options.backend, be.options._timeout.total_seconds()]
    else:
        res["options"] = "absent: Backend.options"
    res["supports"] = [be.supports_splitting, be.supports_coalescing]
    # split_group: [2, 0] (group rank 0 is global rank 2) and [1]
    try:
        sub = dist.split_group(split_ranks=[[2, 0], [1]], timeout=timedelta(seconds=20))
    except RuntimeError as e:
        if "No device associated with the default pg" not in str(e):
            raise
        res["split_rank"] = "absent: " + first_line(e)
        sub = None
    if sub is not None:
        sbe = sub._get_backend(cpu)
        res["split_rank"] = [dist.get_rank(sub), sub.rank(), sub.size(), sbe.name()]
        res["split_options"] = sbe.options._timeout.total_seconds()
        t = torch.full((2,), float(rank + 1))
        dist.all_reduce(t, group=sub)
        res["split_allreduce"] = t.tolist()
        b = torch.full((2,), float(rank))
        dist.broadcast(b, group=sub, group_src=0)
        res["split_broadcast"] = b.tolist()
    # gather_single into one tensor on rank 1
    if hasattr(dist, "gather_single"):
        out = torch.full((world * 2,), -1.0) if rank == 1 else None
        dist.gather_single(torch.tensor([rank, 10.0 * rank]), out, dst=1)
        res["gather_single"] = out.tolist() if out is not None else None
    else:
        res["gather_single"] = "absent: dist.gather_single"
    # startCoalescing/endCoalescing: two broadcasts from different roots
    bs = [torch.full((3,), float(rank)), torch.full((1,), float(rank) + 0.5)]
    with _coalescing_manager(device=cpu):
        dist.broadcast(bs[0], src=1)
        dist.broadcast(bs[1], src=2)
    res["coalesced_broadcast"] = [x.tolist() for x in bs]
    ts = [torch.full((2,), float(rank + 1)), torch.full((1,), 2.0 * rank)]
    with _coalescing_manager(device=cpu, async_ops=True) as cm:
        for x in ts:
            dist.all_reduce(x, async_op=True)
    cm.wait()
    res["coalesced_async"] = [x.tolist() for x in ts]
    # batch_isend_irecv (supports_coalescing: one Work for the batch)
    recv = torch.full((4,), -1.0)
    ops = [dist.P2POp(dist.isend, torch.full((4,), 100.0 + rank), (rank + 1) % world),
           dist.P2POp(dist.irecv, recv, (rank - 1) % world)]
    reqs = dist.batch_isend_irecv(ops)
    for q in reqs:
        q.wait()
    res["batch"] = [len(reqs), recv.tolist()]
    # a second start starts over (as NCCL's: torch may leave a region
    # without endCoalescing); an op collie refuses ends its region
    res["nested"] = _err(lambda: [pg._start_coalescing(cpu), pg._start_coalescing(cpu)])[0]
    pg._end_coalescing(cpu).wait()
    res["end_alone"] = _err(lambda: pg._end_coalescing(cpu))[0]
    pg._start_coalescing(cpu)
    bad = torch.zeros(1, dtype=torch.uint32)
    res["refused"] = _err(lambda: dist.send(bad, (rank + 1) % world))[0]
    res["end_refused"] = _err(lambda: pg._end_coalescing(cpu))[0]
    _sync(store, "x")
    dist.destroy_process_group()
    return res


def tcp_store():
    return dist.TCPStore("127.0.0.1", int(port), world, rank == 0, timedelta(seconds=30))


def init(name, store, prefix):
    dist.init_process_group(name, store=dist.PrefixStore(prefix, store), rank=rank,
                            world_size=world, timeout=timedelta(seconds=30))


def first_line(e):
    return f"{type(e).__name__}: {str(e).splitlines()[0] if str(e) else ''}"


SPELLINGS = ["collie", "COLLIE", "Collie", "cpu:collie", "cpu:Collie", "CPU:COLLIE",
             "cpu:gloo,cuda:Collie"]


def spellings():
    """init_process_group with collie named in every case, alone and in a
    device map, one after the other in this process: the group's default
    backend type, the CPU's backend, an allreduce, get_backend."""
    store = tcp_store()
    res = {"plugins": list(dist.Backend._plugins), "groups": []}
    cpu = torch.device("cpu")
    for i, name in enumerate(SPELLINGS):
        g = {"name": name}
        try:
            init(name, store, f"s{i}")
        except Exception as e:  # noqa: BLE001
            g["init"] = first_line(e)
            res["groups"].append(g)
            continue
        pg = dist.group.WORLD
        g["type"] = str(pg._get_backend_name())
        g["cpu"] = type(pg._get_backend(cpu)).__name__
        g["backend"] = str(dist.get_backend())
        t = torch.full((3,), float(rank + i))
        dist.all_reduce(t)
        g["sum"] = t.tolist()
        dist.barrier()
        dist.destroy_process_group()
        res["groups"].append(g)
    return res


def collie_nccl_mapped():
    with open("/proc/self/maps") as f:
        return any("libcollie_nccl" in line for line in f)


def lazy_cuda():
    """BACKEND "cpu:gloo,cuda:collie": the group inits without touching CUDA
    (torch's CUDA state uninitialized, collie's NCCL plugin not loaded), CPU
    collectives go through gloo; a CUDA tensor collective fails with a
    clear error (no GPU here: torch's own, at the tensor) and the process
    goes on: CPU collectives after it, destroy_process_group."""
    store = tcp_store()
    init(backend, store, "lazy")
    pg = dist.group.WORLD
    res = {"type": str(pg._get_backend_name()),
           "cpu": type(pg._get_backend(torch.device("cpu"))).__name__,
           "cuda": type(pg._get_backend(torch.device("cuda"))).__name__,
           "cuda_initialized": torch.cuda.is_initialized()}
    t = torch.arange(3, dtype=torch.float32) + rank
    dist.all_reduce(t)
    res["allreduce"] = t.tolist()
    outs = [torch.zeros(2) for _ in range(world)]
    dist.all_gather(outs, torch.full((2,), float(rank)))
    res["allgather"] = [o.tolist() for o in outs]
    b = torch.full((2,), float(rank))
    dist.broadcast(b, src=world - 1)
    res["broadcast"] = b.tolist()
    res["cuda_initialized_after_cpu"] = torch.cuda.is_initialized()
    res["plugin_loaded"] = collie_nccl_mapped()
    res["gpu"] = torch.cuda.is_available()
    try:
        c = torch.full((2,), float(rank + 1), device="cuda")
        dist.all_reduce(c)
        res["cuda_op"] = c.tolist()
    except Exception as e:  # noqa: BLE001
        res["cuda_op"] = first_line(e)
    t = torch.ones(2)
    dist.all_reduce(t)
    res["after"] = t.tolist()
    dist.barrier()
    dist.destroy_process_group()
    res["destroyed"] = not dist.is_initialized()
    return res


def nccl_map():
    """BACKEND "cpu:collie,cuda:nccl": without a GPU torch refuses NCCL (its
    error, kept); with one (a GPU per rank), CPU tensors go through collie
    and CUDA tensors through NCCL. Either way a collie group made after it
    in this process works."""
    store = tcp_store()
    res = {"gpu": torch.cuda.is_available()}
    try:
        init(backend, store, "n")
    except Exception as e:  # noqa: BLE001
        res["init"] = first_line(e)
    else:
        pg = dist.group.WORLD
        res["init"] = "ok"
        res["type"] = str(pg._get_backend_name())
        res["cpu"] = type(pg._get_backend(torch.device("cpu"))).__name__
        res["cuda"] = type(pg._get_backend(torch.device("cuda"))).__name__
        t = torch.full((2,), float(rank + 1))
        dist.all_reduce(t)
        res["cpu_sum"] = t.tolist()
        c = torch.full((2,), float(rank + 1), device=f"cuda:{rank % torch.cuda.device_count()}")
        dist.all_reduce(c)
        res["cuda_sum"] = c.tolist()
        dist.destroy_process_group()
    init("cpu:collie", store, "after")
    t = torch.ones(2)
    dist.all_reduce(t)
    res["after"] = t.tolist()
    dist.destroy_process_group()
    return res


def groups():
    """torch 2.x group features on a collie group: new_group with
    use_local_synchronization (a group of each rank alone, made by that rank
    only, and one of all), init_device_mesh("cpu", ...) in 1-D and 2-D,
    functional collectives on CPU tensors."""
    import torch.distributed._functional_collectives as fc
    from torch.distributed.device_mesh import init_device_mesh

    store = tcp_store()
    init(backend, store, "g")
    cpu = torch.device("cpu")
    res = {}
    alone = dist.new_group([rank], use_local_synchronization=True)
    both = dist.new_group(list(range(world)), use_local_synchronization=True)
    t = torch.full((2,), float(rank + 1))
    dist.all_reduce(t, group=alone)
    res["alone"] = [t.tolist(), alone.size(), alone._get_backend(cpu).name()]
    t = torch.full((2,), float(rank + 1))
    dist.all_reduce(t, group=both)
    res["both"] = [t.tolist(), both.size(), both._get_backend(cpu).name()]
    mesh = init_device_mesh("cpu", (world,), mesh_dim_names=("dp",))
    g = mesh.get_group("dp")
    t = torch.full((2,), float(rank + 1))
    dist.all_reduce(t, group=g)
    res["mesh1"] = [t.tolist(), g._get_backend(cpu).name()]
    mesh2 = init_device_mesh("cpu", (1, world), mesh_dim_names=("pp", "tp"))
    res["mesh2"] = {}
    for dim in ("pp", "tp"):
        g = mesh2.get_group(dim)
        outs = [torch.zeros(1) for _ in range(g.size())]
        dist.all_gather(outs, torch.full((1,), float(rank)), group=g)
        res["mesh2"][dim] = [[o.item() for o in outs], g._get_backend(cpu).name()]
    w = dist.group.WORLD
    x = torch.full((2,), float(rank + 1))
    # 2.15 renamed the *_tensor forms *_single (the old names warn)
    rs = getattr(fc, "reduce_scatter_single", None) or fc.reduce_scatter_tensor
    ag = getattr(fc, "all_gather_single", None) or fc.all_gather_tensor
    res["functional"] = {
        "all_reduce": fc.all_reduce(x, "sum", w).tolist(),
        "all_gather": ag(x, 0, w).tolist(),
        "reduce_scatter": rs(torch.arange(2.0 * world) * (rank + 1), "sum", 0, w).tolist(),
        "broadcast": fc.broadcast(x, world - 1, w).tolist(),
        "all_to_all_single": fc.all_to_all_single(
            torch.arange(float(world)) + 10 * rank, None, None, w).tolist(),
    }
    dist.barrier()
    dist.destroy_process_group()
    return res


def split():
    """torch's split_group (2.x, where it exists) of a collie group into
    groups of one rank each, and an allreduce in the split."""
    store = tcp_store()
    init(backend, store, "sp")
    res = {"has": hasattr(dist, "split_group"), "torch": torch.__version__}
    try:
        g = dist.split_group(split_ranks=[[r] for r in range(world)])
        t = torch.full((2,), float(rank + 1))
        dist.all_reduce(t, group=g)
        res["split"] = [t.tolist(), g.size(), g._get_backend(torch.device("cpu")).name()]
    except Exception as e:  # noqa: BLE001
        res["split"] = first_line(e)
    dist.barrier()
    dist.destroy_process_group()
    return res


def future_chain():
    """Future callbacks that wait for other works' futures (an outside
    breaker's find: collie completed every future on one thread, where the
    callback ran, so the future it waited for never completed): on rank 0,
    w1's and w2's callbacks both wait for w3's future (two callbacks blocked
    at once); rank 1 posts 1 s later, so the callbacks are attached first."""
    import threading

    store = tcp_store()
    init(backend, store, "fc")
    if rank == 1:
        time.sleep(1.0)
    a, b, c = torch.ones(4), torch.ones(4), torch.ones(4)
    w1 = dist.all_reduce(a, async_op=True)
    w2 = dist.all_reduce(b, async_op=True)
    w3 = dist.all_reduce(c, async_op=True)
    chained = [w.get_future().then(lambda f: float(w3.get_future().wait()[0].sum()))
               for w in (w1, w2)]
    res = {}
    done = threading.Event()

    def waiter():
        try:
            res["values"] = [ch.wait() for ch in chained]
        except Exception as e:  # noqa: BLE001
            res["values"] = first_line(e)
        done.set()

    t0 = time.time()
    threading.Thread(target=waiter, daemon=True).start()
    res["done"] = done.wait(15)
    res["waited_s"] = round(time.time() - t0, 1)
    for w in (w1, w2, w3):
        w.wait()  # completes them here if the completer did not: the test then fails
    done.wait(10)
    dist.barrier()
    dist.destroy_process_group()
    return res


def split_disagree():
    """split_group given different split_ranks on different ranks (an
    outside breaker's find: the group formed anyway and summed the wrong
    ranks, OK): rank 0 asks for [[0, 1, 2]], ranks 1 and 2 for
    [[0, 1], [2]]; each allreduces rank + 1 on what it got."""
    store = tcp_store()
    init(backend, store, "sd")
    res = {"has": hasattr(dist, "split_group"), "torch": torch.__version__}
    wanted = [[0, 1, 2]] if rank == 0 else [[0, 1], [2]]
    try:
        g = dist.split_group(split_ranks=wanted, timeout=timedelta(seconds=10))
        t = torch.full((2,), float(rank + 1))
        dist.all_reduce(t, group=g)
        res["split"] = [t.tolist(), g.size()]
    except Exception as e:  # noqa: BLE001
        res["split"] = first_line(e)
    dist.barrier()
    dist.destroy_process_group()
    return res


def profiler():
    """torch's profiler sees collie's operations as gloo's are seen:
    "collie:all_reduce", "collie:broadcast", "collie:send"/"collie:recv"
    "collie:all_gather" events, async, with the recorded tensors' shapes
    (record_shapes)."""
    store = dist.TCPStore("127.0.0.1", int(port), world, rank == 0, timedelta(seconds=30))
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=30))
    t = torch.full((2, 3), float(rank))
    b = torch.full((4,), float(rank))
    p = torch.full((5,), float(rank))
    g = [torch.zeros(3) for _ in range(world)]
    with torch.autograd.profiler.profile(record_shapes=True) as prof:
        dist.all_reduce(t)
        dist.broadcast(b, src=0)
        dist.all_gather(g, torch.full((3,), float(rank)))
        if rank == 0:
            dist.send(p, 1)
        elif rank == 1:
            dist.recv(p, 0)
    events = {}
    for e in prof.function_events:
        if e.name.startswith("collie:"):
            events[e.name] = [e.count, e.is_async, e.input_shapes]
    res = {"events": events, "allreduce": t.tolist(), "broadcast": b.tolist(), "p2p": p.tolist(),
           "allgather": [x.tolist() for x in g]}
    dist.barrier()
    dist.destroy_process_group()
    return res


def _lose_last(sub=None):
    """A world group over a TCPStore rank 0 hosts (it outlives the lost
    rank), an allreduce (checked), a store sync so that no collective is in
    flight, then the last rank prints what it saw and SIGKILLs itself; each
    survivor's next allreduce fails (bounded: the peer's death is seen at
    once, else the group's 30 s deadline). With `sub` (a list), a group of
    every rank is made first and has one allreduce too; it is put there.
    Returns the store and what was seen."""
    import signal

    store = tcp_store()
    dist.init_process_group(backend, store=store, rank=rank, world_size=world,
                            timeout=timedelta(seconds=30))
    res = {"pid": os.getpid()}
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    res["first"] = t.tolist()
    if sub is not None:
        sub.append(dist.new_group(list(range(world))))
        dist.all_reduce(torch.ones(1), group=sub[0])
    _sync(store, "first")
    if rank == world - 1:
        print(json.dumps(res), flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    res["failed"] = _err(lambda: dist.all_reduce(torch.ones(4)))
    return store, res


def survivors_new_group():
    """After the last rank died: new_group(use_local_synchronization=True)
    of the survivors (no new init_process_group), an allreduce on it
    (values checked), a group of a subset of them, and a group naming the
    dead rank (refused: timed out today, at once when the world's comm knows
    the rank is dead)."""
    import time

    store, res = _lose_last()
    cpu = torch.device("cpu")
    alive = list(range(world - 1))
    t0 = time.monotonic()
    res["with_dead"] = _err(lambda: dist.new_group(list(range(world)), use_local_synchronization=True,
                                                   timeout=timedelta(seconds=5)))
    g = dist.new_group(alive, use_local_synchronization=True, timeout=timedelta(seconds=30))
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t, group=g)
    res["group"] = [t.tolist(), g.size(), g.rank(), g._get_backend(cpu).name()]
    b = torch.full((2,), float(rank))
    dist.broadcast(b, src=alive[-1], group=g)
    res["broadcast"] = b.tolist()
    if rank in alive[:2]:
        sub = dist.new_group(alive[:2], use_local_synchronization=True,
                             timeout=timedelta(seconds=30))
        t = torch.full((3,), float(10 * (rank + 1)))
        dist.all_reduce(t, group=sub)
        res["subset"] = [t.tolist(), sub.size()]
    res["seconds"] = time.monotonic() - t0
    _sync_alive(store, "end")
    dist.destroy_process_group()
    return res


def _sync_alive(store, what):
    """_sync among the survivors of _lose_last."""
    store.set(f"{what}{rank}", "1")
    store.wait([f"{what}{r}" for r in range(world - 1)], timedelta(seconds=60))


def _world_after_shrink(new):
    """What a survivor sees of the group collie.torch.shrink / shrink_group
    gave it, and an allreduce and a broadcast on it (the default group)."""
    cpu = torch.device("cpu")
    res = {"size": new.size(), "rank": new.rank(), "map": collie.torch.rank_map(new),
           "name": new._get_backend(cpu).name(), "is_default": new is dist.group.WORLD,
           "world": [dist.get_rank(), dist.get_world_size()]}
    t = torch.full((4,), float(rank + 1))
    dist.all_reduce(t)
    res["allreduce"] = t.tolist()
    b = torch.full((2,), float(rank))
    dist.broadcast(b, src=new.size() - 1)
    res["broadcast"] = b.tolist()
    return res


def survivors_shrink():
    """After the last rank died: collie.torch.shrink(sub) of a group of
    every rank (not the default one), an allreduce on it; then
    collie.torch.shrink() (collie's agreement, then torch's shrink_group)
    gives the survivors a default group of 3, ranks kept in order, whose
    allreduce and broadcast are right; the rank map says who was left out."""
    import time

    sub = []
    store, res = _lose_last(sub)
    # a group other than the default one first (shrinking the default group
    # destroys the others: torch's rule)
    g = collie.torch.shrink(sub[0], timeout=30)
    t = torch.full((2,), float(10 * (rank + 1)))
    dist.all_reduce(t, group=g)
    res["sub"] = [g.size(), g.rank(), collie.torch.rank_map(g), t.tolist(),
                  dist.get_world_size(), g is dist.group.WORLD]
    t0 = time.monotonic()
    new = collie.torch.shrink(timeout=30)
    res["shrink_s"] = time.monotonic() - t0
    res.update(_world_after_shrink(new))
    _sync_alive(store, "end")
    dist.destroy_process_group()
    return res


def survivors_shrink_group():
    """After the last rank died, torch's own dist.shrink_group on the
    collie group: a list that is not what the survivors agree on is refused
    naming both sets (the agreed group is kept), then the agreed list gets
    it; the same checks as survivors_shrink."""
    store, res = _lose_last()
    be = dist.group.WORLD._get_backend(torch.device("cpu"))
    res["supports"] = be.supports_shrinking
    res["wrong"] = _err(lambda: be.shrink([world - 2, world - 1]))[0]
    new = dist.shrink_group([world - 1])
    res.update(_world_after_shrink(new))
    _sync_alive(store, "end")
    dist.destroy_process_group()
    return res


def shrink_stopped():
    """The last rank dies; rank 2 stops itself (SIGSTOP) before it can take
    part; ranks 0 and 1 shrink with a 4 s bound, which leaves out 3 (dead)
    and 2 (silent): a group of 2, allreduce checked; then rank 0 resumes
    rank 2 (SIGCONT), whose shrink is refused: it was left out."""
    import signal

    store, res = _lose_last()
    store.set(f"pid{rank}", str(os.getpid()))
    if rank == 2:
        os.kill(os.getpid(), signal.SIGSTOP)
        # resumed by rank 0 once 0 and 1 hold their group
        res["shrink"] = _err(lambda: collie.torch.shrink(timeout=10))
        res["post"] = _err(lambda: dist.all_reduce(torch.ones(2)))[0]
        store.set("done2", "1")
    else:
        _survivor_shrinks_then_resumes(store, res, lambda: collie.torch.shrink(timeout=4))
    dist.destroy_process_group()
    return res


def _survivor_shrinks_then_resumes(store, res, shrink):
    """Ranks 0 and 1 of a world of 3 whose rank 2 stopped itself: shrink()
    (timed, the group of 2 checked), then rank 0 resumes rank 2 once both
    hold their group, and both wait for rank 2's "done2"."""
    import signal
    import time

    t0 = time.monotonic()
    new = shrink()
    res["shrink_s"] = time.monotonic() - t0
    res.update(_world_after_shrink(new))
    store.set(f"held{rank}", "1")
    store.wait(["held0", "held1"], timedelta(seconds=60))
    if rank == 0:
        os.kill(int(store.get("pid2")), signal.SIGCONT)
    store.wait(["done2"], timedelta(seconds=60))


def shrink_healthy():
    """collie.torch.shrink on a healthy group is refused naming why; the
    group goes on working."""
    store = tcp_store()
    init(backend, store, "h")
    res = {"shrink": _err(lambda: collie.torch.shrink(timeout=5))}
    t = torch.full((2,), float(rank + 1))
    dist.all_reduce(t)
    res["after"] = t.tolist()
    dist.destroy_process_group()
    return res


def shrink_abort():
    """World of 3, healthy; rank 2 stops itself (SIGSTOP) after an
    allreduce; ranks 0 and 1 call torch's shrink_group([2]) with
    SHRINK_ABORT and a 3 s timeout: the group is aborted, the agreement
    leaves rank 2 out at its deadline, a group of 2 (allreduce checked);
    rank 0 then resumes rank 2, whose next post is refused (left out)."""
    import signal
    import time

    store = tcp_store()
    init(backend, store, "a")
    res = {}
    t = torch.full((2,), float(rank + 1))
    dist.all_reduce(t)
    res["first"] = t.tolist()
    store.set(f"pid{rank}", str(os.getpid()))
    _sync(store, "first")
    if rank == 2:
        os.kill(os.getpid(), signal.SIGSTOP)
        # the old group learns it was left out from the survivors' notice
        # on its control channel (after their abort notice): its posts fail
        # EABORTED until then, ENOTMEMBER after (polled, bounded)
        t0 = time.monotonic()
        res["posts"] = []
        while time.monotonic() - t0 < 10:
            msg = _err(lambda: dist.all_reduce(torch.ones(2)))[0]
            if not res["posts"] or res["posts"][-1] != msg:
                res["posts"].append(msg)
            if "COLLIE_ENOTMEMBER" in msg or msg == "ok":
                break
            time.sleep(0.05)
        res["told_s"] = time.monotonic() - t0
        store.set("done2", "1")
    else:
        opts = torch._C._distributed_c10d.Backend.Options("collie", timedelta(seconds=3))
        _survivor_shrinks_then_resumes(store, res, lambda: dist.shrink_group(
            [2], shrink_flags=c10d.SHRINK_ABORT, pg_options=opts))
    dist.destroy_process_group()
    return res


SCENARIOS = {
    "spellings": spellings,
    "lazy_cuda": lazy_cuda,
    "nccl_map": nccl_map,
    "groups": groups,
    "split": split,
    "split_disagree": split_disagree,
    "future_chain": future_chain,
    "profiler": profiler,
    "coalesced": coalesced,
    "basic": basic,
    "cycles": cycles,
    "destroy_pending": lambda: pending("destroy"),
    "abort_pending": lambda: pending("abort"),
    "monitored": monitored,
    "barrier_timeout": barrier_timeout,
    "anysource": anysource,
    "extras": extras,
    "survivors_new_group": survivors_new_group,
    "survivors_shrink": survivors_shrink,
    "survivors_shrink_group": survivors_shrink_group,
    "shrink_stopped": shrink_stopped,
    "shrink_healthy": shrink_healthy,
    "shrink_abort": shrink_abort,
}

if scenario == "basic":
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
print(json.dumps(SCENARIOS[scenario]()), flush=True)
