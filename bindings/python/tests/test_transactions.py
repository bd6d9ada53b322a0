"""Versions are transactions (ABI 0.2): failing a chunk after its last view, failures as data on
the trainer's errors, dropping a receiver, committing without data, abandoning, and polling a
receiver to decide whether to roll back."""

import os

import pytest
import torch

import wsync
from wsync import FailureKind, Status, WsyncError
from wsync.engine import ModuleLoader
from wsync.trainer import send_model


def receive_all(receiver, request):
    with receiver.receive(request) as it:
        return it.info, [name for name, _ in it]


# --- failing a chunk --------------------------------------------------------------------------
def test_fail_after_the_last_view_reaches_the_flush_as_fields(sync):
    request = sync.sender.send_chunk({"a": torch.ones(3), "b": torch.ones(2)}, last=True)
    it = sync.receiver.receive(request)
    assert [name for name, _ in it] == ["a", "b"]  # every view taken
    it.fail(Status.MISMATCH, "tensor 'b' has no home in this engine")
    assert it.ended
    with pytest.raises(WsyncError) as info:
        sync.sender.flush(5)
    err = info.value
    assert err.status is Status.PEER
    assert "tensor 'b' has no home in this engine" in err.message
    [failure] = err.failures
    assert failure.what is FailureKind.FAILED
    assert failure.status is Status.MISMATCH
    assert (failure.receiver, failure.version, failure.chunk_index) == (0, 1, 0)
    assert failure.pid == os.getpid()
    assert failure.message == "tensor 'b' has no home in this engine"
    assert sync.sender.failures == err.failures
    assert sync.receiver.completed_version == 0


def test_a_loader_failing_after_the_last_view_fails_the_trainers_flush(make_sync):
    # The engine helper takes the chunk's only (so last) view and its copy fails: the chunk is
    # failed with the copy's error, not acknowledged as loaded.
    s = make_sync()
    request = s.sender.send_chunk({"w": torch.ones(4)}, last=True)
    target = {"w": torch.zeros(4)}
    loader = ModuleLoader(target)

    class Broken(dict):
        def get(self, name, default=None):
            t = super().get(name, default)
            if t is None:
                return t

            class Refuses:
                shape = t.shape
                is_cuda = False

                def copy_(self, view):
                    raise MemoryError("cannot place 'w'")

            return Refuses()

    loader.targets = Broken(loader.targets)
    with pytest.raises(MemoryError):
        loader.load(s.receiver, request)
    with pytest.raises(WsyncError) as info:
        s.sender.flush(5)
    [failure] = info.value.failures
    assert (failure.status, failure.message) == (Status.NO_MEMORY, "MemoryError: cannot place 'w'")
    state = s.receiver.poll()
    assert (state.failed_version, state.failed_status, state.completed_version) == (
        1, Status.NO_MEMORY, 0)


def test_fail_needs_an_error_status_and_an_open_iteration(sync):
    request = sync.sender.send_chunk({"a": torch.ones(1)}, last=True)
    it = sync.receiver.receive(request)
    with pytest.raises(wsync.InvalidArgumentError, match="not OK"):
        it.fail(Status.OK, "fine")
    assert not it.ended  # refused before the library was called
    it.fail(Status.INTEGRITY, "x" * 1000 + "é")  # cut to 255 bytes
    with pytest.raises(wsync.WrongStateError, match="already ended"):
        it.fail(Status.INTEGRITY, "again")
    with pytest.raises(WsyncError) as info:
        sync.sender.flush(5)
    message = info.value.failures[0].message
    assert set(message) == {"x"} and len(message) <= 255


def test_failed_version_is_not_completed_and_the_next_one_is(sync):
    request = sync.sender.send_chunk({"a": torch.ones(1)}, last=True)
    with pytest.raises(ValueError):
        with sync.receiver.receive(request) as it:
            list(it)
            raise ValueError("bad values")
    with pytest.raises(WsyncError):
        sync.sender.flush(5)
    request = sync.sender.send_chunk({"a": torch.ones(1)}, last=True)
    receive_all(sync.receiver, request)
    sync.sender.flush(5)
    assert sync.receiver.completed_version == 2


# --- membership -------------------------------------------------------------------------------
def test_drop_receiver_lets_flush_succeed_for_the_rest(make_sync):
    s = make_sync(receivers=2)
    request = s.sender.send_chunk({"a": torch.ones(2)}, last=True)
    receive_all(s.receivers[0], request)  # receiver 1 never answers (a frozen engine)
    with pytest.raises(WsyncError) as info:
        s.sender.flush(0.2)
    assert info.value.status is Status.TIMEOUT
    assert [(f.receiver, f.what) for f in info.value.failures] == [(1, FailureKind.TIMEOUT)]
    s.sender.drop_receiver(1)
    s.sender.flush(5)
    assert s.sender.failures == ()
    assert s.receivers[0].completed_version == 1
    # the next version goes to receiver 0 only
    request = s.sender.send_chunk({"a": torch.ones(2)}, last=True)
    receive_all(s.receivers[0], request)
    s.sender.flush(5)
    assert s.receivers[0].completed_version == 2
    # the dropped receiver learns it at its next call
    with pytest.raises(WsyncError) as info:
        s.receivers[1].receive(request)
    assert info.value.status is Status.PEER
    assert s.receivers[1].poll().dropped


def test_drop_receiver_checks_the_index(make_sync):
    s = make_sync(receivers=2)
    with pytest.raises(wsync.InvalidArgumentError):
        s.sender.drop_receiver(2)
    with pytest.raises(wsync.InvalidArgumentError):
        s.sender.drop_receiver(-1)


# --- commit and abandon -----------------------------------------------------------------------


def test_commit_returns_a_request_with_the_manifest_and_begins_the_next_version(sync):
    sync.sender.send_chunk({"a": torch.ones(3)})
    commit = sync.sender.commit()
    assert sync.sender.version == 2
    body = wsync.describe(commit)["body"]
    assert (body["version"], body["chunk"], body["last"]) == (1, 1, True)
    assert body["tensors"]["names"] == []
    assert (body["manifest"]["tensors"], body["manifest"]["bytes"]) == (1, 12)


def test_commit_without_data_completes_the_version(sync):
    first = sync.sender.send_chunk({"a": torch.ones(3)})
    commit = sync.sender.commit()
    assert sync.sender.version == 2
    info, names = receive_all(sync.receiver, first)
    assert (info.version, info.chunk_index, info.last, names) == (1, 0, False, ["a"])
    assert sync.receiver.completed_version == 0  # not committed yet here
    info, names = receive_all(sync.receiver, commit)
    assert (info.version, info.chunk_index, info.last, info.count, names) == (1, 1, True, 0, [])
    assert (info.version_tensors, info.version_bytes) == (1, 12)
    assert info.version_chunks >= 1
    sync.sender.flush(5)
    assert sync.receiver.completed_version == 1


def test_commit_with_nothing_sent_is_wrong_state(sync):
    with pytest.raises(wsync.WrongStateError):
        sync.sender.commit()


def test_an_empty_last_chunk_is_a_commit(sync):
    first = sync.sender.send_chunk({"a": torch.ones(3)})
    commit = sync.sender.send_chunk({}, last=True)
    receive_all(sync.receiver, first)
    info, names = receive_all(sync.receiver, commit)
    assert info.last and info.count == 0 and names == []
    assert sync.receiver.completed_version == 1


def test_the_last_chunk_carries_the_manifest(sync):
    a = sync.sender.send_chunk({"a": torch.ones(3)})
    b = sync.sender.send_chunk({"b": torch.ones(2, dtype=torch.float64), "c": torch.ones(1)},
                               last=True)
    info, _ = receive_all(sync.receiver, a)
    assert (info.version_chunks, info.version_tensors, info.version_bytes) == (0, 0, 0)
    info, _ = receive_all(sync.receiver, b)
    assert (info.count, info.bytes) == (2, 20)
    assert (info.version_chunks, info.version_tensors, info.version_bytes) == (2, 3, 32)


def test_poll_after_an_abandon_reports_the_failed_version(sync):
    first = sync.sender.send_chunk({"a": torch.ones(3)})
    receive_all(sync.receiver, first)
    assert sync.receiver.poll().open_version == 1
    sync.sender.abandon()
    state = sync.receiver.poll()
    assert state.failed_version == 1 and state.failed_status is Status.ABANDONED
    assert (state.open_version, state.completed_version) == (0, 0)
    assert not state.dropped and not state.sender_gone
    # the next chunk begins a new version, which completes
    assert sync.sender.version == 2
    request = sync.sender.send_chunk({"a": torch.ones(3)}, last=True)
    info, _ = receive_all(sync.receiver, request)
    assert info.version == 2
    sync.sender.flush(5)
    assert sync.receiver.poll().completed_version == 2


def test_a_chunk_of_an_abandoned_version_is_refused_as_abandoned(sync):
    first = sync.sender.send_chunk({"a": torch.ones(3)})
    second = sync.sender.send_chunk({"b": torch.ones(3)})
    receive_all(sync.receiver, first)
    sync.sender.abandon()
    with pytest.raises(wsync.AbandonedError) as info:
        sync.receiver.receive(second)
    assert info.value.status is Status.ABANDONED


def test_abandon_without_a_published_chunk_does_nothing(sync):
    sync.sender.abandon()
    assert sync.sender.version == 1
    request = sync.sender.send_chunk({"a": torch.ones(1)}, last=True)
    receive_all(sync.receiver, request)
    assert sync.receiver.completed_version == 1


def test_poll_refuses_while_an_iteration_is_open(sync):
    request = sync.sender.send_chunk({"a": torch.ones(1)}, last=True)
    with sync.receiver.receive(request) as it:
        with pytest.raises(wsync.WrongStateError):
            sync.receiver.poll()
        list(it)


def test_send_model_abandons_the_version_when_forwarding_fails(make_sync):
    s = make_sync(buckets=4, bucket_bytes=1 << 16)
    model = {f"layers.{i}.w": torch.full((1024,), float(i)) for i in range(4)}
    seen = []

    def forward(request):
        seen.append(request)
        receive_all(s.receiver, request)
        raise ConnectionError("controller lost")

    with pytest.raises(ConnectionError):
        send_model(s.sender, model, chunk_bytes=8 << 10, group_depth=0, on_request=forward)
    assert len(seen) == 1
    state = s.receiver.poll()
    assert (state.failed_version, state.failed_status) == (1, Status.ABANDONED)
    send_model(s.sender, model, chunk_bytes=8 << 10, group_depth=0,
               on_request=lambda r: receive_all(s.receiver, r), flush_timeout_s=5)
    assert s.receiver.completed_version == 2
