"""The torch.distributed backend "collie" (torch 1.13, CPU): every
collective, unsupported calls, Work.wait(timeout) as gloo's, get_future off
the progress thread, case-insensitive names, pg_options and policy errors,
a timeout over collie's limit (no deadline, as gloo takes it),
10 init/destroy cycles without fd or thread growth, a group destroyed with
a work in flight (aborted at once), exit without destroy, and DDP: parameters
equal gloo's bit for bit at world size 2, allclose at 3. Each scenario
runs its ranks as processes (tests/python/torch_worker.py), once under
Debian's torch 1.13 ([torch1]) and once under the torch 2.x venv ([torch2],
where it and build/torch2/_C.so exist; make test runs those in its torch2
stage)."""

import math
import os
import sys

import pytest
from rank_procs import run_ranks

torch = pytest.importorskip("torch", reason="python3-torch is not installed")
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
EXT = os.path.join(ROOT, "build", "python", "_C.so")
if not os.path.exists(EXT) and not os.environ.get("COLLIE_TORCH_EXT"):
    pytest.skip("the torch extension is not built (make python)", allow_module_level=True)

# The same scenarios and assertions on torch 2.x (make test's torch2 stage
# selects them with -k torch2): the ranks run under the torch 2.x venv's
# Python with build/torch2/_C.so, where both are there.
TORCH2_PYTHON = os.environ.get("COLLIE_TORCH2_PYTHON",
                               os.path.join(ROOT, "build", "torch2-venv", "bin", "python"))
PYTHONS = [pytest.param(sys.executable, id="torch1")]
if os.path.exists(TORCH2_PYTHON) and os.path.exists(os.path.join(ROOT, "build", "torch2", "_C.so")):
    PYTHONS.append(pytest.param(TORCH2_PYTHON, id="torch2"))
PYTHON = sys.executable


@pytest.fixture(autouse=True, params=PYTHONS)
def torch_python(request, monkeypatch):
    """Every test once per torch: scenario() runs the ranks under it."""
    monkeypatch.setattr(sys.modules[__name__], "PYTHON", request.param)
    return request.param


def scenario(name, backend="collie", world=2, timeout=120, env=None):
    return run_ranks(
        lambda r, port: [PYTHON, os.path.join(HERE, "torch_worker.py"), name, backend,
                         str(r), str(world), port],
        world, f"{name}/{backend}", timeout, dict(os.environ, **(env or {})))


@pytest.mark.parametrize("world", [2, 3])
def test_every_collective(world):
    res = scenario("collectives", world=world)
    n = world
    for r, out in enumerate(res):
        for key, val in out.items():
            if key.startswith("allreduce_"):
                assert val == [n * (n - 1) / 2 + i * n for i in range(4)], key
        assert out["prod"] == [math.factorial(n)] and out["max"] == [n]
        assert out["bool_min"] == [True, False]
        assert out["broadcast"] == [n - 1.0] * 3
        if r == 0:
            assert out["reduce_root"] == [n * (n + 1) / 2]
            assert out["gather"] == [[3.0 * p] for p in range(n)]
        assert out["all_gather"] == [[p, 10 * p] for p in range(n)]
        assert out["all_gather_base"] == sum(([p, 10.0 * p] for p in range(n)), [])
        assert out["all_gather_coalesced"] == [[[p], [p, 2.0 * p]] for p in range(n)]
        assert out["all_reduce_coalesced"] == [[n * (n - 1) / 2], [n, 2.0 * n]]
        assert out["scatter"] == [r, r + 0.5]
        assert out["reduce_scatter"] == [sum(r + p for p in range(n))]
        assert out["reduce_scatter_base"] == [n * 2.0 * r, n * (2.0 * r + 1)]
        assert out["all_to_all_single"] == [100.0 * p + r for p in range(n)]
        assert out["all_to_all_uneven"] == sum(([10.0 * p + r] * (r + 1) for p in range(n)), [])
        assert out["all_to_all"] == [[float(p)] * (r + 1) for p in range(n)]
        if r == 1:
            assert out["recv"] == [42.0, 43.0]
        if r == 0:
            assert out["recv_any"] == [n - 1, [n - 1.0]]
        assert out["is_completed"] is True
        if r in (0, n - 1):
            assert out["subgroup"] == [2.0]


def test_unsupported_calls_say_so():
    for out in scenario("unsupported"):
        assert "not supported by collie: allreduce with ReduceOp.BAND" in out["band"]
        assert "not supported by collie: allreduce of complex tensors" in out["complex"]
        assert "not supported by collie" in out["bool_sum"]


def test_wait_timeout_behaves_as_gloo():
    gloo = scenario("wait_timeout", backend="gloo")
    ours = scenario("wait_timeout")
    assert gloo[0]["first"].startswith("RuntimeError: Operation timed out!")
    assert ours[0]["first"] == gloo[0]["first"]
    assert ours[0]["completed_after_timeout"] is False
    assert [r["value"] for r in ours] == [[3.0], [3.0]] == [r["value"] for r in gloo]


def test_future_callbacks_run_off_the_progress_thread():
    res = scenario("future")
    for out in res:
        assert out["value"] == [6.0]
        assert out["thread"] and not out["thread"].startswith("cl-"), out["thread"]


def test_backend_name_is_case_insensitive():
    for out in scenario("names"):
        assert out == {n: ["collie", 2.0] for n in ("COLLIE", "Collie", "collie")}


def test_pg_options_and_policy_errors():
    for out in scenario("options"):
        assert "unknown key(s) 'colour'" in out["unknown"]
        assert "policy 'sometimes' is not one of" in out["bad_policy"]
        assert "a collie.torch.Options or a dict" in out["bad_type"]
        assert "conflicts with the environment's 'blocking_wait'" in out["conflict"]
        assert out["agreeing"] == 2.0


def test_timeout_over_collies_limit_means_no_deadline():
    """init_process_group(timeout=timedelta(days=30)) (over 2^31-1 ms): gloo
    takes it, and collie did not ("over collie's limit of 2^31-1 ms")."""
    for backend in ("gloo", "collie"):
        for out in scenario("long_timeout", backend=backend):
            assert out == {"world": [3.0, 3.0], "group": [2.0]}, (backend, out)


def test_ten_init_destroy_cycles_without_growth():
    for out in scenario("cycles"):
        counts = out["counts"]
        assert counts[1:] == [counts[1]] * 10, counts  # after the first cycle's one-time setup


def test_destroy_with_work_in_flight_aborts_it_at_once():
    out = scenario("destroy_pending")[0]
    assert out["destroy_s"] < 5, out
    # torch 2.x ends a group through Backend::shutdown (docs/torch2.md)
    why = ("the process group was shut down (destroy_process_group)" if PYTHON == TORCH2_PYTHON
           else "the process group was destroyed")
    assert f"{why} (COLLIE_EABORTED)" in out["wait"], out


def test_exit_without_destroy_is_clean():
    # the completer thread may still hold the last reference of a tensor
    # when Python finalizes: every run must exit 0 (a crash was ~1 in 3)
    for _ in range(6):
        for out in scenario("exit_without_destroy", timeout=60):
            assert out == {"done": True}


def gloo_reference(name, world):
    """The Gloo run a collie result is compared with: the reference, not
    what is tested. torch 2.x's Gloo rank sometimes dies at its exit
    (std::terminate: "terminate called without an active exception", about
    1 run in 5 on a loaded 2-core machine) after its results were right; such
    a run is made again, at most twice. collie's runs are never retried."""
    for attempt in range(3):
        try:
            return scenario(name, backend="gloo", world=world)
        except AssertionError as e:
            if attempt == 2 or "exit -" not in str(e):
                raise
            print(f"gloo reference {name} at {world} ranks died by a signal; again: {e}")
    raise AssertionError("unreachable")


@pytest.mark.parametrize("world", [2, 3])
def test_ddp_matches_gloo(world):
    gloo = gloo_reference("ddp", world)
    ours = scenario("ddp", world=world)
    for g, c in zip(gloo, ours):
        if world == 2:
            assert g["params"] == c["params"], "DDP parameters differ from gloo's"
        else:
            for a, b in zip(g["params"], c["params"]):
                assert torch.allclose(torch.tensor(a), torch.tensor(b), rtol=1e-6, atol=1e-7)


# the process group's monitored_barrier with gloo's messages (torch's
# test_monitored_barrier_*), world size 3: the missing rank named by rank 0,
# a rank that came told by rank 0, every missing rank with wait_all_ranks,
# the first in order, rank 0's own timeout of 0; the comm stays healthy
def test_monitored_barrier():
    res = scenario("monitored", world=3)
    for r, out in enumerate(res):
        assert out["pass"] == "ok" and out["pass_all"] == "ok", (r, out)
        assert out["after"] == [6.0] * 3, (r, out)
        # torch 1.13's gate is opened by importing collie.torch (_torch_gaps); 2.x has none
        assert out["gate"] == "ok", (r, out)
        assert out["dist"] == "ok", (r, out)
    r0, r1, r2 = res
    msg, secs = r0["missing"]
    assert "Rank 1 failed to pass monitoredBarrier in 1000 ms" in msg, msg
    assert 0.9 <= secs < 10, secs
    msg, secs = r2["missing"]
    assert ("Rank 2 successfully reached monitoredBarrier, but received errors while "
            "waiting for send/recv from rank 0") in msg, msg
    assert secs < 10, secs
    msg, secs = r0["wait_all"]
    assert "Ranks 1, 2 failed to pass monitoredBarrier in 500 ms" in msg, msg
    assert "Rank 2 failed to pass monitoredBarrier in 1000 ms" in r0["order"][0]
    assert "Rank 1 successfully reached monitoredBarrier" in r1["order"][0]
    assert "Rank 0 timed out in monitoredBarrier" in r0["zero"], r0["zero"]


# a barrier that times out says "Timed out" (torch's test_barrier_timeout_*)
def test_barrier_timeout_says_timed_out():
    import re

    res = scenario("barrier_timeout")
    msg, secs = res[0]["barrier"]
    assert re.search(" (Timed out|closed|timeout) ", msg), msg
    assert 0.9 <= secs < 10, secs
    assert [out["after"] for out in res] == [[1.0, 1.0]] * 2
