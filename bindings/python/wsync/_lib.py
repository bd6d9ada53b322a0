"""Finding, loading and declaring libwsync (the C library behind ``include/wsync.h``).

The library is looked for in three places, in this order:

1. the path in the ``WSYNC_LIBRARY`` environment variable (a full path to ``libwsync.so``);
   when it is set, it is the only place tried, so a wrong path is reported, not silently
   replaced by another copy of the library;
2. this package's own folder (a ``libwsync.so.0`` or ``libwsync.so`` placed beside
   ``__init__.py``, as a wheel that bundles the library would do);
3. the system, through ``ctypes.util.find_library("wsync")`` (``ldconfig`` and friends).

After loading, the runtime major version (``wsync_version_number() // 10000``) must equal
:data:`ABI_MAJOR`, the major version this binding was written for, and the version must be at
least :data:`ABI_MINOR` of that major (the structs and calls this binding uses, e.g.
``wsync_recv_fail``, appeared in 0.2); anything else is refused. Then every function of
``wsync.h`` gets its ``argtypes`` and ``restype``.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import threading
from ctypes import (
    POINTER,
    Structure,
    c_bool,
    c_char_p,
    c_int32,
    c_int64,
    c_size_t,
    c_uint8,
    c_uint16,
    c_uint32,
    c_uint64,
    c_void_p,
)
from typing import Callable, Mapping, Optional

#: The major version of the C ABI this binding was written for.
ABI_MAJOR = 0
#: The minor version whose structs and functions this binding declares: the loaded library
#: must be at least ``ABI_MAJOR.ABI_MINOR`` (0.2 made versions transactions: struct_size
#: fields, a new wsync_recv_info_t, commit/abandon/drop_receiver, failures as data, poll;
#: 0.3 added wsync_sender_wait_released; 0.5 the split-tensor calls, declared below; 0.7 the
#: authenticated ucx wire, which a 0.6 library cannot speak with a 0.7 peer).
ABI_MINOR = 7
#: The lowest ``wsync_version_number()`` this binding accepts (the header's one formula).
MIN_VERSION_NUMBER = ABI_MAJOR * 10000 + ABI_MINOR * 100

#: Environment variable holding the full path of the library to load.
ENV_VAR = "WSYNC_LIBRARY"

#: File names tried in the package folder, in order.
PACKAGE_LIBRARY_NAMES = ("libwsync.so.0", "libwsync.so")

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))


class LibraryError(ImportError):
    """libwsync could not be used: not found, not loadable, or of the wrong version."""


class LibraryNotFoundError(LibraryError):
    """No loadable libwsync in any of the places searched; the message lists each place."""


class LibraryVersionError(LibraryError):
    """The loaded libwsync has a major version this binding was not written for, or is older
    than :data:`MIN_VERSION_NUMBER`."""


# ---------------------------------------------------------------------------------------------
# Struct layouts, field for field as in wsync.h. tests/test_layout.py checks them against the
# library's own wsync_abi_layout().
# ---------------------------------------------------------------------------------------------
class Dtype(Structure):
    """``wsync_dtype_t``: DLPack's DLDataType (code, bits, lanes)."""

    _fields_ = [("code", c_uint8), ("bits", c_uint8), ("lanes", c_uint16)]


class Device(Structure):
    """``wsync_device_t``: DLPack's DLDevice (type, index)."""

    _fields_ = [("type", c_int32), ("index", c_int32)]


class Tensor(Structure):
    """``wsync_tensor_t``: a tensor descriptor (input) or view (output)."""

    _fields_ = [
        ("name", c_char_p),
        ("data", c_void_p),
        ("shape", POINTER(c_int64)),
        ("strides", POINTER(c_int64)),
        ("ndim", c_int32),
        ("dtype", Dtype),
        ("device", Device),
        ("flags", c_uint32),
        ("struct_size", c_uint32),
    ]


class Chunk(Structure):
    """``wsync_chunk_t``: the tensors of one ``wsync_sender_send_chunk`` call."""

    _fields_ = [
        ("tensors", POINTER(Tensor)),
        ("count", c_size_t),
        ("flags", c_uint32),
        ("struct_size", c_uint32),
    ]


class Part(Structure):
    """``wsync_part_t``: a byte range of one tensor (a part of a split tensor, 0.5)."""

    _fields_ = [("offset", c_uint64), ("bytes", c_uint64)]


class Blob(Structure):
    """``wsync_blob_t``: bytes owned by the library until ``wsync_blob_free``."""

    _fields_ = [("data", POINTER(c_uint8)), ("size", c_size_t)]


class RecvInfo(Structure):
    """``wsync_recv_info_t``: what a receive iteration carries, with the version's manifest on
    the chunk that commits it. ``struct_size`` must be set before ``wsync_recv_info``."""

    _fields_ = [
        ("struct_size", c_uint32),
        ("flags", c_uint32),
        ("version", c_uint64),
        ("bytes", c_uint64),
        ("count", c_uint64),
        ("chunk_index", c_uint32),
        ("version_chunks", c_uint32),
        ("version_tensors", c_uint64),
        ("version_bytes", c_uint64),
    ]


#: ``wsync_failure_t.message``: bytes, NUL included.
FAILURE_MESSAGE_BYTES = 256


class Failure(Structure):
    """``wsync_failure_t``: one receiver's failure as the sender learnt it.
    ``struct_size`` must be set before ``wsync_sender_failure``."""

    _fields_ = [
        ("struct_size", c_uint32),
        ("what", c_uint32),
        ("status", c_int32),
        ("receiver", c_uint32),
        ("version", c_uint64),
        ("chunk_index", c_uint32),
        ("pid", c_int32),
        ("message", ctypes.c_char * FAILURE_MESSAGE_BYTES),
    ]


class ReceiverState(Structure):
    """``wsync_receiver_state_t``: where a receiver stands (the rollback hook).
    ``struct_size`` must be set before ``wsync_receiver_poll``."""

    _fields_ = [
        ("struct_size", c_uint32),
        ("flags", c_uint32),
        ("completed_version", c_uint64),
        ("open_version", c_uint64),
        ("failed_version", c_uint64),
        ("failed_status", c_int32),
        ("reserved_", c_uint32),
    ]


class Patch(Structure):
    """``wsync_patch_t``: a delta patch as flat element indices and values (0.5), written by
    ``wsync_recv_patch``; the pointers are valid until the iteration ends."""

    _fields_ = [
        ("struct_size", c_uint32),
        ("index_bits", c_uint32),
        ("base_version", c_uint64),
        ("count", c_uint64),
        ("elements", c_uint64),
        ("indices", c_void_p),
        ("values", c_void_p),
        ("base_xxh3", c_uint64),
        ("result_xxh3", c_uint64),
    ]


class Dest(Structure):
    """``wsync_dest_t``: one destination of a destination table (0.6): where a wire tensor's
    bytes land, and which wire tensor (name, dtype, shape) and byte range it takes."""

    _fields_ = [
        ("name", c_char_p),
        ("data", c_void_p),
        ("shape", POINTER(c_int64)),
        ("ndim", c_int32),
        ("dtype", Dtype),
        ("src_offset", c_uint64),
        ("bytes", c_uint64),
        ("flags", c_uint32),
        ("struct_size", c_uint32),
    ]


class ApplyResult(Structure):
    """``wsync_apply_result_t``: what one ``wsync_recv_apply`` did (0.6)."""

    _fields_ = [
        ("struct_size", c_uint32),
        ("launches", c_uint32),
        ("tensors", c_uint64),
        ("writes", c_uint64),
        ("unmatched", c_uint64),
        ("bytes", c_uint64),
        ("device_copies", c_uint64),  # 0.6.1
    ]


#: The ctypes declaration of each struct, keyed by its C name (used by the layout test).
STRUCTS = {
    "wsync_dtype_t": Dtype,
    "wsync_device_t": Device,
    "wsync_tensor_t": Tensor,
    "wsync_chunk_t": Chunk,
    "wsync_part_t": Part,
    "wsync_blob_t": Blob,
    "wsync_recv_info_t": RecvInfo,
    "wsync_failure_t": Failure,
    "wsync_receiver_state_t": ReceiverState,
    "wsync_patch_t": Patch,
    "wsync_dest_t": Dest,
    "wsync_apply_result_t": ApplyResult,
}


def sized(cls):
    """A zeroed instance of a sized struct with ``struct_size`` set to its size, as the header
    asks of callers (0.2 layout)."""
    obj = cls()
    obj.struct_size = ctypes.sizeof(cls)
    return obj

# ---------------------------------------------------------------------------------------------
# Function signatures: (restype, argtypes) for every function in wsync.h. Opaque handles are
# void pointers; byte inputs are char pointers so Python bytes pass without a copy.
# ---------------------------------------------------------------------------------------------
_status = c_int32  # wsync_status_t is an enum forced to 32 bits
_handle = c_void_p
_out_handle = POINTER(c_void_p)
_bytes_in = c_char_p  # const uint8_t *

SIGNATURES: Mapping[str, tuple] = {
    # 1. versions and statuses
    "wsync_version_number": (c_uint32, []),
    "wsync_version_string": (c_char_p, []),
    "wsync_status_string": (c_char_p, [_status]),
    "wsync_last_error": (c_char_p, []),
    # 2. blobs and strings
    "wsync_blob_free": (None, [POINTER(Blob)]),
    "wsync_string_free": (None, [c_void_p]),
    # 3. strategies
    "wsync_strategy_create": (_status, [c_char_p, c_char_p, _out_handle]),
    "wsync_strategy_destroy": (None, [_handle]),
    "wsync_strategy_kind": (_status, [_handle, POINTER(c_char_p)]),
    "wsync_strategy_kinds": (_status, [POINTER(c_void_p)]),
    "wsync_strategy_describe_options": (_status, [c_char_p, POINTER(c_void_p)]),
    "wsync_strategy_create_init_info": (_status, [_handle, POINTER(Blob)]),
    # 4. sender
    "wsync_sender_create": (_status, [_handle, _bytes_in, c_size_t, _out_handle]),
    "wsync_sender_destroy": (None, [_handle]),
    "wsync_sender_send_chunk": (_status, [_handle, POINTER(Chunk), POINTER(Blob)]),
    "wsync_sender_send_parts": (
        _status, [_handle, POINTER(Chunk), POINTER(Part), POINTER(Blob)]),
    "wsync_sender_flush": (_status, [_handle, c_int64]),
    "wsync_sender_wait_released": (_status, [_handle, c_uint64, c_int64]),
    "wsync_sender_commit": (_status, [_handle, POINTER(Blob)]),
    "wsync_sender_abandon": (_status, [_handle]),
    "wsync_sender_version": (_status, [_handle, POINTER(c_uint64)]),
    "wsync_sender_drop_receiver": (_status, [_handle, c_uint32]),
    "wsync_sender_set_stream": (_status, [_handle, c_void_p]),
    "wsync_sender_arena": (_status, [_handle, POINTER(c_void_p), POINTER(c_uint64)]),
    "wsync_sender_failure_count": (_status, [_handle, POINTER(c_size_t)]),
    "wsync_sender_failure": (_status, [_handle, c_size_t, POINTER(Failure)]),
    "wsync_request_merge": (_status, [POINTER(Blob), c_size_t, POINTER(Blob)]),
    # 5. receiver and receive iteration
    "wsync_receiver_create": (_status, [_handle, _bytes_in, c_size_t, c_uint32, _out_handle]),
    "wsync_receiver_destroy": (None, [_handle]),
    "wsync_receiver_receive": (_status, [_handle, _bytes_in, c_size_t, _out_handle]),
    "wsync_receiver_completed_version": (_status, [_handle, POINTER(c_uint64)]),
    "wsync_receiver_poll": (_status, [_handle, POINTER(ReceiverState)]),
    "wsync_receiver_set_stream": (_status, [_handle, c_void_p]),
    "wsync_recv_info": (_status, [_handle, POINTER(RecvInfo)]),
    "wsync_recv_peek": (_status, [_handle, c_size_t, POINTER(Tensor)]),
    "wsync_recv_next": (_status, [_handle, POINTER(Tensor), POINTER(c_bool)]),
    "wsync_recv_copy": (_status, [_handle, c_size_t, c_uint64, c_void_p, c_uint64]),
    "wsync_recv_part": (_status, [_handle, c_size_t, POINTER(Part)]),
    "wsync_recv_next_part": (
        _status, [_handle, POINTER(Tensor), POINTER(Part), POINTER(c_bool)]),
    "wsync_recv_patch": (_status, [_handle, c_size_t, POINTER(Patch)]),
    "wsync_dest_table_create": (_status, [_handle, POINTER(Dest), c_size_t, _out_handle]),
    "wsync_dest_table_destroy": (None, [_handle]),
    "wsync_recv_apply": (_status, [_handle, _handle, c_uint32, POINTER(ApplyResult)]),
    "wsync_receiver_land": (_status, [_handle, _handle]),
    "wsync_recv_end": (_status, [_handle]),
    "wsync_recv_fail": (_status, [_handle, _status, c_char_p]),
    # 6. planner
    "wsync_plan_create": (_status, [POINTER(Tensor), c_size_t, c_char_p, _out_handle]),
    "wsync_plan_destroy": (None, [_handle]),
    "wsync_plan_chunk_count": (_status, [_handle, POINTER(c_size_t)]),
    "wsync_plan_chunk": (
        _status,
        [_handle, c_size_t, POINTER(POINTER(c_size_t)), POINTER(c_size_t), POINTER(c_uint64)],
    ),
    "wsync_plan_chunk_parts": (_status, [_handle, c_size_t, POINTER(POINTER(Part))]),
    # 7. blobs and introspection
    "wsync_blob_describe": (_status, [_bytes_in, c_size_t, POINTER(c_void_p)]),
    "wsync_abi_layout": (_status, [POINTER(c_void_p)]),
}


class Library:
    """A loaded, version-checked libwsync with every function declared.

    Attributes are the C functions (``lib.wsync_strategy_create``...), plus ``path`` (what was
    loaded), ``where`` (which of the three places it came from) and ``version_number``.
    """

    def __init__(self, cdll, path: str, where: str):
        self.cdll = cdll
        self.path = path
        self.where = where
        self.version_number = check_version(cdll, path)
        missing = [name for name in SIGNATURES if not hasattr(cdll, name)]
        if missing:
            raise LibraryError(
                f"libwsync at {path} lacks functions this binding needs: {', '.join(missing)} "
                f"(the binding was written for ABI {ABI_MAJOR}.{ABI_MINOR})"
            )
        for name, (restype, argtypes) in SIGNATURES.items():
            fn = getattr(cdll, name)
            fn.restype = restype
            fn.argtypes = argtypes
            setattr(self, name, fn)

    def __repr__(self) -> str:
        return f"<wsync.Library {self.path!r} from {self.where}, version {self.version_number}>"


def check_version(cdll, path: str = "?") -> int:
    """Returns ``wsync_version_number()`` of ``cdll`` or raises :class:`LibraryVersionError`
    (another major version, or older than :data:`MIN_VERSION_NUMBER`).

    Only the version functions are declared here, since a library of another version may not
    have the others.
    """
    fn = cdll.wsync_version_number
    fn.restype = c_uint32
    fn.argtypes = []
    number = int(fn())
    major = number // 10000
    if major != ABI_MAJOR:
        text = f"{major}.{number // 100 % 100}.{number % 100}"
        raise LibraryVersionError(
            f"libwsync at {path} is version {text} (major {major}), but this Python binding was "
            f"written for major version {ABI_MAJOR}; install a libwsync {ABI_MAJOR}.x or a "
            f"binding made for version {major}"
        )
    if number < MIN_VERSION_NUMBER:
        text = f"{major}.{number // 100 % 100}.{number % 100}"
        raise LibraryVersionError(
            f"libwsync at {path} is version {text}, but this Python binding needs at least "
            f"{ABI_MAJOR}.{ABI_MINOR}.0 (it uses the {ABI_MAJOR}.{ABI_MINOR} structs and calls: "
            "struct_size fields, wsync_recv_fail, wsync_sender_commit...); install a newer "
            "libwsync or point WSYNC_LIBRARY at one"
        )
    return number


def _try_load(loader: Callable[[str], object], path: str):
    try:
        return loader(path), None
    except OSError as exc:
        return None, str(exc)


def locate(
    environ: Optional[Mapping[str, str]] = None,
    package_dir: Optional[str] = None,
    find_library: Optional[Callable[[str], Optional[str]]] = None,
    loader: Optional[Callable[[str], object]] = None,
) -> Library:
    """Finds, loads and checks libwsync; raises :class:`LibraryError` when that fails.

    Every argument defaults to the real thing (``os.environ``, this package's folder,
    ``ctypes.util.find_library``, ``ctypes.CDLL``) and is a parameter only so the search order
    can be tested. Most code wants :func:`lib` instead, which caches the result.
    """
    environ = os.environ if environ is None else environ
    package_dir = PACKAGE_DIR if package_dir is None else package_dir
    find_library = ctypes.util.find_library if find_library is None else find_library
    loader = ctypes.CDLL if loader is None else loader

    looked = []
    explicit = environ.get(ENV_VAR)
    if explicit:
        cdll, err = _try_load(loader, explicit)
        if cdll is not None:
            return Library(cdll, explicit, f"${ENV_VAR}")
        looked.append(f"1. ${ENV_VAR}={explicit}: cannot load it: {err}")
        looked.append(f"2. the package folder {package_dir}: not searched, ${ENV_VAR} is set "
                      "and takes precedence")
        looked.append("3. the system (ctypes.util.find_library('wsync')): not searched, "
                      f"${ENV_VAR} is set and takes precedence")
    else:
        looked.append(f"1. ${ENV_VAR}: not set")
        tried = []
        for name in PACKAGE_LIBRARY_NAMES:
            candidate = os.path.join(package_dir, name)
            if not os.path.exists(candidate):
                tried.append(f"no {name}")
                continue
            cdll, err = _try_load(loader, candidate)
            if cdll is not None:
                return Library(cdll, candidate, "the package folder")
            tried.append(f"{name} exists but cannot be loaded: {err}")
        looked.append(f"2. the package folder {package_dir}: {'; '.join(tried)}")
        found = find_library("wsync")
        if found:
            cdll, err = _try_load(loader, found)
            if cdll is not None:
                return Library(cdll, found, "the system")
            looked.append(f"3. the system (ctypes.util.find_library('wsync')): found {found} "
                          f"but cannot load it: {err}")
        else:
            looked.append("3. the system (ctypes.util.find_library('wsync')): nothing found")
    raise LibraryNotFoundError(
        "libwsync could not be loaded. Looked in:\n  "
        + "\n  ".join(looked)
        + f"\nBuild it (cmake -S . -B build && cmake --build build) and set "
        f"{ENV_VAR}=/path/to/build/libwsync.so, put libwsync.so.0 beside wsync/__init__.py, "
        "or install the libwsync0 package."
    )


_lock = threading.Lock()
_library: Optional[Library] = None


def lib() -> Library:
    """The process-wide :class:`Library`, located and loaded on first use."""
    global _library
    if _library is None:
        with _lock:
            if _library is None:
                _library = locate()
    return _library

