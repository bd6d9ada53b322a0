"""Element types and devices: DLPack codes <-> torch and numpy.

libwsync describes an element type exactly as DLPack's ``DLDataType`` (code, bits, lanes) and a
device as ``DLDevice`` (type, index). This module maps torch and numpy types onto those codes
and back. torch is optional: everything torch-specific is looked up only when torch is
importable.
"""

from __future__ import annotations

import functools
import sys
from typing import NamedTuple

import numpy as np

# wsync_dtype_t.code values (DLPack's DLDataTypeCode).
DTYPE_INT = 0
DTYPE_UINT = 1
DTYPE_FLOAT = 2
DTYPE_BFLOAT = 4
DTYPE_COMPLEX = 5
DTYPE_BOOL = 6
DTYPE_FLOAT8_E3M4 = 7
DTYPE_FLOAT8_E4M3 = 8
DTYPE_FLOAT8_E4M3B11FNUZ = 9
DTYPE_FLOAT8_E4M3FN = 10
DTYPE_FLOAT8_E4M3FNUZ = 11
DTYPE_FLOAT8_E5M2 = 12
DTYPE_FLOAT8_E5M2FNUZ = 13
DTYPE_FLOAT8_E8M0FNU = 14
DTYPE_FLOAT6_E2M3FN = 15
DTYPE_FLOAT6_E3M2FN = 16
DTYPE_FLOAT4_E2M1FN = 17

# wsync_device_t.type values (DLPack's DLDeviceType).
DEVICE_CPU = 1
DEVICE_CUDA = 2
DEVICE_CUDA_HOST = 3
DEVICE_ROCM = 10
DEVICE_ROCM_HOST = 11
DEVICE_CUDA_MANAGED = 13

_DEVICE_NAMES = {
    DEVICE_CPU: "cpu",
    DEVICE_CUDA: "cuda",
    DEVICE_CUDA_HOST: "cuda_host",
    DEVICE_ROCM: "rocm",
    DEVICE_ROCM_HOST: "rocm_host",
    DEVICE_CUDA_MANAGED: "cuda_managed",
}
#: Device types whose memory the CPU can address directly.
HOST_DEVICE_TYPES = frozenset({DEVICE_CPU, DEVICE_CUDA_HOST, DEVICE_ROCM_HOST})

# Canonical names (torch's spelling where torch has the type) for every (code, bits, lanes)
# this binding knows. The library may accept more (e.g. vector lanes); those get a generic name.
_NAMES = {
    (DTYPE_BOOL, 8, 1): "bool",
    (DTYPE_INT, 8, 1): "int8",
    (DTYPE_INT, 16, 1): "int16",
    (DTYPE_INT, 32, 1): "int32",
    (DTYPE_INT, 64, 1): "int64",
    (DTYPE_UINT, 8, 1): "uint8",
    (DTYPE_UINT, 16, 1): "uint16",
    (DTYPE_UINT, 32, 1): "uint32",
    (DTYPE_UINT, 64, 1): "uint64",
    (DTYPE_FLOAT, 16, 1): "float16",
    (DTYPE_FLOAT, 32, 1): "float32",
    (DTYPE_FLOAT, 64, 1): "float64",
    (DTYPE_BFLOAT, 16, 1): "bfloat16",
    (DTYPE_COMPLEX, 32, 1): "complex32",
    (DTYPE_COMPLEX, 64, 1): "complex64",
    (DTYPE_COMPLEX, 128, 1): "complex128",
    (DTYPE_FLOAT8_E3M4, 8, 1): "float8_e3m4",
    (DTYPE_FLOAT8_E4M3, 8, 1): "float8_e4m3",
    (DTYPE_FLOAT8_E4M3B11FNUZ, 8, 1): "float8_e4m3b11fnuz",
    (DTYPE_FLOAT8_E4M3FN, 8, 1): "float8_e4m3fn",
    (DTYPE_FLOAT8_E4M3FNUZ, 8, 1): "float8_e4m3fnuz",
    (DTYPE_FLOAT8_E5M2, 8, 1): "float8_e5m2",
    (DTYPE_FLOAT8_E5M2FNUZ, 8, 1): "float8_e5m2fnuz",
    (DTYPE_FLOAT8_E8M0FNU, 8, 1): "float8_e8m0fnu",
}
_BY_NAME = {name: key for key, name in _NAMES.items()}

# numpy dtypes with a DLPack code of their own.
_NUMPY_TO_DL = {
    np.dtype(np.bool_): (DTYPE_BOOL, 8, 1),
    np.dtype(np.int8): (DTYPE_INT, 8, 1),
    np.dtype(np.int16): (DTYPE_INT, 16, 1),
    np.dtype(np.int32): (DTYPE_INT, 32, 1),
    np.dtype(np.int64): (DTYPE_INT, 64, 1),
    np.dtype(np.uint8): (DTYPE_UINT, 8, 1),
    np.dtype(np.uint16): (DTYPE_UINT, 16, 1),
    np.dtype(np.uint32): (DTYPE_UINT, 32, 1),
    np.dtype(np.uint64): (DTYPE_UINT, 64, 1),
    np.dtype(np.float16): (DTYPE_FLOAT, 16, 1),
    np.dtype(np.float32): (DTYPE_FLOAT, 32, 1),
    np.dtype(np.float64): (DTYPE_FLOAT, 64, 1),
    np.dtype(np.complex64): (DTYPE_COMPLEX, 64, 1),
    np.dtype(np.complex128): (DTYPE_COMPLEX, 128, 1),
}
_DL_TO_NUMPY = {dl: dt for dt, dl in _NUMPY_TO_DL.items()}

# Integer "carrier" dtypes of each element size, for types numpy lacks (bfloat16, float8,
# complex32): their bytes are viewed through the carrier, then reinterpreted by torch.
_CARRIER = {1: np.dtype(np.uint8), 2: np.dtype(np.int16), 4: np.dtype(np.int32),
            8: np.dtype(np.int64)}


@functools.lru_cache(maxsize=None)
def torch_module():
    """The torch module, or None when torch is not installed (looked up once)."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def loaded_torch():
    """The torch module if this process has imported it already, else None (never imports it).

    For "is this object a torch tensor / dtype / module?": no object can be one unless torch
    is loaded, so the check costs nothing for numpy users (importing torch to ask took 0.75-0.9 s
    on a trainer's first send: delta user trial).
    """
    torch = sys.modules.get("torch")
    if torch is None or not all(hasattr(torch, a) for a in ("Tensor", "dtype", "nn")):
        return None  # not imported, or still being imported
    return torch


def require_torch():
    """The torch module; raises ImportError with a clear message when it is missing."""
    torch = torch_module()
    if torch is None:
        raise ImportError("this wsync feature needs PyTorch; install torch, or use "
                          "framework='numpy'")
    return torch


@functools.lru_cache(maxsize=None)
def torch_tables():
    """(torch dtype -> DLPack triple, DLPack triple -> torch dtype) for this torch version.

    Types that only some torch versions have (unsigned 16/32/64-bit, float8) are included when
    the running torch has them.
    """
    torch = require_torch()
    names = {
        "bool": (DTYPE_BOOL, 8, 1),
        "int8": (DTYPE_INT, 8, 1),
        "int16": (DTYPE_INT, 16, 1),
        "int32": (DTYPE_INT, 32, 1),
        "int64": (DTYPE_INT, 64, 1),
        "uint8": (DTYPE_UINT, 8, 1),
        "uint16": (DTYPE_UINT, 16, 1),
        "uint32": (DTYPE_UINT, 32, 1),
        "uint64": (DTYPE_UINT, 64, 1),
        "float16": (DTYPE_FLOAT, 16, 1),
        "float32": (DTYPE_FLOAT, 32, 1),
        "float64": (DTYPE_FLOAT, 64, 1),
        "bfloat16": (DTYPE_BFLOAT, 16, 1),
        "complex32": (DTYPE_COMPLEX, 32, 1),
        "complex64": (DTYPE_COMPLEX, 64, 1),
        "complex128": (DTYPE_COMPLEX, 128, 1),
        "float8_e4m3fn": (DTYPE_FLOAT8_E4M3FN, 8, 1),
        "float8_e4m3fnuz": (DTYPE_FLOAT8_E4M3FNUZ, 8, 1),
        "float8_e5m2": (DTYPE_FLOAT8_E5M2, 8, 1),
        "float8_e5m2fnuz": (DTYPE_FLOAT8_E5M2FNUZ, 8, 1),
        "float8_e8m0fnu": (DTYPE_FLOAT8_E8M0FNU, 8, 1),
    }
    to_dl, from_dl = {}, {}
    for name, dl in names.items():
        dt = getattr(torch, name, None)
        if isinstance(dt, torch.dtype):
            to_dl[dt] = dl
            from_dl[dl] = dt
    return to_dl, from_dl


class DType(NamedTuple):
    """An element type as libwsync sees it: DLPack's (code, bits, lanes)."""

    code: int
    bits: int
    lanes: int = 1

    @property
    def name(self) -> str:
        """Canonical name (``"float32"``, ``"bfloat16"``...), or ``dtype(code=..)`` for types
        this binding has no name for."""
        known = _NAMES.get(tuple(self))
        if known:
            return known
        return f"dtype(code={self.code},bits={self.bits},lanes={self.lanes})"

    @property
    def itemsize(self) -> int:
        """Bytes per element (bits * lanes / 8)."""
        return self.bits * self.lanes // 8

    def __str__(self) -> str:
        return self.name

    def to_torch(self):
        """The torch dtype; raises TypeError when this torch has none for it."""
        dt = torch_tables()[1].get(tuple(self))
        if dt is None:
            raise TypeError(f"{self.name} has no torch dtype in torch {require_torch().__version__}")
        return dt

    def to_numpy(self) -> np.dtype:
        """The numpy dtype; raises TypeError for types numpy lacks (bfloat16, float8...)."""
        dt = _DL_TO_NUMPY.get(tuple(self))
        if dt is None:
            raise TypeError(f"{self.name} has no numpy dtype; receive it with framework='torch'")
        return dt

    @classmethod
    def from_torch(cls, dtype) -> "DType":
        """The DLPack type of a torch dtype; raises TypeError when it has none."""
        dl = torch_tables()[0].get(dtype)
        if dl is None:
            raise TypeError(f"torch dtype {dtype} has no DLPack type code")
        return cls(*dl)

    @classmethod
    def from_numpy(cls, dtype) -> "DType":
        """The DLPack type of a numpy dtype (native byte order only)."""
        dt = np.dtype(dtype)
        dl = _NUMPY_TO_DL.get(dt)
        if dl is None:
            raise TypeError(f"numpy dtype {dt} has no DLPack type code (only native-endian "
                            "bool, ints, uints, floats and complex are supported)")
        return cls(*dl)

    @classmethod
    def of(cls, value) -> "DType":
        """Converts a DType, (code, bits, lanes) tuple, name string, torch dtype or numpy dtype."""
        if isinstance(value, DType):
            return value
        if isinstance(value, str):
            key = _BY_NAME.get(value)
            if key is None:
                raise TypeError(f"unknown dtype name {value!r}")
            return cls(*key)
        if isinstance(value, tuple):
            return cls(*value)
        torch = loaded_torch()
        if torch is not None and isinstance(value, torch.dtype):
            return cls.from_torch(value)
        return cls.from_numpy(value)


def numpy_carrier(dl: tuple) -> np.dtype:
    """The numpy dtype a view of type ``dl`` is built with: the type itself when numpy has it,
    else an integer of the same size, reinterpreted afterwards by torch."""
    dt = _DL_TO_NUMPY.get(dl)
    if dt is not None:
        return dt
    carrier = _CARRIER.get(dl[1] * dl[2] // 8)
    if carrier is None:
        raise TypeError(f"no numpy carrier for {DType(*dl).name}")
    return carrier


def device_name(device_type: int, index: int) -> str:
    """``"cpu:0"``, ``"cuda:1"``... as the library spells devices in messages."""
    return f"{_DEVICE_NAMES.get(device_type, f'device(type={device_type})')}:{index}"
