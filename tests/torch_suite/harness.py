"""What PyTorch's own test harness needs before it can run here, for every
suite in this directory (each spawned rank imports this module again), on
Debian's torch 1.13 (/usr/bin/python3) and on torch 2.x (the venv's
python, build/torch2-venv/bin/python; make torch2-venv, make torch2). Every
difference between the two torch versions is in this file:

- expecttest, which neither Debian nor the venv has: a stand-in with the
  two names the harness uses, installed only when the real module is
  missing;
- 1.13 only: DDP's ReplicatedTensor mode kept off: the harness turns it on
  in every rank, and on Python 3.11 its import fails (a dataclass with a
  mutable default in torch.distributed._shard), failing every DDP test for
  every backend (the mode is off by default outside the harness; 2.x has
  no ReplicatedTensor);
- collie registered as a torch backend (the package from this tree; it
  loads build/python/_C.so on 1.13, build/torch2/_C.so on 2.x);
- join(backend): collie joins DistTestCases as torch's docs say a plugin
  does: its name in backend_feature "plugin", "ddp" and "subgroup" (the
  same sets on 1.13 and 2.x);
- 2.x, make test-torch2-suite: run() runs the suite with unittest (written
  before the venv had pytest; make test's stage runs curated2.txt under the
  venv's pytest) and prints one pytest-style line per test ("dist_suite.py::Class::test
  PASSED|FAILED|ERROR|SKIPPED (reason)") and a pytest-style summary, the
  lines compare.py reads (1.13 runs under Debian's pytest -v -rA);
- TORCH_SUITE_START=fork (both versions; scripts/torch-suite.sh sets it for
  2.x): dist_suite.py forks the ranks rather than spawning them (torch's
  MultiProcessTestCase does either); a spawned rank imports torch and the
  suite anew, ~30 s a test on this loaded 2-core machine.

OPEN_GATES=1 ("gates opened"; both versions): the suite runs many tests
only for backends it names: decorators evaluated when distributed_test is
imported (require_backend_is_available({"gloo"}), skip_if(BACKEND !=
"gloo"), skip_if(BACKEND not in {"mpi", "nccl", "gloo"}),
require_backend_is_available(backend_feature["gpu"]) = {nccl, gloo, ...}),
and at run time the profiler checks (dist.get_backend() in
PROFILING_SUPPORTED_BACKENDS). open_gates() opens them to collie without
editing the suite: while distributed_test is imported, os.environ is a
view of the same environment whose "BACKEND" reads as a name that also
compares (and hashes) equal to "gloo", so every gate by name that admits
gloo admits the backend under test too; afterwards the module's BACKEND
keeps that name, and "collie" joins the profiler lists. Comparisons with
"nccl", "mpi" or "ucc" stay false, so the CUDA-only tests stay gated (no
GPU here), and so do the GPU-count checks. What a test does inside
(init_process_group, dist.get_backend(), error texts) sees the real name:
"collie". The tests that open then check gloo's behaviour on collie; a
difference there is listed in known_differences*.txt like any other. The
same mode for gloo changes no gate (its name already is "gloo"), so both
backends' counts come from the same suite and are comparable."""

import os
import sys
import time
import types
import unittest

import torch

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TORCH2 = int(torch.__version__.split(".")[0]) >= 2
OPEN_GATES = os.environ.get("OPEN_GATES", "0") not in ("", "0")
START = os.environ.get("TORCH_SUITE_START", "spawn")
if START not in ("spawn", "fork"):
    raise ValueError(f"TORCH_SUITE_START={START!r}: spawn or fork")

try:
    import expecttest  # noqa: F401
except ImportError:
    stand_in = types.ModuleType("expecttest")
    stand_in.ACCEPT = False
    stand_in.TestCase = unittest.TestCase
    sys.modules["expecttest"] = stand_in

if not TORCH2:
    import torch.nn.parallel._replicated_tensor_ddp_utils as _rt

    _rt._set_ddp_with_replicated_tensor = lambda value: None

sys.path.insert(0, os.path.join(ROOT, "python"))
import collie.torch  # noqa: E402,F401  (registers the backend)


def join(backend):
    """Add a plugin backend to DistTestCases' feature sets (a no-op for gloo)."""
    from torch.testing._internal.common_distributed import DistTestCases

    if backend in ("gloo", "nccl", "mpi", "ucc"):
        return
    for feature in ("plugin", "ddp", "subgroup"):
        DistTestCases.backend_feature[feature].add(backend)


class _GlooToo(str):
    """A backend's name that also compares (and hashes) equal to "gloo"."""

    def __eq__(self, other):
        return isinstance(other, str) and str.__str__(other) in (str.__str__(self), "gloo")

    def __ne__(self, other):
        return not self.__eq__(other)

    def __hash__(self):
        return hash("gloo")


def _import_opened():
    env = os.environ

    class GateEnv(type(env)):
        def __getitem__(self, key):
            value = super().__getitem__(key)
            return _GlooToo(value) if key == "BACKEND" else value

    os.environ = GateEnv(env._data, env.encodekey, env.decodekey, env.encodevalue,
                         env.decodevalue)
    try:
        from torch.testing._internal.distributed import distributed_test
    finally:
        os.environ = env
    name = os.environ["BACKEND"]
    for lst in ("PROFILING_SUPPORTED_BACKENDS", "CUDA_PROFILING_SUPPORTED_BACKENDS",
                "SEND_RECV_PROFILING_SUPPORTED_BACKENDS"):
        supported = getattr(distributed_test, lst, None)
        if supported is not None and name not in supported:
            supported.append(name)
    return distributed_test


def distributed_test():
    """torch's distributed_test module for os.environ["BACKEND"], joined
    (join) and, under OPEN_GATES=1, with the gates opened."""
    join(os.environ["BACKEND"])
    if OPEN_GATES:
        if "torch.testing._internal.distributed.distributed_test" in sys.modules:
            raise RuntimeError("harness: OPEN_GATES needs distributed_test imported here first")
        return _import_opened()
    from torch.testing._internal.distributed import distributed_test as module

    return module


def fork_context():
    """TORCH_SUITE_START=fork: the ranks are forked from the test process
    (torch's MultiProcessTestCase can start them either way) rather than
    spawned (each rank a fresh Python importing torch and the suite: several
    seconds a test on a loaded machine)."""
    return torch.multiprocessing.get_context("fork")


class _LineResult(unittest.TextTestResult):
    """One pytest-style line per test, flushed at once (2.x's side by side)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.tally = {"passed": 0, "failed": 0, "error": 0, "skipped": 0, "xfailed": 0}

    def _line(self, test, outcome, key, reason=""):
        self.tally[key] += 1
        cls, _, name = test.id().rpartition(".")
        cls = cls.rpartition(".")[2]
        reason = " ".join(str(reason).split())
        sys.stdout.write(f"dist_suite.py::{cls}::{name} {outcome}"
                         + (f" ({reason})" if reason else "") + "\n")
        sys.stdout.flush()

    def addSuccess(self, test):
        super().addSuccess(test)
        self._line(test, "PASSED", "passed")

    def addFailure(self, test, err):
        super().addFailure(test, err)
        self._line(test, "FAILED", "failed")

    def addError(self, test, err):
        super().addError(test, err)
        self._line(test, "ERROR", "error")

    def addSkip(self, test, reason):
        super().addSkip(test, reason)
        self._line(test, "SKIPPED", "skipped", reason)

    def addExpectedFailure(self, test, err):
        super().addExpectedFailure(test, err)
        self._line(test, "XFAIL", "xfailed")

    def addUnexpectedSuccess(self, test):
        super().addUnexpectedSuccess(test)
        self._line(test, "FAILED", "failed", "unexpected success")


def run():
    """Run the calling __main__ module's tests: torch's run_tests on 1.13
    (under pytest as scripts/torch-suite.sh calls it), unittest with
    pytest-style lines on 2.x."""
    from torch.testing._internal import common_utils

    if not TORCH2:
        common_utils.run_tests()
        return
    common_utils.parse_cmd_line_args()
    start = time.monotonic()
    runner = unittest.TextTestRunner(stream=sys.stderr, verbosity=0, resultclass=_LineResult)
    prog = unittest.main(argv=common_utils.UNITTEST_ARGS, testRunner=runner, exit=False)
    t = prog.result.tally
    parts = [f"{t['failed']} failed"] if t["failed"] else []
    parts += [f"{t['passed']} passed"]
    parts += [f"{t['skipped']} skipped"] if t["skipped"] else []
    parts += [f"{t['xfailed']} xfailed"] if t["xfailed"] else []
    parts += [f"{t['error']} error"] if t["error"] else []
    print(f"===== {', '.join(parts)} in {time.monotonic() - start:.2f}s =====", flush=True)
    sys.exit(0 if prog.result.wasSuccessful() else 1)
