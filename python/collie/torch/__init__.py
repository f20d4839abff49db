"""collie as a torch.distributed backend (torch 1.13 and torch 2.x: CPU tensors; CUDA tensors on 2.x).

    import collie.torch               # registers the backend "collie"
    dist.init_process_group("collie", rank=r, world_size=n, init_method=...)
    pg = collie.torch.new_process_group(store, rank, size)   # or directly
    pg = collie.torch.shrink()        # torch 2.x: the survivors of a lost rank

Design notes
- Rendezvous: torch hands each process group a store (a PrefixStore of the
  group). Group rank 0 serves a collie store from this process (one server
  per process, on an ephemeral port, with a random token) and publishes
  "host:port", the token and a fresh comm name in torch's store; the other
  ranks read them and connect. Torch's store is only used for that one key
  per group creation: every rank counts itself in "collie/arrivals", so the
  k-th creation on a reused store reads key k - never a stale key from an
  earlier round. The comm's own name is new each time, so collie's store
  holds no stale keys either.
- One collie Engine per process serves every process group; one store
  client per server address.
- The process group's timeout (init_process_group(timeout=...)) is the
  comm's default op timeout: every collective's deadline. A timeout over
  collie's limit (2^31-1 ms, about 24.8 days; gloo takes any) means no
  deadline, as the extension does for a per-op timeout over it: so
  timeout=timedelta(days=30) works as on gloo. The same for
  Options.create_timeout. Settings come
  from pg_options (collie.torch.Options or a dict) or the environment
  (COLLIE_BLOCKING_WAIT, COLLIE_ASYNC_ERROR_HANDLING): unknown keys, bad
  values and a pg_options policy that contradicts the environment are
  errors, never silently resolved.
- One extension source for both torch versions, built twice: against
  Debian's torch 1.13 into build/python/_C.so, against a torch 2.x
  (make torch2) into build/torch2/_C.so (installed as _C.so and
  _C_torch2.so beside this file); the installed or build tree's copy is picked by
  the importing torch's major version. On torch 2.x the backend registers
  for devices=["cpu"], plus "cuda" when collie's NCCL plugin is present
  (nccl_plugin(); docs/torch2.md).
- CUDA tensors (torch 2.x): each group gets a factory (_cuda_factory) that
  its C++ side (cuda_side.h) calls at the group's first CUDA op: a second
  comm over the same collie store, named after the group's comm + "cuda",
  on the backend "nccl", on the tensor's device. It is made after torch
  loaded libnccl.so.2, so the plugin binds torch's copy; the factory checks
  that one libnccl.so.2 is mapped (nccl_libraries()).
- A rank lost (docs/torch2.md, "Losing a rank"): new_group (also with
  use_local_synchronization=True) makes a fresh collie comm among its
  members over the group's store, as for any group, not a collie shrink of
  the default group's comm: the members may be any subset of the survivors
  (a shrink would wait for the survivors that are not members until its
  deadline and then leave them out), and survivors whose views of the
  failed set differ at that moment would take different paths (one
  shrinking, one making a comm) and meet only at a timeout. A shrink's
  comm is made by a rendezvous too; what it adds is the agreement on the
  failed set, which a group with a given member list does not need. A
  group that names a rank the default group's comm knows dead or left is
  refused at once (refuse_lost) instead of waiting out its rendezvous.
  collie_comm_shrink itself is reached through torch's shrink_group
  (Backend::shrink) and shrink() below, which asks collie for the agreed
  set first (torch wants the list up front; collie agrees on it).
- The host published for rank 0's server: $COLLIE_TORCH_HOST, else
  MASTER_ADDR when this process is global rank 0, else this host's
  resolved name.
"""

import atexit
import json
import math
import os
import re
import secrets
import socket
import threading
from datetime import timedelta

import torch  # noqa: F401  (torch's own library before the extension)
import torch.distributed as dist

import collie
from collie.comm import POLICIES

TORCH2 = int(torch.__version__.split(".")[0]) >= 2
_lock = threading.Lock()
_state = {"engine": None, "server": None, "token": None, "clients": {}, "ext": None, "count": 0}


def _after_fork_in_child():
    """A forked child makes its own engine, server and store clients: the
    parent's have no threads here (collie refuses them, naming the fork)."""
    global _lock
    _lock = threading.Lock()  # another parent thread may have held it at the fork
    _state.update(engine=None, server=None, token=None, clients={}, count=0)


os.register_at_fork(after_in_child=_after_fork_in_child)


def _load_ext():
    import importlib.machinery
    import importlib.util

    here = os.path.dirname(os.path.abspath(__file__))
    built = os.path.join("torch2", "_C.so") if TORCH2 else os.path.join("python", "_C.so")
    candidates = [
        os.environ.get("COLLIE_TORCH_EXT"),
        os.path.join(here, "_C_torch2.so" if TORCH2 else "_C.so"),  # installed beside this file
        os.path.join(here, "..", "..", "..", "build", built),  # the build tree
    ]
    for path in candidates:
        if path and os.path.exists(path):
            loader = importlib.machinery.ExtensionFileLoader("collie.torch._C", path)
            spec = importlib.util.spec_from_file_location("collie.torch._C", path, loader=loader)
            mod = importlib.util.module_from_spec(spec)
            loader.exec_module(mod)
            return mod
    if TORCH2:
        raise ImportError(
            f"collie.torch: the extension for torch {torch.__version__} is not built "
            "(run `make torch2`, or set COLLIE_TORCH_EXT)"
        )
    raise ImportError(
        "collie.torch: the extension _C.so is not built (run `make` with python3-torch, "
        "libtorch-dev and pybind11-dev installed, or set COLLIE_TORCH_EXT)"
    )


_C = _load_ext()
ProcessGroupCollie = _C.ProcessGroupCollie
# The completer thread stops before Python finalizes (see at_exit in the
# extension); works completing later are finished by the last group's
# destruction.
atexit.register(_C.at_exit)

OPTION_KEYS = ("policy", "create_timeout")
LIMIT_MS = 2**31 - 1  # collie's longest finite timeout (int32 ms)


def comm_seconds(timeout):
    """A torch-side timeout (timedelta or seconds) as collie.Comm takes it:
    over collie's limit (LIMIT_MS, about 24.8 days) is no deadline (math.inf),
    as the extension makes a per-op timeout over it."""
    t = timeout.total_seconds() if isinstance(timeout, timedelta) else float(timeout)
    if math.isnan(t):
        raise ValueError("collie.torch: a timeout of NaN seconds")
    return math.inf if t * 1000 > LIMIT_MS else t


_ENV_ASYNC = {
    "0": "none",
    "none": "none",
    "1": "abort_process",
    "3": "abort_process",
    "abort_process": "abort_process",
    "2": "abort_comm",
    "abort_comm": "abort_comm",
}


class Options:
    """pg_options for the collie backend.

    policy: 'abort_comm', 'blocking_wait', 'abort_process' or 'none' (what a
    fault does; None: the environment's, else abort_comm). create_timeout:
    seconds for the rendezvous (None: the process group's timeout).
    """

    def __init__(self, policy=None, create_timeout=None):
        if policy is not None and str(policy).lower() not in POLICIES:
            raise ValueError(
                f"collie pg_options: policy {policy!r} is not one of "
                f"{', '.join(p for p in POLICIES if p != 'default')}"
            )
        if create_timeout is not None:
            if isinstance(create_timeout, timedelta):
                create_timeout = create_timeout.total_seconds()
            if not float(create_timeout) > 0:
                raise ValueError(f"collie pg_options: create_timeout {create_timeout!r} must be > 0")
            create_timeout = comm_seconds(create_timeout)
        self.policy = None if policy is None else str(policy).lower()
        self.create_timeout = create_timeout

    @classmethod
    def of(cls, pg_options):
        if pg_options is None:
            return cls()
        if isinstance(pg_options, cls):
            return pg_options
        if isinstance(pg_options, dict):
            unknown = sorted(set(pg_options) - set(OPTION_KEYS))
            if unknown:
                raise ValueError(
                    f"collie pg_options: unknown key(s) {', '.join(map(repr, unknown))} "
                    f"(known: {', '.join(OPTION_KEYS)})"
                )
            return cls(**pg_options)
        raise TypeError(
            f"collie pg_options: a collie.torch.Options or a dict, got {type(pg_options).__name__}"
        )


def env_policy():
    """The policy the environment asks for (None if it asks for none)."""
    bw = os.environ.get("COLLIE_BLOCKING_WAIT")
    ae = os.environ.get("COLLIE_ASYNC_ERROR_HANDLING")
    blocking = bw is not None and bw.lower() in ("1", "true", "yes")
    if bw is not None and not blocking and bw.lower() not in ("0", "false", "no"):
        raise ValueError(f"COLLIE_BLOCKING_WAIT={bw!r} is invalid: expected 0 or 1")
    asyn = None
    if ae is not None:
        if ae.lower() not in _ENV_ASYNC:
            raise ValueError(
                f"COLLIE_ASYNC_ERROR_HANDLING={ae!r} is invalid: expected abort_comm, "
                "abort_process, none, 0, 1, 2 or 3"
            )
        asyn = _ENV_ASYNC[ae.lower()]
    if blocking and asyn not in (None, "none"):
        raise ValueError(
            f"COLLIE_BLOCKING_WAIT=1 conflicts with COLLIE_ASYNC_ERROR_HANDLING={ae!r}: "
            "choose one error policy"
        )
    if blocking:
        return "blocking_wait"
    return asyn


def resolve_policy(opts):
    env = env_policy()
    if opts.policy is None:
        return env or "default"
    if env is not None and env != opts.policy:
        raise ValueError(
            f"collie: pg_options policy {opts.policy!r} conflicts with the environment's "
            f"{env!r} (COLLIE_BLOCKING_WAIT / COLLIE_ASYNC_ERROR_HANDLING): choose one"
        )
    return opts.policy


def engine():
    """The process's collie Engine (made on first use)."""
    with _lock:
        if _state["engine"] is None:
            _state["engine"] = collie.Engine(name="torch")
        return _state["engine"]


def _server():
    with _lock:
        if _state["server"] is None:
            _state["token"] = secrets.token_hex(16)
            _state["server"] = collie.StoreServer(
                _state["engine"], host="0.0.0.0", port=0, token=_state["token"]
            )
        return _state["server"], _state["token"]


def _client(addr, token):
    with _lock:
        key = (addr, token)
        if key not in _state["clients"]:
            _state["clients"][key] = collie.Store(_state["engine"], addr, token=token)
        return _state["clients"][key]


def _advertised_host(global_ranks):
    host = os.environ.get("COLLIE_TORCH_HOST")
    if host:
        return host
    master = os.environ.get("MASTER_ADDR")
    if master and (not global_ranks or global_ranks[0] == 0):
        return master
    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def _default_collie():
    """The default (world) group's collie backend, or None (no default
    group yet, or its CPU backend is not collie's)."""
    if not dist.is_initialized():
        return None
    try:
        pg = dist.distributed_c10d._get_default_group()
        be = pg._get_backend(torch.device("cpu")) if TORCH2 else pg
    except (RuntimeError, ValueError, AttributeError):
        return None
    return be if isinstance(be, ProcessGroupCollie) else None


def refuse_lost(ranks, what="new group"):
    """Raise at once when a group to be made names a rank the default
    group's collie comm knows is dead or has left: its rendezvous would wait
    its whole timeout for that rank (ranks: global ranks)."""
    world = _default_collie()
    if world is None or not ranks:
        return
    lost, why = world._lost_ranks()
    gone = [r for r in ranks if r in lost]
    if gone:
        alive = [r for r in ranks if r not in lost]
        raise RuntimeError(
            f"collie: {what} of ranks {list(ranks)}: rank{'s' if len(gone) > 1 else ''} "
            f"{', '.join(map(str, gone))} {'are' if len(gone) > 1 else 'is'} dead or "
            f"{'have' if len(gone) > 1 else 'has'} left (the default group's collie comm: "
            f"{why or 'peer health'}); make the group of the survivors (new_group({alive}, "
            "use_local_synchronization=True), or collie.torch.shrink())"
        )


def create_process_group(dist_opts, pg_options=None):
    """torch's creator function (extended_api=True)."""
    opts = Options.of(pg_options)
    policy = resolve_policy(opts)
    # a subgroup (torch's new_group; the default group is made with no
    # list, before is_initialized) that names a rank known lost
    refuse_lost(list(dist_opts.global_ranks_in_group))
    store = dist_opts.store
    rank, size = dist_opts.group_rank, dist_opts.group_size
    timeout = comm_seconds(dist_opts.timeout)
    engine()
    arrival = store.add("collie/arrivals", 1)
    key = f"collie/{(arrival - 1) // size}/store"
    if rank == 0:
        srv, token = _server()
        with _lock:
            _state["count"] += 1
            name = f"torch{os.getpid()}x{_state['count']}x{secrets.token_hex(4)}"
        host = _advertised_host(list(dist_opts.global_ranks_in_group))
        if ":" in host:
            host = f"[{host}]"
        store.set(key, json.dumps({"addr": f"{host}:{srv.port}", "token": token, "name": name}))
    info = json.loads(store.get(key))
    cstore = _client(info["addr"], info["token"])
    comm = collie.Comm(
        _state["engine"],
        cstore,
        rank,
        size,
        name=info["name"],
        timeout=timeout,
        create_timeout=opts.create_timeout,
        policy=policy,
    )
    handle, comm._h = comm._h, None  # the process group owns the comm now
    # the cached store client outlives the comm (collie_comm_create's rule)
    pg = ProcessGroupCollie(rank, size, handle, dist_opts.timeout)
    if TORCH2:
        pg._set_cuda_factory(
            _cuda_factory(cstore, rank, size, info["name"] + "cuda", timeout, opts, policy)
        )
    return pg


def nccl_plugin():
    """The path of collie's NCCL plugin (libcollie_nccl.so) that a comm on
    the backend "nccl" would load, or None: looked for as comm/backend.c does
    - the COLLIE_PLUGIN_PATH directories, else beside libcollie (collie/,
    then its own directory) - and in LD_LIBRARY_PATH's directories (of the
    loader's default search, only those). Only the file is looked for:
    whether it loads (libnccl.so.2, libcudart) shows at the first CUDA op."""
    from collie import _lib

    env = os.environ.get("COLLIE_PLUGIN_PATH")
    if env is not None:
        dirs = env.split(":")
    else:
        here = os.path.dirname(os.path.realpath(_lib.path)) if os.sep in _lib.path else None
        dirs = [os.path.join(here, "collie"), here] if here else []
    dirs += os.environ.get("LD_LIBRARY_PATH", "").split(":")
    for d in dirs:
        path = os.path.join(d, "libcollie_nccl.so") if d else None
        if path and os.path.exists(path):
            return path
    return None


def nccl_libraries():
    """The distinct files of libnccl.so* mapped into this process (/proc/self/maps)."""
    found = set()
    with open("/proc/self/maps") as f:
        for line in f:
            m = re.search(r"(/\S*/libnccl\.so[.0-9]*)$", line.strip())
            if m:
                found.add(os.path.realpath(m.group(1)))
    return sorted(found)


def _cuda_factory(cstore, rank, size, name, timeout, opts, policy):
    """The group's CUDA side, made at its first CUDA op (cuda_side.h calls
    it with the GIL): returns the comm's handle, owned by the group."""

    def start(device):
        comm = collie.Comm(
            _state["engine"],
            cstore,
            rank,
            size,
            name=name,
            backend="nccl",
            device=device,
            timeout=timeout,
            create_timeout=opts.create_timeout,
            policy=policy,
        )
        libs = nccl_libraries()
        if len(libs) > 1:
            comm.close()
            raise RuntimeError(
                f"collie: two copies of libnccl.so.2 are loaded ({', '.join(libs)}): collie's "
                "NCCL plugin must be loaded after torch (import torch before making any "
                "collie comm on 'nccl'; docs/torch2.md)"
            )
        handle, comm._h = comm._h, None
        return handle

    return start


def new_process_group(store, rank, size, timeout=timedelta(minutes=30), pg_options=None):
    """A collie process group over `store` without init_process_group, as
    c10d.ProcessGroupGloo(store, rank, size) makes a gloo one (rank 0's
    host is found as for init_process_group)."""
    opts = dist.distributed_c10d._DistributedBackendOptions()
    opts.store = store
    opts.group_rank = rank
    opts.group_size = size
    opts.timeout = timeout if isinstance(timeout, timedelta) else timedelta(seconds=timeout)
    opts.group_id = ""
    opts.global_ranks_in_group = list(range(size))
    return create_process_group(opts, pg_options)


def shrink(group=None, timeout=None):
    """The survivors of a fault in `group` (None: the default group) as a
    new ProcessGroup, ranks renumbered in their old order, without a new
    init_process_group: collie's agreement (collie_comm_shrink: every
    survivor calls this) names the ranks left out, then
    torch's dist.shrink_group(those ranks, group) installs the group that
    agreement made (Backend::shrink), as for NCCL: a shrunk default group
    becomes the default group and torch destroys the other groups; the old
    group is destroyed. A group that has not noticed a death the default
    group's comm saw is aborted first (a revoke). `timeout` (timedelta or
    seconds; None: the comm's
    creation timeout) bounds the agreement and is the new group's op
    timeout. rank_map(new) maps the old ranks to new ones. Raises
    RuntimeError naming why: this rank was left out by the survivors, the
    group is healthy, a store that died; NotImplementedError where torch has
    no shrink_group (torch 1.13, 2.x before about 2.10): there,
    new_group(survivors, use_local_synchronization=True) makes a collie
    group of the survivors (docs/torch2.md)."""
    if not TORCH2 or not hasattr(dist, "shrink_group") or not ProcessGroupCollie._torch_has_shrink:
        raise NotImplementedError(
            f"collie.torch.shrink: torch {torch.__version__} has no dist.shrink_group / "
            "Backend::shrink to install a shrunk group with; make the survivors' group with "
            "new_group(ranks, use_local_synchronization=True) (docs/torch2.md)"
        )
    pg = group if group is not None else dist.distributed_c10d._get_default_group()
    be = pg._get_backend(torch.device("cpu"))
    if not isinstance(be, ProcessGroupCollie):
        raise TypeError(
            f"collie.torch.shrink: the group's CPU backend is {type(be).__name__}, not collie's"
        )
    if timeout is not None and not isinstance(timeout, timedelta):
        timeout = timedelta(seconds=timeout)
    # A group other than the default one may not have noticed yet a death
    # the default group's comm saw (an idle group learns it a moment later,
    # or, across hosts, at its next collective): collie would call it
    # healthy. Its comm is aborted first then (a revoke: the other members'
    # works fail and they shrink too), and the agreement sees the death
    # through peer health, or leaves the silent rank out at its deadline.
    world = _default_collie()
    revoke = False
    if world is not None and pg is not dist.distributed_c10d._get_default_group():
        lost, _ = world._lost_ranks()
        revoke = bool(set(lost) & set(dist.get_process_group_ranks(pg)))
    kw = {"abort_first": revoke}
    if timeout is not None:
        kw["timeout"] = timeout
    left = be._shrink_agree(**kw)
    # shrink_group's pg_options reach Backend::shrink: the new group's timeout
    opts = None if timeout is None else torch._C._distributed_c10d.Backend.Options("collie", timeout)
    return dist.shrink_group(list(left), group=pg, pg_options=opts)


def rank_map(group):
    """For a group made by shrink (collie.torch.shrink, dist.shrink_group of
    a collie group): each rank of the group it came from, with its rank in
    `group` or None (left out); None for any other group."""
    be = group._get_backend(torch.device("cpu")) if TORCH2 else group
    if not isinstance(be, ProcessGroupCollie):
        raise TypeError(f"collie.torch.rank_map: the group's CPU backend is {type(be).__name__}")
    m = be.rank_map()
    return [None if r < 0 else r for r in m] if m else None


def _first_plugin():
    """pytorch#178756 (torch 2.x before the fix #178759, 2.11 among them):
    for a device map ("cpu:collie", "cpu:gloo,cuda:collie")
    _new_process_group_helper takes the group's default backend type from
    the *first* key of Backend._plugins only, and compares that upper-case
    key ("COLLIE") with the map's lower-case names, so it never matches and
    the default type stays UNDEFINED (init then fails: "Could not find the
    default backend type 0"). A lower-case alias "collie", made the first
    key, matches. torch looks plugins up by the upper-case name only
    (`_plugins[name.upper()]`, checked in 2.15 and 2.11's sources), so the
    alias is seen by that one iteration alone; torch 2.15 takes the type
    from the map itself and is unaffected. Idempotent; a plugin registered
    before collie keeps its entry, after the alias (docs/torch2.md)."""
    plugins = dist.Backend._plugins
    if next(iter(plugins), None) == "collie":
        return
    rest = [(k, v) for k, v in plugins.items() if k != "collie"]
    plugins.clear()  # in place: torch holds this dict on the class
    plugins["collie"] = dict(rest)["COLLIE"]
    plugins.update(rest)


def _register():
    if "COLLIE" not in dist.Backend._plugins:
        if TORCH2:
            # torch 2.x maps devices to backends: collie serves CPU tensors, and
            # CUDA tensors where its NCCL plugin is (started at the first CUDA op)
            dist.Backend.register_backend(
                "collie",
                create_process_group,
                extended_api=True,
                devices=["cpu", "cuda"] if nccl_plugin() else ["cpu"],
            )
        else:
            dist.Backend.register_backend("collie", create_process_group, extended_api=True)
    if TORCH2:
        _first_plugin()
    # torch 1.13's dist.monitored_barrier (and 2.11's) admits only gloo by name
    from collie.torch import _torch_gaps as gaps

    if gaps.gated():
        gaps.allow_monitored_barrier()
    if gaps.coalescing_state():  # mixed regions, a wrong OK (_torch_gaps.py)
        gaps.guard_coalescing_manager()


_register()
