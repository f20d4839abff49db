"""Loading libcollie and declaring the C functions the package calls.

Design notes
- The library is found in this order: $COLLIE_LIB (a path), the build tree
  this package sits in (build/lib/libcollie.so.0 beside python/), the
  installed one next to this package (<prefix>/lib), then the dynamic
  loader's search path (libcollie.so.0). The soname's major number is the
  ABI the declarations below are written for.
- Every function the package calls is declared once in SIGNATURES, as
  collie.h spells it; tests/python/test_signatures.py parses collie.h (with
  the parts it includes) and collie_cuda.h and checks each entry (argument
  count and C types), so a header change cannot leave a stale declaration
  here.
- ctypes.CDLL releases the GIL around every call: a blocking wait in C
  never holds up the interpreter's other threads.
"""

import ctypes
import ctypes.util
import os
from ctypes import (
    POINTER,
    c_bool,
    c_char_p,
    c_int,
    c_int32,
    c_int64,
    c_size_t,
    c_uint16,
    c_uint32,
    c_uint64,
    c_void_p,
)

SONAME = "libcollie.so.0"

p = c_void_p  # every opaque collie object is passed as a void pointer
pp = POINTER(c_void_p)
c_size_p = POINTER(c_size_t)


class EngineOpts(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("name", c_char_p),
        ("stall_ms", c_int32),
        ("on_stall", c_void_p),
        ("on_stall_arg", c_void_p),
    ]


class PostOpts(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("timeout_ms", c_int32),
        ("cb", c_void_p),
        ("cb_arg", c_void_p),
        ("cq", c_void_p),
        ("tag", c_uint64),
    ]


class WorkDetails(ctypes.Structure):
    _fields_ = [
        ("op", c_char_p),
        ("seq", c_uint64),
        ("bytes", c_uint64),
        ("status", c_int),
        ("timeout_ms", c_int32),
        ("post_ns", c_int64),
        ("start_ns", c_int64),
        ("end_ns", c_int64),
        ("deadline_ns", c_int64),
    ]


class StoreServerOpts(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("token", c_char_p),
        ("max_key_size", c_uint32),
        ("max_value_size", c_uint32),
        ("max_keys", c_uint32),
        ("max_connections", c_uint32),
        ("insecure", ctypes.c_int),
    ]


class StoreOpts(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("token", c_char_p),
        ("timeout_ms", c_int32),
        ("max_backoff_ms", c_int32),
    ]


class CommOpts(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("name", c_char_p),
        ("backend", c_char_p),
        ("timeout_ms", c_int32),
        ("create_timeout_ms", c_int32),
        ("policy", c_int),
        ("on_error", c_void_p),
        ("on_error_arg", c_void_p),
        ("device", c_int),
        ("post", POINTER(PostOpts)),  # collie_comm_create_post's completion
    ]


class ShrinkOpts(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("timeout_ms", c_int32),
        ("comm", POINTER(CommOpts)),  # the new comm's options (NULL: the old comm's)
    ]


class GrowOpts(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("count", c_int),
        ("timeout_ms", c_int32),
        ("comm", POINTER(CommOpts)),
        ("rank", c_int),  # a joiner's wish (-1: any)
    ]


FAULT_RANKS = 64
FAULT_NUM_KINDS = 9  # COLLIE_FAULT_NUM_KINDS


class Fault(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("status", c_int),
        ("kind", c_int),
        ("view", c_int),
        ("origin", c_int),
        ("nranks", c_int),
        ("ranks", c_int * FAULT_RANKS),
    ]


class PeerHealth(ctypes.Structure):
    _fields_ = [
        ("state", c_int),
        ("heard_ago_ms", c_int64),
        ("seq", c_uint64),
    ]


class CommEvent(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("kind", c_int),
        ("rank", c_int),
        ("status", c_int),
        ("fault_kind", c_int),
        ("time_ns", c_int64),
        ("dropped", c_uint64),
    ]


LATENCY_BUCKETS = 31
STATS_OPS = 16
STATS_STATUSES = 24


class LatencyHistogram(ctypes.Structure):
    _fields_ = [
        ("count", c_uint64),
        ("sum_ns", c_uint64),
        ("buckets", c_uint64 * LATENCY_BUCKETS),
    ]


class CommStats(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("generation", c_uint64),
        ("status", c_int),
        ("connections", c_uint32),
        ("posted", c_uint64),
        ("completed", c_uint64),
        ("failed", c_uint64),
        ("in_flight", c_uint64),
        ("bytes", c_uint64),
        ("failed_by_status", c_uint64 * STATS_STATUSES),
        ("store_reconnects", c_uint64),
        ("stalls", c_uint64),
        ("latency", LatencyHistogram * STATS_OPS),
        ("shm_connections", c_uint32),
        ("shm_single_copy_bytes", c_uint64),
        ("fault_kind", c_int),
        ("failed_by_kind", c_uint64 * FAULT_NUM_KINDS),
        ("peers_dead", c_uint32),
        ("peers_suspected", c_uint32),
        ("peers_left", c_uint32),
        ("shrinks", c_uint32),
        ("grows", c_uint32),
    ]


class LogRecord(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("level", c_int),
        ("module", c_char_p),
        ("comm", c_char_p),
        ("rank", c_int),
        ("message", c_char_p),
        ("time_ns", c_int64),
    ]


class EngineStats(ctypes.Structure):
    _fields_ = [
        ("size", c_size_t),
        ("works_posted", c_uint64),
        ("works_completed", c_uint64),
        ("works_failed", c_uint64),
        ("works_in_flight", c_uint64),
        ("stalls", c_uint64),
        ("residents", c_uint32),
        ("helper_steps", c_uint64),
    ]


PO = POINTER(PostOpts)
# common tails: (post opts, work out)
_post = [PO, pp]
_stream = [c_void_p]  # collie_cuda_stream_t

# name -> (restype, [argtypes]) exactly as collie.h / collie_cuda.h declare them
SIGNATURES = {
    "collie_version": (c_int, []),
    "collie_version_string": (c_char_p, []),
    "collie_strerror": (c_char_p, [c_int]),
    "collie_status_name": (c_char_p, [c_int]),
    "collie_last_error": (c_char_p, []),
    "collie_dtype_size": (c_size_t, [c_int]),
    "collie_engine_create": (c_int, [POINTER(EngineOpts), pp]),
    "collie_engine_destroy": (c_int, [p]),
    "collie_engine_get_stats": (c_int, [p, POINTER(EngineStats)]),
    "collie_work_test": (c_bool, [p]),
    "collie_work_result": (c_int, [p]),
    "collie_work_wait": (c_int, [p, c_int32]),
    "collie_work_cancel": (c_int, [p]),
    "collie_work_hold": (None, [p]),
    "collie_work_release": (None, [p]),
    "collie_work_error_message": (c_char_p, [p]),
    "collie_work_seq": (c_uint64, [p]),
    "collie_work_tag": (c_uint64, [p]),
    "collie_work_source": (c_int, [p]),
    "collie_work_info": (c_int, [p, POINTER(WorkDetails)]),
    "collie_cq_create": (c_int, [pp]),
    "collie_cq_fd": (c_int, [p]),
    "collie_cq_pop": (c_int, [p, c_int32, pp]),
    "collie_cq_size": (c_size_t, [p]),
    "collie_cq_destroy": (None, [p]),
    "collie_store_server_create": (
        c_int,
        [p, c_char_p, c_uint16, POINTER(StoreServerOpts), pp],
    ),
    "collie_store_server_port": (c_uint16, [p]),
    "collie_store_server_num_connections": (c_size_t, [p]),
    "collie_store_server_destroy": (None, [p]),
    "collie_store_connect": (c_int, [p, c_char_p, POINTER(StoreOpts), pp]),
    "collie_store_prefix": (c_int, [p, c_char_p, pp]),
    "collie_store_destroy": (None, [p]),
    "collie_store_address": (c_char_p, [p]),
    "collie_store_post_set": (c_int, [p, c_char_p, c_void_p, c_size_t] + _post),
    "collie_store_post_get": (c_int, [p, c_char_p] + _post),
    "collie_store_post_add": (c_int, [p, c_char_p, c_int64] + _post),
    "collie_store_post_compare_set": (
        c_int,
        [p, c_char_p, c_void_p, c_size_t, c_void_p, c_size_t] + _post,
    ),
    "collie_store_post_check": (c_int, [p, POINTER(c_char_p), c_size_t] + _post),
    "collie_store_post_wait": (c_int, [p, POINTER(c_char_p), c_size_t] + _post),
    "collie_store_post_delete": (c_int, [p, c_char_p] + _post),
    "collie_store_post_delete_prefix": (c_int, [p, c_char_p] + _post),
    "collie_store_post_num_keys": (c_int, [p] + _post),
    "collie_store_post_multi_get": (c_int, [p, POINTER(c_char_p), c_size_t] + _post),
    "collie_store_post_multi_set": (
        c_int,
        [p, POINTER(c_char_p), POINTER(c_void_p), c_size_p, c_size_t] + _post,
    ),
    "collie_store_post_append": (c_int, [p, c_char_p, c_void_p, c_size_t] + _post),
    "collie_store_post_barrier": (c_int, [p, c_char_p, c_uint32] + _post),
    "collie_store_work_value": (c_int, [p, pp, c_size_p]),
    "collie_store_work_value_at": (c_int, [p, c_size_t, pp, c_size_p]),
    "collie_store_work_int": (c_int, [p, POINTER(c_int64)]),
    "collie_comm_create": (c_int, [p, p, c_int, c_int, POINTER(CommOpts), pp]),
    "collie_comm_create_from_env": (c_int, [p, POINTER(CommOpts), pp]),
    "collie_comm_split": (c_int, [p, c_int, c_int, POINTER(CommOpts), pp]),
    "collie_comm_new_group": (c_int, [p, POINTER(c_int), c_int, POINTER(CommOpts), pp]),
    "collie_comm_create_post": (c_int, [p, p, c_int, c_int, POINTER(CommOpts), pp, pp]),
    "collie_comm_destroy": (c_int, [p]),
    "collie_comm_shrink": (c_int, [p, POINTER(ShrinkOpts), pp]),
    "collie_comm_shrink_post": (c_int, [p, POINTER(ShrinkOpts)] + _post),
    "collie_comm_work_comm": (c_int, [p, pp]),
    "collie_comm_rank_map": (c_int, [p, POINTER(c_int), c_int]),
    "collie_comm_grow": (c_int, [p, POINTER(GrowOpts), pp]),
    "collie_comm_grow_post": (c_int, [p, POINTER(GrowOpts)] + _post),
    "collie_comm_join": (c_int, [p, p, c_char_p, POINTER(GrowOpts), pp]),
    "collie_comm_join_post": (c_int, [p, p, c_char_p, POINTER(GrowOpts)] + _post),
    "collie_comm_destroy_post": (c_int, [p] + _post),
    "collie_comm_abort": (c_int, [p, c_char_p]),
    "collie_comm_error": (c_int, [p, POINTER(c_int), POINTER(c_char_p)]),
    "collie_comm_rank": (c_int, [p]),
    "collie_comm_size": (c_int, [p]),
    "collie_comm_name": (c_char_p, [p]),
    "collie_comm_generation": (c_uint64, [p]),
    "collie_comm_get_stats": (c_int, [p, POINTER(CommStats)]),
    "collie_work_fault": (c_int, [p, POINTER(Fault)]),
    "collie_comm_fault": (c_int, [p, POINTER(Fault)]),
    "collie_fault_kind_name": (c_char_p, [c_int]),
    "collie_comm_health": (c_int, [p, POINTER(PeerHealth), c_int]),
    "collie_peer_state_name": (c_char_p, [c_int]),
    "collie_comm_event_fd": (c_int, [p]),
    "collie_comm_event_pop": (c_int, [p, POINTER(CommEvent)]),
    "collie_event_kind_name": (c_char_p, [c_int]),
    "collie_stats_op_name": (c_char_p, [c_int]),
    "collie_allreduce": (c_int, [p, c_void_p, c_void_p, c_size_t, c_int, c_int] + _post),
    "collie_broadcast": (c_int, [p, c_void_p, c_size_t, c_int, c_int] + _post),
    "collie_reduce": (c_int, [p, c_void_p, c_void_p, c_size_t, c_int, c_int, c_int] + _post),
    "collie_allgather": (c_int, [p, c_void_p, c_void_p, c_size_t, c_int] + _post),
    "collie_reduce_scatter": (c_int, [p, c_void_p, c_void_p, c_size_t, c_int, c_int] + _post),
    "collie_alltoall": (c_int, [p, c_void_p, c_void_p, c_size_t, c_int] + _post),
    "collie_gather": (c_int, [p, c_void_p, c_void_p, c_size_t, c_int, c_int] + _post),
    "collie_scatter": (c_int, [p, c_void_p, c_void_p, c_size_t, c_int, c_int] + _post),
    "collie_barrier": (c_int, [p] + _post),
    "collie_allgatherv": (c_int, [p, c_void_p, c_void_p, c_size_p, c_size_p, c_int] + _post),
    "collie_alltoallv": (
        c_int,
        [p, c_void_p, c_size_p, c_size_p, c_void_p, c_size_p, c_size_p, c_int] + _post,
    ),
    "collie_send": (c_int, [p, c_void_p, c_size_t, c_int, c_int, c_uint64] + _post),
    "collie_recv": (c_int, [p, c_void_p, c_size_t, c_int, c_int, c_uint64] + _post),
    # collie_cuda.h
    "collie_cuda_allreduce": (
        c_int,
        [p, c_void_p, c_void_p, c_size_t, c_int, c_int] + _stream + _post,
    ),
    "collie_cuda_broadcast": (c_int, [p, c_void_p, c_size_t, c_int, c_int] + _stream + _post),
    "collie_cuda_reduce": (
        c_int,
        [p, c_void_p, c_void_p, c_size_t, c_int, c_int, c_int] + _stream + _post,
    ),
    "collie_cuda_allgather": (c_int, [p, c_void_p, c_void_p, c_size_t, c_int] + _stream + _post),
    "collie_cuda_reduce_scatter": (
        c_int,
        [p, c_void_p, c_void_p, c_size_t, c_int, c_int] + _stream + _post,
    ),
    "collie_cuda_alltoall": (c_int, [p, c_void_p, c_void_p, c_size_t, c_int] + _stream + _post),
    "collie_cuda_gather": (
        c_int,
        [p, c_void_p, c_void_p, c_size_t, c_int, c_int] + _stream + _post,
    ),
    "collie_cuda_scatter": (
        c_int,
        [p, c_void_p, c_void_p, c_size_t, c_int, c_int] + _stream + _post,
    ),
    "collie_cuda_barrier": (c_int, [p] + _stream + _post),
    "collie_cuda_allgatherv": (
        c_int,
        [p, c_void_p, c_void_p, c_size_p, c_size_p, c_int] + _stream + _post,
    ),
    "collie_cuda_alltoallv": (
        c_int,
        [p, c_void_p, c_size_p, c_size_p, c_void_p, c_size_p, c_size_p, c_int] + _stream + _post,
    ),
    "collie_cuda_send": (
        c_int,
        [p, c_void_p, c_size_t, c_int, c_int, c_uint64] + _stream + _post,
    ),
    "collie_cuda_recv": (
        c_int,
        [p, c_void_p, c_size_t, c_int, c_int, c_uint64] + _stream + _post,
    ),
    "collie_work_wait_stream": (c_int, [p, c_void_p]),
    # logging (collie.h); a collie_log_fn is passed as a C function's address
    "collie_set_log_handler": (None, [c_void_p, c_void_p]),
    "collie_set_log_level": (None, [c_int]),
    "collie_log_level_get": (c_int, []),
    "collie_log_queue_create": (c_int, [c_size_t, pp]),
    "collie_log_queue_handler": (None, [POINTER(LogRecord), c_void_p]),
    "collie_log_queue_pop": (c_int, [p, c_int32, POINTER(LogRecord)]),
    "collie_log_queue_dropped": (c_uint64, [p]),
    "collie_log_queue_destroy": (None, [p]),
}


def _candidates():
    env = os.environ.get("COLLIE_LIB")
    if env:
        return [env]
    here = os.path.dirname(os.path.abspath(__file__))
    found = [
        # the build tree: <repo>/python/collie -> <repo>/build/lib
        os.path.join(here, "..", "..", "build", "lib", SONAME),
        # installed: <prefix>/lib/python3/dist-packages/collie -> <prefix>/lib
        os.path.join(here, "..", "..", "..", SONAME),
    ]
    return [f for f in found if os.path.exists(f)] + [SONAME]


def _load():
    errors = []
    for path in _candidates():
        try:
            return ctypes.CDLL(path), path
        except OSError as e:
            errors.append(f"{path}: {e}")
            if os.environ.get("COLLIE_LIB"):
                break
    raise ImportError(
        "collie: cannot load libcollie ("
        + "; ".join(errors)
        + "); build it with `make` or point COLLIE_LIB at libcollie.so.0"
    )


lib, path = _load()
for _name, (_res, _args) in SIGNATURES.items():
    _fn = getattr(lib, _name)
    _fn.restype = _res
    _fn.argtypes = _args

if lib.collie_version() // 10000 != 0:
    raise ImportError(
        f"collie: {path} is version {lib.collie_version_string().decode()}, "
        "this package speaks ABI 0"
    )


def last_error():
    return lib.collie_last_error().decode(errors="replace")


def size_array(values):
    """A C size_t array from a sequence of non-negative ints (None stays NULL)."""
    if values is None:
        return None
    vals = [int(v) for v in values]
    for v in vals:
        if v < 0:
            raise ValueError(f"counts and displacements must be >= 0, got {v}")
    return (c_size_t * len(vals))(*vals)
