"""Status codes and the one exception every libwsync failure becomes."""

from __future__ import annotations

import enum

from . import _lib


class Status(enum.IntEnum):
    """``wsync_status_t``. Values are pinned by the C ABI; later versions may add codes, which
    show up as pseudo-members named ``WSYNC_ERR_UNKNOWN_<value>``."""

    OK = 0
    INVALID_ARGUMENT = 1  #: a NULL, out-of-range or ill-formed argument or option
    UNSUPPORTED = 2  #: valid, but not supported by this strategy or build
    UNAVAILABLE = 3  #: a run-time dependency is missing (driver, NCCL, /dev/shm)
    MALFORMED = 4  #: a blob is truncated, corrupt, foreign or of a wrong version
    MISMATCH = 5  #: well-formed but does not fit (other strategy, stale request, plan differs)
    TIMEOUT = 6  #: a deadline passed before the peers answered
    PEER = 7  #: a peer died, detached, or reported failure
    NO_MEMORY = 8  #: an allocation or a shared-memory reservation failed
    WRONG_STATE = 9  #: a call out of order (e.g. receive while iterating)
    SYSTEM = 10  #: an operating-system call failed; the message has errno
    INTERNAL = 11  #: a bug in libwsync; please report the message
    INTEGRITY = 12  #: received bytes failed their checksum

    @classmethod
    def _missing_(cls, value):
        # A code added by a newer library: keep its number rather than failing to report it.
        if not isinstance(value, int):
            return None
        member = int.__new__(cls, value)
        member._name_ = f"WSYNC_ERR_UNKNOWN_{value}"
        member._value_ = value
        return member

    @property
    def c_name(self) -> str:
        """The C enumerator's name, e.g. ``"WSYNC_ERR_TIMEOUT"``."""
        if self._name_.startswith("WSYNC_"):
            return self._name_
        return "WSYNC_OK" if self is Status.OK else f"WSYNC_ERR_{self._name_}"


class WsyncError(Exception):
    """A libwsync call failed, or the binding refused an argument before calling it.

    ``status`` is a :class:`Status` member, ``message`` the library's per-thread message
    (``wsync_last_error()``) naming the cause: the option key, the tensor, the receiver index or
    the peer's pid. Errors found by the binding itself before calling the library (a tensor
    whose dtype has no DLPack code, an object of the wrong Python type, an iteration already
    ended) use the same class and the status the library would have used.

    Two statuses get subclasses that are also the matching Python built-in, so ordinary Python
    handlers work too: :class:`InvalidArgumentError` (``INVALID_ARGUMENT``; also ``TypeError``
    and ``ValueError``) and :class:`WrongStateError` (``WRONG_STATE``; also ``RuntimeError``).
    """

    def __init__(self, status, message: str):
        self.status = Status(int(status))
        self.message = message
        super().__init__(self.status, message)

    def __str__(self) -> str:
        return f"{self.status.c_name}: {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.status.c_name}, {self.message!r})"

    def __reduce__(self):
        # Picklable, so an error can cross a multiprocessing queue to a controller.
        return (type(self), (int(self.status), self.message))


class InvalidArgumentError(WsyncError, TypeError, ValueError):
    """``INVALID_ARGUMENT``: a bad argument, found by the library or by the binding (a wrong
    Python type, a name with a NUL, a tensor that is not dense...)."""

    def __init__(self, status=Status.INVALID_ARGUMENT, message: str = ""):
        super().__init__(status, message)


class WrongStateError(WsyncError, RuntimeError):
    """``WRONG_STATE``: a call out of order (a closed handle, an iteration already ended, a
    receive while another iteration is open)."""

    def __init__(self, status=Status.WRONG_STATE, message: str = ""):
        super().__init__(status, message)


_CLASSES = {Status.INVALID_ARGUMENT: InvalidArgumentError, Status.WRONG_STATE: WrongStateError}


def error(status, message: str) -> WsyncError:
    """The :class:`WsyncError` (or its subclass for that status) for ``status`` and ``message``."""
    status = Status(int(status))
    return _CLASSES.get(status, WsyncError)(status, message)


def invalid(message: str) -> InvalidArgumentError:
    """An ``INVALID_ARGUMENT`` error the binding found before calling the library."""
    return InvalidArgumentError(Status.INVALID_ARGUMENT, message)


def last_error(lib=None) -> str:
    """The calling thread's last libwsync failure message (``wsync_last_error()``)."""
    raw = (lib or _lib.lib()).wsync_last_error()
    return raw.decode("utf-8", "replace") if raw else ""


def raise_for(status: int, lib=None, context: str = "") -> None:
    """Raises :class:`WsyncError` for a non-zero status, reading the message right away, on
    the thread that made the failing call."""
    message = last_error(lib)
    if context:
        message = f"{context}: {message}" if message else context
    raise error(status, message)


def status_string(status: int) -> str:
    """``wsync_status_string()``: the library's static name for a status value."""
    return _lib.lib().wsync_status_string(int(status)).decode("ascii", "replace")
