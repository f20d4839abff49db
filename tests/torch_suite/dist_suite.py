"""PyTorch's own distributed test suite (DistributedTest._DistTestBase,
shipped in python3-torch 1.13 and in torch 2.x's wheel) run against a
backend: BACKEND=collie (default) or gloo, WORLD_SIZE=2 (default) or 3,
OPEN_GATES=1 to open the suite's gates by backend name to collie.

    /usr/bin/python3 -m pytest tests/torch_suite/dist_suite.py [-k test_barrier]     # 1.13
    build/torch2-venv/bin/python tests/torch_suite/dist_suite.py [-k test_barrier]   # 2.x

collie joins the suite as torch's docs say a plugin does: it registers
itself (import collie.torch) and adds its name to DistTestCases'
"plugin", "ddp" and "subgroup" features. harness.py makes PyTorch's
harness run here (the differences between torch versions, the gates
opened). The module runs again in every process the harness spawns, so
each rank registers collie (and opens the gates) too."""

import os
import sys
import tempfile

os.environ.setdefault("BACKEND", "collie")
os.environ.setdefault("WORLD_SIZE", "2")
if "TEMP_DIR" not in os.environ:
    os.environ["TEMP_DIR"] = tempfile.mkdtemp(prefix="collie-dist-suite-")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness  # noqa: E402  (torch version differences, collie, gates)

distributed_test = harness.distributed_test()


class TestDistBackendWithSpawn(distributed_test.TestDistBackend,
                               distributed_test.DistributedTest._DistTestBase):
    def setUp(self):
        super().setUp()
        if harness.START == "fork":
            self._start_processes(harness.fork_context().Process)
        else:
            self._spawn_processes()


if __name__ == "__main__":
    harness.run()
