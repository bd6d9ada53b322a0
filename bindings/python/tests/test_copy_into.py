"""Iteration.copy_into (wsync_recv_copy) and ModuleLoader's copy into CPU parameters."""

import mmap

import numpy as np
import pytest
import torch

import wsync
from wsync import Status, WsyncError
from wsync.engine import ModuleLoader
from conftest import shm_segment


def expect(status, *needles):
    raises = pytest.raises(WsyncError)

    class _Expect:
        def __enter__(self):
            self.info = raises.__enter__()
            return self.info

        def __exit__(self, *exc):
            handled = raises.__exit__(*exc)
            assert self.info.value.status is status, repr(self.info.value)
            for n in needles:
                assert n in self.info.value.message, self.info.value.message
            return handled

    return _Expect()


def test_copy_into_a_torch_tensor_is_bit_exact_and_takes_the_tensor(sync):
    a, b = torch.randn(1000), torch.arange(77, dtype=torch.int64)
    request = sync.sender.send_chunk({"a": a, "b": b}, last=True)
    out = torch.empty(1000)
    with sync.receiver.receive(request) as it:
        assert it.copy_into(0, out) == 4000
        assert [name for name, _ in it] == ["b"]  # "a" was taken by the copy
    assert torch.equal(out, a)
    assert sync.receiver.completed_version == 1


def test_copy_into_numpy_and_bytearray_with_a_byte_range(sync):
    src = np.arange(256, dtype=np.uint8)
    request = sync.sender.send_chunk({"x": src}, last=True)
    arr, buf = np.zeros(10, np.uint8), bytearray(5)
    with sync.receiver.receive(request, framework="numpy") as it:
        assert it.copy_into(0, arr, offset=100, nbytes=10) == 10
        assert it.copy_into(0, buf, offset=251) == 5  # the rest of the tensor
    assert arr.tolist() == list(range(100, 110))
    assert bytes(buf) == bytes(range(251, 256))


def test_copy_into_refuses_bad_ranges_and_destinations_and_loses_nothing(sync):
    request = sync.sender.send_chunk({"x": torch.ones(4)}, last=True)
    with sync.receiver.receive(request) as it:
        with expect(Status.INVALID_ARGUMENT, "index 1 is out of range"):
            it.copy_into(1, torch.empty(4))
        with expect(Status.INVALID_ARGUMENT, "'x'", "which has 16 bytes"):
            it.copy_into(0, torch.empty(8), offset=8, nbytes=9)
        with expect(Status.INVALID_ARGUMENT, "holds 8 bytes"):
            it.copy_into(0, torch.empty(2))
        with expect(Status.INVALID_ARGUMENT, "not contiguous"):
            it.copy_into(0, torch.empty(4, 2).t())
        with expect(Status.INVALID_ARGUMENT, "read-only"):
            it.copy_into(0, b"0123456789abcdef")
        out = torch.empty(4)
        it.copy_into(0, out)
    assert torch.equal(out, torch.ones(4))


def test_copy_into_catches_a_flipped_byte_naming_the_tensor(make_sync):
    s = make_sync(receivers=2, attach=1, bucket_bytes=1 << 16)  # keeps the segment's name
    payload = np.frombuffer(b"WSYNC-COPY-INTO-MARKER-0123456789" * 4, dtype=np.uint8).copy()
    request = s.sender.send_chunk({"marked": payload}, last=True)
    with open(shm_segment(s.init), "r+b") as f, mmap.mmap(f.fileno(), 0) as m:
        at = m.find(payload.tobytes())
        m[at + 3] = m[at + 3] ^ 0x01
    with expect(Status.INTEGRITY, "tensor 'marked'", "checksum mismatch"):
        with s.receivers[0].receive(request) as it:
            it.copy_into(0, np.empty(payload.size, np.uint8))


def test_module_loader_copies_into_cpu_parameters_in_place(sync):
    trainer, engine = torch.nn.Linear(16, 8), torch.nn.Linear(16, 8)
    weight_storage = engine.weight.data_ptr()
    request = sync.sender.send_chunk(dict(trainer.state_dict()), last=True)
    ModuleLoader(engine).load(sync.receiver, request)
    assert engine.weight.data_ptr() == weight_storage
    assert torch.equal(engine.weight, trainer.weight) and torch.equal(engine.bias, trainer.bias)
    assert sync.receiver.completed_version == 1
