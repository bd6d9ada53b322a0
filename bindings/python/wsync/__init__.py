"""wsync: move model weights from RL trainers to inference engines (Python binding of libwsync).

A pure-Python package over libwsync's C ABI (``include/wsync.h``) through ctypes. The library
is found through ``$WSYNC_LIBRARY`` (a full path), then this package's folder, then the
system; see :mod:`wsync._lib`. Loading happens on first use, so importing ``wsync`` never fails
for want of the library; call :func:`load_library` to check early.

Trainer::

    strategy = wsync.Strategy("shm", receivers=2)
    init = strategy.create_init_info()              # forward these bytes to every engine
    sender = strategy.sender(init)
    request = sender.send_chunk({"w": torch.ones(4)}, last=True)   # forward to every engine
    sender.flush(timeout_s=30)                      # WsyncError.failures: each engine's failure

Engine::

    receiver = wsync.Strategy.for_init_info(init).receiver(init, index)
    with receiver.receive(request) as it:
        for name, view in it:                       # views valid until the block ends
            params[name].copy_(view)                # an exception here fails the chunk
"""

from . import _lib
from ._core import (
    ApplyResult,
    CHUNK_LAST,
    Dest,
    DestTable,
    MAX_BLOB_BYTES,
    MAX_FAIL_MESSAGE_BYTES,
    MAX_NAME_BYTES,
    MAX_NDIM,
    TENSOR_PATCH,
    TENSOR_READ_ONLY,
    Iteration,
    RECEIVER_DROPPED,
    RECEIVER_SENDER_GONE,
    PartView,
    PatchData,
    PlannedChunk,
    Receiver,
    ReceiverState,
    RecvInfo,
    Sender,
    Strategy,
    TensorMeta,
    TensorPart,
    WsyncWarning,
    abi_layout,
    describe,
    describe_options,
    kinds,
    merge_requests,
    plan,
    status_for_exception,
    version,
    version_number,
)
from ._dtypes import (
    DEVICE_CPU,
    DEVICE_CUDA,
    DEVICE_CUDA_HOST,
    DEVICE_CUDA_MANAGED,
    DEVICE_ROCM,
    DEVICE_ROCM_HOST,
    DTYPE_BFLOAT,
    DTYPE_BOOL,
    DTYPE_COMPLEX,
    DTYPE_FLOAT,
    DTYPE_FLOAT4_E2M1FN,
    DTYPE_FLOAT6_E2M3FN,
    DTYPE_FLOAT6_E3M2FN,
    DTYPE_FLOAT8_E3M4,
    DTYPE_FLOAT8_E4M3,
    DTYPE_FLOAT8_E4M3B11FNUZ,
    DTYPE_FLOAT8_E4M3FN,
    DTYPE_FLOAT8_E4M3FNUZ,
    DTYPE_FLOAT8_E5M2,
    DTYPE_FLOAT8_E5M2FNUZ,
    DTYPE_FLOAT8_E8M0FNU,
    DTYPE_INT,
    DTYPE_UINT,
    DType,
)
from ._errors import (
    NO_CHUNK,
    AbandonedError,
    Failure,
    FailureKind,
    InvalidArgumentError,
    Status,
    WrongStateError,
    WsyncError,
    last_error,
    status_string,
)
from ._lib import (
    ABI_MAJOR,
    ABI_MINOR,
    LibraryError,
    LibraryNotFoundError,
    LibraryVersionError,
)

__version__ = "0.7.0"


def load_library() -> "_lib.Library":
    """Locates, loads and version-checks libwsync now (otherwise done on first use); raises
    :class:`LibraryError` naming every place it looked."""
    return _lib.lib()


__all__ = [
    "ABI_MAJOR", "ABI_MINOR", "CHUNK_LAST", "MAX_BLOB_BYTES", "MAX_FAIL_MESSAGE_BYTES", "MAX_NAME_BYTES", "MAX_NDIM",
    "NO_CHUNK", "RECEIVER_DROPPED", "RECEIVER_SENDER_GONE", "TENSOR_PATCH", "TENSOR_READ_ONLY",
    "AbandonedError", "Failure", "FailureKind", "ReceiverState", "status_for_exception",
    "DEVICE_CPU", "DEVICE_CUDA", "DEVICE_CUDA_HOST", "DEVICE_CUDA_MANAGED", "DEVICE_ROCM",
    "DEVICE_ROCM_HOST",
    "DTYPE_BFLOAT", "DTYPE_BOOL", "DTYPE_COMPLEX", "DTYPE_FLOAT", "DTYPE_FLOAT4_E2M1FN",
    "DTYPE_FLOAT6_E2M3FN", "DTYPE_FLOAT6_E3M2FN", "DTYPE_FLOAT8_E3M4", "DTYPE_FLOAT8_E4M3",
    "DTYPE_FLOAT8_E4M3B11FNUZ", "DTYPE_FLOAT8_E4M3FN", "DTYPE_FLOAT8_E4M3FNUZ",
    "DTYPE_FLOAT8_E5M2", "DTYPE_FLOAT8_E5M2FNUZ", "DTYPE_FLOAT8_E8M0FNU", "DTYPE_INT",
    "DTYPE_UINT",
    "DType", "InvalidArgumentError", "Iteration", "LibraryError", "LibraryNotFoundError", "LibraryVersionError",
    "ApplyResult", "Dest", "DestTable", "PartView", "PatchData", "PlannedChunk", "Receiver", "RecvInfo", "Sender", "Status", "Strategy", "TensorMeta", "TensorPart",
    "WrongStateError", "WsyncError", "WsyncWarning",
    "abi_layout", "describe", "describe_options", "kinds", "last_error", "load_library",
    "merge_requests", "plan", "status_string", "version", "version_number",
]
