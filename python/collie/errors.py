"""collie's status codes as Python exceptions.

Design notes
- One exception class per error status, all under CollieError, which
  carries `status` (the negative code), `name` ("COLLIE_ETIMEDOUT") and the
  message collie gave (the work's error message or collie_last_error).
- Classes also derive from the matching builtin where one exists, so
  ordinary Python handlers work: CollieTimeout is a TimeoutError,
  CollieInvalidArgument a ValueError, CollieNotSupported a
  NotImplementedError.
"""

from . import _lib

OK = 0
INPROGRESS = 1


class CollieError(RuntimeError):
    """An error reported by collie: .status (negative code), .name, .message,
    and for a failed work or comm .fault (collie.Fault: what broke and who),
    with .kind ("peer_dead", "deadline", ...; None without fault data) and
    .ranks (the suspects, a tuple) as shortcuts."""

    status = None

    def __init__(self, status, message="", fault=None):
        self.status = status
        self.name = _lib.lib.collie_status_name(status).decode()
        self.message = message or _lib.lib.collie_strerror(status).decode()
        self.fault = fault
        super().__init__(f"{self.message} ({self.name})")

    @property
    def kind(self):
        return self.fault.kind if self.fault else None

    @property
    def ranks(self):
        return self.fault.ranks if self.fault else ()


class CollieInvalidArgument(CollieError, ValueError):
    status = -1


class CollieNoMemory(CollieError, MemoryError):
    status = -2


class CollieTimeout(CollieError, TimeoutError):
    status = -3


class CollieCancelled(CollieError):
    status = -4


class CollieAborted(CollieError):
    status = -5


class ColliePeerError(CollieError, ConnectionError):
    status = -6


class CollieClosed(CollieError):
    status = -7


class CollieNotMember(CollieError):
    status = -8


class CollieBackendError(CollieError):
    status = -9


class CollieProtocolError(CollieError):
    status = -10


class CollieAuthError(CollieError, PermissionError):
    status = -11


class CollieNotSupported(CollieError, NotImplementedError):
    status = -12


class CollieStateError(CollieError):
    status = -13


class CollieSystemError(CollieError, OSError):
    status = -14


class CollieLimitError(CollieError):
    status = -15


class CollieExists(CollieError):
    status = -16


class CollieNotFound(CollieError, LookupError):
    status = -17


_BY_STATUS = {
    cls.status: cls
    for cls in (
        CollieInvalidArgument,
        CollieNoMemory,
        CollieTimeout,
        CollieCancelled,
        CollieAborted,
        ColliePeerError,
        CollieClosed,
        CollieNotMember,
        CollieBackendError,
        CollieProtocolError,
        CollieAuthError,
        CollieNotSupported,
        CollieStateError,
        CollieSystemError,
        CollieLimitError,
        CollieExists,
        CollieNotFound,
    )
}


def error_for(status, message="", fault=None):
    """The exception for a collie error status (CollieError for unknown codes)."""
    cls = _BY_STATUS.get(status, CollieError)
    if cls is CollieError:
        return CollieError(status, message, fault)
    return cls(status, message, fault)


def check(status, what=""):
    """Raise the exception for a failed call's status, with collie_last_error."""
    if status == OK:
        return
    msg = _lib.last_error()
    if what and what not in msg:
        msg = f"{what}: {msg}" if msg else what
    raise error_for(status, msg)
