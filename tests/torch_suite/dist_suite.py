"""PyTorch 1.13's own distributed test suite (DistributedTest._DistTestBase,
shipped in python3-torch) run against a backend: BACKEND=collie (default)
or gloo, WORLD_SIZE=2 (default) or 3.

    /usr/bin/python3 tests/torch_suite/dist_suite.py [unittest args, e.g. -k test_barrier]

collie joins the suite as torch's docs say a plugin does: it registers
itself (import collie.torch) and adds its name to DistTestCases'
"plugin", "ddp" and "subgroup" features. The harness imports expecttest,
which Debian does not package: a stand-in with the two names it uses is
installed when the real one is missing, and DDP's ReplicatedTensor mode
stays off (see below). The module runs again in every process the harness
spawns, so each rank registers collie too."""

import os
import sys
import tempfile
import types
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
os.environ.setdefault("BACKEND", "collie")
os.environ.setdefault("WORLD_SIZE", "2")
if "TEMP_DIR" not in os.environ:
    os.environ["TEMP_DIR"] = tempfile.mkdtemp(prefix="collie-dist-suite-")

try:
    import expecttest  # noqa: F401
except ImportError:
    stand_in = types.ModuleType("expecttest")
    stand_in.ACCEPT = False
    stand_in.TestCase = unittest.TestCase
    sys.modules["expecttest"] = stand_in

# The harness turns on DDP's ReplicatedTensor mode in every rank; on Python
# 3.11 its import fails (a dataclass with a mutable default in
# torch.distributed._shard), failing every DDP test for every backend. Keep
# the mode off (it is off by default outside this harness).
import torch.nn.parallel._replicated_tensor_ddp_utils as _rt  # noqa: E402

_rt._set_ddp_with_replicated_tensor = lambda value: None

sys.path.insert(0, os.path.join(ROOT, "python"))
import collie.torch  # noqa: E402,F401  (registers the backend)
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

if os.environ["BACKEND"] == "collie":
    for feature in ("plugin", "ddp", "subgroup"):
        DistTestCases.backend_feature[feature].add("collie")

from torch.testing._internal.common_utils import run_tests  # noqa: E402
from torch.testing._internal.distributed.distributed_test import (  # noqa: E402
    DistributedTest,
    TestDistBackend,
)


class TestDistBackendWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        self._spawn_processes()


if __name__ == "__main__":
    run_tests()
