"""Trainer-side helpers: from an ``nn.Module`` (or a state dict) to sent chunks.

:func:`iter_chunks` lists a model's tensors, groups them with the library's planner (tensors of
one module stay together, chunks stay under a byte threshold), optionally casts floating-point
tensors (e.g. float32 -> bfloat16) or moves them to another device one chunk at a time, and
yields chunks ready for :meth:`wsync.Sender.send_chunk`, the last one flagged so that one pass
is one sync version. :func:`send_model` does all of it in one call.
"""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Callable, Iterator, List, Mapping, NamedTuple, Optional, Tuple

import numpy as np

from . import _dtypes
from ._core import Sender, TensorMeta, plan
from ._dtypes import DType
from ._errors import invalid

#: The planner's default chunk size (256 MiB), used when neither the caller nor the sender's
#: init info says otherwise.
DEFAULT_CHUNK_BYTES = 256 << 20


class ChunkToSend(NamedTuple):
    """One planned chunk: ``tensors`` as (name, tensor) pairs, its position, whether it is the
    last of the version, and its payload bytes."""

    index: int
    tensors: List[Tuple[str, Any]]
    last: bool
    bytes: int


def named_tensors(source) -> List[Tuple[str, Any]]:
    """The (name, tensor) pairs of a source, in order.

    ``source`` is an ``nn.Module`` (its ``state_dict()``: parameters and persistent buffers,
    detached, tied weights under each of their names), a mapping ``{name: tensor}``, or an
    iterable of (name, tensor) pairs such as ``module.named_parameters()``.
    """
    torch = _dtypes.torch_module()
    if torch is not None and isinstance(source, torch.nn.Module):
        return list(source.state_dict().items())
    if isinstance(source, Mapping):
        return list(source.items())
    items = list(source)
    for i, item in enumerate(items):
        if not isinstance(item, tuple) or len(item) != 2:
            raise invalid(f"source must be an nn.Module, a mapping or (name, tensor) pairs; "
                          f"item {i} is a {type(item).__name__}")
    return items


def _target_dtype(t, dtype):
    """The dtype ``t`` is sent as: ``dtype`` for floating-point torch tensors when given."""
    torch = _dtypes.torch_module()
    if dtype is not None and torch is not None and isinstance(t, torch.Tensor) and t.is_floating_point():
        return dtype
    return t.dtype


def _meta(name: str, t, dtype) -> TensorMeta:
    torch = _dtypes.torch_module()
    try:
        if torch is not None and isinstance(t, torch.Tensor):
            return TensorMeta(name, DType.from_torch(_target_dtype(t, dtype)), tuple(t.shape))
        if isinstance(t, np.ndarray):
            return TensorMeta(name, DType.from_numpy(t.dtype), tuple(t.shape))
    except TypeError as exc:
        raise invalid(f"tensor '{name}': {exc}") from None
    raise invalid(f"tensor '{name}': expected a torch.Tensor or numpy.ndarray, got "
                  f"{type(t).__module__}.{type(t).__name__}")


def _prepare(t, dtype, device, make_contiguous: bool):
    torch = _dtypes.torch_module()
    if torch is None or not isinstance(t, torch.Tensor):
        return t
    t = t.detach()
    want = _target_dtype(t, dtype)
    if want != t.dtype or (device is not None and t.device != torch.device(device)):
        t = t.to(device=device if device is not None else t.device, dtype=want)
    if make_contiguous and not t.is_contiguous():
        t = t.contiguous()
    return t


def iter_chunks(source, *, chunk_bytes: Optional[int] = None, group_depth: int = 2,
                dtype=None, device=None, make_contiguous: bool = False) -> Iterator[ChunkToSend]:
    """Plans ``source``'s tensors into chunks and yields them ready to send, in order; the
    last one has ``last=True``, so sending every chunk of one call is one sync version.

    - ``chunk_bytes`` (default 256 MiB) and ``group_depth`` (default 2) go to the planner
      (see :func:`wsync.plan`); for ``shm`` keep ``chunk_bytes`` at most the ``bucket_bytes``.
    - ``dtype``: cast floating-point tensors to this torch dtype (integer and bool tensors are
      sent as they are). The plan counts the bytes after the cast.
    - ``device``: move tensors there (e.g. ``"cpu"`` for ``shm`` from a GPU model).
    - Casts and moves happen one chunk at a time, when that chunk is yielded, so at most one
      chunk of converted copies exists at once if the caller sends each chunk before asking
      for the next.
    - ``make_contiguous``: copy non-contiguous tensors into contiguous ones; without it they
      are passed as they are and the library refuses them by name.
    """
    items = named_tensors(source)
    if not items:
        raise invalid("nothing to send: the source has no tensors")
    metas = [_meta(name, t, dtype) for name, t in items]
    chunks = plan(metas, chunk_bytes=chunk_bytes, group_depth=group_depth)
    for k, planned in enumerate(chunks):
        tensors = [(items[i][0], _prepare(items[i][1], dtype, device, make_contiguous))
                   for i in planned.indices]
        yield ChunkToSend(k, tensors, k == len(chunks) - 1, planned.bytes)


def default_chunk_bytes(sender: Sender) -> int:
    """The chunk size to plan with for a sender: its init info's ``bucket_bytes`` when the
    strategy has buckets (``shm``), else :data:`DEFAULT_CHUNK_BYTES`."""
    body = sender.init_description.get("body", {})
    value = body.get("bucket_bytes") if isinstance(body, dict) else None
    return int(value) if isinstance(value, int) and value > 0 else DEFAULT_CHUNK_BYTES


def send_model(sender: Sender, source, *, chunk_bytes: Optional[int] = None, group_depth: int = 2,
               dtype=None, device=None, make_contiguous: bool = False,
               on_request: Optional[Callable[[bytes], Any]] = None,
               flush_timeout_s: Optional[float] = None) -> List[bytes]:
    """Sends every chunk of ``source`` as one sync version and returns the request blobs.

    ``on_request(request)``, when given, is called right after each chunk is sent, so a
    controller can forward it to the engines while the next chunk is packed. Without it the
    requests are only returned at the end; then the strategy must have at least as many
    buckets as there are chunks, or sending blocks until its ``timeout_ms`` waiting for
    receivers that have not been told about earlier chunks yet.

    ``chunk_bytes`` defaults to :func:`default_chunk_bytes`. ``flush_timeout_s``, when given,
    makes the call wait for every receiver's acknowledgement (see :meth:`Sender.flush`).

    If anything fails part-way (a send, a cast, ``on_request``) the version is abandoned
    (:meth:`Sender.abandon`; receivers that began it fail it with ``ABANDONED``) and the
    exception propagates; receivers keep the previous version as their completed one. A
    failed send's error carries the receivers' failures (``WsyncError.failures``).
    """
    if chunk_bytes is None:
        chunk_bytes = default_chunk_bytes(sender)
    requests: List[bytes] = []
    try:
        for chunk in iter_chunks(source, chunk_bytes=chunk_bytes, group_depth=group_depth,
                                 dtype=dtype, device=device, make_contiguous=make_contiguous):
            request = sender.send_chunk(chunk.tensors, last=chunk.last)
            del chunk  # drop converted copies before the next chunk is prepared
            requests.append(request)
            if on_request is not None:
                on_request(request)
    except BaseException:
        # A version left open part-way must not look resumable to receivers: abandon it (a
        # no-op when nothing was published, or when the failed send already abandoned it).
        _abandon_quietly(sender)
        raise
    if flush_timeout_s is not None:
        sender.flush(flush_timeout_s)
    return requests


async def send_model_async(sender: Sender, source, *, chunk_bytes: Optional[int] = None,
                           group_depth: int = 2, dtype=None, device=None,
                           make_contiguous: bool = False,
                           on_request: Optional[Callable[[bytes], Any]] = None,
                           flush_timeout_s: Optional[float] = None) -> List[bytes]:
    """:func:`send_model` for asyncio trainers. Preparing each chunk (casts, moves), sending
    it and flushing run on worker threads, so the event loop keeps serving while weights go
    out; ``on_request`` may be a plain function or a coroutine function (awaited on the loop,
    e.g. an HTTP call to the inference engines). Failures abandon the version, as in
    :func:`send_model`."""
    if chunk_bytes is None:
        chunk_bytes = default_chunk_bytes(sender)
    chunks = iter_chunks(source, chunk_bytes=chunk_bytes, group_depth=group_depth,
                         dtype=dtype, device=device, make_contiguous=make_contiguous)
    requests: List[bytes] = []
    try:
        while True:
            chunk = await asyncio.to_thread(next, chunks, None)
            if chunk is None:
                break
            request = await sender.send_chunk_async(chunk.tensors, last=chunk.last)
            del chunk
            requests.append(request)
            if on_request is not None:
                result = on_request(request)
                if inspect.isawaitable(result):
                    await result
    except BaseException:
        await asyncio.to_thread(_abandon_quietly, sender)
        raise
    if flush_timeout_s is not None:
        await sender.flush_async(flush_timeout_s)
    return requests


def _abandon_quietly(sender: Sender) -> None:
    try:
        sender.abandon()
    except Exception:  # the sender is closed or broken: the original error matters more
        pass
