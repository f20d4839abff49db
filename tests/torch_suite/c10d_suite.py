"""PyTorch 1.13.1's test/distributed/test_c10d_common.py run with collie as
the backend. That file is not in Debian's binary packages:
scripts/torch-src.sh extracts it from the source package of the installed
python3-torch into build/torch-src (COLLIE_TORCH_SRC overrides); without
it every test here skips, saying why.

What runs, and how it maps onto the upstream file:
- CollieExtensionTest: PythonProcessGroupExtensionTest, the plugin-
  extension tests (register a backend, init_process_group by its name,
  all_gather / all_reduce / broadcast / reduce_scatter / barrier,
  send / recv, exit without destroy_process_group), with collie in place of
  the Python dummy and the real results asserted instead of the dummy's
  made-up ones; plus the backend name in any case.
- CollieCommTest: AbstractCommTest's backend-generic checks, as
  test_c10d_gloo.py runs them for gloo (sequence numbers, rank membership,
  dtype mismatches, complex tensors); the CUDA-only ones are not listed.
- CollieDispatchedCollectivesTest: ProcessGroupWithDispatchedCollectivesTests
  (world size 1).
- CollieDdpTest: CommonDistributedDataParallelTest's DDP harness on a collie
  process group made directly from a store, as test_c10d_gloo.py does with
  ProcessGroupGloo (its CUDA-only tests skip themselves)."""

import os
import sys
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))
SRC = os.environ.get("COLLIE_TORCH_SRC", os.path.join(ROOT, "build", "torch-src"))
sys.path.insert(0, HERE)
import harness  # noqa: E402,F401  (expecttest stand-in, ReplicatedTensor off, collie)

import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.distributed.distributed_c10d as c10d  # noqa: E402
from torch.testing._internal.common_distributed import MultiProcessTestCase  # noqa: E402
from torch.testing._internal.common_utils import run_tests  # noqa: E402

import collie.torch  # noqa: E402

if os.path.exists(os.path.join(SRC, "test_c10d_common.py")):
    sys.path.insert(0, SRC)
    import test_c10d_common as upstream  # noqa: E402

    AbstractCommTest = upstream.AbstractCommTest
    CommonDdp = upstream.CommonDistributedDataParallelTest
    Dispatched = upstream.ProcessGroupWithDispatchedCollectivesTests
    MISSING = None
else:
    upstream = None
    AbstractCommTest = CommonDdp = object
    Dispatched = MultiProcessTestCase
    MISSING = (
        f"{SRC}/test_c10d_common.py is missing (PyTorch 1.13.1's test file, "
        "from `scripts/torch-src.sh build/torch-src test/distributed/test_c10d_common.py`, "
        "which needs Debian's source mirror)"
    )
needs_upstream = unittest.skipIf(MISSING is not None, MISSING or "")


class _Spawned(MultiProcessTestCase):
    @property
    def world_size(self):
        return 2

    def setUp(self):
        super().setUp()
        self._spawn_processes()

    def tearDown(self):
        super().tearDown()
        try:
            os.remove(self.file_name)
        except OSError:
            pass

    def init(self, backend="collie"):
        store = dist.FileStore(self.file_name, self.world_size)
        dist.init_process_group(backend, world_size=self.world_size, rank=self.rank, store=store)


@needs_upstream
class CollieExtensionTest(_Spawned):
    def test_backend_class_attr(self):
        self.assertEqual(dist.Backend.COLLIE, "COLLIE")
        plugin = dist.Backend._plugins["COLLIE"]
        self.assertIs(plugin.creator_fn, collie.torch.create_process_group)
        self.assertTrue(plugin.extended_api)

    def test_backend_name_any_case(self):
        for name in ("collie", "COLLIE", "Collie"):
            self.init(name)
            self.assertEqual(dist.get_backend(), "collie")
            t = torch.ones(3)
            dist.all_reduce(t)
            self.assertEqual(t, torch.full((3,), float(self.world_size)))
            dist.destroy_process_group()

    def test_collectives(self):
        os.environ["MASTER_ADDR"] = "localhost"  # collie's rank 0 advertises it
        self.init()
        n = self.world_size
        # all_gather
        inp = torch.ones(2, 2) * (self.rank + 7)
        outs = [torch.zeros(2, 2) for _ in range(n)]
        dist.all_gather(outs, inp)
        for r, t in enumerate(outs):
            self.assertEqual(t, torch.ones(2, 2) * (r + 7))
        # all_reduce
        inp = torch.ones(2, 2) * 7
        dist.all_reduce(inp)
        self.assertEqual(inp, torch.ones(2, 2) * 7 * n)
        # broadcast, async + wait
        inp = torch.ones(2, 2) if self.rank == 0 else torch.zeros(2, 2)
        dist.broadcast(inp, 0, async_op=True).wait()
        self.assertEqual(torch.ones(2, 2), inp)
        # reduce_scatter
        out = torch.zeros(2, 2)
        dist.reduce_scatter(out, [torch.ones(2, 2) * (r + 1) for r in range(n)])
        self.assertEqual(out, torch.ones(2, 2) * (self.rank + 1) * n)
        dist.barrier()
        dist.destroy_process_group()

    def test_send_recv(self):
        self.init()
        n = self.world_size
        nxt, prv = (self.rank + 1) % n, (self.rank - 1) % n
        sent = torch.full((2, 2), float(self.rank))
        got = torch.zeros(2, 2)
        if self.rank % 2 == 0:
            dist.send(sent, nxt)
            dist.recv(got, prv)
        else:
            dist.recv(got, prv)
            dist.send(sent, nxt)
        self.assertEqual(got, torch.full((2, 2), float(prv)))
        self.assertEqual(sent, torch.full((2, 2), float(self.rank)))  # send leaves it
        dist.barrier()
        # no destroy_process_group, as upstream: exiting with the group
        # still up must be clean too


@needs_upstream
class CollieCommTest(AbstractCommTest, _Spawned):
    @property
    def device(self):
        return torch.device("cpu")

    def test_sequence_num_set_default_pg(self):
        self._test_sequence_num_set_default_pg(backend="collie")

    def test_sequence_num_set_new_group(self):
        self._test_sequence_num_set_new_group(backend="collie")

    def test_sequence_num_counts_ops(self):
        # _test_sequence_num_incremented without its torch.cuda calls.
        self.init()
        pg = c10d._get_default_group()
        verify = dist.new_group(backend="gloo")
        start = self._verify_sequence_number_across_pg(pg=pg, verify_pg=verify)
        for i in range(10):
            dist.all_reduce(torch.ones(1))
            self.assertEqual(
                self._verify_sequence_number_across_pg(pg=pg, verify_pg=verify), start + i + 1
            )

    def test_rank_membership(self):
        self._test_rank_membership(backend="collie")

    def test_tensor_dtype_mismatch(self):
        self._test_tensor_dtype_mismatch(backend="collie")

    def test_tensor_dtype_complex(self):
        self._test_tensor_dtype_complex(backend="collie")


@needs_upstream
class CollieDispatchedCollectivesTest(Dispatched):
    def test_collectives(self):
        self._test_collectives(backend="collie")


@needs_upstream
class CollieDdpTest(CommonDdp, _Spawned):
    def _get_process_group(self):
        return collie.torch.new_process_group(self._get_store(), self.rank, self.world_size)

    def test_collie_backend_cpu_module(self):
        self._test_ddp_with_process_group(
            self._get_process_group(), [torch.device("cpu")], None
        )

    def test_collie_backend_cpu_module_grad_is_view(self):
        self._test_ddp_with_process_group(
            self._get_process_group(), [torch.device("cpu")], None,
            gradient_as_bucket_view=True,
        )


if __name__ == "__main__":
    run_tests()
