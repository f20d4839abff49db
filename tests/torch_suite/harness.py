"""What PyTorch 1.13's own test harness needs before it can run here, for
every suite in this directory (each spawned rank imports this module again):

- expecttest, which Debian does not package: a stand-in with the two names
  the harness uses, installed only when the real module is missing;
- DDP's ReplicatedTensor mode kept off: the harness turns it on in every
  rank, and on Python 3.11 its import fails (a dataclass with a mutable
  default in torch.distributed._shard), failing every DDP test for every
  backend (the mode is off by default outside the harness);
- collie registered as a torch backend (the package from this tree)."""

import os
import sys
import types
import unittest

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

try:
    import expecttest  # noqa: F401
except ImportError:
    stand_in = types.ModuleType("expecttest")
    stand_in.ACCEPT = False
    stand_in.TestCase = unittest.TestCase
    sys.modules["expecttest"] = stand_in

import torch.nn.parallel._replicated_tensor_ddp_utils as _rt  # noqa: E402

_rt._set_ddp_with_replicated_tensor = lambda value: None

sys.path.insert(0, os.path.join(ROOT, "python"))
import collie.torch  # noqa: E402,F401  (registers the backend)
