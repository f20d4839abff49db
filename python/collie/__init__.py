"""collie: non-blocking collective communication with a watchdog, from Python.

A thin layer over libcollie (ctypes; no compiler needed). Five lines:

    import collie, numpy as np
    eng = collie.Engine()
    comm = collie.Comm.from_env(eng)          # under collie-run
    x = np.ones(4, np.float32)
    comm.allreduce(x).wait()                  # or: await comm.allreduce_async(x)

Every collective returns a Work at once (test, wait(timeout), cancel,
result, info, await). Errors are exceptions carrying collie's status and
message (CollieTimeout, ColliePeerError, CollieAborted, ...) and, for a
failed work or comm, the fault as data (.kind, .ranks: collie.Fault);
comm.health(), comm.fault() and `async for ev in comm.events()` say which
peers are alive, dead, suspected or gone. `collie.torch`
registers the torch.distributed backend "collie".
"""

from ._buffers import DTYPES
from ._engine import Engine, Work
from ._faults import Event, Fault, PeerHealth
from ._lib import path as library_path
from ._log import log_to_python
from .comm import POLICIES, REDOPS, Comm
from .errors import (
    CollieAborted,
    CollieAuthError,
    CollieBackendError,
    CollieCancelled,
    CollieClosed,
    CollieError,
    CollieExists,
    CollieInvalidArgument,
    CollieLimitError,
    CollieNoMemory,
    CollieNotFound,
    CollieNotMember,
    CollieNotSupported,
    ColliePeerError,
    CollieProtocolError,
    CollieStateError,
    CollieSystemError,
    CollieTimeout,
)
from .store import Store, StoreServer
from . import _lib


def version():
    """The loaded libcollie's version string ("0.1.0")."""
    return _lib.lib.collie_version_string().decode()


__all__ = [
    "Engine",
    "Work",
    "Comm",
    "Fault",
    "PeerHealth",
    "Event",
    "Store",
    "StoreServer",
    "DTYPES",
    "REDOPS",
    "POLICIES",
    "version",
    "log_to_python",
    "library_path",
    "CollieError",
    "CollieInvalidArgument",
    "CollieNoMemory",
    "CollieTimeout",
    "CollieCancelled",
    "CollieAborted",
    "ColliePeerError",
    "CollieClosed",
    "CollieNotMember",
    "CollieBackendError",
    "CollieProtocolError",
    "CollieAuthError",
    "CollieNotSupported",
    "CollieStateError",
    "CollieSystemError",
    "CollieLimitError",
    "CollieExists",
    "CollieNotFound",
]
