"""Comm: a collie communicator and its collectives from Python.

Design notes
- Every collective posts and returns a Work at once (non-blocking, as
  collie.h); `await work` or the *_async forms resolve it on an asyncio
  loop, work.wait() on any thread. The Work holds the buffers until its
  completion is observed (see _engine.py).
- Sizes are checked here, where Python knows them and collie cannot:
  an output too small for what collie will write is a ValueError naming
  both sizes, never a write past the end. Element types must match across
  the buffers of one call (TypeError).
- Host forms take CPU memory (numpy, torch CPU tensors, bytes-like);
  cuda_* forms take device buffers and a stream (an int cudaStream_t, an
  object with .cuda_stream such as torch.cuda.Stream, or None/0 for the
  default stream) and run on the comm's cuda backend (collie_cuda.h).
- broadcast_object / send_object / recv_object move pickled Python objects
  (blocking, with _async forms); their wire format and trust are in
  _objects.py.
- The comm owns nothing it did not create: the store passed in stays the
  caller's (kept alive by the comm); from_env's store is the comm's own.
- Recovery from an event loop: Comm.create_async and destroy_async post
  collie_comm_create_post / collie_comm_destroy_post with the engine's
  completion queue and await the work, so the rendezvous and the destroy's
  bounded waits run on collie's progress thread, never on the loop. What
  the loop stops awaiting (a cancelled create, a destroy nobody awaits)
  finishes in the background: _BACKGROUND keeps those tasks alive until
  the destroy is done and a store the comm owns is closed after it.
"""

import asyncio
import os
from ctypes import byref, c_char_p, c_int, c_void_p, pointer, sizeof

from . import _lib, _objects
from ._buffers import DTYPE_NAMES, device_buffer, host_buffer, stream_handle as _stream
from ._engine import Closable, Engine, timeout_ms
from ._faults import Health, stats_fields
from ._shrink import Shrink
from .errors import OK, CollieAborted, CollieClosed, CollieNotMember, check, error_for
from .store import Store

lib = _lib.lib

REDOPS = {"sum": 0, "prod": 1, "product": 1, "min": 2, "max": 3, "avg": 4, "mean": 4}
POLICIES = {
    "default": 0,
    "abort_comm": 1,
    "blocking_wait": 2,
    "abort_process": 3,
    "none": 4,
}


PERCENTILES = (50, 90, 99)

# tasks finishing a destroy that nobody awaits (kept from the garbage collector)
_BACKGROUND = set()


def _check_create_args(engine, store, rank, size):
    """The types a creation takes (store None: from the environment, rank
    and size unchecked here)."""
    if not isinstance(engine, Engine):
        raise TypeError("engine: a collie.Engine")
    if store is None:
        return
    if not isinstance(store, Store):
        raise TypeError("store: a collie.Store")
    for v, what in ((rank, "rank"), (size, "size")):
        if not isinstance(v, int) or isinstance(v, bool):
            raise TypeError(f"{what}: an int, got {type(v).__name__}")


def _env_int(var, what):
    v = os.environ.get(var)
    if v is None or not v.strip().lstrip("-").isdigit():
        raise error_for(-1, f"{what}: not given and {var} is {'not set' if v is None else repr(v)}")
    return int(v)


async def _destroy_done(work, store):
    """The end of a posted destroy: True if nothing had to be aborted; then
    the store the comm owned (from the environment) is closed."""
    try:
        await work
        return True
    except CollieAborted:
        return False
    finally:
        if store is not None:
            store.close()


def _in_background(coro):
    task = asyncio.ensure_future(coro)
    _BACKGROUND.add(task)
    task.add_done_callback(_BACKGROUND.discard)
    return task


def _bucket_bounds_us(i):
    """[lo, hi) of latency bucket i in microseconds (collie_comm.h): [0, 1),
    then [2^(i-1), 2^i); the last bucket has no upper bound (hi None)."""
    if i == 0:
        return 0.0, 1.0
    lo = float(1 << (i - 1))
    return lo, (None if i == _lib.LATENCY_BUCKETS - 1 else 2.0 * lo)


def latency_percentile(buckets, q):
    """The q-th percentile (0..100) in microseconds estimated from collie's
    power-of-two latency histogram, or None when it is empty.

    The bucket holding the percentile's sample is found exactly; within it
    the value is interpolated linearly by rank. So the estimate lies in the
    same bucket as the true value: off by less than the bucket's width,
    which equals its lower bound (a factor of 2: a true 40 us reads between
    32 and 64 us; under 1 us, between 0 and 1). In the last, open bucket
    (2^29 us and over) the estimate is its lower bound."""
    if not 0 <= q <= 100:
        raise ValueError(f"q: {q} (a percentile in [0, 100])")
    total = sum(buckets)
    if total == 0:
        return None
    target = q / 100.0 * total
    below = 0
    for i, n in enumerate(buckets):
        if n and below + n >= target:
            lo, hi = _bucket_bounds_us(i)
            if hi is None:
                return lo
            return lo + (hi - lo) * max(0.0, target - below) / n
        below += n
    return None  # not reached: the last non-empty bucket holds target <= total


def redop_code(op):
    if isinstance(op, int) and not isinstance(op, bool) and 0 <= op < 5:
        return op
    name = str(op).lower()
    if name.startswith("reduceop."):
        name = name[len("reduceop.") :]
    if name in REDOPS:
        return REDOPS[name]
    raise ValueError(f"op: {op!r} is not a collie reduction (sum, prod, min, max, avg)")


def policy_code(policy):
    if policy is None:
        return 0
    name = str(policy).lower().replace("-", "_")
    if name in POLICIES:
        return POLICIES[name]
    raise ValueError(f"policy: {policy!r} is not one of {', '.join(POLICIES)}")


def _comm_opts(name, backend, timeout, create_timeout, policy, device):
    if name is not None and not isinstance(name, str):
        raise TypeError("name: a str")
    if backend is not None and not isinstance(backend, str):
        raise TypeError("backend: a str such as 'tcp', 'nccl' or 'cpu:tcp,cuda:nccl'")
    return _lib.CommOpts(
        sizeof(_lib.CommOpts),
        name.encode() if name else None,
        backend.encode() if backend else None,
        timeout_ms(timeout, "timeout"),
        timeout_ms(create_timeout, "create_timeout"),
        policy_code(policy),
        None,
        None,
        -1 if device is None else int(device),
    )


def _child_opts(opts):
    """Options of a split/new_group child: those given, the parent's for the rest."""
    known = ("name", "backend", "timeout", "create_timeout", "policy", "device")
    unknown = sorted(set(opts) - set(known))
    if unknown:
        raise TypeError(f"unknown option(s) {', '.join(unknown)} (known: {', '.join(known)})")
    return _comm_opts(*(opts.get(k) for k in known))


def _same_dtype(what, *bufs):
    bufs = [b for b in bufs if b is not None]
    for b in bufs[1:]:
        if b.dtype != bufs[0].dtype:
            raise TypeError(
                f"{what}: buffers of different types ({DTYPE_NAMES[bufs[0].dtype]} and "
                f"{DTYPE_NAMES[b.dtype]})"
            )


def _per_rank(op, n, **vectors):
    """Each given per-rank vector (None: not given) has one entry per rank."""
    for what, v in vectors.items():
        if v is not None and len(v) != n:
            raise ValueError(f"{op}: {what} has {len(v)} entries, the comm {n} ranks")


def _extent(counts, displs):
    """Elements a v-buffer must hold: the blocks packed, or the end of the
    furthest block that has elements (collie never touches empty ones)."""
    if displs is None:
        return sum(counts)
    return max((d + c for d, c in zip(displs, counts) if c), default=0)


def _at_least(what, buf, need):
    if buf.count < need:
        raise ValueError(f"{what}: holds {buf.count} elements, the call writes {need}")


class Comm(Closable, Health, Shrink):
    """A communicator of `size` ranks; every rank creates it with the same name.

    Comm(engine, store, rank, size, name=None, backend=None, timeout=None,
    create_timeout=None, policy=None, device=None). Timeouts are seconds;
    policy is 'abort_comm', 'blocking_wait', 'abort_process', 'none' or
    None (COLLIE_BLOCKING_WAIT / COLLIE_ASYNC_ERROR_HANDLING, else abort_comm).
    """

    def __init__(
        self,
        engine,
        store,
        rank,
        size,
        name=None,
        backend=None,
        timeout=None,
        create_timeout=None,
        policy=None,
        device=None,
        _handle=None,
        _parent=None,
    ):
        _check_create_args(engine, None if _handle is not None else store, rank, size)
        self._engine = engine
        self._store = store
        self._parent = _parent
        self._own_store = None  # a store made for the comm (create_async from the environment)
        if _handle is not None:
            self._h = _handle
            return
        opts = _comm_opts(name, backend, timeout, create_timeout, policy, device)
        h = c_void_p()
        if store is None:
            st = lib.collie_comm_create_from_env(engine.handle, byref(opts), byref(h))
            check(st, "collie_comm_create_from_env")
        else:
            check(
                lib.collie_comm_create(engine.handle, store.handle, rank, size, byref(opts), byref(h)),
                "collie_comm_create",
            )
        self._h = h.value

    @classmethod
    def from_env(cls, engine, **opts):
        """COLLIE_STORE_ADDR, COLLIE_RANK, COLLIE_WORLD_SIZE (as collie-run sets them)."""
        return cls(engine, None, None, None, **opts)

    @classmethod
    async def create_async(
        cls,
        engine,
        store=None,
        rank=None,
        size=None,
        name=None,
        backend=None,
        timeout=None,
        create_timeout=None,
        policy=None,
        device=None,
    ):
        """`comm = await Comm.create_async(engine, store, rank, size, ...)`: the
        constructor's arguments; store=None connects to COLLIE_STORE_ADDR and
        takes rank and size from COLLIE_RANK / COLLIE_WORLD_SIZE when not
        given (as from_env). The rendezvous runs on collie's progress thread
        (collie_comm_create_post): the event loop never blocks on it. It is
        bounded by create_timeout (CollieTimeout naming the ranks that never
        came). Cancelling the awaiting task (asyncio.wait_for's timeout too)
        cancels the creation: ranks that joined the same generation fail at
        once naming this one, and what was made is destroyed in the
        background (never on the loop)."""
        own = None
        if store is None:
            rank = _env_int("COLLIE_RANK", "rank") if rank is None else rank
            size = _env_int("COLLIE_WORLD_SIZE", "size") if size is None else size
        _check_create_args(engine, store, rank, size)
        opts = _comm_opts(name, backend, timeout, create_timeout, policy, device)
        if store is None:
            # connects in the background (collie_store_connect returns at once)
            own = store = Store(engine, os.environ.get("COLLIE_STORE_ADDR"))
        h = c_void_p()

        def post(eh, sh, r, n, post_opts, out_work):
            opts.post = pointer(post_opts._obj)  # the engine's queue and the work's tag
            return lib.collie_comm_create_post(eh, sh, r, n, byref(opts), byref(h), out_work)

        try:
            work = engine.post("collie_comm_create_post", post, (engine.handle, store.handle, rank, size), None)
        except BaseException:
            if own is not None:
                own.close()
            raise
        comm = cls(engine, store, None, None, _handle=h.value)
        comm._own_store = own
        try:
            await work
        except BaseException:  # cancelled, or the creation failed
            work.cancel()
            comm._destroy_in_background()
            raise
        return comm

    # ---- the comm itself -------------------------------------------------------

    @property
    def handle(self):
        if not self._h:
            raise error_for(-7, "the comm is destroyed")
        return self._h

    @property
    def rank(self):
        return lib.collie_comm_rank(self.handle)

    @property
    def size(self):
        return lib.collie_comm_size(self.handle)

    @property
    def name(self):
        return lib.collie_comm_name(self.handle).decode()

    @property
    def generation(self):
        return lib.collie_comm_generation(self.handle)

    @property
    def engine(self):
        return self._engine

    def error(self):
        """None while healthy, else the exception describing the comm's fault."""
        st, msg = c_int(OK), c_char_p()
        lib.collie_comm_error(self.handle, byref(st), byref(msg))  # returns the status too
        if st.value == OK:
            return None
        return error_for(st.value, msg.value.decode(errors="replace") if msg.value else "",
                         self.fault())

    def stats(self):
        """A snapshot of the comm's counters (collie_comm_get_stats) as a dict.
        "latency" maps each op kind that completed to its count, mean_us and
        the estimated p50_us, p90_us, p99_us (latency_percentile: within a
        factor of 2 of the true value)."""
        st = _lib.CommStats()
        st.size = sizeof(st)
        check(lib.collie_comm_get_stats(self.handle, byref(st)))
        out = {
            f: getattr(st, f)
            for f, _ in _lib.CommStats._fields_
            if f not in ("size", "failed_by_status", "latency", "failed_by_kind")
        }
        out.update(stats_fields(st))
        out["failed_by_status"] = {
            lib.collie_status_name(-i).decode(): st.failed_by_status[i]
            for i in range(1, _lib.STATS_STATUSES)
            if st.failed_by_status[i]
        }
        lat = {}
        for i in range(_lib.STATS_OPS):
            name = lib.collie_stats_op_name(i)
            if name is None:
                break
            h = st.latency[i]
            if h.count:
                d = {"count": h.count, "mean_us": h.sum_ns / h.count / 1000.0}
                buckets = list(h.buckets)
                for q in PERCENTILES:
                    d[f"p{q}_us"] = latency_percentile(buckets, q)
                lat[name.decode()] = d
        out["latency"] = lat
        return out

    def abort(self, reason="aborted by the application"):
        """Fail every pending work with CollieAborted and close the transport."""
        check(lib.collie_comm_abort(self.handle, reason.encode()), "collie_comm_abort")

    def destroy(self):
        """Graceful: waits for pending works up to the comm's timeout, then aborts
        them. Returns True if nothing had to be aborted. Blocks the caller for
        all of that: from an event loop, use destroy_async."""
        if self._h:
            self._events_stop()  # before the event fd closes
        h, self._h = self._h, None
        if not h:
            return True
        st = lib.collie_comm_destroy(h)
        self._engine.reap()
        self._close_own_store()
        return st == OK

    async def destroy_async(self):
        """`await comm.destroy_async()`: destroy() without blocking the event
        loop: collie_comm_destroy_post runs the same bounded steps on collie's
        progress thread. The comm is unusable from the call on. Returns True
        if nothing had to be aborted. Cancelling the await does not cancel the
        destroy (it cannot be undone): it finishes in the background."""
        if self._h:
            self._events_stop()  # before the event fd closes
        h, self._h = self._h, None
        if not h:
            return True
        work = self._post_destroy(h)
        if work is None:
            return True
        return await asyncio.shield(_in_background(_destroy_done(work, self._take_own_store())))

    def _post_destroy(self, h):
        """Post collie_comm_destroy_post; None when the engine is gone (then
        the blocking form, which only frees memory, has run)."""
        try:
            return self._engine.post("collie_comm_destroy_post", lib.collie_comm_destroy_post, (h,), None)
        except CollieClosed:
            lib.collie_comm_destroy(h)
            self._close_own_store()
            return None

    def _destroy_in_background(self):
        if self._h:
            self._events_stop()
        h, self._h = self._h, None
        if not h:
            return
        work = self._post_destroy(h)
        if work is None:
            return
        store = self._take_own_store()
        try:
            asyncio.get_running_loop()
        except RuntimeError:  # no loop: wait here (a sync caller)
            try:
                work.wait()
            except Exception:
                pass
            if store is not None:
                store.close()
            return
        _in_background(_destroy_done(work, store))

    def _take_own_store(self):
        store, self._own_store = getattr(self, "_own_store", None), None
        return store

    def _close_own_store(self):
        store = self._take_own_store()
        if store is not None:
            store.close()

    def close(self):
        self.destroy()  # after the engine closed this only frees memory (collie.h)

    def __del__(self):
        """The last reference dropped (`comm = comm.shrink()` drops the old
        one): never block, wherever the collector runs (an event loop too):
        the destroy is posted (collie_comm_destroy_post) and finishes on
        collie's thread; the comm keeps its own store handle meanwhile."""
        try:
            if getattr(self, "_h", None):
                self._events_stop()
            h, self._h = getattr(self, "_h", None), None
            if h:
                self._post_destroy(h)  # the Work is dropped: the destroy goes on
                self._close_own_store()
        except Exception:
            pass

    def _child(self, st, h, what):
        if st == -8:  # COLLIE_ENOTMEMBER: this rank joins no group
            return None
        check(st, what)
        return Comm(self._engine, self._store, None, None, _handle=h.value, _parent=self)

    _child_opts_of = staticmethod(_child_opts)

    def _shrunk(self, h):
        return Comm(self._engine, self._store, None, None, _handle=h)

    def split(self, color, key=0, **opts):
        """New comm of the ranks with the same colour (None: join none and get
        None). Every rank of this comm calls it."""
        o = _child_opts(opts)
        h = c_void_p()
        st = lib.collie_comm_split(self.handle, -1 if color is None else int(color), int(key), byref(o), byref(h))
        return self._child(st, h, "collie_comm_split")

    def new_group(self, ranks, **opts):
        """A comm of the listed ranks, in that order; None on non-members."""
        rs = [int(r) for r in ranks]
        arr = (c_int * len(rs))(*rs)
        o = _child_opts(opts)
        h = c_void_p()
        st = lib.collie_comm_new_group(self.handle, arr, len(rs), byref(o), byref(h))
        return self._child(st, h, "collie_comm_new_group")

    # ---- posting ---------------------------------------------------------------

    def _post(self, what, fn, args, bufs, timeout, output, stream=False, s=None):
        args = (self.handle,) + tuple(args)
        if stream:
            args += (s,)
        return self._engine.post(what, fn, args, bufs, timeout, owner=self, output=output)

    # Each collective has a host form (name) and a device form (cuda_name);
    # _buf turns an argument into a Buffer for either.
    @staticmethod
    def _buf(obj, what, writable, dev, dtype=None, count=None):
        if obj is None:
            return None
        if dev and isinstance(obj, _DevicePtr):
            return device_buffer(obj.ptr, what, obj.count, dtype)
        if dev:
            return device_buffer(obj, what, count, dtype)
        return host_buffer(obj, what, writable, dtype)

    def _allreduce(self, dev, buf, out, op, timeout, stream, dtype, count):
        s = self._buf(buf, "buf", out is None, dev, dtype, count)
        r = self._buf(out, "out", True, dev, dtype, count) if out is not None else s
        _same_dtype("allreduce", s, r)
        _at_least("allreduce out", r, s.count)
        fn = lib.collie_cuda_allreduce if dev else lib.collie_allreduce
        return self._post(
            "allreduce", fn, (s.ptr, r.ptr, s.count, s.dtype, redop_code(op)), (s, r), timeout,
            r.obj, dev, _stream(stream),
        )

    def _broadcast(self, dev, buf, root, timeout, stream, dtype, count):
        b = self._buf(buf, "buf", True, dev, dtype, count)
        fn = lib.collie_cuda_broadcast if dev else lib.collie_broadcast
        return self._post(
            "broadcast", fn, (b.ptr, b.count, b.dtype, int(root)), (b,), timeout, b.obj, dev,
            _stream(stream),
        )

    def _reduce(self, dev, buf, out, op, root, timeout, stream, dtype, count):
        s = self._buf(buf, "buf", out is None, dev, dtype, count)
        r = self._buf(out, "out", True, dev, dtype, count) if out is not None else s
        _same_dtype("reduce", s, r)
        if int(root) == self.rank:
            _at_least("reduce out", r, s.count)
        fn = lib.collie_cuda_reduce if dev else lib.collie_reduce
        return self._post(
            "reduce", fn, (s.ptr, r.ptr, s.count, s.dtype, redop_code(op), int(root)), (s, r),
            timeout, r.obj, dev, _stream(stream),
        )

    def _allgather(self, dev, buf, out, timeout, stream, dtype, count):
        s = self._buf(buf, "buf", False, dev, dtype, count)
        r = self._buf(out, "out", True, dev, dtype)
        if r is None:
            raise TypeError("allgather: out is required (size * count elements)")
        _same_dtype("allgather", s, r)
        _at_least("allgather out", r, s.count * self.size)
        fn = lib.collie_cuda_allgather if dev else lib.collie_allgather
        return self._post(
            "allgather", fn, (s.ptr, r.ptr, s.count, s.dtype), (s, r), timeout, r.obj, dev,
            _stream(stream),
        )

    def _reduce_scatter(self, dev, buf, out, op, timeout, stream, dtype, count):
        s = self._buf(buf, "buf", False, dev, dtype)
        r = self._buf(out, "out", True, dev, dtype, count)
        if r is None:
            raise TypeError("reduce_scatter: out is required (count elements)")
        _same_dtype("reduce_scatter", s, r)
        _at_least("reduce_scatter buf", s, r.count * self.size)
        fn = lib.collie_cuda_reduce_scatter if dev else lib.collie_reduce_scatter
        return self._post(
            "reduce_scatter", fn, (s.ptr, r.ptr, r.count, s.dtype, redop_code(op)), (s, r), timeout,
            r.obj, dev, _stream(stream),
        )

    def _alltoall(self, dev, buf, out, timeout, stream, dtype, count):
        s = self._buf(buf, "buf", False, dev, dtype, count)
        r = self._buf(out, "out", True, dev, dtype, count)
        if r is None:
            raise TypeError("alltoall: out is required")
        _same_dtype("alltoall", s, r)
        n = self.size
        if s.count % n:
            raise ValueError(f"alltoall: buf holds {s.count} elements, not a multiple of size {n}")
        _at_least("alltoall out", r, s.count)
        fn = lib.collie_cuda_alltoall if dev else lib.collie_alltoall
        return self._post(
            "alltoall", fn, (s.ptr, r.ptr, s.count // n, s.dtype), (s, r), timeout, r.obj, dev,
            _stream(stream),
        )

    def _gather(self, dev, buf, out, root, timeout, stream, dtype, count):
        s = self._buf(buf, "buf", False, dev, dtype, count)
        r = self._buf(out, "out", True, dev, dtype)
        root = int(root)
        if root == self.rank:
            if r is None:
                raise TypeError("gather: out is required on the root (size * count elements)")
            _same_dtype("gather", s, r)
            _at_least("gather out", r, s.count * self.size)
        fn = lib.collie_cuda_gather if dev else lib.collie_gather
        return self._post(
            "gather", fn, (s.ptr, r.ptr if r else None, s.count, s.dtype, root), (s, r), timeout,
            r.obj if r else None, dev, _stream(stream),
        )

    def _scatter(self, dev, buf, out, root, timeout, stream, dtype, count):
        r = self._buf(out, "out", True, dev, dtype, count)
        if r is None:
            raise TypeError("scatter: out is required (count elements)")
        s = self._buf(buf, "buf", False, dev, dtype)
        root = int(root)
        if root == self.rank:
            if s is None:
                raise TypeError("scatter: buf is required on the root (size * count elements)")
            _same_dtype("scatter", s, r)
            _at_least("scatter buf", s, r.count * self.size)
        fn = lib.collie_cuda_scatter if dev else lib.collie_scatter
        return self._post(
            "scatter", fn, (s.ptr if s else None, r.ptr, r.count, r.dtype, root), (s, r), timeout,
            r.obj, dev, _stream(stream),
        )

    def _barrier(self, dev, timeout, stream):
        fn = lib.collie_cuda_barrier if dev else lib.collie_barrier
        return self._post("barrier", fn, (), (), timeout, None, dev, _stream(stream))

    def _allgatherv(self, dev, buf, out, counts, displs, timeout, stream, dtype):
        counts = list(counts)
        _per_rank("allgatherv", self.size, counts=counts, displs=displs)
        end = _extent(counts, displs)
        s = self._buf(buf, "buf", False, dev, dtype, counts[self.rank])
        r = self._buf(out, "out", True, dev, dtype, end)
        _same_dtype("allgatherv", s, r)
        _at_least("allgatherv buf", s, counts[self.rank])
        _at_least("allgatherv out", r, end)
        fn = lib.collie_cuda_allgatherv if dev else lib.collie_allgatherv
        ca, da = _lib.size_array(counts), _lib.size_array(displs)
        return self._post(
            "allgatherv", fn, (s.ptr, r.ptr, ca, da, s.dtype), (s, r), timeout, r.obj, dev,
            _stream(stream),
        )

    def _alltoallv(self, dev, buf, send_counts, out, recv_counts, sdispls, rdispls, timeout, stream, dtype):
        _per_rank("alltoallv", self.size, send_counts=send_counts, recv_counts=recv_counts,
                  send_displs=sdispls, recv_displs=rdispls)
        s = self._buf(buf, "buf", False, dev, dtype, _extent(send_counts, sdispls))
        r = self._buf(out, "out", True, dev, dtype, _extent(recv_counts, rdispls))
        _same_dtype("alltoallv", s, r)

        _at_least("alltoallv buf", s, _extent(send_counts, sdispls))
        _at_least("alltoallv out", r, _extent(recv_counts, rdispls))
        fn = lib.collie_cuda_alltoallv if dev else lib.collie_alltoallv
        arrays = [_lib.size_array(a) for a in (send_counts, sdispls, recv_counts, rdispls)]
        return self._post(
            "alltoallv", fn, (s.ptr, arrays[0], arrays[1], r.ptr, arrays[2], arrays[3], s.dtype),
            (s, r), timeout, r.obj, dev, _stream(stream),
        )

    def _p2p(self, dev, send, buf, peer, tag, timeout, stream, dtype, count):
        b = self._buf(buf, "buf", not send, dev, dtype, count)
        if send:
            fn = lib.collie_cuda_send if dev else lib.collie_send
        else:
            fn = lib.collie_cuda_recv if dev else lib.collie_recv
        if int(tag) < 0:
            raise ValueError(f"tag: {tag} (must be >= 0)")
        return self._post(
            "send" if send else "recv", fn, (b.ptr, b.count, b.dtype, int(peer), int(tag)), (b,),
            timeout, None if send else b.obj, dev, _stream(stream),
        )

    # ---- host collectives ------------------------------------------------------

    def allreduce(self, buf, out=None, op="sum", timeout=None):
        """Reduce `buf` over every rank into `out` (None: in place)."""
        return self._allreduce(False, buf, out, op, timeout, None, None, None)

    def broadcast(self, buf, root=0, timeout=None):
        return self._broadcast(False, buf, root, timeout, None, None, None)

    def reduce(self, buf, out=None, op="sum", root=0, timeout=None):
        """The reduction lands in `out` (None: in `buf`) on the root only."""
        return self._reduce(False, buf, out, op, root, timeout, None, None, None)

    def allgather(self, buf, out, timeout=None):
        """`out` (size * len(buf)) gets rank r's buf at block r."""
        return self._allgather(False, buf, out, timeout, None, None, None)

    def reduce_scatter(self, buf, out, op="sum", timeout=None):
        """`buf` holds size blocks of len(out); rank r gets block r reduced."""
        return self._reduce_scatter(False, buf, out, op, timeout, None, None, None)

    def alltoall(self, buf, out, timeout=None):
        """Block p of `buf` goes to rank p; block p of `out` comes from rank p."""
        return self._alltoall(False, buf, out, timeout, None, None, None)

    def gather(self, buf, out=None, root=0, timeout=None):
        return self._gather(False, buf, out, root, timeout, None, None, None)

    def scatter(self, buf, out, root=0, timeout=None):
        """The root's `buf` (size blocks of len(out)); others pass buf=None."""
        return self._scatter(False, buf, out, root, timeout, None, None, None)

    def barrier(self, timeout=None):
        return self._barrier(False, timeout, None)

    def allgatherv(self, buf, out, counts, displs=None, timeout=None):
        """Rank r contributes counts[r] elements; block p lands at displs[p]
        (None: packed)."""
        return self._allgatherv(False, buf, out, counts, displs, timeout, None, None)

    def alltoallv(self, buf, send_counts, out, recv_counts, send_displs=None, recv_displs=None, timeout=None):
        return self._alltoallv(
            False, buf, send_counts, out, recv_counts, send_displs, recv_displs, timeout, None, None
        )

    def send(self, buf, peer, tag=0, timeout=None):
        return self._p2p(False, True, buf, peer, tag, timeout, None, None, None)

    def recv(self, buf, peer=None, tag=0, timeout=None):
        """Receive into `buf` from `peer`, or with peer=None from any rank
        (COLLIE_ANY_SOURCE): the work's `source` then says which."""
        peer = -1 if peer is None else peer
        return self._p2p(False, False, buf, peer, tag, timeout, None, None, None)

    # ---- Python objects (pickle; _objects.py) --------------------------------
    # Unpickling runs code the sender chose: these calls are as trusted as the
    # comm's other ranks (collie takes messages only from members of the comm).

    def broadcast_object(self, obj, root=0, timeout=None, first_bytes=_objects.FIRST_BYTES):
        """Every rank returns the root's `obj` (others pass anything, e.g.
        None). One broadcast when the pickle fits `first_bytes` (the same on
        every rank), two otherwise; no size cap. `timeout`: each broadcast's."""
        return _objects.run(_objects.broadcast_steps(self, obj, root, timeout, first_bytes))

    async def broadcast_object_async(self, obj, root=0, timeout=None, first_bytes=_objects.FIRST_BYTES):
        return await _objects.arun(_objects.broadcast_steps(self, obj, root, timeout, first_bytes))

    def send_object(self, obj, dst, tag=0, timeout=None):
        """Send `obj` to rank `dst` (tag in [0, 2^32)); returns once sent."""
        return _objects.run(_objects.send_steps(self, obj, dst, tag, timeout))

    async def send_object_async(self, obj, dst, tag=0, timeout=None):
        return await _objects.arun(_objects.send_steps(self, obj, dst, tag, timeout))

    def recv_object(self, src=None, tag=0, timeout=None):
        """Receive an object sent with send_object: returns (obj, sender).
        src=None takes it from any rank (COLLIE_ANY_SOURCE)."""
        return _objects.recv(self, src, tag, timeout)

    async def recv_object_async(self, src=None, tag=0, timeout=None):
        return await _objects.arecv(self, src, tag, timeout)

    # ---- CUDA collectives (collie_cuda.h): device buffers on a stream -----------
    # A buffer is a CUDA array object or an int device pointer with count= and
    # dtype=. The work completes when the GPU has finished.

    def cuda_allreduce(self, buf, out=None, op="sum", stream=None, count=None, dtype=None, timeout=None):
        return self._allreduce(True, buf, out, op, timeout, stream, dtype, count)

    def cuda_broadcast(self, buf, root=0, stream=None, count=None, dtype=None, timeout=None):
        return self._broadcast(True, buf, root, timeout, stream, dtype, count)

    def cuda_reduce(self, buf, out=None, op="sum", root=0, stream=None, count=None, dtype=None, timeout=None):
        return self._reduce(True, buf, out, op, root, timeout, stream, dtype, count)

    def cuda_allgather(self, buf, out, stream=None, count=None, dtype=None, timeout=None):
        if isinstance(out, int) and count is not None:
            out = _DevicePtr(out, count * self.size)
        return self._allgather(True, buf, out, timeout, stream, dtype, count)

    def cuda_reduce_scatter(self, buf, out, op="sum", stream=None, count=None, dtype=None, timeout=None):
        if isinstance(buf, int) and count is not None:
            buf = _DevicePtr(buf, count * self.size)
        return self._reduce_scatter(True, buf, out, op, timeout, stream, dtype, count)

    def cuda_alltoall(self, buf, out, stream=None, count=None, dtype=None, timeout=None):
        """count: the whole buffer's elements (size blocks) for raw pointers."""
        return self._alltoall(True, buf, out, timeout, stream, dtype, count)

    def cuda_gather(self, buf, out=None, root=0, stream=None, count=None, dtype=None, timeout=None):
        if isinstance(out, int) and count is not None:
            out = _DevicePtr(out, count * self.size)
        return self._gather(True, buf, out, root, timeout, stream, dtype, count)

    def cuda_scatter(self, buf, out, root=0, stream=None, count=None, dtype=None, timeout=None):
        if isinstance(buf, int) and count is not None:
            buf = _DevicePtr(buf, count * self.size)
        return self._scatter(True, buf, out, root, timeout, stream, dtype, count)

    def cuda_barrier(self, stream=None, timeout=None):
        return self._barrier(True, timeout, stream)

    def cuda_allgatherv(self, buf, out, counts, displs=None, stream=None, dtype=None, timeout=None):
        return self._allgatherv(True, buf, out, counts, displs, timeout, stream, dtype)

    def cuda_alltoallv(
        self, buf, send_counts, out, recv_counts, send_displs=None, recv_displs=None, stream=None,
        dtype=None, timeout=None,
    ):
        return self._alltoallv(
            True, buf, send_counts, out, recv_counts, send_displs, recv_displs, timeout, stream, dtype
        )

    def cuda_send(self, buf, peer, tag=0, stream=None, count=None, dtype=None, timeout=None):
        return self._p2p(True, True, buf, peer, tag, timeout, stream, dtype, count)

    def cuda_recv(self, buf, peer, tag=0, stream=None, count=None, dtype=None, timeout=None):
        return self._p2p(True, False, buf, peer, tag, timeout, stream, dtype, count)


class _DevicePtr:
    """A raw device pointer with its element count (for the cuda_* forms whose
    second buffer is a different size from the first)."""

    def __init__(self, ptr, count):
        self.ptr, self.count = ptr, count


def _async_form(name):
    async def form(self, *args, **kwargs):
        return await getattr(self, name)(*args, **kwargs)

    form.__name__ = form.__qualname__ = f"{name}_async"
    form.__doc__ = f"`await comm.{name}_async(...)`: posts {name} and resolves to its output."
    return form


# asyncio: every collective (host and cuda_*) has an _async form resolving to
# its output (None for barrier and send) or raising its error.
for _name in ("allreduce", "broadcast", "reduce", "allgather", "reduce_scatter", "alltoall",
              "gather", "scatter", "barrier", "allgatherv", "alltoallv", "send", "recv"):
    setattr(Comm, f"{_name}_async", _async_form(_name))
    setattr(Comm, f"cuda_{_name}_async", _async_form(f"cuda_{_name}"))
