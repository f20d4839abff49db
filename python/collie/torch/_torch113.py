"""torch 1.13's Python-side gate on monitored_barrier, opened for collie.

torch 1.13's dist.monitored_barrier refuses every group whose backend is
not named gloo ("monitored_barrier is only implemented for GLOO backend."),
though all it then does is call the group's monitored_barrier, which
collie's process group implements (process_group_collie.cpp, gloo's
semantics and messages). allow_monitored_barrier() wraps torch's function
so that a collie group goes through; every other group still goes to
torch's own, unchanged. torch 2.x takes any group with a CPU backend:
nothing to do there.

Design notes
- Idempotent; it replaces the name in torch.distributed and in
  torch.distributed.distributed_c10d (callers use either).
- collie.torch calls it on torch 1.13 when it registers the backend (until
  then, a caller may)."""

import functools

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d


def allow_monitored_barrier():
    orig = c10d.monitored_barrier
    if getattr(orig, "_collie", False):
        return

    @functools.wraps(orig)
    def monitored_barrier(group=c10d.GroupMember.WORLD, timeout=None, wait_all_ranks=False):
        if c10d._rank_not_in_group(group) or c10d.get_backend(group) != "collie":
            return orig(group, timeout, wait_all_ranks)
        if timeout is None:
            timeout = c10d.default_pg_timeout
        group_to_use = c10d._get_default_group() if group is None else group
        return group_to_use.monitored_barrier(timeout, wait_all_ranks=wait_all_ranks)

    monitored_barrier._collie = True
    c10d.monitored_barrier = monitored_barrier
    dist.monitored_barrier = monitored_barrier
