"""PyTorch 1.13's own distributed test suite (DistributedTest._DistTestBase,
shipped in python3-torch) run against a backend: BACKEND=collie (default)
or gloo, WORLD_SIZE=2 (default) or 3.

    /usr/bin/python3 tests/torch_suite/dist_suite.py [unittest args, e.g. -k test_barrier]

collie joins the suite as torch's docs say a plugin does: it registers
itself (import collie.torch) and adds its name to DistTestCases'
"plugin", "ddp" and "subgroup" features. harness.py makes PyTorch's
harness run here (expecttest, ReplicatedTensor mode). The module runs again
in every process the harness spawns, so each rank registers collie too."""

import os
import sys
import tempfile

os.environ.setdefault("BACKEND", "collie")
os.environ.setdefault("WORLD_SIZE", "2")
if "TEMP_DIR" not in os.environ:
    os.environ["TEMP_DIR"] = tempfile.mkdtemp(prefix="collie-dist-suite-")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402,F401  (expecttest stand-in, ReplicatedTensor off, collie)
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
