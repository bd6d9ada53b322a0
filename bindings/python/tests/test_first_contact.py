"""What a new engine author meets first (issue 39), in Python: messages name this package's
calls, an index held by a live process names its pid and the remedy, the rest of a failed
version is SKIPPED, and an exception leaving the iteration reaches the trainer as itself."""

import os

import pytest
import torch

import wsync
from wsync import Status


def test_an_index_held_by_a_live_process_names_the_pid_and_the_python_remedy(make_sync):
    s = make_sync()
    other = wsync.Strategy("shm")
    try:
        with pytest.raises(wsync.WsyncError) as info:
            other.receiver(s.init, 0)
    finally:
        other.close()
    e = info.value
    assert e.status is Status.WRONG_STATE
    assert f"pid {os.getpid()}" in e.message and "end that process" in e.message
    assert "Sender.drop_receiver" in e.message and "wsync_" not in e.message


def test_plain_iteration_refuses_a_part_naming_the_python_calls_that_take_it(make_sync):
    s = make_sync(bucket_bytes=64 << 10, buckets=4)
    request = s.sender.send_chunk([("big", torch.ones(2 * 16384))], parts=[(0, 64 << 10)])
    with pytest.raises(wsync.WsyncError) as info:
        with s.receiver.receive(request) as it:
            list(it)
    assert info.value.status is Status.UNSUPPORTED
    assert "Iteration.iter_parts" in info.value.message and "Iteration.copy_into" in info.value.message
    assert "wsync_recv" not in info.value.message


def test_the_rest_of_a_failed_version_is_skipped_and_the_trainer_hears_the_loaders_error(make_sync):
    s = make_sync(buckets=3)
    first = s.sender.send_chunk([("a", torch.ones(3))])
    second = s.sender.send_chunk([("b", torch.ones(3))], last=True)
    with pytest.raises(KeyError):
        with s.receiver.receive(first) as it:
            for name, view in it:
                raise KeyError(name)
    with pytest.raises(wsync.WsyncError) as info:
        s.receiver.receive(second)
    assert info.value.status is Status.SKIPPED, info.value
    assert "already failed here" in info.value.message
    assert s.receiver.poll().failed_status is Status.MISMATCH
    with pytest.raises(wsync.WsyncError) as flushed:
        s.sender.flush(timeout_s=5)
    [f] = flushed.value.failures
    assert (f.status, f.message) == (Status.MISMATCH, "KeyError: 'a'")
