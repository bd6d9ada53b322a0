"""Strategy, Sender, Receiver, Iteration and the free functions, one behaviour per test."""

import gc
import mmap
import os
import re
import threading
import weakref

import numpy as np
import pytest
import torch

import wsync
from wsync import Status, WsyncError
from conftest import HEADER, shm_segment


def expect_error(status, *needles):
    """Context manager: the block raises WsyncError(status) whose message has every needle."""

    class _Expect:
        def __enter__(self):
            self._raises = pytest.raises(WsyncError)
            self.info = self._raises.__enter__()
            return self.info

        def __exit__(self, *exc):
            handled = self._raises.__exit__(*exc)
            err = self.info.value
            assert err.status is status, f"{err!r}"
            for needle in needles:
                assert needle in err.message, f"{needle!r} not in {err.message!r}"
            return handled

    return _Expect()


# --- strategies, options, introspection --------------------------------------------------------
def test_options_are_sent_as_json_and_validated():
    with wsync.Strategy("shm", receivers=3, buckets=4, bucket_bytes=1 << 16, checksum=False) as s:
        assert s.kind == "shm"
        assert s.options == {"receivers": 3, "buckets": 4, "bucket_bytes": 1 << 16, "checksum": False}
        body = wsync.describe(s.create_init_info())["body"]
        assert (body["receivers"], body["buckets"], body["bucket_bytes"], body["checksum"]) == (3, 4, 1 << 16, False)


def test_unknown_option_key_is_named():
    with expect_error(Status.INVALID_ARGUMENT, "unknown option 'recievers'", "receivers"):
        wsync.Strategy("shm", recievers=2)


def test_option_of_wrong_type_is_named():
    with expect_error(Status.INVALID_ARGUMENT, "'checksum'", "true or false"):
        wsync.Strategy("shm", checksum=1)


def test_unknown_kind_is_unsupported():
    with expect_error(Status.UNSUPPORTED, "carrier_pigeon"):
        wsync.Strategy("carrier_pigeon")


def test_kinds_lists_shm():
    shm = [k for k in wsync.kinds() if k["kind"] == "shm"]
    assert len(shm) == 1
    assert shm[0]["available"] is True and shm[0]["reason"] == ""


def test_kinds_carry_their_capabilities_as_data():
    caps = {k["kind"]: k["capabilities"] for k in wsync.kinds()}
    assert caps["shm"] == {"tensor_memory": ["host"], "senders": "one", "drop_receiver": True,
                           "reattach": True, "collective": False, "gpu_per_receiver": False,
                           "delta": "host"}
    assert caps["nccl_broadcast"]["collective"] is True
    assert caps["nccl_broadcast"]["drop_receiver"] is False
    assert caps["nccl_broadcast"]["gpu_per_receiver"] is True
    assert caps["cuda_ipc"]["senders"] == "many" and caps["cuda_ipc"]["tensor_memory"] == ["cuda"]


def test_describe_options_of_shm():
    opts = wsync.describe_options("shm")
    assert set(opts) >= {"receivers", "buckets", "bucket_bytes", "checksum", "verify", "timeout_ms"}
    assert all({"type", "side", "doc"} <= set(o) for o in opts.values())
    assert opts["receivers"]["type"] == "uint" and opts["verify"]["side"] == "receiver"
    with expect_error(Status.UNSUPPORTED):
        wsync.describe_options("nope")


def test_init_info_is_made_once():
    with wsync.Strategy("shm") as s:
        s.create_init_info()
        with expect_error(Status.WRONG_STATE, "already"):
            s.create_init_info()


def test_describe_renders_blobs_and_refuses_garbage(sync):
    d = wsync.describe(sync.init)
    assert (d["magic"], d["type"], d["kind"]) == ("wsync", "init", "shm")
    request = sync.sender.send_chunk({"x": torch.ones(2)})
    d = wsync.describe(request)
    assert d["type"] == "request" and d["body"]["tensors"]["names"] == ["x"]
    with expect_error(Status.MALFORMED):
        wsync.describe(b"\x00garbage\xff" * 3)
    with expect_error(Status.INVALID_ARGUMENT, "NULL or empty"):
        wsync.describe(b"")
    with pytest.raises(wsync.InvalidArgumentError):
        wsync.describe("text")


def test_version_functions_agree_with_each_other_and_the_header():
    n = wsync.version_number()
    assert wsync.version() == f"{n // 10000}.{n // 100 % 100}.{n % 100}"
    if HEADER.exists():
        text = HEADER.read_text()
        parts = [int(re.search(rf"#define WSYNC_VERSION_{p} (\d+)", text).group(1))
                 for p in ("MAJOR", "MINOR", "PATCH")]
        assert n == parts[0] * 10000 + parts[1] * 100 + parts[2]


def test_closed_objects_refuse_use():
    s = wsync.Strategy("shm")
    s.close()
    s.close()  # idempotent
    assert s.closed
    with expect_error(Status.WRONG_STATE, "strategy is closed"):
        s.create_init_info()


def test_senders_and_receivers_outlive_their_strategy():
    s = wsync.Strategy("shm")
    init = s.create_init_info()
    tx = s.sender(init)
    rx = wsync.Strategy("shm").receiver(init, 0)
    s.close()
    gc.collect()
    request = tx.send_chunk({"a": torch.arange(3.0)}, last=True)
    with rx.receive(request) as it:
        assert torch.equal(dict(it.items())["a"], torch.arange(3.0))
    tx.flush(5)
    tx.close()
    rx.close()


# --- sender ------------------------------------------------------------------------------------
def test_sender_from_malformed_init_info():
    with wsync.Strategy("shm") as s:
        s.create_init_info()
        with expect_error(Status.MALFORMED):
            s.sender(b"definitely not a blob")


def test_sender_from_another_strategys_init_info(sync):
    with wsync.Strategy("shm") as other:
        other.create_init_info()
        with expect_error(Status.MISMATCH, "segment"):
            other.sender(sync.init)


def test_send_accepts_dict_or_pairs_and_versions_advance(sync):
    assert sync.sender.version == 1
    sync.sender.send_chunk({"a": torch.ones(1)})
    assert sync.sender.version == 1
    sync.sender.send_chunk([("b", torch.ones(1)), ("c", np.ones(2))], last=True)
    assert sync.sender.version == 2


def test_empty_chunk_is_refused_unless_it_commits(sync):
    with expect_error(Status.INVALID_ARGUMENT, "chunk has no tensors"):
        sync.sender.send_chunk({})
    with expect_error(Status.WRONG_STATE, "nothing to commit"):  # empty + last is a commit
        sync.sender.send_chunk({}, last=True)


def test_duplicate_names_are_refused(sync):
    with expect_error(Status.INVALID_ARGUMENT, "tensor 1 ('w')", "duplicate name"):
        sync.sender.send_chunk([("w", torch.ones(2)), ("w", torch.zeros(2))])


def test_zero_size_tensor_is_refused_as_zero_size(sync):
    with expect_error(Status.INVALID_ARGUMENT, "tensor 0 ('e')", "zero-size"):
        sync.sender.send_chunk({"e": torch.empty(0, 4)})
    with expect_error(Status.INVALID_ARGUMENT, "tensor 0 ('n')", "zero-size"):
        sync.sender.send_chunk({"n": np.empty((3, 0), dtype=np.float32)})


def test_non_contiguous_torch_tensor_is_refused_not_copied(sync):
    t = torch.arange(12.0).view(3, 4).t()
    with expect_error(Status.INVALID_ARGUMENT, "tensor 0 ('t')", "not contiguous"):
        sync.sender.send_chunk({"t": t})
    with expect_error(Status.INVALID_ARGUMENT, "('s')", "not contiguous"):
        sync.sender.send_chunk({"s": torch.arange(10.0)[::2]})


def test_non_contiguous_numpy_array_is_refused_not_copied(sync):
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    with expect_error(Status.INVALID_ARGUMENT, "('f')", "not contiguous"):
        sync.sender.send_chunk({"f": np.asfortranarray(a)})
    with expect_error(Status.INVALID_ARGUMENT, "('r')", "not contiguous"):
        sync.sender.send_chunk({"r": a[::-1]})
    with expect_error(Status.INVALID_ARGUMENT, "('odd')", "not contiguous"):
        sync.sender.send_chunk({"odd": np.lib.stride_tricks.as_strided(a, (2, 2), (6, 4))})


def test_contiguous_views_with_unit_dimensions_are_accepted(sync):
    a = torch.arange(12.0).view(3, 4)
    tensors = {"col": a[:, 1:2].contiguous(), "row": a[1:2], "tt": torch.ones(1, 3).t()}
    request = sync.sender.send_chunk(tensors, last=True)
    with sync.receiver.receive(request) as it:
        for name, view in it:
            assert torch.equal(view, tensors[name])


def test_names_are_checked(sync):
    with expect_error(Status.INVALID_ARGUMENT, "NUL"):
        sync.sender.send_chunk({"a\0b": torch.ones(1)})
    with expect_error(Status.INVALID_ARGUMENT, "empty"):
        sync.sender.send_chunk({"": torch.ones(1)})
    with expect_error(Status.INVALID_ARGUMENT, "longer than 1024"):
        sync.sender.send_chunk({"x" * 1025: torch.ones(1)})
    with pytest.raises(wsync.InvalidArgumentError):
        sync.sender.send_chunk({7: torch.ones(1)})


def test_non_tensors_are_type_errors(sync):
    with pytest.raises(wsync.InvalidArgumentError, match="torch.Tensor or numpy.ndarray"):
        sync.sender.send_chunk({"l": [1.0, 2.0]})
    with pytest.raises(wsync.InvalidArgumentError, match="dict or"):
        sync.sender.send_chunk([torch.ones(1)])


def test_too_many_dimensions_are_refused(sync):
    with expect_error(Status.INVALID_ARGUMENT, "ndim 17"):
        sync.sender.send_chunk({"deep": torch.ones([1] * 17)})


def test_chunk_larger_than_a_bucket_is_refused(make_sync):
    s = make_sync(bucket_bytes=4096)
    with expect_error(Status.INVALID_ARGUMENT, "does not fit in one bucket", "'big'"):
        s.sender.send_chunk({"big": torch.ones(2048)})


def test_failed_send_publishes_nothing_and_keeps_the_chunk_number(sync):
    with pytest.raises(WsyncError):
        sync.sender.send_chunk({"bad": torch.empty(0)})
    request = sync.sender.send_chunk({"good": torch.ones(2)}, last=True)
    assert wsync.describe(request)["body"]["chunk"] == 0
    with sync.receiver.receive(request) as it:
        list(it)
    sync.sender.flush(5)
    assert sync.receiver.completed_version == 1


def test_tensor_memory_is_read_during_the_call_only(sync):
    t = torch.arange(6.0)
    request = sync.sender.send_chunk({"t": t}, last=True)
    t.fill_(-1)  # allowed once send_chunk returned
    with sync.receiver.receive(request) as it:
        assert torch.equal(dict(it.items())["t"], torch.arange(6.0))


def test_flush_times_out_naming_the_receiver(make_sync):
    s = make_sync(receivers=2)
    request = s.sender.send_chunk({"a": torch.ones(2)}, last=True)
    with s.receivers[0].receive(request) as it:
        list(it)
    with expect_error(Status.TIMEOUT, "receivers [1]"):
        s.sender.flush(0.05)


def test_flush_needs_a_finite_timeout(sync):
    with expect_error(Status.INVALID_ARGUMENT, "finite"):
        sync.sender.flush(float("inf"))
    with expect_error(Status.INVALID_ARGUMENT, "timeout_ms must be >= 0"):
        sync.sender.flush(-1)
    with expect_error(Status.INVALID_ARGUMENT, "timeout_ms must be >= 0"):
        sync.sender.flush(-0.0001)  # not rounded to 0 (a poll)
    sync.sender.flush(0)  # nothing sent: polls and returns


def test_wait_released_returns_at_once_for_shm_and_refuses_unfinished_versions(sync):
    request = sync.sender.send_chunk({"a": torch.ones(2)}, last=True)
    with sync.receiver.receive(request) as it:
        list(it)
    sync.sender.flush(5)
    sync.sender.wait_released(1, 0)  # shm copied the tensors: nothing of the trainer's is mapped
    sync.sender.wait_released(wsync.Sender.ALL_VERSIONS, 0)
    with expect_error(Status.INVALID_ARGUMENT, "version 2"):
        sync.sender.wait_released(2, 5)
    with expect_error(Status.INVALID_ARGUMENT, "timeout_ms must be >= 0"):
        sync.sender.wait_released(1, -1)


def test_send_blocks_for_a_free_bucket_up_to_timeout_ms(make_sync):
    s = make_sync(buckets=1, timeout_ms=50)
    s.sender.send_chunk({"a": torch.ones(1)})
    with expect_error(Status.TIMEOUT, "no free bucket", "receivers [0]"):
        s.sender.send_chunk({"b": torch.ones(1)})


def test_merge_requests(sync):
    request = sync.sender.send_chunk({"a": torch.ones(1)})
    assert wsync.merge_requests([request]) == request
    with expect_error(Status.UNSUPPORTED, "single sender"):
        wsync.merge_requests([request, request])
    with expect_error(Status.INVALID_ARGUMENT, "no parts"):
        wsync.merge_requests([])
    with expect_error(Status.INVALID_ARGUMENT, "part 0 is NULL or empty"):
        wsync.merge_requests([b""])
    with expect_error(Status.MALFORMED):
        wsync.merge_requests([b"junk"])


# --- receiver ----------------------------------------------------------------------------------
def test_wrong_receiver_index_is_named(sync):
    with expect_error(Status.INVALID_ARGUMENT, "receiver index 5", "1 receiver, index 0"):
        sync.engine_strategy.receiver(sync.init, 5)
    with expect_error(Status.INVALID_ARGUMENT, "unsigned 32-bit"):
        sync.engine_strategy.receiver(sync.init, -1)


def test_receiver_index_taken_by_a_live_process(sync):
    with expect_error(Status.WRONG_STATE, "already attached", f"pid {os.getpid()}"):
        sync.engine_strategy.receiver(sync.init, 0)


def test_receiver_from_malformed_init_info(sync):
    with expect_error(Status.MALFORMED):
        sync.engine_strategy.receiver(sync.init[:-3], 0)


def test_receive_malformed_request(sync):
    with expect_error(Status.MALFORMED):
        sync.receiver.receive(b"\x01\x02\x03")
    with expect_error(Status.MISMATCH):
        sync.receiver.receive(sync.init)  # an init blob is not a request


def test_receive_while_an_iteration_is_open(sync):
    r1 = sync.sender.send_chunk({"a": torch.ones(1)})
    r2 = sync.sender.send_chunk({"b": torch.ones(1)}, last=True)
    it = sync.receiver.receive(r1)
    with expect_error(Status.WRONG_STATE, "still open"):
        sync.receiver.receive(r2)
    list(it)
    it.end()
    with sync.receiver.receive(r2) as it2:
        list(it2)
    sync.sender.flush(5)
    assert sync.receiver.completed_version == 1


def test_replayed_or_reordered_request_is_a_mismatch(sync):
    r1 = sync.sender.send_chunk({"a": torch.ones(1)})
    r2 = sync.sender.send_chunk({"b": torch.ones(1)}, last=True)
    with expect_error(Status.MISMATCH, "chunk 1 of version 1", "expected chunk 0"):
        sync.receiver.receive(r2)
    # Version 1 failed here at its first out-of-order chunk (and the trainer is told so): its
    # chunk 0, arriving late, cannot complete it.
    with expect_error(Status.MISMATCH, "chunk 0 of version 1"):
        sync.receiver.receive(r1)
    state = sync.receiver.poll()
    assert (state.completed_version, state.failed_version) == (0, 1)
    with expect_error(Status.PEER, "failed chunk 1 of version 1", "expected chunk 0"):
        sync.sender.send_chunk({"a": torch.ones(1)}, last=True)  # the trainer hears of it
    r3 = sync.sender.send_chunk({"a": torch.ones(1)}, last=True)
    with sync.receiver.receive(r3) as it:
        list(it)
    assert sync.receiver.completed_version == 2
    with expect_error(Status.MISMATCH, "chunk 0 of version 2", "replayed"):
        sync.receiver.receive(r3)


def test_request_of_another_sync_is_a_mismatch(sync, make_sync):
    other = make_sync()
    request = other.sender.send_chunk({"a": torch.ones(1)})
    with expect_error(Status.MISMATCH, "segment"):
        sync.receiver.receive(request)


def test_completed_version_follows_successful_versions(sync):
    assert sync.receiver.completed_version == 0
    for version in (1, 2, 3):
        for last in (False, True):
            request = sync.sender.send_chunk({"w": torch.full((4,), float(version))}, last=last)
            with sync.receiver.receive(request) as it:
                list(it)
        sync.sender.flush(5)
        assert sync.receiver.completed_version == version


# --- iteration ---------------------------------------------------------------------------------
def test_info_metas_and_peek_describe_without_reading(sync):
    tensors = {"l.0.q.weight": torch.ones(2, 3), "l.0.q.bias": torch.zeros(3, dtype=torch.bfloat16),
               "step": torch.tensor(7)}
    request = sync.sender.send_chunk(tensors, last=True)
    with sync.receiver.receive(request) as it:
        info = it.info
        assert (info.version, info.chunk_index, info.count, info.last) == (1, 0, 3, True)
        assert info.bytes == 6 * 4 + 3 * 2 + 8
        assert len(it) == 3
        assert it.metas() == [
            wsync.TensorMeta("l.0.q.weight", wsync.DType(2, 32, 1), (2, 3)),
            wsync.TensorMeta("l.0.q.bias", wsync.DType(4, 16, 1), (3,)),
            wsync.TensorMeta("step", wsync.DType(0, 64, 1), ()),
        ]
        assert it.peek(1).nbytes == 6
        with expect_error(Status.INVALID_ARGUMENT, "index 3 is out of range"):
            it.peek(3)
        with expect_error(Status.INVALID_ARGUMENT, "index -1 is not a non-negative integer"):
            it.peek(-1)
        list(it)


def test_torch_views_are_zero_copy_and_copies_are_owned(make_sync):
    s = make_sync()
    request = s.sender.send_chunk({"a": torch.arange(64.0), "b": torch.arange(64.0) * 2})
    with s.receiver.receive(request) as it:
        views = dict(it.items())
        a, b = views["a"], views["b"]
        assert b.data_ptr() - a.data_ptr() == 256  # both live in the shared bucket, packed
        assert torch.equal(b, torch.arange(64.0) * 2)
    request = s.sender.send_chunk({"a": torch.arange(64.0)}, last=True)
    with s.receiver.receive(request, copy=True) as it:
        copies = dict(it.items())
    copies["a"].add_(1)  # owned and writable, valid after the iteration ended
    assert torch.equal(copies["a"], torch.arange(64.0) + 1)


def test_numpy_views_of_shm_are_read_only(sync):
    request = sync.sender.send_chunk({"a": np.arange(5, dtype=np.int32)}, last=True)
    with sync.receiver.receive(request, framework="numpy") as it:
        (name, view), = it.items()
        assert not view.flags.writeable
        with pytest.raises(ValueError):
            view[0] = 1
        np.testing.assert_array_equal(view, np.arange(5))


def test_numpy_copies_are_writable(sync):
    request = sync.sender.send_chunk({"a": np.arange(5, dtype=np.int32)}, last=True)
    with sync.receiver.receive(request, framework="numpy", copy=True) as it:
        (_, arr), = it.items()
    arr[0] = 99
    assert arr.flags.writeable and arr.tolist() == [99, 1, 2, 3, 4]


def test_a_view_keeps_its_iteration_alive(sync):
    request = sync.sender.send_chunk({"a": torch.ones(3), "b": torch.ones(3)}, last=True)
    it = sync.receiver.receive(request)
    views = list(it)
    ref = weakref.ref(it)
    del it
    gc.collect()
    assert ref() is not None  # views hold it, so garbage collection does not end it
    ref().end()
    del views
    gc.collect()
    assert ref() is None
    sync.sender.flush(5)
    assert sync.receiver.completed_version == 1


def test_dropping_an_unfinished_iteration_acknowledges_failure_with_a_warning(sync):
    request = sync.sender.send_chunk({"a": torch.ones(3), "b": torch.ones(3)}, last=True)
    it = sync.receiver.receive(request)
    next(iter(it))
    with pytest.warns(wsync.WsyncWarning, match="garbage-collected before end"):
        del it
        gc.collect()
    with expect_error(Status.PEER, "receiver 0", "failed chunk 0 of version 1"):
        sync.sender.flush(5)
    assert sync.receiver.completed_version == 0


def test_ending_early_is_an_error_and_fails_the_chunk(sync):
    request = sync.sender.send_chunk({"a": torch.ones(3), "b": torch.ones(3)}, last=True)
    it = sync.receiver.receive(request)
    next(iter(it))
    with expect_error(Status.WRONG_STATE, "ended after 1 of 2 tensors"):
        it.end()
    assert it.ended
    it.end()  # idempotent
    with expect_error(Status.PEER):
        sync.sender.flush(5)


def test_exception_in_with_block_fails_the_chunk_and_propagates(sync):
    request = sync.sender.send_chunk({"a": torch.ones(3), "b": torch.ones(3)}, last=True)
    with pytest.raises(KeyError, match="loader broke") as info:
        with sync.receiver.receive(request) as it:
            for name, view in it:
                raise KeyError("loader broke")
    assert it.ended
    assert any("acknowledged as failed" in note for note in getattr(info.value, "__notes__", []))
    with expect_error(Status.PEER, "WSYNC_ERR_MISMATCH", "KeyError: 'loader broke'") as flush:
        sync.sender.flush(5)
    [failure] = flush.value.failures
    assert (failure.status, failure.message) == (Status.MISMATCH, "KeyError: 'loader broke'")
    assert sync.receiver.completed_version == 0
    # the next version goes through
    request = sync.sender.send_chunk({"a": torch.ones(3)}, last=True)
    with sync.receiver.receive(request) as it:
        list(it)
    sync.sender.flush(5)
    assert sync.receiver.completed_version == 2


def test_exception_after_every_tensor_was_taken_fails_the_chunk(sync):
    # 0.2's wsync_recv_fail fails a fully consumed iteration: the sender is told.
    request = sync.sender.send_chunk({"a": torch.ones(3)}, last=True)
    with pytest.raises(RuntimeError):
        with sync.receiver.receive(request) as it:
            list(it)
            raise RuntimeError("after the last view")
    with expect_error(Status.PEER, "RuntimeError: after the last view") as flush:
        sync.sender.flush(5)
    assert [f.status for f in flush.value.failures] == [Status.WRONG_STATE]
    assert sync.receiver.completed_version == 0
    request = sync.sender.send_chunk({"a": torch.ones(3)}, last=True)
    with sync.receiver.receive(request) as it:
        list(it)
    assert sync.receiver.completed_version == 2


def test_iterating_an_ended_iteration_is_wrong_state(sync):
    request = sync.sender.send_chunk({"a": torch.ones(3)}, last=True)
    with sync.receiver.receive(request) as it:
        list(it)
    with expect_error(Status.WRONG_STATE, "already ended"):
        list(it)
    with expect_error(Status.WRONG_STATE, "already ended"):
        it.metas()


def test_iteration_is_single_pass(sync):
    request = sync.sender.send_chunk({"a": torch.ones(1), "b": torch.ones(1)}, last=True)
    with sync.receiver.receive(request) as it:
        assert [n for n, _ in it] == ["a", "b"]
        assert list(it) == []


def test_closing_the_receiver_ends_its_open_iteration(make_sync):
    s = make_sync()
    request = s.sender.send_chunk({"a": torch.ones(3)}, last=True)
    it = s.receiver.receive(request)
    s.receiver.close()
    assert it.ended
    it.end()  # nothing left to do, and no use of freed memory
    with expect_error(Status.PEER, "receiver 0", "failed chunk 0 of version 1"):
        s.sender.flush(5)
    with expect_error(Status.WRONG_STATE, "receiver is closed"):
        s.receiver.receive(request)


def test_bad_framework_is_an_invalid_argument(sync):
    with pytest.raises(wsync.InvalidArgumentError, match="framework"):
        sync.receiver.receive(b"x", framework="jax")


def test_corrupted_bytes_fail_verification_naming_the_tensor(make_sync):
    s = make_sync(receivers=2, attach=1, bucket_bytes=1 << 16)  # keeps the segment's name
    payload = np.frombuffer(b"WSYNC-INTEGRITY-MARKER-0123456789" * 4, dtype=np.uint8).copy()
    request = s.sender.send_chunk({"first": np.ones(4, np.float32), "marked": payload}, last=True)
    path = shm_segment(s.init)
    with open(path, "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        at = m.find(payload.tobytes())
        assert at > 0
        m[at] = m[at] ^ 0xFF
    with expect_error(Status.INTEGRITY, "tensor 'marked'", "checksum mismatch"):
        with s.receivers[0].receive(request) as it:
            list(it)
    # Receiver 1 never attached: the flush waits for it to its deadline, then names both.
    with expect_error(Status.PEER, "failed chunk 0 of version 1: WSYNC_ERR_INTEGRITY",
                      "and receivers [1] did not acknowledge within 200 ms") as flush:
        s.sender.flush(0.2)
    assert [(f.receiver, f.status) for f in flush.value.failures] == [
        (0, Status.INTEGRITY), (1, Status.TIMEOUT)]


def test_segment_name_is_gone_once_every_receiver_attached(sync):
    sync.sender.send_chunk({"a": torch.ones(1)})
    assert not os.path.exists(shm_segment(sync.init))


# --- planner -----------------------------------------------------------------------------------
def test_plan_keeps_modules_together_under_the_threshold():
    metas = [("layers.0.attn.q.weight", "float32", (16, 16)),
             ("layers.0.attn.k.weight", "float32", (16, 16)),
             ("layers.0.attn.v.weight", "float32", (16, 16)),
             ("layers.0.mlp.up.weight", "float32", (16, 16)),
             ("layers.1.attn.q.weight", "float32", (16, 16))]
    chunks = wsync.plan(metas, chunk_bytes=3 * 1024, group_depth=2)
    assert [c.indices for c in chunks] == [(0, 1, 2), (3, 4)]
    assert [c.bytes for c in chunks] == [3 * 1024, 2 * 1024]
    assert [c.indices for c in wsync.plan(metas, chunk_bytes=1 << 30)] == [(0, 1, 2, 3, 4)]
    assert len(wsync.plan(metas, chunk_bytes=1024, group_depth=0)) == 5


def test_plan_accepts_tensors_and_metas():
    entries = [("a.w", torch.ones(10)), wsync.TensorMeta("b.w", wsync.DType.of("bfloat16"), (5,)),
               ("c.w", np.ones(3, np.int8))]
    chunks = wsync.plan(entries)
    assert chunks == [wsync.PlannedChunk((0, 1, 2), 40 + 10 + 3)]
    assert wsync.plan({"x.y": torch.ones(2)}) == [wsync.PlannedChunk((0,), 8)]


def test_plan_errors_name_the_cause():
    with expect_error(Status.INVALID_ARGUMENT, "'chunk_bytes' = 0 is out of range"):
        wsync.plan([("a", "float32", (1,))], chunk_bytes=0)
    with expect_error(Status.INVALID_ARGUMENT, "'group_depth' = 99"):
        wsync.plan([("a", "float32", (1,))], group_depth=99)
    with expect_error(Status.INVALID_ARGUMENT, "('z')", "zero-size"):
        wsync.plan([("z", "float32", (0,))])
    with expect_error(Status.INVALID_ARGUMENT, "duplicate"):
        wsync.plan([("a", "float32", (1,)), ("a", "float32", (1,))])
    with pytest.raises(wsync.InvalidArgumentError):
        wsync.plan([object()])


def test_receiver_that_detaches_is_reported_by_flush(make_sync):
    s = make_sync()
    s.sender.send_chunk({"a": torch.ones(1)}, last=True)
    s.receiver.close()
    with expect_error(Status.PEER, "receiver 0",
                      "detached without acknowledging chunk 0 of version 1 (seq 1)"):
        s.sender.flush(5)
    (f,) = s.sender.failures
    assert (f.what, f.receiver, f.version, f.chunk_index) == (wsync.FailureKind.DETACHED, 0, 1, 0)


def test_closing_the_trainer_side_removes_the_segment():
    strategy = wsync.Strategy("shm", receivers=2, bucket_bytes=1 << 16)
    init = strategy.create_init_info()
    path = shm_segment(init)
    sender = strategy.sender(init)
    assert os.path.exists(path)
    strategy.close()
    assert os.path.exists(path)  # the sender still holds it
    sender.close()
    assert not os.path.exists(path)
    lone = wsync.Strategy("shm", bucket_bytes=1 << 16)
    path = shm_segment(lone.create_init_info())
    del lone  # garbage collection closes too
    gc.collect()
    assert not os.path.exists(path)


# --- threads and engines that do not know the kind ---------------------------------------------
def test_flush_releases_the_gil_while_it_waits(sync):
    # If flush held the GIL, this thread could not receive until flush timed out.
    request = sync.sender.send_chunk({"a": torch.ones(3)}, last=True)
    outcome = {}

    def flush():
        try:
            sync.sender.flush(10)
            outcome["ok"] = True
        except WsyncError as exc:
            outcome["error"] = exc

    waiter = threading.Thread(target=flush)
    waiter.start()
    with sync.receiver.receive(request) as it:
        list(it)
    waiter.join(timeout=15)
    assert not waiter.is_alive()
    assert outcome == {"ok": True}


def test_strategy_for_init_info_takes_the_kind_from_the_blob(sync):
    with wsync.Strategy.for_init_info(sync.init, verify=False) as engine_side:
        assert engine_side.kind == wsync.describe(sync.init)["kind"]
        assert engine_side.options == {"verify": False}
    request = sync.sender.send_chunk({"a": torch.ones(1)})
    with expect_error(Status.INVALID_ARGUMENT, "request blob, not an init blob"):
        wsync.Strategy.for_init_info(request)
    with expect_error(Status.MALFORMED):
        wsync.Strategy.for_init_info(b"junk")


def test_options_that_are_not_json_are_invalid_arguments():
    with expect_error(Status.INVALID_ARGUMENT, "JSON"):
        wsync.Strategy("shm", receivers=object())


def _listed_kinds():
    try:  # at collection time; without a library the session fixture reports why and stops
        return [k["kind"] for k in wsync.kinds()]
    except wsync.LibraryError:
        return ["shm"]


@pytest.mark.parametrize("kind", _listed_kinds())
def test_every_listed_kind_passes_through_the_binding(kind):
    # No kind is known to the binding: whatever the library lists describes its options, and
    # a kind whose run-time dependency is missing is refused as UNAVAILABLE with the reason.
    entry = next(k for k in wsync.kinds() if k["kind"] == kind)
    options = wsync.describe_options(kind)
    assert options and all({"type", "side", "doc"} <= set(o) for o in options.values())
    # A network kind ("ucx") requires the devices it listens on to be named (wsync.h).
    kwargs = {"net_devices": "all"} if "net_devices" in options else {}
    if entry["available"]:
        with wsync.Strategy(kind, **kwargs) as s:
            assert s.kind == kind
    else:
        with expect_error(Status.UNAVAILABLE, entry["reason"]):
            wsync.Strategy(kind, **kwargs)


@pytest.mark.parametrize("timeout_s", [2 ** 62 / 1000, 1e16, 1e300])
def test_a_very_long_flush_timeout_still_waits(sync, timeout_s):
    # Past the library's clock range (2^62 ms) or past 64 bits (ctypes would truncate): the
    # binding clamps, rather than failing at once with TIMEOUT or INVALID_ARGUMENT.
    request = sync.sender.send_chunk({"a": torch.ones(3)}, last=True)
    outcome = {}

    def flush():
        try:
            sync.sender.flush(timeout_s)
            outcome["ok"] = True
        except WsyncError as exc:
            outcome["error"] = exc

    waiter = threading.Thread(target=flush)
    waiter.start()
    waiter.join(timeout=0.2)
    assert waiter.is_alive(), outcome  # still waiting for the receiver
    with sync.receiver.receive(request) as it:
        list(it)
    waiter.join(timeout=10)
    assert not waiter.is_alive() and outcome == {"ok": True}


def test_set_stream_takes_a_torch_stream_an_int_or_none_and_shm_ignores_it(sync):
    sync.sender.set_stream(None)
    sync.sender.set_stream(0x1000)
    receiver = sync.receivers[0]
    receiver.set_stream(0x1000)
    receiver.set_stream(None)
    for bad in ("stream", -1, 1 << 64, True, 1.5):
        with pytest.raises(WsyncError) as info:
            sync.sender.set_stream(bad)
        assert info.value.status is Status.INVALID_ARGUMENT and "stream must be" in info.value.message


def test_receiver_set_stream_while_an_iteration_is_open_is_wrong_state(sync):
    request = sync.sender.send_chunk({"w": np.arange(4, dtype=np.float32)}, last=True)
    receiver = sync.receivers[0]
    with receiver.receive(request) as it:
        with pytest.raises(WsyncError) as info:
            receiver.set_stream(0x1000)
        assert info.value.status is Status.WRONG_STATE
        list(it)

