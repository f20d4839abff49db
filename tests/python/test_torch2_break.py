"""Breakage reproducers for collie.torch on torch 2.x (a fresh-eyed
tester's findings, issue 31): each test asserts the behaviour the docs or
gloo/NCCL give (fixed since: the comments say what collie did). Ranks are
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


def test_batch_isend_irecv_works_after_a_failed_batch():
    for r, out in enumerate(run("batch_after_failed_batch")):
        assert out["bad"] == BAD, out
        # observed: "RuntimeError: collie: startCoalescing: already coalescing
        # (endCoalescing first)"
        assert out["good"] == "ok", (r, out)
        assert out["got"] == [float((r - 1) % 2)] * 4, (r, out)


def test_abort_process_group_after_a_failed_batch():
    for r, out in enumerate(run("abort_after_failed_batch")):
        assert out["bad"] == BAD, out
        # observed: the abort raises "already coalescing" and the group stays
        # initialized
        assert out["abort"] == "ok", (r, out)
        assert out["initialized_after_abort"] is False, (r, out)


def test_works_not_kept_after_a_failed_batch():
    for r, out in enumerate(run("works_kept_after_failed_batch")):
        assert out["freed_before"] is True, out
        assert out["bad"] == BAD, out
        assert out["freed_after"] is True, (r, out)


def test_monitored_barrier_names_the_dead_rank_not_a_live_one():
    import json
    import subprocess

    from rank_procs import free_port

    port = str(free_port())
    procs = [subprocess.Popen([PYTHON, os.path.join(HERE, "torch2_break_worker.py"), str(r), "3",
                               port, "monitored_barrier_dead_rank"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(3)]
    try:
        outs = [p.communicate(timeout=90)[0] for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait(10)
    assert procs[2].returncode == -9
    out0 = json.loads(outs[0].strip().splitlines()[-1])
    # observed: "[Rank 0]: Rank 1 failed to pass monitoredBarrier in 20000 ms ...
    # rank 1 failed: rank 2 closed its connection"
    assert out0["mb"].startswith("RuntimeError: [Rank 0]: Rank 2 failed to pass"), out0
    # observed: "[Rank 0]: Ranks 1, 2 failed to pass monitoredBarrier"
    assert out0["mb_all"].startswith("RuntimeError: [Rank 0]: Ranks 2 failed to pass"), out0


def test_abort_from_another_thread_during_split_is_prompt():
    out = run("abort_during_split", timeout=90)[0]
    # observed: {'split': '...split: store.multi_get ... deadline of 10000 ms passed
    # (COLLIE_ETIMEDOUT)', 'abort_s': ~9, 'split_s': ~10}
    assert out["abort_s"] < 3, out
    assert out["split_s"] < 4, out


def test_allreduce_after_an_abandoned_coalescing_region_reduces():
    for r, out in enumerate(run("mixed_coalescing_then_allreduce")):
        if out["mixed"] == "ok":  # torch 2.11 takes a mixed region: then it must be right
            assert out["mixed_values"] == [[2.0] * 2, [1.0] * 4], (r, out)  # world size 2
        else:  # torch 2.15 refuses the mix after the body
            assert out["mixed"].startswith("RuntimeError: Coalescing manager requires all "
                                           "collectives to be the same type"), out
        # all_reduce SUM then MAX in one region: torch runs both with SUM
        # (a wrong OK on 2.11 and 2.15); collie refuses it before posting
        assert "different reduce ops" in out["mixed_ops"], (r, out)
        assert out["mixed_ops_values"] == [[1.0] * 2, [float(r)] * 2], (r, out)
        # observed: allreduce "ok" with sum [1.0, 1.0, 1.0]: a wrong result
        # that says OK
        assert out["allreduce"] != "ok" or out["sum"] == [2.0] * 3, (r, out)
        # observed: "RuntimeError: collie: startCoalescing: already coalescing
        # (endCoalescing first)"
        assert out["again"] == "ok", (r, out)
