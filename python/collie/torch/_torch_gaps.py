"""Gaps in torch's Python layer, filled for collie groups: the gate on
monitored_barrier (opened), and torch 2.11's coalescing manager, which runs
a region of mixed collectives as if all were the first's (guarded).

torch 1.13's dist.monitored_barrier (and 2.x's until at least 2.11; 2.15's
has no such gate) refuses every group whose backend is
not named gloo ("monitored_barrier is only implemented for GLOO backend."),
though all it then does is call the group's monitored_barrier, which
collie's process group implements (process_group_collie.cpp, gloo's
semantics and messages). allow_monitored_barrier() wraps torch's function
so that a collie group goes through; every other group still goes to
torch's own, unchanged. gated() says whether this torch has the gate (its
message is in the function's source): 2.15 takes any group with a CPU
backend, nothing to do there.

Design notes
- Idempotent; it replaces the name in torch.distributed and in
  torch.distributed.distributed_c10d (callers use either).
- collie.torch calls it when it registers the backend where torch has the
  gate (until then, a caller may).
- torch 2.11's _coalescing_manager, at the end of a region, hands every
  recorded op to the first op's coalesced call: an all_reduce then an
  all_gather_into_tensor became one allreduce_coalesced of both tensors,
  and the gather's output was never written, returned OK (with any
  backend; torch 2.15 refuses the mix: "Coalescing manager requires all
  collectives to be the same type"). And every torch 2.x runs a region of
  all_reduce with different reduce ops (SUM, MAX) with the first one's op.
  guard_coalescing_manager() wraps it so that a collie group's region of
  mixed types or reduce ops is refused, before anything is posted (the
  region is ended, empty). coalescing_state() says whether this torch's
  manager has the op list it reads.
  Like the gate, it replaces the module's name: a caller that imported
  the function before collie.torch keeps torch's."""

import contextlib
import functools
import inspect
from datetime import timedelta

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d


def allow_monitored_barrier():
    orig = c10d.monitored_barrier
    if getattr(orig, "_collie", False):
        return

    @functools.wraps(orig)
    def monitored_barrier(group=c10d.GroupMember.WORLD, timeout=None, wait_all_ranks=False):
        if c10d._rank_not_in_group(group) or not _cpu_is_collie(group):
            return orig(group, timeout, wait_all_ranks)
        if timeout is None:
            timeout = getattr(c10d, "default_pg_timeout", timedelta(minutes=30))
        elif isinstance(timeout, (int, float)):
            timeout = timedelta(seconds=timeout)
        group_to_use = c10d._get_default_group() if group is None else group
        return group_to_use.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)

    monitored_barrier._collie = True
    c10d.monitored_barrier = monitored_barrier
    dist.monitored_barrier = monitored_barrier


def _cpu_is_collie(group):
    """The group's CPU backend is collie: "collie", or "cpu:collie" in a
    device map (get_backend gives the map's text, "cpu:collie,cuda:nccl")."""
    name = str(c10d.get_backend(group)).lower()
    if ":" not in name:
        return name == "collie"
    return any(dev.strip() == "cpu" and be.strip() == "collie"
               for dev, _, be in (part.partition(":") for part in name.split(",")))


def gated():
    """Whether this torch's monitored_barrier admits only gloo by name."""
    try:
        return "only implemented for GLOO" in inspect.getsource(c10d.monitored_barrier)
    except (OSError, TypeError):
        return False


def coalescing_state():
    """Whether this torch's _coalescing_manager keeps its op list in
    _world.pg_coalesce_state (torch 2.x), which the guard reads."""
    try:
        src = inspect.getsource(c10d._coalescing_manager)
    except (OSError, TypeError, AttributeError):
        return False
    return "pg_coalesce_state" in src


def guard_coalescing_manager():
    orig = c10d._coalescing_manager
    if getattr(orig, "_collie", False):
        return

    @contextlib.contextmanager
    @functools.wraps(orig)
    def _coalescing_manager(group=None, device=None, async_ops=False):
        ctx = orig(group, device, async_ops)
        cm = ctx.__enter__()
        try:
            yield cm
        except BaseException as e:
            if not ctx.__exit__(type(e), e, e.__traceback__):
                raise
            return
        pg = group or c10d._get_default_group()
        ops = c10d._world.pg_coalesce_state.get(pg, [])
        kinds = {op.op for op in ops}
        redops = {str(getattr(op, "redop", None)) for op in ops}
        if _cpu_is_collie(pg) and (len(kinds) > 1 or len(redops) > 1):
            c10d._world.pg_coalesce_state.pop(pg, None)
            if device:
                pg._end_coalescing(device)  # the region, empty: nothing was posted
            first = getattr(ops[0].op, "__name__", ops[0].op)
            if len(kinds) > 1:
                raise RuntimeError(
                    "Coalescing manager requires all collectives to be the same type (collie: "
                    f"this torch would run them all as {first}; torch 2.15 refuses the mix too)")
            raise RuntimeError(
                f"collie: a coalescing region of {first} with different reduce ops "
                f"({', '.join(sorted(redops))}): torch would run them all with the first one's")
        ctx.__exit__(None, None, None)

    _coalescing_manager._collie = True
    c10d._coalescing_manager = _coalescing_manager
