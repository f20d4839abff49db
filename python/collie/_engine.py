"""Engine and Work: collie's progress engine and work handles in Python.

Design notes
- No Python code ever runs on collie's progress thread: the package sets no
  Python callbacks (log_to_python installs libcollie's own queue handler,
  _log.py). Instead every work is posted with the engine's completion
  queue (collie_cq); completions are taken from it ("reaped") by whichever
  Python thread next posts, tests or waits, and by an asyncio loop watching
  the queue's fd with loop.add_reader.
- Buffer lifetime: each post records a _Pending (its Buffers, its asyncio
  futures) under a fresh key before the post and gives that key as the
  work's tag, so a concurrent reap always finds it (and no lock is held
  while collie is called). The
  Buffers are dropped only once completion is observed - by Work.test /
  wait or by the reap - so a Work dropped in flight leaves its memory
  pinned until collie is done with it, never less.
- A Work owns one collie reference (released by __del__); the queue holds
  another until the reap. Work.wait gives up the GIL (ctypes does) and is
  bounded: by its timeout and always by the work's own deadline.
- fork(): an Engine (and what was made from it) that a child inherited is
  the parent's; collie refuses it in the child (ESTATE, naming the fork),
  and closing or collecting it there does nothing. The child makes its own.
"""

import asyncio
import os
import threading
import weakref
from ctypes import byref, c_void_p, sizeof

from . import _lib
from ._buffers import stream_handle
from ._faults import work_fault
from .errors import INPROGRESS, OK, CollieClosed, check, error_for

lib = _lib.lib


def timeout_ms(timeout, what="timeout"):
    """Seconds (float) -> collie milliseconds for a post: None = the owner's
    default, math.inf or a negative number = none."""
    if timeout is None:
        return 0  # COLLIE_TIMEOUT_DEFAULT
    t = float(timeout)
    if t != t:
        raise ValueError(f"{what}: NaN")
    if t < 0 or t == float("inf"):
        return -1  # COLLIE_TIMEOUT_INFINITE
    ms = int(round(t * 1000))
    if ms <= 0:
        raise ValueError(f"{what}: {timeout} s rounds to 0 ms (use a positive timeout)")
    if ms > 2**31 - 1:
        raise ValueError(f"{what}: {timeout} s is over collie's limit of 2^31-1 ms")
    return ms


def wait_ms(timeout):
    """Seconds -> collie milliseconds for a wait: None = until done (still
    bounded by the work's deadline), 0 = poll."""
    if timeout is None:
        return -1
    t = float(timeout)
    if t != t or t < 0:
        raise ValueError(f"timeout: {timeout} (seconds >= 0, or None)")
    return min(int(t * 1000 + 0.999), 2**31 - 1)


class _Pending:
    __slots__ = ("buffers", "futures", "done", "status", "message", "fault")

    def __init__(self, buffers):
        self.buffers = buffers
        self.futures = []
        self.done = False
        self.status = INPROGRESS
        self.message = ""
        self.fault = None


def _settle(fut, status, message, fault):
    if not fut.done():
        fut.set_result((status, message, fault))


class Closable:
    """Context manager and finaliser for objects with close()."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        # an object a forked child inherited is its parent's: left alone
        # (its engine's thread is not in this process; collie refuses it)
        eng = self if isinstance(self, Engine) else getattr(self, "_engine", None)
        if eng is not None and getattr(eng, "_pid", None) != os.getpid():
            return
        try:
            self.close()
        except Exception:
            pass


class Engine(Closable):
    """collie's progress engine: one progress thread for every store and comm
    made from it. Use as a context manager or call close()."""

    def __init__(self, name=None, stall_ms=0):
        opts = _lib.EngineOpts(sizeof(_lib.EngineOpts), name.encode() if name else None, stall_ms)
        h = c_void_p()
        check(lib.collie_engine_create(byref(opts), byref(h)), "collie_engine_create")
        cq = c_void_p()
        st = lib.collie_cq_create(byref(cq))
        if st != OK:
            lib.collie_engine_destroy(h)
            check(st, "collie_cq_create")
        self._h = h.value
        self._cq = cq.value
        self._lock = threading.Lock()
        self._pending = {}  # post tag -> _Pending, until the reap
        self._next_key = 0
        self._loops = weakref.WeakSet()
        self._closed = False
        self._pid = os.getpid()  # a forked child's copy is left alone (close)

    @property
    def handle(self):
        if self._closed:
            raise CollieClosed(-7, "the engine is closed")
        return self._h

    def stats(self):
        st = _lib.EngineStats()
        st.size = sizeof(st)
        check(lib.collie_engine_get_stats(self.handle, byref(st)))
        return {f: getattr(st, f) for f, _ in _lib.EngineStats._fields_ if f != "size"}

    def close(self):
        """Stop the engine: pending works fail with CollieClosed."""
        if self._closed:
            return
        if self._pid != os.getpid():  # a forked child's copy: the parent's to stop
            self._closed = True
            return
        for loop in list(self._loops):
            if not loop.is_closed():
                try:
                    loop.remove_reader(lib.collie_cq_fd(self._cq))
                except Exception:
                    pass
        lib.collie_engine_destroy(self._h)
        self._closed = True
        self.reap()
        lib.collie_cq_destroy(self._cq)
        self._cq = None

    # ---- posting and reaping ------------------------------------------------

    def post(self, what, fn, args, buffers, timeout=None, owner=None, output=None):
        """Call a collie post function fn(*args, opts, &work) and wrap the work.
        The work's tag names its _Pending, recorded before the post, so a
        reap on another thread finds it without a lock held across the call."""
        if self._closed:
            raise CollieClosed(-7, f"{what}: the engine is closed")
        pend = _Pending(buffers)
        with self._lock:
            key = self._next_key = self._next_key + 1
            self._pending[key] = pend
        opts = _lib.PostOpts(sizeof(_lib.PostOpts), timeout_ms(timeout), None, None, self._cq, key)
        w = c_void_p()
        st = fn(*args, byref(opts), byref(w))
        if st != OK:
            with self._lock:
                del self._pending[key]
            fault = getattr(owner, "fault", None)
            if fault is not None and st in (-5, -6, -7):  # refused by a failed comm: its fault
                f = fault()
                if f is not None:
                    raise error_for(st, _lib.last_error() or what, f)
            check(st, what)
        self.reap()
        return Work(self, w.value, pend, owner, output)

    def reap(self):
        """Take every completed work off the queue; returns how many."""
        cq = self._cq
        if cq is None:
            return 0
        n = 0
        w = c_void_p()
        while lib.collie_cq_pop(cq, 0, byref(w)) == OK:
            n += 1
            status = lib.collie_work_result(w)
            msg = lib.collie_work_error_message(w).decode(errors="replace") if status else ""
            fault = work_fault(w) if status else None
            with self._lock:
                pend = self._pending.pop(lib.collie_work_tag(w), None)
                if pend is not None:
                    pend.done, pend.status, pend.message = True, status, msg
                    pend.fault = fault
                    pend.buffers = None
                    futures, pend.futures = pend.futures, []
            lib.collie_work_release(w)
            if pend is not None:
                for loop, fut in futures:
                    if not loop.is_closed():
                        loop.call_soon_threadsafe(_settle, fut, status, msg, fault)
        return n

    def _watch(self, loop):
        if loop not in self._loops:
            loop.add_reader(lib.collie_cq_fd(self._cq), self.reap)
            self._loops.add(loop)


class Work:
    """A handle on one posted operation (collie_work)."""

    def __init__(self, engine, handle, pend, owner=None, output=None):
        self._engine = engine
        self._h = handle
        self._pend = pend
        self._owner = owner  # keeps the comm / store alive while the Work is
        self._output = output

    def __del__(self):
        h, self._h = getattr(self, "_h", None), None
        if h:
            try:
                lib.collie_work_release(h)
            except Exception:
                pass

    def _observed(self):
        # completion is visible: collie never touches the buffers again
        self._pend.buffers = None

    @property
    def status(self):
        """collie's status code: 1 (in progress) until done, then 0 or the error."""
        return lib.collie_work_result(self._h)

    @property
    def error_message(self):
        return lib.collie_work_error_message(self._h).decode(errors="replace")

    def test(self):
        """True once the work is done (any status). Never blocks."""
        done = bool(lib.collie_work_test(self._h))
        if done:
            self._observed()
        self._engine.reap()
        return done

    def wait(self, timeout=None):
        """Block until done or `timeout` seconds pass (None: until done, still
        bounded by the work's deadline; 0: poll). Returns True when the work
        succeeded, False when the wait gave up first (the work goes on);
        raises the work's error (CollieTimeout, ColliePeerError, ...)."""
        st = lib.collie_work_wait(self._h, wait_ms(timeout))
        if st == INPROGRESS:
            return False
        self._observed()
        self._engine.reap()
        if st != OK:
            raise error_for(st, self.error_message, work_fault(self._h))
        return True

    def result(self, timeout=None):
        """Wait, then return the output buffer (None for barrier/send);
        raise the error, or CollieTimeout if `timeout` passed first."""
        if not self.wait(timeout):
            raise error_for(-3, f"Work.result: still running after {timeout} s")
        return self._output

    def exception(self):
        """The error as an exception once done (None if it succeeded or is pending)."""
        st = self.status
        if st in (OK, INPROGRESS):
            return None
        return error_for(st, self.error_message, work_fault(self._h))

    @property
    def fault(self):
        """The Fault of a done, failed work (kind, ranks, ...); None otherwise."""
        return work_fault(self._h) if self.status not in (OK, INPROGRESS) else None

    def cancel(self):
        """Cancel if not done: True if this call cancelled it, or (a receive or a CUDA
        work, from a thread other than the progress thread) asked the progress thread
        to, which may still see it complete first: its status says which."""
        return lib.collie_work_cancel(self._h) == OK

    def info(self):
        d = _lib.WorkDetails()
        check(lib.collie_work_info(self._h, byref(d)))
        out = {f: getattr(d, f) for f, _ in _lib.WorkDetails._fields_}
        out["op"] = d.op.decode() if d.op else ""
        return out

    def wait_stream(self, stream=None):
        """A CUDA work: make `stream` wait for its GPU completion without
        blocking the host (collie_work_wait_stream)."""
        check(lib.collie_work_wait_stream(self._h, stream_handle(stream)), "wait_stream")

    @property
    def seq(self):
        return lib.collie_work_seq(self._h)

    @property
    def source(self):
        """A receive's sender (for recv with src=None, once done); None for
        other works or while unknown (collie_work_source)."""
        r = lib.collie_work_source(self._h)
        return None if r < 0 else r

    def __await__(self):
        loop = asyncio.get_running_loop()
        eng, pend = self._engine, self._pend
        fut = loop.create_future()
        with eng._lock:
            if pend.done:
                fut.set_result((pend.status, pend.message, pend.fault))
            else:
                pend.futures.append((loop, fut))
        if not fut.done():
            eng._watch(loop)
            eng.reap()  # it may have completed before the reader was on
        status, message, fault = yield from fut.__await__()
        self._observed()
        if status != OK:
            raise error_for(status, message, fault)
        return self._output

    def __repr__(self):
        st = self.status
        state = "pending" if st == INPROGRESS else lib.collie_status_name(st).decode()
        return f"<collie.Work seq={self.seq} {state}>"

