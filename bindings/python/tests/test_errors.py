"""Statuses and WsyncError: every failure becomes WsyncError(status, message naming the cause)."""

import pickle
import threading

import pytest

import wsync
from wsync import Status, WsyncError


@pytest.mark.parametrize("status", list(Status))
def test_status_names_match_the_library(status):
    assert wsync.status_string(status) == status.c_name


def test_unknown_status_is_kept_not_dropped():
    s = Status(4242)
    assert int(s) == 4242
    assert s.c_name == "WSYNC_ERR_UNKNOWN_4242"
    assert wsync.status_string(4242) == "WSYNC_ERR_UNKNOWN"
    err = WsyncError(4242, "from the future")
    assert err.status == 4242 and "WSYNC_ERR_UNKNOWN_4242" in str(err)


def test_error_carries_status_and_message():
    err = WsyncError(Status.TIMEOUT, "receivers [1] did not acknowledge")
    assert err.status is Status.TIMEOUT
    assert err.message == "receivers [1] did not acknowledge"
    assert str(err) == "WSYNC_ERR_TIMEOUT: receivers [1] did not acknowledge"
    assert "WSYNC_ERR_TIMEOUT" in repr(err)


def test_error_survives_pickling():
    err = pickle.loads(pickle.dumps(WsyncError(Status.PEER, "receiver 0 died")))
    assert err.status is Status.PEER and err.message == "receiver 0 died"
    err = pickle.loads(pickle.dumps(wsync.InvalidArgumentError(Status.INVALID_ARGUMENT, "key")))
    assert type(err) is wsync.InvalidArgumentError and err.message == "key"


def test_invalid_argument_and_wrong_state_are_also_python_builtins():
    with pytest.raises(wsync.InvalidArgumentError) as info:
        wsync.Strategy("shm", receivers=0)  # found by the library
    assert isinstance(info.value, (TypeError, ValueError)) and isinstance(info.value, WsyncError)
    with pytest.raises(TypeError):
        wsync.Strategy(b"shm")  # found by the binding
    s = wsync.Strategy("shm")
    s.close()
    with pytest.raises(RuntimeError, match="strategy is closed") as info:
        s.create_init_info()
    assert type(info.value) is wsync.WrongStateError and info.value.status is Status.WRONG_STATE


def test_other_statuses_are_plain_wsync_errors():
    with pytest.raises(WsyncError) as info:
        wsync.Strategy("no_such_kind")
    assert type(info.value) is WsyncError and info.value.status is Status.UNSUPPORTED


def test_library_failure_becomes_error_with_last_error_text():
    with pytest.raises(WsyncError) as info:
        wsync.Strategy("shm", receivers=0)
    assert info.value.status is Status.INVALID_ARGUMENT
    assert "'receivers'" in info.value.message and "out of range" in info.value.message
    assert wsync.last_error() == info.value.message  # the per-thread slot, read right away


def test_messages_are_per_thread():
    seen = {}

    def fail_in_thread():
        try:
            wsync.Strategy("shm", buckets=1000)
        except WsyncError as exc:
            seen["thread"] = exc.message
        seen["thread_last"] = wsync.last_error()

    with pytest.raises(WsyncError) as info:
        wsync.Strategy("shm", receivers=0)
    t = threading.Thread(target=fail_in_thread)
    t.start()
    t.join(timeout=10)
    assert not t.is_alive()
    assert "'buckets'" in seen["thread"] and seen["thread_last"] == seen["thread"]
    assert wsync.last_error() == info.value.message  # untouched by the other thread


def test_abandoned_has_its_own_class():
    err = wsync._errors.error(Status.ABANDONED, "version 3 was abandoned")
    assert type(err) is wsync.AbandonedError and isinstance(err, WsyncError)
    assert err.status is Status.ABANDONED and err.failures == ()
    assert str(err) == "WSYNC_ERR_ABANDONED: version 3 was abandoned"


def test_failures_travel_with_the_error_and_survive_pickling():
    failure = wsync.Failure(wsync.FailureKind.FAILED, Status.MISMATCH, 1, 2, 0, 42, "shape differs")
    err = WsyncError(Status.PEER, "receiver 1 failed", [failure])
    assert err.failures == (failure,)
    back = pickle.loads(pickle.dumps(err))
    assert back.failures == (failure,) and back.status is Status.PEER
    assert str(failure) == ("receiver 1 failed (chunk 0 of version 2): WSYNC_ERR_MISMATCH: "
                            "shape differs")


def test_unknown_failure_kind_is_kept():
    kind = wsync.FailureKind(77)
    assert int(kind) == 77 and kind.name == "UNKNOWN_77"


@pytest.mark.parametrize("exc, status", [
    (KeyError("x"), Status.MISMATCH), (ValueError("x"), Status.MISMATCH),
    (TypeError("x"), Status.MISMATCH), (IndexError("x"), Status.MISMATCH),
    (MemoryError(), Status.NO_MEMORY), (TimeoutError(), Status.TIMEOUT),
    (PermissionError(), Status.SYSTEM), (RuntimeError("x"), Status.WRONG_STATE),
    (KeyboardInterrupt(), Status.WRONG_STATE),
    (WsyncError(Status.INTEGRITY, "x"), Status.INTEGRITY),
    (wsync.InvalidArgumentError(message="x"), Status.INVALID_ARGUMENT),
])
def test_status_for_an_exception_leaving_a_receive_block(exc, status):
    assert wsync.status_for_exception(exc) is status
