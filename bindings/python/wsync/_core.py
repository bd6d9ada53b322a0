"""Strategy, Sender, Receiver, Iteration and the free functions over libwsync's C ABI.

Threading: like the C handles, one object (and an iteration together with its receiver) is
used by one thread at a time. The binding serialises calls on each handle with a lock, so
misuse from several threads waits instead of corrupting memory; the library's blocking calls
(``send_chunk``, ``flush``) release the GIL while they wait.
"""

from __future__ import annotations

import asyncio
import ctypes
import json
import math
import struct
import threading
import warnings
import weakref
from ctypes import byref, c_bool, c_char, c_char_p, c_size_t, c_uint64, c_void_p
from typing import (Any, Dict, Iterator, List, Mapping, NamedTuple, Optional, Sequence, Tuple,
                    TypeVar)

import numpy as np

from . import _dtypes, _lib
from ._dtypes import DType
from ._errors import (
    Failure,
    Status,
    WrongStateError,
    WsyncError,
    invalid,
    raise_for,
    sender_failures,
)

#: wsync_tensor_t.flags: set on views whose memory must not be written.
TENSOR_READ_ONLY = 1
#: wsync_tensor_t.flags from wsync_recv_peek: the entry crossed as a delta patch (0.5).
TENSOR_PATCH = 2
#: wsync_chunk_t.flags: this chunk commits the current sync version.
CHUNK_LAST = 1
#: wsync_receiver_state_t.flags: the sender dropped this receiver.
RECEIVER_DROPPED = 1
#: wsync_receiver_state_t.flags: the trainer's process is gone.
RECEIVER_SENDER_GONE = 2
#: wsync_receiver_state_t.flags: chunks are acknowledged only once the loader's work queued on
#: the receiver's stream before ending them has run (cuda_ipc with "synchronize"; 0.5).
RECEIVER_ORDERS_LOADER_WORK = 4
#: Longest message wsync_recv_fail passes on, in bytes (the rest is cut).
MAX_FAIL_MESSAGE_BYTES = 255
#: Most dimensions a tensor may have.
MAX_NDIM = 16
#: Longest tensor name in bytes (UTF-8, without the NUL).
MAX_NAME_BYTES = 1024
#: Largest blob (init info or request) the library reads: 256 MiB.
MAX_BLOB_BYTES = 268435456

# One wsync_tensor_t as raw fields (native byte order, explicit padding): name, data, shape,
# strides, ndim, dtype.code, dtype.bits, dtype.lanes, device.type, device.index, flags,
# struct_size. Packing descriptors with one struct call per tensor is several times cheaper than
# setting ctypes fields one by one; the layout is checked against ctypes (and ctypes against
# the library, in tests/test_layout.py) right here at import.
_TENSOR_RAW = struct.Struct("=QQQQiBBHiiII")
_UNKNOWN = object()  # a lazily computed attribute not computed yet


def _check_raw_layout() -> None:
    t = _lib.Tensor
    expected = [t.name.offset, t.data.offset, t.shape.offset, t.strides.offset, t.ndim.offset,
                t.dtype.offset, t.dtype.offset + 1, t.dtype.offset + 2, t.device.offset,
                t.device.offset + 4, t.flags.offset, t.struct_size.offset]
    got, off = [], 0
    for code in "QQQQiBBHiiII":
        got.append(off)
        off += struct.calcsize("=" + code)
    if ctypes.sizeof(c_void_p) != 8 or got != expected or off != ctypes.sizeof(t):
        raise ImportError("wsync: this platform's wsync_tensor_t layout is not the 64-bit one "
                          "the binding packs; only 64-bit platforms are supported")


_check_raw_layout()
_TENSOR_SIZE = ctypes.sizeof(_lib.Tensor)
_CHUNK_SIZE = ctypes.sizeof(_lib.Chunk)

# The longest flush timeout passed to the library (2^40 ms, about 35 years, the strategies'
# own "timeout_ms" maximum): ctypes would silently truncate a value past 64 bits, and libwsync
# 0.1 turns timeout_ms into nanoseconds on a 64-bit clock, which overflows past ~9.2e12 ms
# (its deadline can then lie in the past, failing at once with TIMEOUT).
_MAX_FLUSH_MS = 1 << 40

_DUMMY = ctypes.create_string_buffer(8)
_DUMMY_ADDR = ctypes.addressof(_DUMMY)
_INT64_STRUCTS: Dict[int, struct.Struct] = {n: struct.Struct(f"={n}q") for n in range(MAX_NDIM + 1)}


def _closed_error(what: str) -> WsyncError:
    return WrongStateError(Status.WRONG_STATE, f"{what} is closed")


def _take_blob(lib, blob: _lib.Blob) -> bytes:
    """Copies a library blob into bytes and frees it."""
    try:
        return ctypes.string_at(blob.data, blob.size) if blob.size else b""
    finally:
        lib.wsync_blob_free(byref(blob))


def _take_string(lib, ptr: c_void_p) -> str:
    """Copies a library string (JSON) into str and frees it."""
    try:
        return ctypes.string_at(ptr.value).decode("utf-8") if ptr.value else ""
    finally:
        lib.wsync_string_free(ptr)


def _as_bytes(data, what: str) -> bytes:
    if isinstance(data, bytes):
        return data
    if isinstance(data, (bytearray, memoryview)):
        return bytes(data)
    raise invalid(f"{what} must be bytes, bytearray or memoryview, not {type(data).__name__}")


# ---------------------------------------------------------------------------------------------
# Tensor descriptors
# ---------------------------------------------------------------------------------------------
class TensorMeta(NamedTuple):
    """What a tensor is, without its bytes: a name, a :class:`DType` and a shape."""

    name: str
    dtype: DType
    shape: Tuple[int, ...]

    @property
    def numel(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        """Payload size in bytes."""
        return self.numel * self.dtype.itemsize


def _as_items(tensors) -> list:
    """A dict, or an iterable of (name, tensor) pairs, as a list of pairs."""
    if isinstance(tensors, Mapping):
        return list(tensors.items())
    items = list(tensors)
    for i, item in enumerate(items):
        if not isinstance(item, tuple) or len(item) != 2:
            raise invalid(f"tensors must be a dict or (name, tensor) pairs; item {i} is a "
                          f"{type(item).__name__}")
    return items


def _label(i: int, name: str) -> str:
    return f"tensor {i} ('{name}')"


class _Descriptors:
    """A packed wsync_tensor_t array plus everything its pointers point into (kept alive for as
    long as this object lives: names, shapes and strides, and the tensors themselves)."""

    __slots__ = ("array", "count", "cuda_devices", "_names", "_dims", "_keep")

    def __init__(self, array, count, names, dims, keep):
        self.array, self.count = array, count
        #: Indices of the CUDA devices whose memory the descriptors point into.
        self.cuda_devices: frozenset = frozenset()
        self._names, self._dims, self._keep = names, dims, keep


def _pack(records: list, keep) -> _Descriptors:
    """records: (name_bytes, data, shape, strides or None, (code, bits, lanes), dev_type,
    dev_index) per tensor."""
    n = len(records)
    blob = b"\0".join(r[0] for r in records) + b"\0"
    names = ctypes.create_string_buffer(blob, len(blob))
    nbase = ctypes.addressof(names)
    dims_list: List[int] = []
    for r in records:
        dims_list.extend(r[2])
        if r[3] is not None:
            dims_list.extend(r[3])
    dims = (ctypes.c_int64 * max(1, len(dims_list)))(*dims_list)
    dbase = ctypes.addressof(dims)
    array = (_lib.Tensor * n)()
    pack = _TENSOR_RAW.pack_into
    noff = doff = 0
    for i, (nb, data, shape, strides, dl, dev_type, dev_index) in enumerate(records):
        ndim = len(shape)
        sp = dbase + 8 * doff if ndim else 0
        doff += ndim
        if strides is not None and ndim:
            st = dbase + 8 * doff
            doff += ndim
        else:
            st = 0
        pack(array, _TENSOR_SIZE * i, nbase + noff, data, sp, st, ndim, dl[0], dl[1], dl[2],
             dev_type, dev_index, 0, _TENSOR_SIZE)
        noff += len(nb) + 1
    return _Descriptors(array, n, names, dims, keep)


def _encode_name(i: int, name) -> bytes:
    if not isinstance(name, str):
        raise invalid(f"tensor {i}: name must be str, not {type(name).__name__}")
    nb = name.encode("utf-8")
    if b"\0" in nb:
        raise invalid(f"{_label(i, name)}: name contains a NUL character")
    return nb


def describe_tensors(items: list, need_data: bool = True) -> _Descriptors:
    """Packs (name, tensor) pairs (torch tensors or numpy arrays) into wsync_tensor_t
    descriptors with their real data pointers, shapes and strides.

    Nothing is copied or made contiguous: a non-contiguous tensor is described with its real
    strides, so the library rejects it naming the tensor. Zero-size tensors are described with
    a placeholder data pointer so the library's own check reports them as zero-size (torch gives
    them a NULL pointer, which the library would otherwise report first).
    """
    torch = _dtypes.loaded_torch()
    torch_tensor = torch.Tensor if torch is not None else None
    torch_dl = _dtypes.torch_tables()[0] if torch is not None else None
    has_is_cpu = torch is not None and hasattr(torch_tensor, "is_cpu")
    numpy_dl = _dtypes._NUMPY_TO_DL
    records = []
    cuda_devices = set()
    for i, (name, t) in enumerate(items):
        nb = name.encode("utf-8") if type(name) is str else _encode_name(i, name)
        if b"\0" in nb:
            _encode_name(i, name)  # raises, naming the tensor
        if torch_tensor is not None and isinstance(t, torch_tensor):
            dl = torch_dl.get(t.dtype)
            if dl is None:
                raise invalid(f"{_label(i, name)}: torch dtype {t.dtype} has no DLPack type code")
            if t.is_cuda:
                dev_type, dev_index = _dtypes.DEVICE_CUDA, t.get_device()
                cuda_devices.add(dev_index)
            elif t.is_cpu if has_is_cpu else t.device.type == "cpu":
                dev_type, dev_index = _dtypes.DEVICE_CPU, 0
            else:
                raise WsyncError(Status.UNSUPPORTED,
                                 f"{_label(i, name)}: torch device '{t.device}' has no DLPack "
                                 "device type libwsync supports (cpu, cuda)")
            shape = tuple(t.shape)
            strides = t.stride() if need_data else None
            data = t.data_ptr() if need_data else 0
        elif isinstance(t, np.ndarray):
            dl = numpy_dl.get(t.dtype)
            if dl is None:
                raise invalid(f"{_label(i, name)}: numpy dtype {t.dtype} has no DLPack type code")
            dev_type, dev_index = _dtypes.DEVICE_CPU, 0
            shape = t.shape
            if need_data:
                size = t.itemsize
                strides = []
                for d, s in enumerate(t.strides):
                    if s % size and shape[d] != 1:
                        raise invalid(f"{_label(i, name)}: not contiguous: strides[{d}] = {s} "
                                      f"bytes is not a multiple of the {size}-byte element")
                    strides.append(s // size)
                data = t.__array_interface__["data"][0]
            else:
                strides, data = None, 0
        else:
            raise invalid(f"{_label(i, name)}: expected a torch.Tensor or numpy.ndarray, got "
                          f"{type(t).__module__}.{type(t).__name__}")
        if need_data and not data and 0 in shape:
            data = _DUMMY_ADDR
        records.append((nb, data, shape, strides, dl, dev_type, dev_index))
    descs = _pack(records, items)
    descs.cuda_devices = frozenset(cuda_devices)
    return descs


def _synchronize_cuda(devices) -> None:
    """Waits for the work queued on torch's current stream of each device, so the library
    (which knows nothing of torch's streams) reads the tensors' final values."""
    torch = _dtypes.require_torch()
    for index in devices:
        torch.cuda.current_stream(index).synchronize()


def _tensor_type(i: int, name: str, t) -> Tuple[tuple, tuple]:
    """(DLPack type triple, shape) of a torch tensor or numpy array."""
    torch = _dtypes.loaded_torch()
    if torch is not None and isinstance(t, torch.Tensor):
        dl = _dtypes.torch_tables()[0].get(t.dtype)
        what = f"torch dtype {t.dtype}"
    elif isinstance(t, np.ndarray):
        dl = _dtypes._NUMPY_TO_DL.get(t.dtype)
        what = f"numpy dtype {t.dtype}"
    else:
        raise invalid(f"{_label(i, name)}: expected a torch.Tensor or numpy.ndarray, got "
                      f"{type(t).__module__}.{type(t).__name__}")
    if dl is None:
        raise invalid(f"{_label(i, name)}: {what} has no DLPack type code")
    return dl, tuple(t.shape)


def _describe_metas(metas) -> _Descriptors:
    """Descriptors without data for the planner, from TensorMeta, (name, dtype, shape) or
    (name, tensor) entries."""
    records = []
    for i, m in enumerate(metas):
        if isinstance(m, tuple) and len(m) == 3:
            name, dtype, shape = m
            try:
                dl = tuple(DType.of(dtype))
            except TypeError as exc:
                raise invalid(f"plan entry {i} ('{name}'): {exc}") from None
            shape = tuple(int(s) for s in shape)
        elif isinstance(m, tuple) and len(m) == 2:
            name = m[0]
            dl, shape = _tensor_type(i, name, m[1])
        else:
            raise invalid(f"plan entry {i} must be a TensorMeta, (name, dtype, shape) or "
                          f"(name, tensor), not {type(m).__name__}")
        records.append((_encode_name(i, name), 0, shape, None, dl, _dtypes.DEVICE_CPU, 0))
    return _pack(records, None)


# ---------------------------------------------------------------------------------------------
# Strategy
# ---------------------------------------------------------------------------------------------
_O = TypeVar("_O", bound="_Owned")


class _Owned:
    """What every owner of one native handle (``self._h``) shares: :attr:`closed`, use as a
    context manager, and :meth:`close` run at garbage collection. Subclasses define ``close``
    (idempotent, sets ``self._h`` to ``None``)."""

    _h: Optional[int] = None

    @property
    def closed(self) -> bool:
        """True once :meth:`close` has run."""
        return self._h is None

    def __enter__(self: _O) -> _O:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __del__(self):
        if getattr(self, "_h", None) is not None:
            try:
                self.close()
            except Exception:  # interpreter shutdown: nothing left to report to
                pass


class Strategy(_Owned):
    """A strategy of one kind (``"shm"``...) with its options, e.g.
    ``Strategy("shm", receivers=2, bucket_bytes=64 << 20)``.

    Options are sent to the library as a JSON object and strictly validated there: an unknown
    key, a wrong type or an out-of-range value raises :class:`WsyncError`
    (``INVALID_ARGUMENT``) naming the key. See :func:`describe_options`.

    The trainer side calls :meth:`create_init_info` once and forwards the bytes to every
    engine; then it makes its :meth:`sender` from them, and engines make their :meth:`receiver`.
    Senders and receivers stay valid after the strategy is closed.
    """

    def __init__(self, kind: str, **options: Any):
        self._lib = lib = _lib.lib()
        self._lock = threading.RLock()
        self._h: Optional[int] = None
        if not isinstance(kind, str):
            raise invalid(f"kind must be str, not {type(kind).__name__}")
        self.options = dict(options)
        try:
            text = json.dumps(options).encode("utf-8") if options else None
        except (TypeError, ValueError) as exc:
            raise invalid(f"strategy options must be JSON values: {exc}") from None
        out = c_void_p()
        status = lib.wsync_strategy_create(kind.encode("utf-8"), text, byref(out))
        if status:
            raise_for(status, lib)
        self._h = out.value

    @classmethod
    def for_init_info(cls, init_info: bytes, **options: Any) -> "Strategy":
        """An engine-side strategy of the kind an init-info blob names, with receiver-side
        ``options`` (e.g. ``verify=False``), so an engine need not know the kind in advance."""
        parsed = describe(init_info)
        if parsed.get("type") != "init":
            raise invalid(f"init_info is a wsync {parsed.get('type')} blob, not an init blob")
        return cls(parsed["kind"], **options)

    def _handle(self) -> int:
        if self._h is None:
            raise _closed_error("strategy")
        return self._h

    @property
    def kind(self) -> str:
        """The strategy's kind name."""
        out = c_char_p()
        with self._lock:
            status = self._lib.wsync_strategy_kind(self._handle(), byref(out))
            if status:
                raise_for(status, self._lib)
        return out.value.decode("utf-8")

    def create_init_info(self) -> bytes:
        """Makes the init-info blob every sender and receiver of this sync is created from (for
        ``shm``: creates the shared-memory segment). Call once per strategy."""
        blob = _lib.Blob()
        with self._lock:
            status = self._lib.wsync_strategy_create_init_info(self._handle(), byref(blob))
            if status:
                raise_for(status, self._lib)
        return _take_blob(self._lib, blob)

    def sender(self, init_info: bytes) -> "Sender":
        """The trainer's :class:`Sender`, from this strategy's own init info."""
        init = _as_bytes(init_info, "init_info")
        out = c_void_p()
        with self._lock:
            status = self._lib.wsync_sender_create(self._handle(), init, len(init), byref(out))
            if status:
                raise_for(status, self._lib)
        return Sender(self._lib, out.value, init,
                      delta=str(self.options.get("delta", "off")) != "off")

    def receiver(self, init_info: bytes, index: int) -> "Receiver":
        """An engine's :class:`Receiver` number ``index`` (0 .. receivers-1)."""
        init = _as_bytes(init_info, "init_info")
        if not isinstance(index, int) or index < 0 or index > 0xFFFFFFFF:
            raise invalid(f"receiver index {index!r} is not an unsigned 32-bit integer")
        out = c_void_p()
        with self._lock:
            status = self._lib.wsync_receiver_create(self._handle(), init, len(init), index,
                                                     byref(out))
            if status:
                raise_for(status, self._lib)
        r = Receiver(self._lib, out.value, index)
        # The library says whether it acknowledges a chunk only once the loader's work queued
        # on its stream is done (cuda_ipc with "synchronize"): then a loader need not wait for
        # its GPU copies itself (see wsync_recv_end).
        r.orders_loader_work = r.poll().orders_loader_work
        return r

    def close(self) -> None:
        """Destroys the strategy (idempotent). Its senders and receivers stay valid."""
        with self._lock:
            h, self._h = self._h, None
            if h is not None:
                self._lib.wsync_strategy_destroy(h)

    def __repr__(self) -> str:
        state = "closed" if self._h is None else self.kind
        return f"<wsync.Strategy {state} {self.options}>"


# ---------------------------------------------------------------------------------------------
# Sender
# ---------------------------------------------------------------------------------------------
class Sender(_Owned):
    """The trainer side of a sync: sends chunks of named tensors and waits for receivers.

    Made by :meth:`Strategy.sender`. Use as a context manager, or call :meth:`close`; closing
    does not wait for receivers (call :meth:`flush` first to know they are done).
    """

    def __init__(self, lib, handle: int, init_info: bytes, delta: bool = False):
        self._lib = lib
        self._h: Optional[int] = handle
        #: Whether the strategy's ``delta`` option is on (``"auto"``/``"on"``): such a sender
        #: refuses split tensors, which :func:`wsync.trainer.send_model` checks before it sends.
        self.delta = delta
        self._lock = threading.RLock()
        #: The init-info bytes this sender was made from.
        self.init_info = init_info
        self._init_description: Optional[dict] = None
        self._arena_buf = None  # weakref to the buffer arena() handed out
        #: Bytes of the arena handed out by :func:`wsync.trainer.place_in_arena` so far.
        self.arena_used = 0

    def _handle(self) -> int:
        if self._h is None:
            raise _closed_error("sender")
        return self._h

    def send_chunk(self, tensors, last: bool = False, parts=None) -> bytes:
        """Sends one chunk and returns its request blob, to forward to every receiver.

        ``tensors`` is a dict ``{name: tensor}`` or an iterable of ``(name, tensor)`` pairs,
        where each tensor is a ``torch.Tensor`` (CPU; CUDA tensors are described as DLPack
        device 2 with their index, for strategies that move GPU memory) or a
        ``numpy.ndarray``. Tensors must be dense and row-major: a non-contiguous one is
        rejected by the library (no silent copy). Their memory is read during the call only.
        For CUDA tensors the binding first synchronizes torch's current stream on each of their
        devices, so work queued there (an optimizer step, a cast) has finished.
        ``last=True`` flags the chunk ``WSYNC_CHUNK_LAST``: it commits the current sync
        version (with its manifest), and the next chunk begins the next one. No tensors with
        ``last=True`` is the same as :meth:`commit`.

        Blocks while every bucket is still being read by a receiver, up to the strategy's
        ``timeout_ms``; then raises ``TIMEOUT`` or ``PEER`` (with ``failures``), nothing is sent
        and a version that had published a chunk is abandoned. Bad tensors raise
        ``INVALID_ARGUMENT`` and leave the version as it was.

        ``parts`` (split tensors, libwsync 0.5): ``None``, or one ``(offset, nbytes)`` per
        tensor, in bytes of the whole tensor, ``(0, 0)`` for a tensor sent whole (what
        :attr:`PlannedChunk.parts` gives with ``plan(..., split=True)``). A part's tensor is
        still passed whole; only its range is read and moved (``wsync_sender_send_parts``).
        The parts of one tensor go in consecutive chunks of one version, in order, covering
        it; the library refuses anything else (``INVALID_ARGUMENT`` naming the tensor), and a
        sender with ``delta`` on refuses parts (``UNSUPPORTED``).
        """
        descs, praw = self._describe_chunk(tensors, parts)
        request = self._send_described(descs, last, praw)
        del descs  # the descriptors and everything they point into lived through the call
        return request

    def _describe_chunk(self, tensors, parts=None):
        """send_chunk's checks and packed descriptors (and parts), without sending: what
        :func:`wsync.trainer.send_model` keeps to send a module's next versions again."""
        items = _as_items(tensors)
        praw = None
        if parts is not None:
            parts = list(parts)
            if len(parts) != len(items):
                raise invalid(f"send_chunk: {len(parts)} parts for {len(items)} tensors")
            praw = (_lib.Part * max(1, len(parts)))()
            for k, p in enumerate(parts):
                try:
                    off, size = (int(x) for x in p)
                except (TypeError, ValueError):
                    raise invalid(f"send_chunk: part {k} must be (offset, nbytes), "
                                  f"not {p!r}") from None
                if not (0 <= off < 1 << 64 and 0 <= size < 1 << 64):
                    raise invalid(f"send_chunk: part {k} {p!r} is out of range")
                praw[k].offset, praw[k].bytes = off, size
        return describe_tensors(items, need_data=True), praw

    def _send_described(self, descs: "_Descriptors", last: bool, praw) -> bytes:
        """Sends a chunk from packed descriptors (send_chunk after _describe_chunk)."""
        if descs.cuda_devices:
            _synchronize_cuda(descs.cuda_devices)
        # An empty closing chunk is passed as the header asks: tensors NULL, count 0.
        array = descs.array if descs.count else None
        chunk = _lib.Chunk(array, descs.count, CHUNK_LAST if last else 0, _CHUNK_SIZE)
        blob = _lib.Blob()
        with self._lock:
            h = self._handle()
            if praw is None:
                status = self._lib.wsync_sender_send_chunk(h, byref(chunk), byref(blob))
            else:
                status = self._lib.wsync_sender_send_parts(h, byref(chunk), praw, byref(blob))
            if status:
                raise_for(status, self._lib, sender=h)
        return _take_blob(self._lib, blob)

    def commit(self) -> bytes:
        """Commits the current version without data (the same as an empty last chunk) and
        returns its request blob, to forward to every receiver like any request. For a producer
        that learns only after its last chunk that it is done.

        Raises ``WRONG_STATE`` when the version has no chunk yet; blocks and fails like
        :meth:`send_chunk` (a failure abandons the version).
        """
        blob = _lib.Blob()
        with self._lock:
            h = self._handle()
            status = self._lib.wsync_sender_commit(h, byref(blob))
            if status:
                raise_for(status, self._lib, sender=h)
        return _take_blob(self._lib, blob)

    def abandon(self) -> None:
        """Abandons the current version if it has published a chunk (nothing happens
        otherwise): receivers that began it fail it with ``ABANDONED`` and the next chunk
        begins a new version number. Use it when the trainer gives up on a sync between chunks
        (its own error). Does not block."""
        with self._lock:
            status = self._lib.wsync_sender_abandon(self._handle())
            if status:
                raise_for(status, self._lib)

    def drop_receiver(self, index: int) -> None:
        """Stops waiting for receiver ``index`` (a dead, frozen or failing engine), so
        :meth:`flush` succeeds for the others. The receiver, if alive, fails its next call with
        ``PEER``; a receiver made again with that index re-attaches from the next version that
        begins after it attached. ``INVALID_ARGUMENT`` for an index out of range,
        ``UNSUPPORTED`` for kinds whose group is fixed (``nccl_broadcast``)."""
        if not isinstance(index, int) or isinstance(index, bool) or not 0 <= index <= 0xFFFFFFFF:
            raise invalid(f"drop_receiver: receiver index {index!r} is not an unsigned 32-bit "
                          "integer")
        with self._lock:
            status = self._lib.wsync_sender_drop_receiver(self._handle(), index)
            if status:
                raise_for(status, self._lib)

    @property
    def failures(self) -> Tuple[Failure, ...]:
        """The receiver failures the last failed call (``send_chunk``, ``commit``, ``flush``)
        found, as :class:`wsync.Failure` records; empty after a call that succeeded. The same
        records are on the raised error's ``failures``."""
        with self._lock:
            return sender_failures(self._lib, self._handle())

    def flush(self, timeout_s: float = 60.0) -> None:
        """Waits until every receiver (but dropped ones) has acknowledged every chunk sent so
        far.

        Raises ``PEER`` when a receiver failed a chunk, died or detached owing one, or
        ``TIMEOUT`` after ``timeout_s`` seconds naming the receivers that did not answer. On
        ``shm`` and ``cuda_ipc`` a failure does not end the wait at once: the other receivers
        are waited for until each has answered or failed (or the deadline), so one error names
        every engine that failed the version. The error's ``failures`` lists each receiver's
        failure as data (its own status and message, version, chunk); the trainer may then
        :meth:`drop_receiver` the failed ones and flush again, or resend the version. ``0``
        polls. There is no infinite wait.
        """
        if not isinstance(timeout_s, (int, float)) or not math.isfinite(timeout_s):
            raise invalid(f"flush: timeout_s must be a finite number of seconds, got {timeout_s!r}")
        # A negative timeout stays negative (refused by name), however small.
        ms = math.ceil(timeout_s * 1000) if timeout_s >= 0 else math.floor(timeout_s * 1000)
        ms = min(ms, _MAX_FLUSH_MS)
        with self._lock:
            h = self._handle()
            status = self._lib.wsync_sender_flush(h, ms)
            if status:
                raise_for(status, self._lib, sender=h)

    # -- asyncio: the same calls on a worker thread; ctypes releases the GIL during each
    # foreign call, so the event loop runs while the library packs, copies and waits.

    async def send_chunk_async(self, tensors, last: bool = False, parts=None) -> bytes:
        """:meth:`send_chunk` for asyncio trainers: runs on a worker thread
        (``asyncio.to_thread``), so the event loop keeps running while the chunk is packed or
        a bucket is awaited. The tensors must stay unchanged until it returns. Cancelling the
        awaiting task does not stop a send already under way."""
        return await asyncio.to_thread(self.send_chunk, tensors, last, parts)

    async def commit_async(self) -> bytes:
        """:meth:`commit` on a worker thread (see :meth:`send_chunk_async`)."""
        return await asyncio.to_thread(self.commit)

    async def flush_async(self, timeout_s: float = 60.0) -> None:
        """:meth:`flush` on a worker thread: the event loop runs while receivers finish."""
        await asyncio.to_thread(self.flush, timeout_s)

    #: :meth:`wait_released`: every version (no receiver maps anything of the sender).
    ALL_VERSIONS = (1 << 64) - 1

    def wait_released(self, version: int, timeout_s: float = 60.0) -> None:
        """Waits until the trainer may free or reallocate memory it shared up to ``version``
        that ``version`` no longer uses (:attr:`ALL_VERSIONS`: any memory it shared).

        Only ``cuda_ipc`` with ``packed: false`` shares the trainer's own memory: engines keep
        imported allocations open while versions use them, and freeing memory still imported
        is undefined behaviour in CUDA. Sync a version that no longer names the old memory,
        flush it, wait for it here, then free (``torch.cuda.empty_cache()``). Other kinds return
        at once. Raises ``INVALID_ARGUMENT`` for a version this sender has not finished and
        ``TIMEOUT`` after ``timeout_s`` naming the engines that still map the memory (the
        error's ``failures`` lists them). ``0`` polls; there is no infinite wait.
        """
        if not isinstance(timeout_s, (int, float)) or not math.isfinite(timeout_s):
            raise invalid(f"wait_released: timeout_s must be a finite number of seconds, got {timeout_s!r}")
        if not isinstance(version, int) or not 0 <= version <= self.ALL_VERSIONS:
            raise invalid(f"wait_released: version must be an int in 0..2**64-1, got {version!r}")
        # A negative timeout stays negative (refused by name), however small.
        ms = math.ceil(timeout_s * 1000) if timeout_s >= 0 else math.floor(timeout_s * 1000)
        ms = min(ms, _MAX_FLUSH_MS)
        with self._lock:
            h = self._handle()
            status = self._lib.wsync_sender_wait_released(h, version, ms)
            if status:
                raise_for(status, self._lib, sender=h)

    def set_stream(self, stream) -> None:
        """Orders the GPU kinds' reads of the tensors after the work queued on ``stream`` (a
        ``torch.cuda.Stream``, a raw ``cudaStream_t`` as an int, or ``None`` for the legacy
        default stream, the initial setting) instead of after the legacy default stream. Keep
        the stream alive while the sender uses it. ``shm`` accepts and ignores it."""
        ptr = _stream_pointer(stream)
        with self._lock:
            status = self._lib.wsync_sender_set_stream(self._handle(), ptr)
            if status:
                raise_for(status, self._lib)

    @property
    def version(self) -> int:
        """The sync version the next chunk will belong to (1 before any chunk is sent, or, for a
        ``cuda_ipc`` sender made again on init info an earlier sole sender used, the version
        after the newest that one began: see ``wsync_sender_version`` in wsync.h)."""
        out = c_uint64()
        with self._lock:
            status = self._lib.wsync_sender_version(self._handle(), byref(out))
            if status:
                raise_for(status, self._lib)
        return out.value

    @property
    def init_description(self) -> dict:
        """The init info as :func:`describe` renders it (kind and its fields, e.g. shm's
        ``bucket_bytes``)."""
        if self._init_description is None:
            self._init_description = describe(self.init_info)
        return self._init_description

    @property
    def arena(self):
        """The sender's arena (``shm`` made with ``arena_bytes``, libwsync 0.5; ``ucx`` too since
        0.8) as a writable ctypes byte array (over the shared segment for ``shm``, the trainer's
        private memory for ``ucx``), or ``None`` when it has none.

        Tensors kept there (:func:`wsync.trainer.place_in_arena` moves a module's parameters
        in) cross in place: each engine reads them straight from the trainer's memory instead
        of the trainer packing them into a bucket first (``ucx``: a chunk whose tensors lie
        there in packed layout is served from there, with no staging copy; see
        ``wsync_sender_arena`` in wsync.h). They are then borrowed until the
        version is acknowledged: do not write them (an optimizer step) before ``flush`` (or
        :func:`wsync.trainer.send_model`, which flushes) returns. With checksums on, a write
        before then fails the version on the engines (``INTEGRITY``); with them off it may be
        loaded torn. Tensors made over the array keep it, and with it this sender's memory,
        alive: :meth:`close` then stops the sender but keeps its memory mapped until the last
        of them is freed."""
        with self._lock:
            buf = self._arena_buf() if self._arena_buf is not None else None
            if buf is not None:
                return buf
            base, size = c_void_p(), c_uint64()
            status = self._lib.wsync_sender_arena(self._handle(), byref(base), byref(size))
            if status:
                raise_for(status, self._lib)
            if not base.value:
                return None
            # A subclass, so the array takes weak references (close() watches it).
            buf = type("ArenaBytes", (ctypes.c_uint8 * size.value,), {}).from_address(base.value)
            self._arena_buf = weakref.ref(buf)
            return buf

    def _destroy(self, h: int) -> None:
        buf = self._arena_buf() if self._arena_buf is not None else None
        if buf is None:
            self._lib.wsync_sender_destroy(h)
        else:
            # Tensors still live in the arena: the native sender (which keeps the segment
            # mapped) goes when the last of them, and so the array, is freed.
            weakref.finalize(buf, self._lib.wsync_sender_destroy, h)

    def close(self) -> None:
        """Destroys the sender without waiting for receivers (idempotent). For ``shm`` the
        segment's name is removed. While tensors made over :attr:`arena` live, the memory (and
        the native sender holding it) stays until they are freed."""
        with self._lock:
            h, self._h = self._h, None
            if h is not None:
                self._destroy(h)

    def __repr__(self) -> str:
        return f"<wsync.Sender {'closed' if self._h is None else 'open'}>"


# ---------------------------------------------------------------------------------------------
# Receiver and receive iteration
# ---------------------------------------------------------------------------------------------
class _IterHandle:
    """The C iteration pointer, shared by a Receiver and its open Iteration so that whichever
    goes first ends it exactly once (finalizer order in a garbage cycle is not defined)."""

    __slots__ = ("value",)

    def __init__(self, value: int):
        self.value: Optional[int] = value


class Receiver(_Owned):
    """The engine side of a sync: receives chunks described by request blobs.

    Made by :meth:`Strategy.receiver`. Use as a context manager, or call :meth:`close`; an
    iteration still open then is ended (acknowledged as failed) first.
    """

    def __init__(self, lib, handle: int, index: int):
        self._lib = lib
        self._h: Optional[int] = handle
        self._lock = threading.RLock()
        self._open: Optional[_IterHandle] = None
        #: This receiver's index.
        self.index = index
        #: True when the library itself waits for the loader's GPU work on the receiver's
        #: stream before a chunk is acknowledged (``cuda_ipc`` with ``synchronize`` on).
        self.orders_loader_work = False
        # The memory of the destinations chunks land in (land()): kept alive while they may.
        self._landing: list = []

    def _handle(self) -> int:
        if self._h is None:
            raise _closed_error("receiver")
        return self._h

    def receive(self, request: bytes, *, framework: str = "torch", copy: bool = False) -> "Iteration":
        """Starts receiving the chunk a request blob describes and returns its
        :class:`Iteration` (a context manager; iterate it for ``(name, tensor)`` pairs).

        ``framework`` is ``"torch"`` (views as torch tensors) or ``"numpy"`` (read-only numpy
        arrays for read-only memory). ``copy=True`` yields owned copies instead of views.
        Requests must be received in the order they were sent; only one iteration per
        receiver may be open (``WRONG_STATE`` otherwise). For ``"ucx"`` this pulls the chunk,
        up to the receiver's ``timeout_ms``; a chunk of more than 4 MiB is pulled in pieces
        while the loader reads it: this returns once it is leased, each tensor's first read
        waits for its bytes and ``end`` for the rest, and a failure found then is raised there.
        """
        if framework not in ("torch", "numpy"):
            raise invalid(f"framework must be 'torch' or 'numpy', not {framework!r}")
        if framework == "torch":
            _dtypes.require_torch()
        req = _as_bytes(request, "request")
        out = c_void_p()
        with self._lock:
            status = self._lib.wsync_receiver_receive(self._handle(), req, len(req), byref(out))
            if status:
                raise_for(status, self._lib)
            handle = _IterHandle(out.value)
            self._open = handle
        return Iteration(self, handle, framework, copy)

    @property
    def completed_version(self) -> int:
        """The newest committed version whose every chunk this receiver received, verified and
        ended successfully, and whose manifest matched (0 if none). A version with a failed,
        missing or abandoned chunk never becomes complete, so an engine can keep serving its
        old weights."""
        out = c_uint64()
        with self._lock:
            status = self._lib.wsync_receiver_completed_version(self._handle(), byref(out))
            if status:
                raise_for(status, self._lib)
        return out.value

    def poll(self) -> "ReceiverState":
        """Brings this receiver's view up to date without a request and returns where it
        stands (:class:`ReceiverState`): a version the sender abandoned, or a trainer that
        died, fails the open version here. Call it when requests stop coming, or after a
        failed chunk, to decide whether to roll back (see the README, "Rolling back").
        ``WRONG_STATE`` while an iteration is open. Does not block."""
        raw = _lib.sized(_lib.ReceiverState)
        with self._lock:
            status = self._lib.wsync_receiver_poll(self._handle(), byref(raw))
            if status:
                raise_for(status, self._lib)
        return ReceiverState(raw.completed_version, raw.open_version, raw.failed_version,
                             Status(raw.failed_status), raw.flags)

    def set_stream(self, stream) -> None:
        """The CUDA stream the loader queues its copies out of the views on (a
        ``torch.cuda.Stream``, an int ``cudaStream_t``, or ``None`` for the legacy default
        stream, the initial setting): GPU kinds release each chunk after the work queued there.
        ``WRONG_STATE`` while an iteration is open. ``shm`` accepts and ignores it."""
        ptr = _stream_pointer(stream)
        with self._lock:
            status = self._lib.wsync_receiver_set_stream(self._handle(), ptr)
            if status:
                raise_for(status, self._lib)

    def land(self, table: Optional["DestTable"]) -> None:
        """Lands the chunks this receiver pulls straight in ``table``'s host destinations
        (``wsync_receiver_land``, libwsync 0.8), ``None`` to stop: on ``ucx`` over its data
        stream, each tensor with exactly one destination of its dtype and shape is read from
        the socket into it and hashed as it lands, and :meth:`Iteration.apply` then verifies
        it without a copy (a view of it is the destination). Destinations are written while
        a chunk is pulled, before ``apply``; a chunk that fails may leave them partly written
        (the version does not complete, as with an ``apply`` that fails). The receiver keeps
        the destinations' memory alive while landing. ``UNSUPPORTED`` for kinds that do not
        land bytes (``shm``, ``cuda_ipc``, ``nccl_broadcast``, ``ucx`` with ``device``);
        ``WRONG_STATE`` while an iteration is open."""
        with self._lock:
            handle = table._handle() if table is not None else None
            status = self._lib.wsync_receiver_land(self._handle(), handle)
            if status:
                raise_for(status, self._lib)
            self._landing = table._keep if table is not None else []

    def dest_table(self, dests: Sequence["Dest"]) -> "DestTable":
        """A destination table for this receiver (``wsync_dest_table_create``, libwsync 0.6):
        where each wire tensor lands, declared once, so :meth:`Iteration.apply` loads a whole
        chunk with one call (for the GPU kinds: one kernel launch per chunk).

        ``dests``: :class:`Dest` entries (or ``(name, tensor)`` pairs). Each destination is a
        contiguous torch tensor (on the receiver's GPU for the GPU kinds, on the CPU for host
        kinds) or a C-contiguous writeable numpy array; the wire tensor's dtype and shape are
        the destination's unless the entry gives them. The table keeps a reference to every
        destination, so their memory stays allocated while the table lives. Raises
        ``INVALID_ARGUMENT`` naming the destination the library refuses (memory of another
        GPU, a range outside the tensor, two overlapping destinations of one name)."""
        records, keep = [], []
        for k, entry in enumerate(dests):
            d = entry if isinstance(entry, Dest) else Dest(*entry)
            address, capacity, hold = _writable_address(d.dst, _any_cuda_index(d.dst))
            dtype = d.dtype if d.dtype is not None else _dtype_of(d.dst)
            shape = tuple(int(x) for x in (d.shape if d.shape is not None else d.dst.shape))
            nbytes = d.nbytes if d.nbytes is not None else 0
            if (nbytes or _numel(shape) * dtype.itemsize - d.offset) > capacity:
                raise invalid(f"dest_table: destination {k} ('{d.name}') holds {capacity} bytes, "
                              f"fewer than it would take")
            name = _encode_name(k, d.name)
            shape_arr = (ctypes.c_int64 * max(len(shape), 1))(*shape)
            raw = _lib.Dest(name, address, shape_arr, len(shape), _lib.Dtype(*dtype), d.offset,
                            nbytes, 0, ctypes.sizeof(_lib.Dest))
            records.append(raw)
            keep += [hold, name, shape_arr, d.dst]
        if not records:
            raise invalid("dest_table: no destinations")
        array = (_lib.Dest * len(records))(*records)
        out = c_void_p()
        with self._lock:
            status = self._lib.wsync_dest_table_create(self._handle(), array, len(records),
                                                       byref(out))
            if status:
                raise_for(status, self._lib)
        return DestTable(self, out.value, keep, len(records))

    def _end_open(self) -> Tuple[int, str]:
        """Ends the open iteration, if any (caller holds the lock). Returns (status, message)."""
        handle, self._open = self._open, None
        if handle is None or handle.value is None:
            return 0, ""
        it, handle.value = handle.value, None
        status = self._lib.wsync_recv_end(it)
        if status:
            raw = self._lib.wsync_last_error()
            return status, raw.decode("utf-8", "replace") if raw else ""
        return 0, ""

    def close(self) -> None:
        """Destroys the receiver (idempotent); an open iteration is ended as failed first and
        the sender learns that this receiver detached."""
        with self._lock:
            if self._h is None:
                return
            self._end_open()
            h, self._h = self._h, None
            self._lib.wsync_receiver_destroy(h)

    def __repr__(self) -> str:
        return f"<wsync.Receiver {self.index} {'closed' if self._h is None else 'open'}>"


class Dest(NamedTuple):
    """One destination of :meth:`Receiver.dest_table`: the wire tensor ``name`` lands in
    ``dst`` (a contiguous torch tensor or numpy array: a parameter, or a view of the part of a
    fused parameter it fills). ``dtype`` and ``shape`` (of the wire tensor; default: ``dst``'s)
    are checked against each chunk before any byte moves; ``offset`` and ``nbytes`` (default:
    the rest) select the wire tensor's bytes ``dst`` takes, e.g. a shard."""

    name: str
    dst: Any
    dtype: Optional[DType] = None
    shape: Optional[Sequence[int]] = None
    offset: int = 0
    nbytes: Optional[int] = None


class ApplyResult(NamedTuple):
    """What :meth:`Iteration.apply` did: kernel ``launches`` queued (GPU kinds: 0 or 1 a
    chunk, for its small copies and casts), entries of the chunk taken (``tensors``),
    destinations written (``writes``), entries left without a destination (``unmatched``,
    with ``partial``), ``bytes`` written, and the driver's ``device_copies`` queued (GPU kinds:
    one per destination of ``WSYNC_APPLY_DRIVER_COPY_MIN``, 4 MiB, or more; library 0.6.1)."""

    launches: int
    tensors: int
    writes: int
    unmatched: int
    bytes: int
    device_copies: int = 0


class DestTable(_Owned):
    """A receiver's destination table (``wsync_dest_table_t``); see
    :meth:`Receiver.dest_table`. Holds its destinations alive; :meth:`close` (or garbage
    collection) frees it."""

    def __init__(self, receiver: "Receiver", handle: int, keep: list, count: int):
        self._lib = receiver._lib
        self._h: Optional[int] = handle
        self._keep = keep
        self.receiver = receiver
        #: Number of destinations.
        self.count = count

    def _handle(self) -> int:
        if self._h is None:
            raise _closed_error("destination table")
        return self._h

    def close(self) -> None:
        h, self._h = self._h, None
        if h is not None:
            self._lib.wsync_dest_table_destroy(h)
        self._keep = []

    def __repr__(self) -> str:
        return f"<wsync.DestTable of {self.count} destinations{' (closed)' if self._h is None else ''}>"


def _any_cuda_index(dst) -> Optional[int]:
    """The GPU a torch destination lives on (its own: the library checks it is the receiver's)."""
    device = getattr(dst, "device", None)
    return device.index if getattr(device, "type", None) == "cuda" else None


def _dtype_of(dst) -> DType:
    torch = _dtypes.loaded_torch()
    if torch is not None and isinstance(dst, torch.Tensor):
        return DType.from_torch(dst.dtype)
    if isinstance(dst, np.ndarray):
        return DType.from_numpy(dst.dtype)
    raise invalid(f"dest_table: give the dtype of a {type(dst).__name__} destination")


def _numel(shape) -> int:
    n = 1
    for extent in shape:
        n *= int(extent)
    return n


class RecvInfo(NamedTuple):
    """What an iteration carries (``wsync_recv_info_t``); on the chunk that commits a version
    (``last``) also the version's manifest, which the library checks at the end."""

    version: int  #: sync version of this chunk
    bytes: int  #: payload bytes of all tensors
    chunk_index: int  #: 0-based position of the chunk within its version
    flags: int  #: CHUNK_LAST if this chunk commits the version
    count: int  #: number of tensors (0 for a commit without data)
    version_chunks: int = 0  #: with CHUNK_LAST: chunks in the version, else 0
    version_tensors: int = 0  #: with CHUNK_LAST: tensors in the version, else 0
    version_bytes: int = 0  #: with CHUNK_LAST: payload bytes of the version, else 0

    @property
    def last(self) -> bool:
        """True if this chunk commits its version."""
        return bool(self.flags & CHUNK_LAST)


class TensorPart(NamedTuple):
    """A byte range of one tensor (``wsync_part_t``): ``offset`` and ``nbytes`` count bytes of
    the whole tensor (row-major)."""

    offset: int
    nbytes: int


class PatchData(NamedTuple):
    """One delta patch as :meth:`Iteration.patch` gives it (``wsync_recv_patch``): writing
    ``values[k]`` at flat element ``indices[k]`` of the tensor as of ``base_version`` gives the
    tensor of the chunk's version; nothing else changed. vLLM's sparse patches take exactly
    this (int32 flat indices + values per checkpoint tensor)."""

    name: str  #: the tensor's (wire) name
    indices: Any  #: 1-D int32 (tensors of at most 2^31 elements) or int64 flat indices, strictly increasing
    values: Any  #: 1-D, the tensor's dtype, the changed elements' new bits in index order
    shape: Tuple[int, ...]  #: the whole tensor's shape
    dtype: DType  #: the tensor's dtype
    base_version: int  #: the version the patch applies to (the receiver's completed one)
    base_xxh3: int  #: XXH3-64 (seed 0) of the tensor's bytes at base_version
    result_xxh3: int  #: XXH3-64 (seed 0) of the tensor's bytes once patched

    @property
    def numel(self) -> int:
        """The whole tensor's element count."""
        n = 1
        for s in self.shape:
            n *= s
        return n


class PartView(NamedTuple):
    """One entry yielded by :meth:`Iteration.iter_parts`: a whole tensor or a part of a split
    one, as a flat 1-D view of its elements."""

    name: str  #: the whole tensor's (wire) name
    view: Any  #: flat 1-D view of the entry's elements (torch tensor or numpy array)
    offset: int  #: byte offset of the entry within the whole tensor (0 for a whole tensor)
    nbytes: int  #: the entry's bytes
    shape: Tuple[int, ...]  #: the whole tensor's shape
    itemsize: int  #: bytes per element

    @property
    def start(self) -> int:
        """Index of the entry's first element in the whole tensor, flattened."""
        return self.offset // self.itemsize if self.itemsize else 0

    @property
    def stop(self) -> int:
        """One past the entry's last element in the whole tensor, flattened."""
        return (self.offset + self.nbytes) // self.itemsize if self.itemsize else 0

    @property
    def whole(self) -> bool:
        """True when the entry is the whole tensor (not a part of a split one)."""
        return self.offset == 0 and self.nbytes == math.prod(self.shape) * self.itemsize


class ReceiverState(NamedTuple):
    """Where a receiver stands (``wsync_receiver_state_t``), from :meth:`Receiver.poll`."""

    completed_version: int  #: as :attr:`Receiver.completed_version`
    open_version: int  #: version begun here and neither committed nor failed, or 0
    failed_version: int  #: newest version begun here that failed or was abandoned, or 0
    failed_status: Status  #: why failed_version failed (ABANDONED, the loader's status...); OK if none
    flags: int  #: RECEIVER_DROPPED | RECEIVER_SENDER_GONE | RECEIVER_ORDERS_LOADER_WORK

    @property
    def dropped(self) -> bool:
        """The sender dropped this receiver."""
        return bool(self.flags & RECEIVER_DROPPED)

    @property
    def sender_gone(self) -> bool:
        """The trainer's process is gone."""
        return bool(self.flags & RECEIVER_SENDER_GONE)

    @property
    def orders_loader_work(self) -> bool:
        """Chunks are acknowledged only once the loader's work queued on the receiver's
        stream before ending them has run (cuda_ipc with "synchronize")."""
        return bool(self.flags & RECEIVER_ORDERS_LOADER_WORK)


def _stream_pointer(stream) -> Optional[int]:
    """A CUDA stream as the C ABI takes it: ``torch.cuda.Stream`` (its ``cuda_stream``), an int
    handle, or ``None`` (the legacy default stream)."""
    if stream is None:
        return None
    handle = getattr(stream, "cuda_stream", stream)
    if isinstance(handle, bool) or not isinstance(handle, int) or not 0 <= handle < 1 << 64:
        raise invalid(f"stream must be a torch.cuda.Stream, an int cudaStream_t or None, "
                      f"got {type(stream).__name__}")
    return handle or None


class WsyncWarning(RuntimeWarning):
    """Something the binding could not do as asked, reported without raising."""


class _CudaArray:
    """Exposes a CUDA view through ``__cuda_array_interface__`` (version 2) for
    ``torch.as_tensor``; torch keeps this object, and so the iteration, alive."""

    __slots__ = ("__cuda_array_interface__", "owner")


def _writable_address(dst, cuda_index: Optional[int] = None) -> Tuple[int, int, Any]:
    """(address, byte capacity, object to keep alive) of a writeable destination: host memory,
    or (``cuda_index`` given: the chunk is in that GPU's memory) a tensor on that GPU."""
    torch = _dtypes.loaded_torch()
    if torch is not None and isinstance(dst, torch.Tensor):
        if dst.device.type == "cuda" and cuda_index is not None:
            if dst.device.index != cuda_index:
                raise invalid(f"copy_into: the destination is on {dst.device}; this chunk is in "
                              f"the memory of cuda:{cuda_index}")
        elif dst.device.type != "cpu":
            where = "CPU tensors" if cuda_index is None else f"CPU tensors or cuda:{cuda_index}"
            raise invalid(f"copy_into: the destination is on {dst.device}; only {where} "
                          "(use the views for other devices)")
        if not dst.is_contiguous():
            raise invalid("copy_into: the destination tensor is not contiguous")
        return dst.data_ptr(), dst.numel() * dst.element_size(), dst
    if isinstance(dst, np.ndarray):
        if not dst.flags.c_contiguous or not dst.flags.writeable:
            raise invalid("copy_into: the destination array is not C-contiguous and writeable")
        return dst.ctypes.data, dst.nbytes, dst
    try:
        mv = memoryview(dst)
    except TypeError:
        raise invalid(f"copy_into: cannot write into a {type(dst).__name__}") from None
    if mv.readonly or not mv.c_contiguous:
        raise invalid("copy_into: the destination buffer is read-only or not contiguous")
    mv = mv.cast("B")
    if mv.nbytes == 0:
        return 1, 0, mv  # nothing will be written; the library still wants a non-NULL address
    buf = (c_char * mv.nbytes).from_buffer(mv)
    return ctypes.addressof(buf), mv.nbytes, (mv, buf)


class Iteration:
    """One received chunk: a context manager and a single-pass iterable of ``(name, tensor)``.

    **View lifetime.** Without ``copy=True`` the tensors are zero-copy views into memory the
    library owns (for ``shm``: the shared bucket, mapped read-only). They are valid only until
    the iteration ends (:meth:`end`, leaving the ``with`` block, or closing the receiver):
    after that the sender may overwrite the bucket with a later chunk. Copy what you keep.
    numpy views of read-only memory are flagged non-writeable; torch has no read-only tensors,
    so **writing into a torch view of shm memory crashes the process (SIGSEGV)** - copy from
    views, never into them. A view keeps its Iteration object alive (so the Iteration is not
    ended by garbage collection while a view exists), but ending the iteration explicitly still
    invalidates every view.

    Ending acknowledges the chunk: it succeeds only if every tensor was yielded (and verified,
    with checksums on). :meth:`fail` acknowledges it as failed with the loader's own status and
    message at any point, also after the last view (a load that failed once every view was
    taken); the sender's flush then reports them as a :class:`wsync.Failure`. Leaving the
    ``with`` block through an exception fails the iteration that way (see
    :func:`status_for_exception`) and lets the exception propagate.

    **Split tensors** (libwsync 0.5). A tensor larger than a bucket arrives as *parts*, one per
    chunk in consecutive chunks: each part is an entry with the whole tensor's name, dtype and
    shape (:meth:`peek`) and only a byte range of its bytes (:meth:`part`). Plain iteration
    refuses a part (``UNSUPPORTED`` naming it; the iteration fails), because a whole-tensor
    view would overrun it. Take parts with :meth:`copy_into` (a whole-tensor copy into the
    parameter writes only this part's range; every chunk fills its own) or as flat 1-D views
    with :meth:`iter_parts`, which yields whole tensors too.
    """

    def __init__(self, receiver: Receiver, handle: _IterHandle, framework: str, copy: bool):
        self._receiver = receiver
        self._lib = receiver._lib
        self._lock = receiver._lock
        self._handle = handle
        self._framework = framework
        self._copy = copy
        self._info: Optional[RecvInfo] = None
        self._yielded = 0
        # Set when the library failed the iteration (a checksum, an order error): ending it
        # then reports the library's own error, which a fail() would only replace.
        self._library_failed = False
        self._view = _lib.Tensor()
        self._has = c_bool()
        self._view_ref = byref(self._view)
        self._has_ref = byref(self._has)
        self._makers: Dict[tuple, tuple] = {}
        self._cuda_index: Any = _UNKNOWN

    def _h(self) -> int:
        h = self._handle.value
        if h is None:
            raise WrongStateError(Status.WRONG_STATE, "the iteration has already ended")
        return h

    @property
    def ended(self) -> bool:
        """True once the iteration has ended (its views are then invalid)."""
        return self._handle.value is None

    @property
    def info(self) -> RecvInfo:
        """The chunk's version, byte count, index, flags and tensor count."""
        if self._info is None:
            raw = _lib.sized(_lib.RecvInfo)
            with self._lock:
                status = self._lib.wsync_recv_info(self._h(), byref(raw))
                if status:
                    raise_for(status, self._lib)
            self._info = RecvInfo(raw.version, raw.bytes, raw.chunk_index, raw.flags, raw.count,
                                  raw.version_chunks, raw.version_tensors, raw.version_bytes)
        return self._info

    def __len__(self) -> int:
        return self.info.count

    def _peek_raw(self, i: int) -> tuple:
        """wsync_recv_peek of tensor i as raw descriptor fields (caller holds the lock)."""
        view = _lib.Tensor()
        status = self._lib.wsync_recv_peek(self._h(), i, byref(view))
        if status:
            raise_for(status, self._lib)
        return _TENSOR_RAW.unpack_from(view)

    def peek(self, i: int) -> TensorMeta:
        """Dry run: the name, dtype and shape of tensor ``i`` without touching its bytes."""
        if not isinstance(i, int) or isinstance(i, bool) or i < 0:
            raise invalid(f"peek: tensor index {i!r} is not a non-negative integer")
        with self._lock:
            f = self._peek_raw(i)
            name = ctypes.string_at(f[0]).decode("utf-8")
            shape = _INT64_STRUCTS[f[4]].unpack(ctypes.string_at(f[2], 8 * f[4])) if f[4] else ()
        return TensorMeta(name, DType(f[5], f[6], f[7]), shape)

    def is_patch(self, i: int) -> bool:
        """Whether entry ``i`` crossed as a delta patch (``WSYNC_TENSOR_PATCH`` from
        ``wsync_recv_peek``): take it with :meth:`patch` or :meth:`copy_into`, not as a view."""
        if not isinstance(i, int) or isinstance(i, bool) or i < 0:
            raise invalid(f"is_patch: tensor index {i!r} is not a non-negative integer")
        with self._lock:
            return bool(self._peek_raw(i)[10] & TENSOR_PATCH)

    def patch(self, i: int, *, copy: Optional[bool] = None) -> PatchData:
        """Entry ``i``, which crossed as a delta patch, as flat indices and values
        (``wsync_recv_patch``, libwsync 0.5): a :class:`PatchData` whose ``indices`` are int32
        (the tensor has at most 2^31 elements) or int64 and whose ``values`` have the tensor's
        dtype, both 1-D, as torch tensors or numpy arrays (the iteration's framework).

        The library first checks what it can without the base: that the receiver's completed
        version is the patch's base version (else ``MISMATCH`` naming both; the iteration is
        failed), the patch bytes' checksum (``INTEGRITY``) and the patch itself (``MALFORMED``
        naming the tensor for a bad header, length, or an index out of order or outside the
        tensor). A dense entry raises ``INVALID_ARGUMENT`` naming it, and the iteration goes on.
        The entry is then taken (iterating skips it); applying it is the caller's, and so is
        checking the result (``result_xxh3``), which the library cannot do without the tensor.
        If the caller cannot apply it, fail the iteration (:meth:`fail`, or raise inside the
        ``with`` block) so the version does not complete here.

        Without ``copy`` (default: the iteration's ``copy`` setting) the arrays are views of
        memory the library owns (for ``shm`` the read-only shared bucket: never write into
        them), valid until the iteration ends; ``copy=True`` gives owned copies."""
        if not isinstance(i, int) or isinstance(i, bool) or i < 0:
            raise invalid(f"patch: tensor index {i!r} is not a non-negative integer")
        copy = self._copy if copy is None else bool(copy)
        out = _lib.sized(_lib.Patch)
        with self._lock:
            status = self._lib.wsync_recv_patch(self._h(), i, byref(out))
            if status:
                if status not in (Status.INVALID_ARGUMENT, Status.UNSUPPORTED):
                    self._library_failed = True  # the iteration itself failed
                raise_for(status, self._lib)
            f = self._peek_raw(i)
            name = ctypes.string_at(f[0]).decode("utf-8")
            shape = _INT64_STRUCTS[f[4]].unpack(ctypes.string_at(f[2], 8 * f[4])) if f[4] else ()
            dl = (f[5], f[6], f[7])
            count = int(out.count)
            index_dtype = np.int32 if out.index_bits == 32 else np.int64
            if count:
                ibuf = (c_char * (count * (out.index_bits // 8))).from_address(out.indices)
                ibuf._wsync_owner = self  # a view keeps its iteration alive
                indices = np.frombuffer(ibuf, index_dtype)
            else:
                indices = np.zeros(0, index_dtype)
            try:
                carrier, itemsize, reinterpret = self._maker(dl)
            except TypeError as exc:
                raise WsyncError(Status.UNSUPPORTED, f"tensor '{name}': {exc}") from None
            if count:
                vbuf = (c_char * (count * itemsize)).from_address(out.values)
                vbuf._wsync_owner = self
                values = np.frombuffer(vbuf, carrier)
            else:
                values = np.zeros(0, carrier)
            if copy:
                indices, values = indices.copy(), values.copy()
            else:
                indices.flags.writeable = False
                values.flags.writeable = False
            if self._framework != "numpy":
                torch = _dtypes.torch_module()
                with warnings.catch_warnings():  # torch warns about non-writeable arrays
                    warnings.simplefilter("ignore", UserWarning)
                    indices = torch.from_numpy(indices)
                    values = torch.from_numpy(values)
                if reinterpret is not None:
                    values = values.view(reinterpret)
        return PatchData(name, indices, values, tuple(shape), DType(*dl), int(out.base_version),
                         int(out.base_xxh3), int(out.result_xxh3))

    def metas(self) -> List[TensorMeta]:
        """Dry run over the whole chunk: a :class:`TensorMeta` per tensor, in order, without
        touching any tensor bytes (so a loader can check the plan before anything moves)."""
        return [self.peek(i) for i in range(self.info.count)]

    @property
    def cuda_index(self) -> Optional[int]:
        """The GPU whose memory holds this chunk's tensors (``cuda_ipc``, ``nccl_broadcast``),
        or ``None`` for host memory (and for an empty chunk)."""
        if self._cuda_index is _UNKNOWN:
            with self._lock:
                f = self._peek_raw(0) if self.info.count else None
            self._cuda_index = f[9] if f is not None and f[8] == _dtypes.DEVICE_CUDA else None
        return self._cuda_index

    def copy_into(self, i: int, dst, *, offset: int = 0, nbytes: Optional[int] = None) -> int:
        """Copies tensor ``i``'s bytes (from byte ``offset``; ``nbytes`` of them, by default the
        rest of the tensor) into ``dst``'s memory with the library's copy loop
        (``wsync_recv_copy``), verifying the tensor's checksum in the same pass. Returns the
        bytes copied.

        ``dst``: a contiguous CPU torch tensor, a C-contiguous writeable numpy array, or any
        writeable buffer, at least ``nbytes`` long; its bytes are overwritten raw (no dtype
        conversion, no autograd record). The tensor counts as taken: iterating skips it.
        For the GPU kinds (``cuda_ipc``, ``nccl_broadcast``: the chunk is in GPU memory)
        ``dst`` is a contiguous torch tensor on the receiver's GPU: the copy is queued on the
        loader's stream (the legacy default stream, PyTorch's default, unless
        ``Receiver.set_stream`` named another) and the library orders it like the loader's
        own copies out of views (``wsync_recv_end``; ``synchronize`` on, the default). One
        library call and one driver copy a tensor, no view: the cheap way for a Python loader
        to take GPU tensors.
        Raises ``INVALID_ARGUMENT`` for a bad index, range or destination (the iteration goes
        on), ``INTEGRITY`` naming the tensor when its checksum fails (the iteration is failed
        and ``dst`` holds unspecified bytes), ``UNSUPPORTED`` for a device-memory kind without
        a device copy.
        """
        if not isinstance(i, int) or isinstance(i, bool) or i < 0:
            raise invalid(f"copy_into: tensor index {i!r} is not a non-negative integer")
        if not isinstance(offset, int) or isinstance(offset, bool) or offset < 0:
            raise invalid(f"copy_into: offset {offset!r} is not a non-negative integer")
        address, capacity, keep = _writable_address(dst, self.cuda_index)
        with self._lock:
            if nbytes is None:
                f = self._peek_raw(i)
                size = f[6] * f[7] // 8  # bits * lanes / 8
                if f[4]:
                    for extent in _INT64_STRUCTS[f[4]].unpack(ctypes.string_at(f[2], 8 * f[4])):
                        size *= extent
                nbytes = max(size - offset, 0)
            if not isinstance(nbytes, int) or isinstance(nbytes, bool) or nbytes < 0:
                raise invalid(f"copy_into: nbytes {nbytes!r} is not a non-negative integer")
            if nbytes > capacity:
                raise invalid(f"copy_into: the destination holds {capacity} bytes, "
                              f"{nbytes} are to be copied")
            status = self._lib.wsync_recv_copy(self._h(), i, offset, address, nbytes)
            if status:
                if status not in (Status.INVALID_ARGUMENT, Status.UNSUPPORTED):
                    self._library_failed = True  # the iteration itself failed (a checksum)
                raise_for(status, self._lib)
        del keep
        return nbytes

    def apply(self, table: DestTable, *, partial: bool = False, complete: bool = False) -> ApplyResult:
        """Loads this chunk into ``table``'s destinations with one library call
        (``wsync_recv_apply``, libwsync 0.6): the GPU kinds queue one kernel launch for the whole
        chunk on the loader's stream (ordered like :meth:`copy_into`); host kinds copy with the
        library's verified copy loop.

        Every entry is checked against the table first, and a refusal changes nothing (the
        iteration goes on): ``MISMATCH`` naming the tensor for one without a destination
        (unless ``partial``: then it is left for :meth:`copy_into` or the views, and counted in
        ``unmatched``) or of another dtype or shape, and, with ``complete`` on the chunk that
        commits the version, for destinations this version never wrote; ``INVALID_ARGUMENT``
        for device memory freed or remapped since the table was made, or a table of another
        receiver. ``INTEGRITY`` (host kinds) fails the iteration as :meth:`copy_into` does."""
        if not isinstance(table, DestTable):
            raise invalid(f"apply: table must be a DestTable, not {type(table).__name__}")
        flags = (1 if partial else 0) | (2 if complete else 0)
        out = _lib.ApplyResult()
        out.struct_size = ctypes.sizeof(_lib.ApplyResult)
        with self._lock:
            status = self._lib.wsync_recv_apply(self._h(), table._handle(), flags, byref(out))
            if status:
                if status not in (Status.INVALID_ARGUMENT, Status.UNSUPPORTED, Status.MISMATCH):
                    self._library_failed = True
                raise_for(status, self._lib)
        return ApplyResult(out.launches, out.tensors, out.writes, out.unmatched, out.bytes,
                           out.device_copies)

    def _maker(self, dl: tuple):
        """(numpy dtype the view is built with, itemsize, torch dtype to reinterpret as or
        None), cached per element type."""
        m = self._makers.get(dl)
        if m is None:
            itemsize = dl[1] * dl[2] // 8
            if self._framework == "numpy":
                m = (DType(*dl).to_numpy(), itemsize, None)
            else:
                tdt = DType(*dl).to_torch()
                carrier, reinterpret = torch_carrier(dl)
                m = (carrier, itemsize, tdt if reinterpret else None)
            self._makers[dl] = m
        return m

    def _make(self, fields, part_bytes: Optional[int] = None) -> Tuple[str, Any]:
        """(name, view) of a yielded descriptor; with ``part_bytes``, a flat 1-D view of that
        many bytes (a part of a split tensor, or a whole tensor seen flat)."""
        name_p, data, shape_p, _, ndim, code, bits, lanes, dev_type, dev_index, flags, _ = fields
        name = ctypes.string_at(name_p).decode("utf-8")
        dl = (code, bits, lanes)
        try:
            carrier, itemsize, reinterpret = self._maker(dl)
        except TypeError as exc:
            raise WsyncError(Status.UNSUPPORTED, f"tensor '{name}': {exc}") from None
        if part_bytes is None:
            shape = _INT64_STRUCTS[ndim].unpack(ctypes.string_at(shape_p, 8 * ndim)) if ndim else ()
            nbytes = itemsize
            for s in shape:
                nbytes *= s
        else:
            if itemsize <= 0 or part_bytes % itemsize:
                raise WsyncError(Status.UNSUPPORTED, f"tensor '{name}': a part of {part_bytes} "
                                 f"bytes is not a whole number of {itemsize}-byte elements")
            shape, nbytes = (part_bytes // itemsize,), part_bytes
        if dev_type in _dtypes.HOST_DEVICE_TYPES:
            buf = (c_char * nbytes).from_address(data)
            buf._wsync_owner = self  # the view keeps its iteration alive
            arr = np.frombuffer(buf, carrier).reshape(shape)
            if self._framework == "numpy":
                if self._copy:
                    return name, arr.copy()
                if flags & TENSOR_READ_ONLY:
                    arr.flags.writeable = False
                return name, arr
            torch = _dtypes.torch_module()
            t = torch.from_numpy(arr)
            if reinterpret is not None:
                t = t.view(reinterpret)
            return name, (t.clone() if self._copy else t)
        if dev_type == _dtypes.DEVICE_CUDA:
            if self._framework == "numpy":
                raise WsyncError(Status.UNSUPPORTED,
                                 f"tensor '{name}' is in CUDA memory; numpy cannot view it, "
                                 "receive with framework='torch'")
            t = cuda_view(data, shape, dl, dev_index, owner=self)
            return name, (t.clone() if self._copy else t)
        raise WsyncError(Status.UNSUPPORTED, f"tensor '{name}' is on "
                         f"{_dtypes.device_name(dev_type, dev_index)}, which this binding cannot view")

    def __iter__(self) -> Iterator[Tuple[str, Any]]:
        nxt = self._lib.wsync_recv_next
        unpack = _TENSOR_RAW.unpack_from
        view, view_ref, has, has_ref = self._view, self._view_ref, self._has, self._has_ref
        lock = self._lock
        handle = self._handle
        while True:
            with lock:
                h = handle.value
                if h is None:
                    raise WrongStateError(Status.WRONG_STATE, "the iteration has already ended")
                status = nxt(h, view_ref, has_ref)
                if status:
                    self._library_failed = True
                    raise_for(status, self._lib)
                if not has.value:
                    return
                fields = unpack(view)
                self._yielded += 1
                try:
                    made = self._make(fields)
                except WsyncError as exc:
                    # A view this binding cannot make (a dtype or device the framework cannot
                    # hold) fails the chunk with that reason, even if it was the last one.
                    self._fail_locked(exc.status, exc.message)
                    raise
            yield made

    def items(self) -> List[Tuple[str, Any]]:
        """All remaining ``(name, tensor)`` pairs as a list (same lifetime rule as iterating)."""
        return list(self)

    # -- split tensors (libwsync 0.5)

    def part(self, i: int) -> "TensorPart":
        """The byte range of the whole tensor that entry ``i`` carries (``wsync_recv_part``):
        ``(offset, nbytes)``, or ``(0, the tensor's size)`` for an entry that is a whole
        tensor. An entry that is a *part* of a split tensor (a tensor larger than a bucket,
        sent in consecutive chunks; see :func:`wsync.plan`) has its whole tensor's name,
        dtype and shape in :meth:`peek`, but only this range of its bytes in this chunk.
        Touches no tensor bytes."""
        if not isinstance(i, int) or isinstance(i, bool) or i < 0:
            raise invalid(f"part: tensor index {i!r} is not a non-negative integer")
        out = _lib.Part()
        with self._lock:
            status = self._lib.wsync_recv_part(self._h(), i, byref(out))
            if status:
                raise_for(status, self._lib)
        return TensorPart(out.offset, out.bytes)

    def parts(self) -> List["TensorPart"]:
        """:meth:`part` of every entry, in order."""
        return [self.part(i) for i in range(self.info.count)]

    def iter_parts(self) -> Iterator["PartView"]:
        """Yields every remaining entry, parts of split tensors included, as a
        :class:`PartView`: the name, a **flat 1-D view** of the entry's elements (a part's
        elements, or all of a whole tensor's, in row-major order), the entry's byte offset
        within the whole tensor, its byte count and the whole tensor's shape. Entries taken
        with :meth:`copy_into` are skipped, as by plain iteration. A part's elements belong at
        ``whole.view(-1)[pv.start:pv.stop]``; a whole tensor's view is
        ``pv.view.view(pv.shape)``.

        Plain iteration (``for name, view in it``) refuses parts: it raises ``UNSUPPORTED``
        naming the tensor and fails the iteration, since a loader unaware of parts would read
        the whole tensor's size from a part's bytes. Loaders that copy into host memory need
        neither: :meth:`copy_into` of the whole tensor (offset 0, the tensor's size) writes the
        part's share at its place and leaves the rest alone, so copying every entry whole fills
        a split tensor chunk by chunk. Same view lifetime and verification as plain iteration.
        """
        nxt = self._lib.wsync_recv_next_part
        unpack = _TENSOR_RAW.unpack_from
        view, view_ref, has, has_ref = self._view, self._view_ref, self._has, self._has_ref
        part = _lib.Part()
        part_ref = byref(part)
        lock = self._lock
        handle = self._handle
        while True:
            with lock:
                h = handle.value
                if h is None:
                    raise WrongStateError(Status.WRONG_STATE, "the iteration has already ended")
                status = nxt(h, view_ref, part_ref, has_ref)
                if status:
                    self._library_failed = True
                    raise_for(status, self._lib)
                if not has.value:
                    return
                fields = unpack(view)
                self._yielded += 1
                offset, nbytes = part.offset, part.bytes
                ndim = fields[4]
                shape = (_INT64_STRUCTS[ndim].unpack(ctypes.string_at(fields[2], 8 * ndim))
                         if ndim else ())
                itemsize = fields[6] * fields[7] // 8
                try:
                    name, t = self._make(fields, nbytes)
                except WsyncError as exc:
                    self._fail_locked(exc.status, exc.message)
                    raise
            yield PartView(name, t, offset, nbytes, shape, itemsize)

    def end(self) -> None:
        """Ends the iteration and acknowledges the chunk (idempotent).

        Raises :class:`WsyncError` if the chunk was not fully consumed (``WRONG_STATE``; the
        chunk is then acknowledged as failed) or failed verification (``INTEGRITY``). Every
        view becomes invalid.
        """
        with self._lock:
            if self._handle.value is None:
                return
            h, self._handle.value = self._handle.value, None
            if self._receiver._open is self._handle:
                self._receiver._open = None
            status = self._lib.wsync_recv_end(h)
            if status:
                raise_for(status, self._lib)

    def _fail_locked(self, status: Status, message: str) -> None:
        """wsync_recv_fail on the open iteration (caller holds the lock); frees it."""
        if self._handle.value is None:
            return
        h, self._handle.value = self._handle.value, None
        if self._receiver._open is self._handle:
            self._receiver._open = None
        raw = message.encode("utf-8", "replace")
        if len(raw) > MAX_FAIL_MESSAGE_BYTES:  # cut on a character boundary, as the library would not
            raw = raw[:MAX_FAIL_MESSAGE_BYTES].decode("utf-8", "ignore").encode("utf-8")
        status = self._lib.wsync_recv_fail(h, int(status), raw.replace(b"\0", b" "))
        if status:
            raise_for(status, self._lib)

    def fail(self, status, message: str = "") -> None:
        """Fails the iteration at any point, also after its last view (a loader that found a
        tensor it cannot load, or failed once every view was taken): the chunk is acknowledged
        as failed with ``status`` (an error :class:`Status`, not ``OK``) and ``message`` (cut
        to 255 bytes), which reach the sender's flush as the error's text and as a
        :class:`wsync.Failure`; the version is not completed here. Ends the iteration (every
        view becomes invalid). ``WRONG_STATE`` if it has already ended."""
        try:
            status = Status(int(status))
        except (TypeError, ValueError):
            raise invalid(f"fail: status must be a wsync.Status, not {status!r}") from None
        if status is Status.OK:
            raise invalid("fail: status must be an error status, not OK")
        if not isinstance(message, str):
            raise invalid(f"fail: message must be str, not {type(message).__name__}")
        with self._lock:
            self._h()  # raises WRONG_STATE once ended
            self._fail_locked(status, message)

    def abort(self, status=Status.WRONG_STATE, message: str = "the loader stopped") -> Optional[WsyncError]:
        """Ends the iteration acknowledging the chunk as failed, without raising; returns the
        error that ended it (None if it had already ended). A chunk the library had already
        failed (a checksum) keeps the library's error; otherwise it is failed with ``status``
        and ``message`` as :meth:`fail` does."""
        with self._lock:
            if self._handle.value is None:
                return None
            try:
                if self._library_failed:
                    self.end()
                    return None
                self._fail_locked(Status(int(status)), message)
            except WsyncError as exc:
                return exc
        return WsyncError(status, message)

    def __enter__(self) -> "Iteration":
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc_type is None:
            self.end()
            return False
        if self.ended:
            return False
        status = status_for_exception(exc)
        text = f"{exc_type.__name__}: {exc}" if str(exc) else exc_type.__name__
        if isinstance(exc, WsyncError):
            text = exc.message
        err = self.abort(status, text)
        if err is not None and hasattr(exc, "add_note"):
            exc.add_note(f"wsync: the chunk was acknowledged as failed ({err})")
        return False

    def __del__(self):
        handle = getattr(self, "_handle", None)
        if handle is not None and handle.value is not None:
            ended = False
            try:
                with self._lock:
                    if handle.value is not None:
                        h, handle.value = handle.value, None
                        if self._receiver._open is handle:
                            self._receiver._open = None
                        self._lib.wsync_recv_end(h)
                        ended = True
            except Exception:  # interpreter shutdown
                pass
            if ended:
                try:
                    warnings.warn("wsync: an Iteration was garbage-collected before end() or "
                                  "fail(); it was ended then, so the chunk failed unless every "
                                  "tensor had been taken. End it explicitly, or use it as a "
                                  "context manager", WsyncWarning, stacklevel=2)
                except Exception:  # interpreter shutdown: the warnings machinery may be gone
                    pass

    def __repr__(self) -> str:
        if self.ended:
            return "<wsync.Iteration ended>"
        i = self.info
        return (f"<wsync.Iteration version {i.version} chunk {i.chunk_index}"
                f"{' (last)' if i.last else ''}: {i.count} tensors, {i.bytes} bytes>")


def status_for_exception(exc: BaseException) -> Status:
    """The status an exception leaving a ``with receiver.receive(...)`` block fails the chunk
    with: a :class:`WsyncError`'s own status; ``MISMATCH`` for ``LookupError``, ``TypeError``
    and ``ValueError`` (the chunk does not fit what the loader expected: an unknown name, a
    wrong shape); ``NO_MEMORY`` for ``MemoryError``; ``TIMEOUT`` for ``TimeoutError``;
    ``SYSTEM`` for other ``OSError``; ``WRONG_STATE`` (the loader stopped) for anything else."""
    if isinstance(exc, WsyncError) and exc.status is not Status.OK:
        return exc.status
    if isinstance(exc, (LookupError, TypeError, ValueError)):
        return Status.MISMATCH
    if isinstance(exc, MemoryError):
        return Status.NO_MEMORY
    if isinstance(exc, TimeoutError):
        return Status.TIMEOUT
    if isinstance(exc, OSError):
        return Status.SYSTEM
    return Status.WRONG_STATE


def torch_carrier(dl: tuple) -> Tuple[np.dtype, bool]:
    """The numpy dtype torch can import a view of type ``dl`` through, and whether the result
    must then be reinterpreted (``Tensor.view(dtype)``) as the real type.

    torch imports numpy's bool, signed ints, uint8, floats and complex directly; bfloat16,
    float8, complex32 and the wider unsigned ints go through a signed int of the same size.
    """
    direct = _dtypes._DL_TO_NUMPY.get(dl)
    if direct is not None and not (dl[0] == _dtypes.DTYPE_UINT and dl[1] > 8):
        return direct, False
    size = dl[1] * dl[2] // 8
    carrier = _dtypes._CARRIER.get(size)
    if carrier is None:
        raise TypeError(f"no {size}-byte integer to carry {DType(*dl).name}")
    return carrier, True


def cuda_array_interface(data: int, shape: Sequence[int], dl: tuple) -> dict:
    """The ``__cuda_array_interface__`` (version 2) dict describing a dense CUDA view.

    Types torch cannot take from a typestr (bfloat16, float8, complex32, wide unsigned ints)
    are described with a signed integer of the same size, to be reinterpreted with
    ``Tensor.view(dtype)``. The read-only flag is always False: torch refuses read-only CUDA
    arrays.
    """
    carrier, _ = torch_carrier(dl)
    return {"shape": tuple(int(s) for s in shape), "typestr": carrier.str,
            "data": (int(data), False), "strides": None, "version": 2}


def cuda_view(data: int, shape: Sequence[int], dl: tuple, device_index: int, owner=None):
    """A torch tensor viewing CUDA memory at ``data`` (no copy); ``owner`` is kept alive for as
    long as the tensor lives."""
    torch = _dtypes.require_torch()
    tdt = DType(*dl).to_torch()
    holder = _CudaArray()
    holder.__cuda_array_interface__ = cuda_array_interface(data, shape, dl)
    holder.owner = owner
    t = torch.as_tensor(holder, device=torch.device("cuda", device_index))
    if t.dtype != tdt:
        t = t.view(tdt)
    return t


# ---------------------------------------------------------------------------------------------
# Planner
# ---------------------------------------------------------------------------------------------
class PlannedChunk(NamedTuple):
    """One chunk of a plan: indices into the planned list, its payload bytes, and (plans made
    with ``split=True`` only) the byte range of each tensor the chunk holds."""

    indices: Tuple[int, ...]
    bytes: int
    #: ``None`` when every tensor of the chunk is whole; else one ``(offset, nbytes)`` per
    #: index (bytes of the whole tensor, as :meth:`Sender.send_chunk` takes them), ``(0, 0)``
    #: for a tensor held whole.
    parts: Optional[Tuple[Tuple[int, int], ...]] = None


def plan(metas, *, chunk_bytes: Optional[int] = None, group_depth: Optional[int] = None,
         split: bool = False) -> List[PlannedChunk]:
    """Groups tensors into chunks with the library's planner (``wsync_plan_*``).

    ``metas`` is a list of :class:`TensorMeta`, ``(name, dtype, shape)`` or ``(name, tensor)``
    entries. Consecutive tensors of one module (the name without its last ``group_depth``
    dotted parts; default 2, 0 disables grouping) stay in one chunk; whole groups are batched
    in order while a chunk stays within ``chunk_bytes`` (default 256 MiB). Deterministic.

    A single tensor larger than ``chunk_bytes`` gets a chunk of its own, which a strategy
    whose buckets are ``chunk_bytes`` cannot send. ``split=True`` (libwsync 0.5) splits such
    a tensor into byte-range parts of at most ``chunk_bytes`` each, one part per chunk
    (consecutive chunks; the last part may share its chunk with the rest of its module
    group); each chunk's :attr:`PlannedChunk.parts` says which range of each tensor it holds,
    and :meth:`Sender.send_chunk` sends them with ``parts=``.
    """
    lib = _lib.lib()
    entries = list(metas.items()) if isinstance(metas, Mapping) else list(metas)
    descs = _describe_metas(entries)
    options = {}
    if chunk_bytes is not None:
        options["chunk_bytes"] = chunk_bytes
    if group_depth is not None:
        options["group_depth"] = group_depth
    if split:
        options["split"] = True
    text = json.dumps(options).encode("utf-8") if options else None
    out = c_void_p()
    status = lib.wsync_plan_create(descs.array, descs.count, text, byref(out))
    if status:
        raise_for(status, lib)
    try:
        count = c_size_t()
        status = lib.wsync_plan_chunk_count(out.value, byref(count))
        if status:
            raise_for(status, lib)
        chunks = []
        idx = ctypes.POINTER(c_size_t)()
        n = c_size_t()
        nbytes = c_uint64()
        for i in range(count.value):
            status = lib.wsync_plan_chunk(out.value, i, byref(idx), byref(n), byref(nbytes))
            if status:
                raise_for(status, lib)
            parts = None
            if split and n.value:
                praw = ctypes.POINTER(_lib.Part)()
                status = lib.wsync_plan_chunk_parts(out.value, i, byref(praw))
                if status:
                    raise_for(status, lib)
                ranges = tuple((praw[k].offset, praw[k].bytes) for k in range(n.value))
                if any(r != (0, 0) for r in ranges):
                    parts = ranges
            chunks.append(PlannedChunk(tuple(idx[:n.value]), nbytes.value, parts))
        return chunks
    finally:
        lib.wsync_plan_destroy(out.value)


# ---------------------------------------------------------------------------------------------
# Free functions
# ---------------------------------------------------------------------------------------------
def version() -> str:
    """The loaded library's version string, e.g. ``"0.1.0"``."""
    return _lib.lib().wsync_version_string().decode("ascii")


def version_number() -> int:
    """The loaded library's version number (MAJOR * 10000 + MINOR * 100 + PATCH)."""
    return int(_lib.lib().wsync_version_number())


def describe(blob: bytes) -> dict:
    """Renders any blob (init info or request) as a dict: ``{"magic": "wsync", "format": 1,
    "type": "request", "kind": "shm", "body": {...}}``. Malformed bytes raise ``MALFORMED``."""
    lib = _lib.lib()
    data = _as_bytes(blob, "blob")
    out = c_void_p()
    status = lib.wsync_blob_describe(data, len(data), byref(out))
    if status:
        raise_for(status, lib)
    return json.loads(_take_string(lib, out))


def kinds() -> List[dict]:
    """The strategy kinds this library build knows:
    ``[{"kind": "shm", "available": True, "reason": "", "capabilities": {...}}, ...]``.
    ``"capabilities"`` (libwsync 0.7) is what each kind does differently, as data
    (``tensor_memory``, ``senders``, ``drop_receiver``, ``reattach``, ``collective``,
    ``gpu_per_receiver``, ``delta``; wsync.h's ``wsync_strategy_kinds`` says what each means)."""
    lib = _lib.lib()
    out = c_void_p()
    status = lib.wsync_strategy_kinds(byref(out))
    if status:
        raise_for(status, lib)
    return json.loads(_take_string(lib, out))


def describe_options(kind: str) -> dict:
    """A kind's options: ``{"receivers": {"type": "uint", "default": 1, "min": 1, ...}, ...}``.
    An unknown kind raises ``UNSUPPORTED``."""
    lib = _lib.lib()
    out = c_void_p()
    status = lib.wsync_strategy_describe_options(kind.encode("utf-8"), byref(out))
    if status:
        raise_for(status, lib)
    return json.loads(_take_string(lib, out))


def merge_requests(parts: Sequence[bytes]) -> bytes:
    """Merges the partial requests of several senders of one chunk into one request. Kinds with
    a single sender (``shm``) accept exactly one part and return a copy."""
    lib = _lib.lib()
    parts = [_as_bytes(p, f"part {i}") for i, p in enumerate(parts)]
    bufs = [(ctypes.c_uint8 * len(p)).from_buffer_copy(p) if p else None for p in parts]
    arr = (_lib.Blob * max(1, len(parts)))()
    for i, b in enumerate(bufs):
        if b is not None:
            arr[i].data = ctypes.cast(b, ctypes.POINTER(ctypes.c_uint8))
            arr[i].size = len(parts[i])
    out = _lib.Blob()
    status = lib.wsync_request_merge(arr if parts else None, len(parts), byref(out))
    if status:
        raise_for(status, lib)
    del bufs
    return _take_blob(lib, out)


def abi_layout() -> dict:
    """Sizes, alignments and field offsets of the C structs as the library was compiled
    (``wsync_abi_layout``)."""
    lib = _lib.lib()
    out = c_void_p()
    status = lib.wsync_abi_layout(byref(out))
    if status:
        raise_for(status, lib)
    return json.loads(_take_string(lib, out))
