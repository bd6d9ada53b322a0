"""Status codes, receivers' failures as data, and the one exception every libwsync failure
becomes."""

from __future__ import annotations

import ctypes
import enum
import re
from dataclasses import dataclass
from typing import Optional, Sequence, Tuple

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
    INTEGRITY = 12  #: received bytes or a blob failed their checksum
    ABANDONED = 13  #: the sender abandoned the version (a send failed, abandon(), trainer died)
    SKIPPED = 14  #: a later chunk of a version that already failed here, skipped unread (0.7.0)

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


class FailureKind(enum.IntEnum):
    """``wsync_failure_t.what``: how a receiver failed, as the sender learnt it."""

    FAILED = 1  #: the receiver failed a chunk (its loader, a checksum, the order)
    DIED = 2  #: the receiver's process died owing a chunk
    DETACHED = 3  #: the receiver was destroyed owing a chunk
    TIMEOUT = 4  #: the receiver did not answer by the deadline
    DROPPED = 5  #: the receiver was dropped by the sender

    @classmethod
    def _missing_(cls, value):
        # A kind added by a newer library: keep its number.
        if not isinstance(value, int):
            return None
        member = int.__new__(cls, value)
        member._name_ = f"UNKNOWN_{value}"
        member._value_ = value
        return member


#: ``WSYNC_NO_CHUNK``: ``wsync_failure_t.chunk_index`` when no chunk is known (the binding
#: reports it as ``None``).
NO_CHUNK = 0xFFFFFFFF


@dataclass(frozen=True)
class Failure:
    """One receiver's failure as the sender learnt it (``wsync_failure_t``): data, not only
    text. A trainer can act on it: drop the receiver, resend the version, or log the engine's
    own status and message."""

    what: FailureKind  #: how it failed
    status: "Status"  #: the receiver's own status (e.g. MISMATCH from its loader); PEER for a death
    receiver: int  #: receiver index
    version: int  #: version of the chunk, 0 if unknown
    chunk_index: Optional[int]  #: chunk within that version, None if unknown
    pid: int  #: the receiver's pid as it saw itself, 0 if unknown (for messages only)
    message: str  #: the receiver's own message (possibly cut at 255 bytes)

    def __str__(self) -> str:
        where = f"version {self.version}" if self.version else "no version"
        if self.chunk_index is not None:
            where = f"chunk {self.chunk_index} of {where}"
        return (f"receiver {self.receiver} {self.what.name.lower()} ({where}): "
                f"{self.status.c_name}: {self.message}")


class WsyncError(Exception):
    """A libwsync call failed, or the binding refused an argument before calling it.

    ``status`` is a :class:`Status` member, ``message`` the library's per-thread message
    (``wsync_last_error()``) naming the cause: the option key, the tensor, the receiver index or
    the peer's pid. Errors found by the binding itself before calling the library (a tensor
    whose dtype has no DLPack code, an object of the wrong Python type, an iteration already
    ended) use the same class and the status the library would have used.

    Two statuses get subclasses that are also the matching Python built-in, so ordinary Python
    handlers work too: :class:`InvalidArgumentError` (``INVALID_ARGUMENT``; also ``TypeError``
    and ``ValueError``) and :class:`WrongStateError` (``WRONG_STATE``; also ``RuntimeError``);
    ``ABANDONED`` gets :class:`AbandonedError`.

    ``failures`` is a tuple of :class:`Failure`: when a sender call (``send_chunk``,
    ``commit``, ``flush``) fails because of receivers, one entry per receiver failure, read
    from ``wsync_sender_failure``; empty otherwise.
    """

    def __init__(self, status, message: str, failures: Sequence[Failure] = ()):
        self.status = Status(int(status))
        self.message = message
        self.failures: Tuple[Failure, ...] = tuple(failures)
        super().__init__(self.status, message)

    def __str__(self) -> str:
        return f"{self.status.c_name}: {self.message}"

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.status.c_name}, {self.message!r})"

    def __reduce__(self):
        # Picklable, so an error can cross a multiprocessing queue to a controller.
        return (type(self), (int(self.status), self.message, self.failures))


class InvalidArgumentError(WsyncError, TypeError, ValueError):
    """``INVALID_ARGUMENT``: a bad argument, found by the library or by the binding (a wrong
    Python type, a name with a NUL, a tensor that is not dense...)."""

    def __init__(self, status=Status.INVALID_ARGUMENT, message: str = "", failures=()):
        super().__init__(status, message, failures)


class WrongStateError(WsyncError, RuntimeError):
    """``WRONG_STATE``: a call out of order (a closed handle, an iteration already ended, a
    receive while another iteration is open)."""

    def __init__(self, status=Status.WRONG_STATE, message: str = "", failures=()):
        super().__init__(status, message, failures)


class AbandonedError(WsyncError):
    """``ABANDONED``: the sender abandoned the version this call belonged to (a send failed, the
    trainer called :meth:`wsync.Sender.abandon`, or it died mid-version). Nothing of that
    version completes; the trainer's next chunk begins a new version."""

    def __init__(self, status=Status.ABANDONED, message: str = "", failures=()):
        super().__init__(status, message, failures)


_CLASSES = {Status.INVALID_ARGUMENT: InvalidArgumentError, Status.WRONG_STATE: WrongStateError,
            Status.ABANDONED: AbandonedError}


def error(status, message: str, failures: Sequence[Failure] = ()) -> WsyncError:
    """The :class:`WsyncError` (or its subclass for that status) for ``status`` and ``message``."""
    status = Status(int(status))
    return _CLASSES.get(status, WsyncError)(status, message, failures)


def invalid(message: str) -> InvalidArgumentError:
    """An ``INVALID_ARGUMENT`` error the binding found before calling the library."""
    return InvalidArgumentError(Status.INVALID_ARGUMENT, message)


def last_error(lib=None) -> str:
    """The calling thread's last libwsync failure message (``wsync_last_error()``)."""
    raw = (lib or _lib.lib()).wsync_last_error()
    return raw.decode("utf-8", "replace") if raw else ""


# The C functions the library's messages name, and the calls of this package that make them: a
# Python user is told ``Iteration.copy_into``, not ``wsync_recv_copy`` (user trial).
_PYTHON_NAMES = {
    "wsync_recv_copy": "Iteration.copy_into",
    "wsync_recv_next_part": "Iteration.iter_parts",
    "wsync_recv_next": "iterating the Iteration",
    "wsync_recv_apply": "Iteration.apply",
    "wsync_recv_end": "Iteration.end",
    "wsync_recv_fail": "Iteration.fail",
    "wsync_recv_peek": "Iteration.peek",
    "wsync_recv_part": "Iteration.part",
    "wsync_recv_patch": "Iteration.patch",
    "wsync_recv_info": "Iteration.info",
    "wsync_dest_table_create": "Receiver.dest_table",
    "wsync_receiver_land": "Receiver.land",
    "wsync_sender_send_chunk": "Sender.send_chunk",
    "wsync_sender_send_parts": "Sender.send_chunk",
    "wsync_sender_commit": "Sender.commit",
    "wsync_sender_abandon": "Sender.abandon",
    "wsync_sender_flush": "Sender.flush",
    "wsync_sender_drop_receiver": "Sender.drop_receiver",
    "wsync_sender_wait_released": "Sender.wait_released",
    "wsync_sender_set_stream": "Sender.set_stream",
    "wsync_sender_create": "Strategy.sender",
    "wsync_receiver_create": "Strategy.receiver",
    "wsync_receiver_receive": "Receiver.receive",
    "wsync_receiver_poll": "Receiver.poll",
    "wsync_receiver_completed_version": "Receiver.completed_version",
    "wsync_receiver_set_stream": "Receiver.set_stream",
    "wsync_strategy_create_init_info": "Strategy.create_init_info",
    "wsync_strategy_create": "wsync.Strategy",
    "wsync_plan_create": "wsync.plan",
    "wsync_request_merge": "wsync.merge_requests",
}
_C_NAME = re.compile(r"\bwsync_[a-z0-9_]+")


def in_python_terms(message: str) -> str:
    """``message`` with the C function names it mentions replaced by this package's calls."""
    return _C_NAME.sub(lambda m: _PYTHON_NAMES.get(m.group(0), m.group(0)), message)


def raise_for(status: int, lib=None, context: str = "", sender: Optional[int] = None) -> None:
    """Raises :class:`WsyncError` for a non-zero status, reading the message right away, on
    the thread that made the failing call, naming this package's calls where the library names
    its C functions. With ``sender`` (the C handle of the sender whose call failed) the error's
    ``failures`` are read from it too."""
    message = in_python_terms(last_error(lib))
    if context:
        message = f"{context}: {message}" if message else context
    failures = sender_failures(lib or _lib.lib(), sender) if sender is not None else ()
    raise error(status, message, failures)


def _failure_from(raw) -> Failure:
    chunk = int(raw.chunk_index)
    return Failure(
        what=FailureKind(int(raw.what)),
        status=Status(int(raw.status)),
        receiver=int(raw.receiver),
        version=int(raw.version),
        chunk_index=None if chunk == NO_CHUNK else chunk,
        pid=int(raw.pid),
        message=raw.message.decode("utf-8", "replace"),
    )


def sender_failures(lib, sender: int) -> Tuple[Failure, ...]:
    """The receiver failures the sender's last failed call found (``wsync_sender_failure_count``
    and ``wsync_sender_failure``); empty when there are none or they cannot be read."""
    count = ctypes.c_size_t()
    if lib.wsync_sender_failure_count(sender, ctypes.byref(count)):
        return ()
    out = []
    for i in range(count.value):
        raw = _lib.sized(_lib.Failure)
        if lib.wsync_sender_failure(sender, i, ctypes.byref(raw)):
            break
        out.append(_failure_from(raw))
    return tuple(out)


def status_string(status: int) -> str:
    """``wsync_status_string()``: the library's static name for a status value."""
    return _lib.lib().wsync_status_string(int(status)).decode("ascii", "replace")
