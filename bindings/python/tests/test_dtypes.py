"""dtype mapping torch/numpy <-> DLPack codes, and a bit-exact round trip of every type."""

import numpy as np
import pytest
import torch

from wsync import DType, Status, WsyncError
from wsync._core import cuda_array_interface, torch_carrier

TORCH_CODES = {
    torch.float32: (2, 32, 1),
    torch.float16: (2, 16, 1),
    torch.float64: (2, 64, 1),
    torch.bfloat16: (4, 16, 1),
    torch.int8: (0, 8, 1),
    torch.int16: (0, 16, 1),
    torch.int32: (0, 32, 1),
    torch.int64: (0, 64, 1),
    torch.uint8: (1, 8, 1),
    torch.bool: (6, 8, 1),
    torch.complex64: (5, 64, 1),
    torch.complex128: (5, 128, 1),
}
FLOAT8 = {
    "float8_e4m3fn": (10, 8, 1),
    "float8_e4m3fnuz": (11, 8, 1),
    "float8_e5m2": (12, 8, 1),
    "float8_e5m2fnuz": (13, 8, 1),
    "float8_e8m0fnu": (14, 8, 1),
}
NUMPY_CODES = {
    np.float16: (2, 16, 1), np.float32: (2, 32, 1), np.float64: (2, 64, 1),
    np.int8: (0, 8, 1), np.int16: (0, 16, 1), np.int32: (0, 32, 1), np.int64: (0, 64, 1),
    np.uint8: (1, 8, 1), np.uint16: (1, 16, 1), np.uint32: (1, 32, 1), np.uint64: (1, 64, 1),
    np.bool_: (6, 8, 1), np.complex64: (5, 64, 1), np.complex128: (5, 128, 1),
}


@pytest.mark.parametrize("dtype,code", list(TORCH_CODES.items()), ids=str)
def test_torch_dtype_maps_to_dlpack_and_back(dtype, code):
    assert DType.from_torch(dtype) == code
    assert DType(*code).to_torch() == dtype
    assert DType(*code).itemsize == torch.empty((), dtype=dtype).element_size()


@pytest.mark.parametrize("name,code", list(FLOAT8.items()))
def test_float8_types_map_when_torch_has_them(name, code):
    dtype = getattr(torch, name, None)
    if dtype is None:
        pytest.skip(f"torch {torch.__version__} has no torch.{name}")
    assert DType.from_torch(dtype) == code
    assert DType(*code).to_torch() == dtype


@pytest.mark.parametrize("dtype,code", list(NUMPY_CODES.items()), ids=str)
def test_numpy_dtype_maps_to_dlpack_and_back(dtype, code):
    assert DType.from_numpy(dtype) == code
    assert DType(*code).to_numpy() == np.dtype(dtype)


def test_names_and_conversions():
    assert DType(4, 16).name == "bfloat16" and str(DType(2, 32)) == "float32"
    assert DType(9, 9, 9).name == "dtype(code=9,bits=9,lanes=9)"
    assert DType.of("bool") == (6, 8, 1)
    assert DType.of(torch.bfloat16) == (4, 16, 1)
    assert DType.of(np.int16) == (0, 16, 1)
    assert DType.of((2, 64, 1)) == (2, 64, 1)
    with pytest.raises(TypeError, match="no numpy dtype"):
        DType(4, 16).to_numpy()
    with pytest.raises(TypeError, match="no DLPack type code"):
        DType.from_numpy(np.dtype(">f4"))
    with pytest.raises(TypeError, match="unknown dtype name"):
        DType.of("float13")


def test_carriers_for_types_numpy_or_torch_cannot_import():
    assert torch_carrier((2, 32, 1)) == (np.dtype(np.float32), False)
    assert torch_carrier((4, 16, 1)) == (np.dtype(np.int16), True)
    assert torch_carrier((1, 16, 1)) == (np.dtype(np.int16), True)
    assert torch_carrier((10, 8, 1)) == (np.dtype(np.uint8), True)
    assert torch_carrier((5, 32, 1)) == (np.dtype(np.int32), True)


def test_cuda_array_interface_describes_a_writable_dense_view():
    d = cuda_array_interface(0x7000, (3, 4), (4, 16, 1))
    assert d == {"shape": (3, 4), "typestr": "<i2", "data": (0x7000, False), "strides": None,
                 "version": 2}
    assert cuda_array_interface(16, (), (6, 8, 1))["typestr"] == "|b1"


def _sample(dtype, shape=(3, 5)):
    g = torch.Generator().manual_seed(7)
    if dtype == torch.bool:
        return torch.rand(shape, generator=g) > 0.5
    if dtype.is_complex:
        return torch.randn(shape, dtype=dtype, generator=g)
    if dtype.is_floating_point:
        return (torch.randn(shape, generator=g) * 100).to(dtype)
    info = torch.iinfo(dtype)
    return torch.randint(info.min, info.max, shape, dtype=dtype, generator=g)


def _same_bits(a, b):
    assert a.dtype == b.dtype and a.shape == b.shape
    if a.dtype.is_complex:
        a, b = torch.view_as_real(a), torch.view_as_real(b)
    if a.dtype in (torch.bfloat16, torch.float16):
        a, b = a.view(torch.int16), b.view(torch.int16)
    return a.numpy().tobytes() == b.numpy().tobytes()


def test_every_torch_dtype_round_trips_bit_for_bit(sync):
    tensors = {f"t.{str(dt).replace('torch.', '')}": _sample(dt) for dt in TORCH_CODES}
    tensors["scalar.f32"] = torch.tensor(3.25)
    tensors["scalar.bf16"] = torch.tensor(-1.5, dtype=torch.bfloat16)
    tensors["nan.f32"] = torch.tensor([float("nan"), float("-inf"), -0.0])
    request = sync.sender.send_chunk(tensors, last=True)
    with sync.receiver.receive(request) as it:
        got = dict(it.items())
        for name, t in tensors.items():
            assert _same_bits(got[name], t), name
    sync.sender.flush(5)


def test_every_numpy_dtype_round_trips_bit_for_bit(sync):
    rng = np.random.default_rng(3)
    arrays = {f"a.{np.dtype(dt).name}": (rng.random((4, 3)) * 1000).astype(dt) for dt in NUMPY_CODES}
    request = sync.sender.send_chunk(arrays, last=True)
    with sync.receiver.receive(request, framework="numpy") as it:
        for name, view in it:
            assert view.dtype == arrays[name].dtype
            assert view.tobytes() == arrays[name].tobytes(), name
    sync.sender.flush(5)


def test_numpy_bfloat16_view_is_refused_before_the_chunk_counts_as_received(sync):
    request = sync.sender.send_chunk({"w": torch.ones(2, dtype=torch.bfloat16)}, last=True)
    with pytest.raises(WsyncError) as info:
        with sync.receiver.receive(request, framework="numpy") as it:
            list(it)
    assert info.value.status is Status.UNSUPPORTED
    assert "'w'" in info.value.message and "framework='torch'" in info.value.message
    with pytest.raises(WsyncError) as flush:
        sync.sender.flush(5)
    assert flush.value.status is Status.PEER
    assert sync.receiver.completed_version == 0


@pytest.mark.skipif(hasattr(torch, "uint16"), reason="this torch has torch.uint16")
def test_uint16_into_old_torch_is_refused_naming_the_tensor(sync):
    request = sync.sender.send_chunk({"u": np.arange(4, dtype=np.uint16)}, last=True)
    with pytest.raises(WsyncError, match="'u': uint16 has no torch dtype"):
        with sync.receiver.receive(request) as it:
            list(it)


def test_dtype_without_dlpack_code_is_refused_naming_the_tensor(sync):
    with pytest.raises(WsyncError) as info:
        sync.sender.send_chunk({"ok": torch.ones(2),
                                "q": torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.quint8)})
    assert info.value.status is Status.INVALID_ARGUMENT
    assert "tensor 1 ('q')" in info.value.message and "torch.quint8" in info.value.message
    with pytest.raises(WsyncError, match="numpy dtype >f4 has no DLPack type code"):
        sync.sender.send_chunk({"be": np.ones(2, dtype=">f4")})


def test_a_numpy_only_process_never_imports_torch():
    """A trainer and an engine of numpy arrays never pay torch's import (0.75-0.9 s on the
    first send, delta user trial): the binding asks "is this a torch tensor?" only of a torch
    the process has loaded itself."""
    import os
    import subprocess
    import sys
    import textwrap

    code = textwrap.dedent("""
        import sys
        import numpy as np
        import wsync
        s = wsync.Strategy("shm", buckets=2, bucket_bytes=1 << 20)
        init = s.create_init_info()
        sender = s.sender(init)
        receiver = wsync.Strategy("shm").receiver(init, 0)
        w = np.arange(1024, dtype=np.float32)
        request = sender.send_chunk([("w", w)], last=True)
        with receiver.receive(request, framework="numpy") as it:
            got = dict(it)
        assert (got["w"] == w).all()
        sender.flush(10)
        print("torch" in sys.modules)
    """)
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in sys.path if p)
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "False"
