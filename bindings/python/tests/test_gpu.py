"""CUDA paths: CUDA tensors described as DLPack device 2 with their index, views of CUDA
memory through __cuda_array_interface__, and loading from shm into a model on the GPU.

These need a CUDA device and skip without one (scripts/gpu-validate.sh runs them on a GPU), as
does the round trip of a CUDA model over ucx (the trainer's GPU packs into pinned staging memory).
The GPU kinds' own round trips are C tests (tests/gpu/test_gpu_hw.c, label gpu)."""

import pytest
import torch

import wsync
from wsync import Status, WsyncError
from wsync._core import cuda_view, describe_tensors
from wsync.engine import ModuleLoader
from wsync.trainer import send_model
from _models import TinyLM, model_digests

cuda = pytest.mark.skipif(not torch.cuda.is_available(),
                          reason="torch.cuda.is_available() is False: no CUDA device or driver here")


def test_non_cpu_non_cuda_tensors_are_unsupported():
    # Runs everywhere: the device mapping refuses what DLPack/libwsync cannot address.
    with pytest.raises(WsyncError) as info:
        describe_tensors([("m", torch.empty(2, device="meta"))])
    assert info.value.status is Status.UNSUPPORTED and "'meta'" in info.value.message


@cuda
def test_cuda_tensor_is_described_as_device_2_with_its_index():
    index = torch.cuda.device_count() - 1
    t = torch.arange(6.0, device=f"cuda:{index}")
    d = describe_tensors([("g", t)])
    view = d.array[0]
    assert (view.device.type, view.device.index) == (wsync.DEVICE_CUDA, index)
    assert view.data == t.data_ptr()


@cuda
def test_shm_refuses_cuda_memory_naming_the_tensor(sync):
    with pytest.raises(WsyncError) as info:
        sync.sender.send_chunk({"g": torch.ones(4, device="cuda:0")})
    assert info.value.status is Status.UNSUPPORTED
    assert "'g'" in info.value.message and "cuda:0" in info.value.message


@cuda
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.int64, torch.bool])
def test_cuda_view_is_zero_copy(dtype):
    src = torch.arange(12, device="cuda:0").to(dtype).view(3, 4)
    owner = object()
    view = cuda_view(src.data_ptr(), (3, 4), tuple(wsync.DType.from_torch(dtype)), 0, owner=owner)
    assert view.dtype == dtype and view.device == src.device and view.data_ptr() == src.data_ptr()
    assert torch.equal(view, src)


@cuda
def test_loading_from_shm_into_a_cuda_model(make_sync):
    s = make_sync(buckets=4, bucket_bytes=1 << 20)
    trainer = TinyLM(seed=0).cuda()
    engine = TinyLM(seed=4).cuda()
    requests = send_model(s.sender, trainer, device="cpu")
    loader = ModuleLoader(engine)
    for request in requests:
        loader.load(s.receiver, request)
    s.sender.flush(10)
    assert model_digests(engine) == model_digests(trainer)


@cuda
def test_send_waits_for_torchs_stream_before_the_library_reads_cuda_memory(sync, monkeypatch):
    from wsync import _core
    synced = []
    real = _core._synchronize_cuda
    monkeypatch.setattr(_core, "_synchronize_cuda", lambda devices: (synced.append(set(devices)),
                                                                       real(devices)))
    index = torch.cuda.device_count() - 1
    with pytest.raises(WsyncError):  # shm moves host memory only; the wait comes first
        sync.sender.send_chunk({"g": torch.ones(4, device=f"cuda:{index}"), "c": torch.ones(2)})
    assert synced == [{index}]
    sync.sender.send_chunk({"c": torch.ones(2)})
    assert synced == [{index}]  # host-only chunks never touch CUDA


def _ucx_available():
    return any(k["kind"] == "ucx" and k["available"] for k in wsync.kinds())


@cuda
@pytest.mark.skipif(not _ucx_available(), reason="ucx kind not built or libucp.so.0 missing")
def test_ucx_syncs_a_cuda_model_packed_on_the_trainers_gpu_to_a_gpu_engine():
    # The trainer passes its CUDA parameters as they are (the library's GPU packs each chunk into
    # pinned staging memory); the engine ("device": 0) loads from host views into its CUDA model.
    opts = dict(transports="tcp", net_devices="lo", timeout_ms=20000)
    with wsync.Strategy("ucx", receivers=1, **opts) as t, wsync.Strategy("ucx", device=0, **opts) as e:
        init = t.create_init_info()
        with t.sender(init) as sender, e.receiver(init, 0) as receiver:
            trainer = TinyLM(seed=0).cuda()
            engine = TinyLM(seed=4).cuda()
            loader = ModuleLoader(engine)
            for step in (1, 2, 3):
                with torch.no_grad():
                    for p in trainer.parameters():
                        p.mul_(1.5).add_(step)
                for request in send_model(sender, trainer):
                    loader.load(receiver, request)
                sender.flush(20)
                assert receiver.completed_version == step
                assert model_digests(engine) == model_digests(trainer)
