"""Breakage reproducers for collie.torch on torch 2.x (a fresh-eyed
tester's findings, issue 31): each test asserts the behaviour the docs or
gloo/NCCL give and is marked xfail with what collie does instead. Ranks are
processes (tests/python/torch2_break_worker.py), every wait bounded."""

import os

import pytest
from rank_procs import run_ranks

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
PYTHON = os.environ.get("COLLIE_TORCH2_PYTHON",
                        os.path.join(ROOT, "build", "torch2-venv", "bin", "python"))
EXT = os.path.join(ROOT, "build", "torch2", "_C.so")

if not os.path.exists(PYTHON):
    pytest.skip(f"no torch 2.x Python at {PYTHON} (make torch2-venv)", allow_module_level=True)
if not os.path.exists(EXT) and not os.environ.get("COLLIE_TORCH_EXT"):
    pytest.skip(f"the torch 2.x extension {EXT} is not built (make torch2)",
                allow_module_level=True)


def run(scenario, world=2, timeout=90):
    return run_ranks(
        lambda r, port: [PYTHON, os.path.join(HERE, "torch2_break_worker.py"), str(r),
                         str(world), port, scenario],
        world, scenario, timeout)


BAD = "RuntimeError: not supported by collie: send of UInt32 tensors"

STUCK = ("collie's startCoalescing set coalescing_ and a batch_isend_irecv whose op raised "
         "never reached endCoalescing (torch's _coalescing_manager has no try/finally): "
         "the group stays 'already coalescing' for good (ProcessGroupNCCL's startCoalescing "
         "just starts again)")


@pytest.mark.xfail(strict=True, reason=STUCK)
def test_batch_isend_irecv_works_after_a_failed_batch():
    for r, out in enumerate(run("batch_after_failed_batch")):
        assert out["bad"] == BAD, out
        # observed: "RuntimeError: collie: startCoalescing: already coalescing
        # (endCoalescing first)"
        assert out["good"] == "ok", (r, out)
        assert out["got"] == [float((r - 1) % 2)] * 4, (r, out)


@pytest.mark.xfail(strict=True, reason=STUCK + "; torch's _abort_process_group opens a "
                   "coalescing region around the aborts, so the abort itself fails")
def test_abort_process_group_after_a_failed_batch():
    for r, out in enumerate(run("abort_after_failed_batch")):
        assert out["bad"] == BAD, out
        # observed: the abort raises "already coalescing" and the group stays
        # initialized
        assert out["abort"] == "ok", (r, out)
        assert out["initialized_after_abort"] is False, (r, out)


@pytest.mark.xfail(strict=True, reason=STUCK + "; every later op's Work (and tensors) is "
                   "appended to coalesced_ and never released until destroy")
def test_works_not_kept_after_a_failed_batch():
    for r, out in enumerate(run("works_kept_after_failed_batch")):
        assert out["freed_before"] is True, out
        assert out["bad"] == BAD, out
        assert out["freed_after"] is True, (r, out)
