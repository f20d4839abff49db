"""collie's log lines in Python's logging (logger "collie"): log_to_python.

Design notes
- No Python code runs on collie's threads: libcollie's own handler
  (collie_log_queue_handler) copies each line into a bounded ring, and a
  daemon thread of this package ("collie-log") takes them out
  (collie_log_queue_pop gives up the GIL while it waits, at most 200 ms,
  so the thread notices a stop) and hands them to logging. A progress
  thread therefore never waits for the GIL, whatever holds it (a C++
  extension blocked in collie with the GIL held included).
- A line arriving while the ring is full is dropped by collie and counted;
  the thread reports each new count as one WARNING ("N lines dropped").
- Records: logger "collie", the level mapped (ERROR, WARNING, INFO,
  DEBUG), the time collie took the line (record.created), the text as on
  stderr ("module: comm 'name' rank r: message"), and the fields as
  attributes collie_module, collie_comm (None) and collie_rank (-1).
- Which lines are made at all is collie's level (COLLIE_LOG, default warn);
  log_to_python(level=...) sets it from a logging level. The logger's own
  level and handlers then apply as usual.
- Stop (log_to_python(False), and atexit at interpreter exit - registered
  after logging's own, so it runs first): under _lock, clear _state,
  detach the handler (collie_set_log_handler returns only once no call of
  it runs; lines go to stderr again) and tell the thread to stop; then,
  outside _lock, join it (bounded). The thread itself emits what is left
  and frees the ring as it ends, so the ring is never freed under it (a
  logging handler stuck past the join keeps it until it returns). A stop
  from the collie-log thread (a logging handler calling
  log_to_python(False)) does the same without the join: the thread ends
  once the handler returns, and a later log_to_python(True) starts a new
  ring and thread. Nothing of this package takes the GIL from a foreign
  thread, and the thread is gone before Python finalizes.
"""

import atexit
import logging
import os
import threading
from ctypes import byref, c_void_p, cast, sizeof

from . import _lib
from .errors import OK, check

lib = _lib.lib
logger = logging.getLogger("collie")

_LEVELS = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO, 3: logging.DEBUG}
POP_MS = 200
JOIN_S = 5.0
_lock = threading.Lock()  # guards _state: start and stop from any thread
_state = None  # (queue handle, stop event, thread) while routing


def _collie_level(level):
    if isinstance(level, str):
        name = level.upper()
        value = logging.getLevelName(name)
        if not isinstance(value, int):
            raise ValueError(f"level: {level!r} is no logging level (DEBUG, INFO, WARNING, ERROR)")
        level = value
    if not isinstance(level, int) or isinstance(level, bool):
        raise TypeError(f"level: a logging level (int or name), got {type(level).__name__}")
    if level <= logging.DEBUG:
        return 3
    if level <= logging.INFO:
        return 2
    if level <= logging.WARNING:
        return 1
    return 0


def _emit(r):
    lvl = _LEVELS.get(r.level, logging.ERROR)
    if not logger.isEnabledFor(lvl):
        return
    module = (r.module or b"").decode(errors="replace")
    comm = r.comm.decode(errors="replace") if r.comm else None
    where = ""
    if comm is not None:
        where = f"comm '{comm}' rank {r.rank}: " if r.rank >= 0 else f"comm '{comm}': "
    msg = f"{module}: {where}{(r.message or b'').decode(errors='replace')}"
    rec = logger.makeRecord(
        logger.name, lvl, "(collie)", 0, msg, None, None,
        extra={"collie_module": module, "collie_comm": comm, "collie_rank": r.rank},
    )
    rec.created = r.time_ns / 1e9
    rec.msecs = (r.time_ns // 1_000_000) % 1000
    logger.handle(rec)


def _reader(q, stop):
    rec = _lib.LogRecord()
    reported = 0
    while not stop.is_set():
        rec.size = sizeof(rec)
        st = lib.collie_log_queue_pop(q, POP_MS, byref(rec))
        try:
            if st == OK:
                _emit(rec)
            dropped = lib.collie_log_queue_dropped(q)
            if dropped != reported:
                logger.warning("collie: %d log lines dropped (the reader fell behind)",
                               dropped - reported)
                reported = dropped
        except Exception:  # a failing logging handler must not end the routing
            pass
    # stopped: the handler is detached, so nothing adds lines any more
    for _ in range(1 << 20):  # bounded by the ring's largest capacity
        rec.size = sizeof(rec)
        if lib.collie_log_queue_pop(q, 0, byref(rec)) != OK:
            break
        try:
            _emit(rec)
        except Exception:
            pass
    lib.collie_log_queue_destroy(q)


def log_to_python(on=True, level=None, capacity=4096):
    """Route collie's log lines to logging.getLogger("collie") (on=True) or
    back to stderr / COLLIE_LOG_FILE (on=False). `level` (a logging level or
    its name) also sets which lines collie makes (collie_set_log_level);
    None leaves COLLIE_LOG's. `capacity`: lines held while the reader
    thread is behind (more are dropped and counted). Idempotent; callable
    from any thread, a logging handler (the collie-log thread) included."""
    global _state
    if level is not None:
        lib.collie_set_log_level(_collie_level(level))
    old = None
    with _lock:
        if on and _state is None:
            q = c_void_p()
            check(lib.collie_log_queue_create(int(capacity), byref(q)), "collie_log_queue_create")
            stop = threading.Event()
            t = threading.Thread(target=_reader, args=(q.value, stop), name="collie-log", daemon=True)
            t.start()
            lib.collie_set_log_handler(cast(lib.collie_log_queue_handler, c_void_p), q.value)
            _state = (q.value, stop, t)
        elif not on and _state is not None:
            old, _state = _state, None
            # returns once no handler call runs; lines go to stderr again
            lib.collie_set_log_handler(None, None)
            old[1].set()
    if old is not None and old[2] is not threading.current_thread():
        old[2].join(JOIN_S)  # outside _lock: a handler calling log_to_python must not wait on us


@atexit.register
def _at_exit():
    log_to_python(False)


def _after_fork_in_child():
    """The routing's reader thread is the parent's: a child that inherited
    the routing gets lines on stderr again (collie's own handler) and may
    route them anew with log_to_python (its ring is left to the parent)."""
    global _state, _lock
    _lock = threading.Lock()  # another parent thread may have held it at the fork
    if _state is not None:
        _state = None
        lib.collie_set_log_handler(None, None)


os.register_at_fork(after_in_child=_after_fork_in_child)
