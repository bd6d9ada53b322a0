"""Trainer-side helpers: from an ``nn.Module`` (or a state dict, or a lazy source) to sent chunks.

:func:`iter_chunks` lists a model's tensors, groups them with the library's planner (tensors of
one module stay together, chunks stay under a byte threshold), optionally casts floating-point
tensors (e.g. float32 -> bfloat16) or moves them to another device one chunk at a time, and
yields chunks ready for :meth:`wsync.Sender.send_chunk`, the last one flagged so that one pass
is one sync version. :func:`send_model` does all of it in one call.

Tied and aliased tensors are sent once. Tensors of the source that are one tensor under
several names (same device, data pointer, dtype, shape and strides, as ``state_dict()`` lists a
tied embedding and LM head) travel as **one** wire tensor whose name is every name joined with
``=`` (:data:`ALIAS_SEPARATOR`), in the source's order: ``"embed_tokens.weight=lm_head.weight"``.
The bytes cross once; :class:`wsync.engine.ModuleLoader` loads them under every name (a tied
engine module once, an untied one into each parameter), and its strict check counts every name
as loaded. Views of only part of a storage, or of it with another shape, strides or dtype, are
not aliases and are sent separately. A joined name never exceeds the library's
:data:`MAX_NAME_BYTES`: longer alias lists are split over several joined names (their bytes
then cross once per joined name), and a name that itself contains ``=`` is never joined (its
aliases are sent under their own names). ``aliases="repeat"`` sends every name with its own
copy of the bytes, for engines that read wire names directly and do not split them
(:func:`split_alias_name` is the engine-side rule).

Split tensors. A tensor larger than ``chunk_bytes`` (for ``shm``, the bucket: a 152064 x 3584
bf16 embedding is 1.02 GiB) is split into byte-range parts of at most ``chunk_bytes``, each in a
chunk of its own, consecutive chunks of one version (``split=True``, the default; libwsync
0.5). Each :class:`ChunkToSend` then carries ``parts`` (one ``(offset, nbytes)`` per tensor,
``(0, 0)`` for whole ones), which :meth:`wsync.Sender.send_chunk` takes as ``parts=``; the tensor
itself is passed whole and only the part's range is read. A split tensor is cast, moved or
gathered (lazy source) once, for all its parts, and kept until its last part is sent.
Receivers see each part as an entry with the whole tensor's name, dtype and shape:
:class:`wsync.engine.ModuleLoader` and :meth:`wsync.Iteration.copy_into` load them
transparently; plain iteration over views refuses parts, :meth:`wsync.Iteration.iter_parts`
yields them. Delta sync refuses parts (``UNSUPPORTED``): with ``delta`` on, keep tensors within
``chunk_bytes`` or pass ``split=False`` (an oversized tensor then gets a chunk of its own, as
before 0.5, which ``shm`` refuses naming it: "raise bucket_bytes").

A :class:`LazySource` gives the tensors' metadata up front and gathers the tensors of each chunk
only when that chunk is about to be sent (as FSDP or Megatron trainers all-gather shards), so a
sync holds about one chunk of gathered tensors at a time.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import inspect
import weakref
from typing import Any, Callable, Dict, Iterator, List, Mapping, NamedTuple, Optional, Tuple

import numpy as np

from . import _dtypes
from ._core import Sender, TensorMeta, plan
from ._dtypes import DType
from ._errors import WsyncError, Status, error, invalid

#: The planner's default chunk size (256 MiB), used when neither the caller nor the sender's
#: init info says otherwise.
DEFAULT_CHUNK_BYTES = 256 << 20


#: Joins the names of one tensor's aliases into its wire name (``"a.weight=b.weight"``).
ALIAS_SEPARATOR = "="

#: The longest tensor name the library accepts, in UTF-8 bytes (``WSYNC_MAX_NAME_BYTES``).
MAX_NAME_BYTES = 1024


def join_alias_names(names) -> List[str]:
    """The wire names that carry one tensor known under ``names``: ``names`` joined with
    ``=`` in order, in as few joined names as fit :data:`MAX_NAME_BYTES` each; names that
    contain ``=`` (or are empty) come last, each alone."""
    out: List[str] = []
    alone: List[str] = []
    current: List[str] = []
    size = 0
    for name in names:
        n = len(name.encode("utf-8", "surrogatepass"))
        if not name or ALIAS_SEPARATOR in name:
            alone.append(name)
            continue
        if current and size + 1 + n > MAX_NAME_BYTES:
            out.append(ALIAS_SEPARATOR.join(current))
            current, size = [], 0
        size += n + (1 if current else 0)
        current.append(name)
    if current:
        out.append(ALIAS_SEPARATOR.join(current))
    return out + alone


def split_alias_name(name: str) -> List[str]:
    """The names one wire tensor is loaded under: ``name`` split at ``=``, or ``[name]`` when a
    part would be empty. An engine that reads wire names itself loads the tensor's bytes under
    every one of them (:class:`wsync.engine.ModuleLoader` does)."""
    parts = name.split(ALIAS_SEPARATOR)
    return [name] if len(parts) == 1 or not all(parts) else parts


class ChunkToSend(NamedTuple):
    """One planned chunk: ``tensors`` as (wire name, tensor) pairs (aliases joined with ``=``),
    its position, whether it is the last of the version, its payload bytes, and the byte range
    of each tensor it carries (``None`` when every tensor is whole; else one ``(offset,
    nbytes)`` per tensor, ``(0, 0)`` for a whole one): pass it to
    :meth:`wsync.Sender.send_chunk` as ``parts=``."""

    index: int
    tensors: List[Tuple[str, Any]]
    last: bool
    bytes: int
    parts: Optional[List[Tuple[int, int]]] = None


class LazySource:
    """A source whose tensors exist only when asked for: metadata now, tensors per chunk.

    ``metas`` lists every tensor as a :class:`wsync.TensorMeta` or ``(name, dtype, shape)``
    (``dtype`` a torch or numpy dtype, a :class:`wsync.DType` or a name such as
    ``"bfloat16"``), in sending order, with the dtype and shape the gathered tensor will have
    (before any ``dtype=`` cast of :func:`iter_chunks`). The planner works from these alone.

    ``gather(names)`` is called once per chunk, just before the chunk is handed out, with the
    names of that chunk's tensors (aliases excluded; a split tensor is asked for once, with the
    chunk of its first part, and kept until its last part is sent; a chunk holding only a
    later part calls no gather), and returns their tensors: a mapping
    ``{name: tensor}`` or a sequence in the order of ``names``. Each must match its metadata
    (dtype and shape; anything else raises ``INVALID_ARGUMENT`` naming it); extra entries are
    ignored. The tensors may be fresh (an FSDP all-gather, a Megatron gather onto rank 0): they
    are dropped when the caller asks for the next chunk (:func:`send_model` asks only after the
    chunk was sent), so at most about one chunk of gathered tensors, plus the converted copies
    of a cast or move, is alive at a time. Every library strategy copies (or packs) the tensors
    while sending except ``cuda_ipc`` with ``packed: false``, which shares the trainer's memory
    and so cannot send a lazy source (:func:`send_model` refuses it).

    ``aliases`` maps extra names onto names of ``metas`` (``{"lm_head.weight":
    "embed_tokens.weight"}``, a tied weight): they are not gathered; they join their tensor's
    wire name (see the module documentation), or with ``aliases="repeat"`` are sent as copies.
    """

    def __init__(self, metas, gather: Callable[[List[str]], Any], *,
                 aliases: Optional[Mapping[str, str]] = None):
        if not callable(gather):
            raise invalid(f"LazySource: gather must be callable, not {type(gather).__name__}")
        self.gather = gather
        self.metas: List[TensorMeta] = []
        for i, m in enumerate(metas):
            if not isinstance(m, tuple) or len(m) != 3:
                raise invalid(f"LazySource: metadata entry {i} must be a TensorMeta or (name, "
                              f"dtype, shape), not {m!r}")
            name, dt, shape = m
            if not isinstance(name, str):
                raise invalid(f"LazySource: metadata entry {i}: name must be a str, not {name!r}")
            try:
                dt = DType.of(dt)
                shape = tuple(int(s) for s in shape)
            except (TypeError, ValueError) as exc:
                raise invalid(f"LazySource: tensor '{name}': {exc}") from None
            self.metas.append(TensorMeta(name, dt, shape))
        self._by_name: Dict[str, TensorMeta] = {m.name: m for m in self.metas}
        known = self._by_name
        if len(known) != len(self.metas):
            raise invalid("LazySource: a name appears more than once in the metadata")
        self.aliases: Dict[str, str] = dict(aliases or {})
        for alias, target in self.aliases.items():
            if target not in known:
                raise invalid(f"LazySource: alias '{alias}' names '{target}', which the "
                              f"metadata does not list")
            if alias in known:
                raise invalid(f"LazySource: alias '{alias}' is also a tensor of the metadata")

    def __repr__(self) -> str:
        return f"LazySource({len(self.metas)} tensors, {len(self.aliases)} aliases)"


def named_tensors(source) -> List[Tuple[str, Any]]:
    """The (name, tensor) pairs of a source, in order.

    ``source`` is an ``nn.Module`` (its ``state_dict()``: parameters and persistent buffers,
    detached, tied weights under each of their names), a mapping ``{name: tensor}``, or an
    iterable of (name, tensor) pairs such as ``module.named_parameters()``.
    """
    torch = _dtypes.loaded_torch()
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


def alias_key(t):
    """What makes two tensors one (same memory seen the same way), or None when ``t`` cannot
    be an alias of anything (no elements, no memory, not a tensor)."""
    torch = _dtypes.loaded_torch()
    if torch is not None and isinstance(t, torch.Tensor):
        try:
            if t.numel() == 0 or t.device.type == "meta" or t.is_sparse or t.is_quantized:
                return None
            ptr = t.data_ptr()
            key = ("torch", str(t.device), ptr, t.dtype, tuple(t.shape), tuple(t.stride()))
        except (RuntimeError, NotImplementedError, TypeError):  # no plain memory (subclasses)
            return None
        return key if ptr != 0 else None
    if isinstance(t, np.ndarray):
        if t.size == 0:
            return None
        return ("numpy", t.__array_interface__["data"][0], t.dtype.str, t.shape, t.strides)
    return None


def alias_groups(items: List[Tuple[str, Any]]) -> List[List[int]]:
    """Indices of ``items`` grouped by alias (one tensor under several names), each group in
    order, groups ordered by their first index."""
    groups: List[List[int]] = []
    where: Dict[Any, int] = {}
    for i, (_, t) in enumerate(items):
        key = alias_key(t)
        if key is not None and key in where:
            groups[where[key]].append(i)
            continue
        if key is not None:
            where[key] = len(groups)
        groups.append([i])
    return groups


def _as_torch_dtype(dtype):
    """``dtype`` as a torch dtype: a torch dtype as it is, a name (``"bfloat16"``), a
    :class:`DType` or a (code, bits, lanes) tuple converted; None stays None."""
    if dtype is None:
        return None
    torch = _dtypes.loaded_torch()
    if torch is not None and isinstance(dtype, torch.dtype):
        return dtype
    try:
        return DType.of(dtype).to_torch()
    except (TypeError, ValueError, KeyError) as exc:
        raise invalid(f"dtype {dtype!r}: {exc}") from None


def _target_dtype(t, dtype):
    """The dtype ``t`` is sent as: ``dtype`` for floating-point torch tensors when given."""
    torch = _dtypes.loaded_torch()
    if dtype is not None and torch is not None and isinstance(t, torch.Tensor) and t.is_floating_point():
        return dtype
    return t.dtype


def _meta(name: str, t, dtype) -> TensorMeta:
    torch = _dtypes.loaded_torch()
    try:
        if torch is not None and isinstance(t, torch.Tensor):
            return TensorMeta(name, DType.from_torch(_target_dtype(t, dtype)), tuple(t.shape))
        if isinstance(t, np.ndarray):
            return TensorMeta(name, DType.from_numpy(t.dtype), tuple(t.shape))
    except TypeError as exc:
        raise invalid(f"tensor '{name}': {exc}") from None
    raise invalid(f"tensor '{name}': expected a torch.Tensor or numpy.ndarray, got "
                  f"{type(t).__module__}.{type(t).__name__}")


def _lazy_meta(m: TensorMeta, dtype) -> TensorMeta:
    """A lazy tensor's metadata as sent: ``dtype`` for floating-point ones when given."""
    if dtype is None:
        return m
    try:
        floating = m.dtype.to_torch().is_floating_point
        return m._replace(dtype=DType.from_torch(dtype)) if floating else m
    except TypeError as exc:
        raise invalid(f"tensor '{m.name}': {exc}") from None


def _prepare(t, dtype, device, make_contiguous: bool):
    torch = _dtypes.loaded_torch()
    if torch is None or not isinstance(t, torch.Tensor):
        return t
    if t.requires_grad:
        t = t.detach()  # only then: the tensor itself is sent, not a new view of its storage
    want = _target_dtype(t, dtype)
    if want != t.dtype or (device is not None and t.device != torch.device(device)):
        t = t.to(device=device if device is not None else t.device, dtype=want)
    if make_contiguous and not t.is_contiguous():
        t = t.contiguous()
    return t


class _Entry(NamedTuple):
    """One wire tensor: its wire name, what gives its bytes (eager: the tensor; lazy: the name
    to gather) and its metadata as planned (the first name, the dtype as sent)."""

    wire_name: str
    key: Any
    meta: TensorMeta


def _entries(source, aliases: str, dtype) -> Tuple[List[_Entry], Optional[LazySource]]:
    if aliases not in ("join", "repeat"):
        raise invalid(f"aliases must be 'join' or 'repeat', not {aliases!r}")
    entries: List[_Entry] = []
    if isinstance(source, LazySource):
        extra: Dict[str, List[str]] = {}
        for alias, target in source.aliases.items():
            extra.setdefault(target, []).append(alias)
        for m in source.metas:
            meta = _lazy_meta(m, dtype)
            names = [m.name, *extra.get(m.name, ())]
            wire = join_alias_names(names) if aliases == "join" else names
            entries += [_Entry(w, m.name, meta._replace(name=split_alias_name(w)[0])) for w in wire]
        return entries, source
    items = named_tensors(source)
    groups = alias_groups(items) if aliases == "join" else [[i] for i in range(len(items))]
    for group in groups:
        name, t = items[group[0]]
        meta = _meta(name, t, dtype)
        for w in join_alias_names([items[i][0] for i in group]):
            entries.append(_Entry(w, t, meta._replace(name=split_alias_name(w)[0])))
    return entries, None


def _gathered(lazy: LazySource, names: List[str]) -> Dict[str, Any]:
    """Calls the lazy source's gather for one chunk and checks what it gave."""
    got = lazy.gather(list(names))
    if isinstance(got, Mapping):
        missing = [n for n in names if n not in got]
        if missing:
            raise invalid("LazySource: gather returned no tensor for "
                          + ", ".join(f"'{n}'" for n in missing))
        out = {n: got[n] for n in names}
    else:
        got = list(got)
        if len(got) != len(names):
            raise invalid(f"LazySource: gather returned {len(got)} tensors for "
                          f"{len(names)} names")
        out = dict(zip(names, got))
    del got
    want = lazy._by_name
    for name, t in out.items():
        have = _meta(name, t, None)
        if (have.dtype, have.shape) != (want[name].dtype, want[name].shape):
            raise invalid(f"LazySource: gather returned tensor '{name}' as "
                          f"{have.dtype.name}{list(have.shape)}, its metadata says "
                          f"{want[name].dtype.name}{list(want[name].shape)}")
    return out


def iter_chunks(source, *, chunk_bytes: Optional[int] = None, group_depth: int = 2,
                dtype=None, device=None, make_contiguous: bool = False,
                aliases: str = "join", split: bool = True) -> Iterator[ChunkToSend]:
    """Plans ``source``'s tensors into chunks and yields them ready to send, in order; the
    last one has ``last=True``, so sending every chunk of one call is one sync version.

    - ``source``: an ``nn.Module``, a mapping or (name, tensor) pairs (see
      :func:`named_tensors`), or a :class:`LazySource`.
    - ``chunk_bytes`` (default 256 MiB) and ``group_depth`` (default 2) go to the planner
      (see :func:`wsync.plan`); for ``shm`` keep ``chunk_bytes`` at most the ``bucket_bytes``.
    - ``split`` (default ``True``): a tensor larger than ``chunk_bytes`` is split into
      byte-range parts, one per chunk (see "Split tensors" in the module documentation);
      with ``split=False`` it gets a chunk of its own, which ``shm`` refuses naming it.
    - ``dtype``: cast floating-point tensors to this dtype (a torch dtype, or a name such as
      ``"bfloat16"`` or a :class:`DType`, as elsewhere in the binding; integer and bool tensors
      are sent as they are). The plan counts the bytes after the cast.
    - ``device``: move tensors there (e.g. ``"cpu"`` for ``shm`` from a GPU model).
    - Casts, moves and a lazy source's gathers happen one chunk at a time, when that chunk is
      yielded, and are dropped when the next one is asked for, so at most one chunk of
      converted or gathered tensors exists at once if the caller sends each chunk (and drops
      it) before asking for the next. A split tensor is gathered, cast or moved once, when its
      first part is yielded, and kept until its last part was yielded.
    - ``make_contiguous``: copy non-contiguous tensors into contiguous ones; without it they
      are passed as they are and the library refuses them by name.
    - ``aliases``: ``"join"`` (default) sends a tensor known under several names (a tied
      weight) once, under its names joined with ``=``; ``"repeat"`` sends it under each name,
      its bytes each time (see the module documentation).
    """
    return _iter_chunks(source, chunk_bytes=chunk_bytes, group_depth=group_depth, dtype=dtype,
                        device=device, make_contiguous=make_contiguous, aliases=aliases,
                        split=split)


def _iter_chunks(source, *, chunk_bytes, group_depth, dtype, device, make_contiguous, aliases,
                 split, parts_refused: bool = False) -> Iterator[ChunkToSend]:
    """:func:`iter_chunks`; with ``parts_refused`` (a sender with delta on), a plan that splits a
    tensor is refused with ``UNSUPPORTED`` naming it before the first chunk is yielded, so
    nothing of the version is sent."""
    dtype = _as_torch_dtype(dtype)
    entries, lazy = _entries(source, aliases, dtype)
    if not entries:
        raise invalid("nothing to send: the source has no tensors")
    metas = [e.meta for e in entries]
    chunks = plan(metas, chunk_bytes=chunk_bytes, group_depth=group_depth, split=split)
    del metas
    if parts_refused:
        for planned in chunks:
            if planned.parts:
                k = next(j for j, (_, size) in enumerate(planned.parts) if size)
                e = entries[planned.indices[k]]
                raise error(Status.UNSUPPORTED,
                            f"delta sync does not take split tensors: tensor '{e.wire_name}' "
                            f"({e.meta.nbytes} bytes) is larger than chunk_bytes ({chunk_bytes}); "
                            "raise bucket_bytes and chunk_bytes, or run the sender with delta "
                            "\"off\" (nothing of this version was sent)")
    # Split tensors whose last part is still to come: ident -> the prepared tensor, reused for
    # every part (gathered, cast or moved once).
    pending: Dict[Any, Any] = {}
    for k, planned in enumerate(chunks):
        picked = [entries[i] for i in planned.indices]
        ranges = planned.parts or [(0, 0)] * len(picked)
        if lazy is not None:
            keys = list(dict.fromkeys(e.key for e in picked if e.key not in pending))
            sources = _gathered(lazy, keys) if keys else {}
        else:
            sources = None
        prepared: Dict[Any, Any] = {}  # one converted copy per tensor, shared by its wire names
        tensors = []
        for e, (offset, size) in zip(picked, ranges):
            ident = e.key if sources is not None else id(e.key)
            if ident not in prepared:
                if ident in pending:
                    prepared[ident] = pending[ident]
                else:
                    # A gathered tensor leaves `sources` as it is prepared, so a cast or moved
                    # copy replaces its original here instead of both living until the chunk
                    # is sent.
                    t = sources.pop(e.key) if sources is not None else e.key
                    if sources is not None and dtype is not None and isinstance(t, np.ndarray):
                        # The plan cast every floating-point lazy tensor: numpy ones go through
                        # torch.
                        t = _dtypes.require_torch().from_numpy(t)
                    prepared[ident] = _prepare(t, dtype, device, make_contiguous)
                    t = None
            if size:
                # A part: keep the prepared tensor for the next parts, drop it after the last.
                if offset + size < e.meta.nbytes:
                    pending[ident] = prepared[ident]
                else:
                    pending.pop(ident, None)
            tensors.append((e.wire_name, prepared[ident]))
        sources = prepared = None
        yield ChunkToSend(k, tensors, k == len(chunks) - 1, planned.bytes,
                          list(planned.parts) if planned.parts else None)
        # The caller is done with this chunk: drop its gathered and converted tensors before
        # the next gather, so two chunks of them never coexist here.
        del tensors


#: Where :func:`place_in_arena` starts each tensor: the offset alignment a tensor needs to be
#: sent in place (wsync_sender_arena).
ARENA_ALIGN = 256


def place_in_arena(sender: Sender, source) -> int:
    """Moves a CPU module's parameters and buffers (or a list of tensors) into the sender's
    arena (``shm`` or, since libwsync 0.8, ``ucx`` made with ``arena_bytes``) and returns the
    arena bytes they take, so that every later sync sends them in place: each engine copies
    straight from the trainer's memory, as with ``share_memory_()``, and no bucket copy is
    made (``ucx``: for each chunk whose tensors lie there in the order they are sent).

    Each tensor keeps its identity: a parameter's ``.data`` is replaced by a tensor of the
    same dtype and shape over the arena holding the same values (contiguous, at a multiple of
    :data:`ARENA_ALIGN` bytes), so optimizers, hooks and tied parameters (one ``Parameter`` under
    two names, moved once) are unaffected. Tensors placed by earlier calls stay where they are
    (passing them again moves nothing); each call appends after them (``sender.arena_used``).
    Empty tensors are left where they are.

    A module's tensors are laid out in the order :func:`send_model` sends it (its
    ``state_dict()``, a tied tensor at its first name, then parameters and buffers the state
    dict leaves out), one after another. ``shm`` sends any arena tensor in place; ``ucx`` only
    a chunk that lies in the arena exactly as it would be packed, which that order gives for
    ``send_model(sender, module)``. What is sent differently is packed as usual, silently (the
    sync is the same, only the copy and the trainer's staging memory come back): a ``dtype=``
    cast, ``aliases="repeat"``, a list placed in another order than it is sent, or tensors
    placed by several calls between which the module's other tensors are sent.

    The rule that comes with it (see :attr:`wsync.Sender.arena`): do not write the placed
    tensors (an optimizer step) while a sync is in flight, i.e. before :func:`send_model` (or
    ``flush``) returns; with checksums on, a write then fails the version on the engines.

    Raises ``INVALID_ARGUMENT`` before moving anything when the sender has no arena, a tensor is
    not a CPU tensor, or the tensors do not fit (the message gives the bytes needed and the
    ``arena_bytes`` option to raise).
    """
    import torch

    arena = sender.arena
    if arena is None:
        raise invalid("place_in_arena: the sender has no arena; make the shm or ucx strategy "
                      "with arena_bytes (e.g. wsync.Strategy('shm', arena_bytes=...))")
    if isinstance(source, torch.nn.Module):
        # In the order send_model sends the module (its state dict, ties once), then what the
        # state dict leaves out (non-persistent buffers): each chunk then lies in the arena as
        # it would be packed, which ucx needs to send it in place.
        listed = [t for t in source.state_dict(keep_vars=True).values() if isinstance(t, torch.Tensor)]
        tensors = listed + list(source.parameters()) + [b for b in source.buffers() if b is not None]
    else:
        tensors = list(source)
    lo = ctypes.addressof(arena)
    hi = lo + ctypes.sizeof(arena)
    seen, unique = set(), []
    for t in tensors:
        if not isinstance(t, torch.Tensor):
            raise invalid(f"place_in_arena: {type(t).__name__} is not a torch.Tensor")
        if t.device.type != "cpu" or t.is_sparse:
            raise invalid(f"place_in_arena: a {t.device.type} {'sparse ' if t.is_sparse else ''}"
                          f"tensor of shape {tuple(t.shape)} cannot live in the sender's arena "
                          f"(host memory)")
        if lo <= t.data_ptr() < hi:
            continue  # placed by an earlier call: it stays where it is
        if id(t) not in seen and t.numel() > 0:
            seen.add(id(t))
            unique.append(t)
    offsets, end = [], sender.arena_used
    for t in unique:
        start = -(-end // ARENA_ALIGN) * ARENA_ALIGN
        offsets.append(start)
        end = start + t.numel() * t.element_size()
    size = ctypes.sizeof(arena)
    if end > size:
        raise invalid(f"place_in_arena: {len(unique)} tensors need {end - sender.arena_used} bytes "
                      f"of arena from offset {sender.arena_used}, and the arena has {size} bytes; "
                      f"make the strategy with arena_bytes >= {end}")
    with torch.no_grad():
        for t, off in zip(unique, offsets):
            placed = torch.frombuffer(arena, dtype=t.dtype, count=t.numel(), offset=off)
            placed = placed.view(t.shape)
            placed.copy_(t.data)
            t.data = placed
    used = end - sender.arena_used
    sender.arena_used = end
    return used


def default_chunk_bytes(sender: Sender) -> int:
    """The chunk size to plan with for a sender: its init info's ``bucket_bytes`` when the
    strategy has buckets (``shm``), else :data:`DEFAULT_CHUNK_BYTES`."""
    body = sender.init_description.get("body", {})
    value = body.get("bucket_bytes") if isinstance(body, dict) else None
    return int(value) if isinstance(value, int) and value > 0 else DEFAULT_CHUNK_BYTES


class _QuickCheck:
    """Whether a module still holds the tensors taken from its ``state_dict`` (``names``, in
    its order) by a loader or by :func:`send_model`, read
    from the modules' own parameter and buffer dictionaries instead of building the state dict
    again (3.9 ms a version for an 8B model on the H200 run of 2026-12-04; this is about a
    tenth): the same objects, over the same memory, of the same dtype, shape and strides, and no
    parameter or buffer added or removed anywhere. Made only for modules whose state dict is
    just their parameters and persistent buffers (no state-dict hooks, no module that
    customises ``_save_to_state_dict`` or extra state); else ``of`` gives None and the loader
    compares the state dict."""

    def __init__(self, slots, dicts):
        self._slots = slots  # (dict, key, tensor, data_ptr, dtype, shape, stride)
        self._dicts = dicts  # (dict, len) of every parameter and buffer dict walked

    @staticmethod
    def of(module, names: List[str]) -> Optional["_QuickCheck"]:
        torch = _dtypes.loaded_torch()
        if torch is None or not isinstance(module, torch.nn.Module):
            return None
        base = torch.nn.Module
        slots, dicts, walked = [], [], []

        def walk(m, prefix):
            if (m._state_dict_hooks or getattr(m, "_state_dict_pre_hooks", None)
                    or type(m)._save_to_state_dict is not base._save_to_state_dict
                    or type(m).get_extra_state is not base.get_extra_state):
                return False
            dicts.append((m._parameters, len(m._parameters)))
            dicts.append((m._buffers, len(m._buffers)))
            for key, t in m._parameters.items():
                if t is not None:
                    slots.append((m._parameters, key, t))
                    walked.append(prefix + key)
            for key, t in m._buffers.items():
                if t is not None and key not in m._non_persistent_buffers_set:
                    slots.append((m._buffers, key, t))
                    walked.append(prefix + key)
            return all(walk(child, prefix + name + ".")
                       for name, child in m._modules.items() if child is not None)

        try:
            if not walk(module, "") or walked != names:
                return None  # not what state_dict gave: compare the state dict each version
            return _QuickCheck([(d, k, t, t.data_ptr(), t.dtype, t.shape, t.stride())
                                for d, k, t in slots], dicts)
        except (AttributeError, RuntimeError, TypeError):
            return None

    def unchanged(self, slots: Optional[List[int]] = None, structure: bool = True) -> bool:
        """True if the module still holds what was taken: with ``structure``, no parameter or
        buffer added or removed anywhere; then the tensors of ``slots`` (indices in the taken
        names' order; ``None``: every one)."""
        if structure:
            for d, n in self._dicts:
                if len(d) != n:
                    return False
        chosen = self._slots if slots is None else [self._slots[i] for i in slots]
        for d, key, t, ptr, dtype, shape, stride in chosen:
            now = d.get(key)
            if (now is not t or now.data_ptr() != ptr or now.dtype is not dtype
                    or now.shape != shape or now.stride() != stride):
                return False
        return True


def send_model(sender: Sender, source, *, chunk_bytes: Optional[int] = None, group_depth: int = 2,
               dtype=None, device=None, make_contiguous: bool = False,
               on_request: Optional[Callable[[bytes], Any]] = None,
               flush_timeout_s: Optional[float] = None, aliases: str = "join",
               split: bool = True) -> List[bytes]:
    """Sends every chunk of ``source`` (a module, a state dict or a :class:`LazySource`; see
    :func:`iter_chunks`, which also describes ``aliases``) as one sync version and returns the
    request blobs.

    ``on_request(request)``, when given, is called right after each chunk is sent, so a
    controller can forward it to the engines while the next chunk is packed. Without it the
    requests are only returned at the end; then the strategy must have at least as many
    buckets as there are chunks, or sending blocks until its ``timeout_ms`` waiting for
    receivers that have not been told about earlier chunks yet.

    ``chunk_bytes`` defaults to :func:`default_chunk_bytes`. ``flush_timeout_s``, when given,
    makes the call wait for every receiver's acknowledgement (see :meth:`Sender.flush`). A
    sender with tensors placed in its arena (:func:`place_in_arena`) always flushes before
    returning (``flush_timeout_s`` or, when ``None``, :data:`ARENA_FLUSH_TIMEOUT_S`): engines
    read those tensors in place, so the trainer may write them again only once every receiver
    has acknowledged; a flush that fails raises, and the trainer must not step before the
    engines are dropped or the version resent. Such a sender needs ``on_request`` (refused
    with ``INVALID_ARGUMENT`` before anything is sent without it).

    ``split`` (default ``True``): a tensor larger than ``chunk_bytes`` (a bucket) is sent as
    parts in consecutive chunks (see "Split tensors" in the module documentation). Delta sync
    refuses parts (``UNSUPPORTED``): a sender with ``delta`` on must keep every tensor within
    ``chunk_bytes``, or pass ``split=False`` (the oversized tensor then gets a chunk of its own,
    which ``shm`` refuses naming it: "raise bucket_bytes").

    If anything fails part-way (a send, a cast, ``on_request``) the version is abandoned
    (:meth:`Sender.abandon`; receivers that began it fail it with ``ABANDONED``) and the
    exception propagates; receivers keep the previous version as their completed one. A
    failed send's error carries the receivers' failures (``WsyncError.failures``).
    """
    _check_lazy_allowed(sender, source)
    _check_arena_forwarding(sender, on_request)
    if chunk_bytes is None:
        chunk_bytes = default_chunk_bytes(sender)
    requests: List[bytes] = []
    # A module sent as it is (no cast, move or copy) is planned and described once per sender:
    # while it holds the same tensors over the same memory, each version sends the described
    # chunks again (about 1 us a tensor to check, instead of planning and describing every
    # tensor each version: about 9 ms a version for an 8B model on the H200 run of 2026-12-04).
    options = (chunk_bytes, group_depth, aliases, split)
    cached = _declared_chunks(sender, source, options, dtype, device, make_contiguous)
    record: Optional[list] = [] if cached is None and _declarable(source, dtype, device, make_contiguous) else None
    try:
        if cached is not None:
            chunks, quick, first, rest = cached
            # The first chunk's own tensors are checked before it goes, the rest's right after
            # (while the engines take the first): the first request leaves about 0.3 ms sooner
            # for an 8B model (H200 timeline, docs/data-path.md). A module changed where only
            # the rest shows it abandons that version (engines keep their last complete one)
            # and sends it again, planned anew.
            for k, (descs, last, praw) in enumerate(chunks):
                if k == 1 and not quick.unchanged(rest, structure=False):
                    _abandon_quietly(sender)
                    requests = []
                    _forget_declared(sender, source)
                    cached, record = None, []
                    break
                request = sender._send_described(descs, last, praw)
                requests.append(request)
                if on_request is not None:
                    on_request(request)
        if cached is None:
            for chunk in _iter_chunks(source, chunk_bytes=chunk_bytes, group_depth=group_depth,
                                      dtype=dtype, device=device, make_contiguous=make_contiguous,
                                      aliases=aliases, split=split,
                                      parts_refused=getattr(sender, "delta", False)):
                with _contiguity_hint(make_contiguous):
                    descs, praw = sender._describe_chunk(chunk.tensors, chunk.parts)
                    request = sender._send_described(descs, chunk.last, praw)
                if record is not None:
                    record.append((descs, chunk.last, praw, [n for n, _ in chunk.tensors]))
                del chunk, descs  # drop converted copies before the next chunk is prepared
                requests.append(request)
                if on_request is not None:
                    on_request(request)
            if record is not None:
                _declare_chunks(sender, source, options, record)
    except BaseException:
        # A version left open part-way must not look resumable to receivers: abandon it (a
        # no-op when nothing was published, or when the failed send already abandoned it).
        _abandon_quietly(sender)
        raise
    flush_timeout_s = _flush_timeout(sender, flush_timeout_s)
    if flush_timeout_s is not None:
        sender.flush(flush_timeout_s)
    return requests


# Per sender, per module (by id, with a weak reference to tell a new module at the same
# address): the chunks send_model described for it, and the check that the module still holds
# the tensors they point at.
_DECLARED: "weakref.WeakKeyDictionary" = weakref.WeakKeyDictionary()


def _declarable(source, dtype, device, make_contiguous) -> bool:
    torch = _dtypes.loaded_torch()
    return (torch is not None and isinstance(source, torch.nn.Module) and dtype is None
            and device is None and not make_contiguous)


def _declared_chunks(sender, source, options, dtype, device, make_contiguous):
    """The chunks described for ``source`` by an earlier send_model over ``sender``, if the
    module still holds the same tensors over the same memory and the options are the same."""
    if not _declarable(source, dtype, device, make_contiguous):
        return None
    try:
        entry = _DECLARED.get(sender, {}).get(id(source))
    except TypeError:
        return None
    if entry is None:
        return None
    ref, opts, quick, chunks, first, rest = entry
    if ref() is not source or opts != options or not quick.unchanged(first, structure=True):
        _DECLARED[sender].pop(id(source), None)
        return None
    return chunks, quick, first, rest


def _forget_declared(sender, source) -> None:
    try:
        _DECLARED.get(sender, {}).pop(id(source), None)
    except TypeError:
        pass


def _declare_chunks(sender, source, options, record) -> None:
    """Keeps what send_model described for ``source`` (``record``: per chunk its descriptors,
    last flag, parts and wire names) with the module check, split into the first chunk's
    tensors and the rest's (indices into the check's slots, by state-dict name)."""
    names = list(source.state_dict(keep_vars=True))
    quick = _QuickCheck.of(source, names)
    if quick is None:
        return  # a module with a custom state dict: planned and described every version
    at = {name: i for i, name in enumerate(names)}
    first: List[int] = []
    rest: List[int] = []
    for k, (_, _, _, wire_names) in enumerate(record):
        for wire in wire_names:
            for name in split_alias_name(wire):
                i = at.get(name)
                if i is None:
                    return  # a name the check does not know: planned and described every version
                (first if k == 0 else rest).append(i)
    try:
        per = _DECLARED.setdefault(sender, {})
    except TypeError:
        return
    chunks = [(descs, last, praw) for descs, last, praw, _ in record]
    per[id(source)] = (weakref.ref(source), options, quick, chunks, sorted(set(first)),
                       sorted(set(rest) - set(first)))


#: How long :func:`send_model` waits for the engines' acknowledgements when the sender has
#: tensors in its arena and the caller gave no ``flush_timeout_s`` (seconds; the default of
#: :meth:`Sender.flush`).
ARENA_FLUSH_TIMEOUT_S = 60.0


def _check_arena_forwarding(sender: Sender, on_request) -> None:
    """A sender with placed tensors flushes before send_model returns, so the engines must
    have the requests by then: refuse, before anything is sent, a call without
    ``on_request`` (its requests would only be handed back after a flush no engine can
    answer, and the version would be committed with nobody told)."""
    if on_request is None and getattr(sender, "arena_used", 0):
        raise invalid("send_model: the sender has tensors placed in its arena, which engines "
                      "read in place, so send_model flushes before it returns; pass on_request "
                      "to forward each request to the engines as its chunk is sent")


def _flush_timeout(sender: Sender, flush_timeout_s: Optional[float]) -> Optional[float]:
    """The flush :func:`send_model` owes before it returns: the caller's, or for a sender
    whose arena holds placed tensors (engines read the trainer's own memory) a flush even
    when none was asked for, since returning earlier invites the next optimizer step to
    write bytes the engines are still copying (wrong weights, silent with checksums off)."""
    if flush_timeout_s is None and getattr(sender, "arena_used", 0):
        return ARENA_FLUSH_TIMEOUT_S
    return flush_timeout_s


async def send_model_async(sender: Sender, source, *, chunk_bytes: Optional[int] = None,
                           group_depth: int = 2, dtype=None, device=None,
                           make_contiguous: bool = False,
                           on_request: Optional[Callable[[bytes], Any]] = None,
                           flush_timeout_s: Optional[float] = None,
                           aliases: str = "join", split: bool = True) -> List[bytes]:
    """:func:`send_model` for asyncio trainers. Preparing each chunk (casts, moves), sending
    it and flushing run on worker threads, so the event loop keeps serving while weights go
    out; ``on_request`` may be a plain function or a coroutine function (awaited on the loop,
    e.g. an HTTP call to the inference engines). Failures abandon the version, and a sender
    with placed tensors flushes before returning, as in :func:`send_model`. A :class:`LazySource`'s ``gather`` runs on those worker threads too,
    one call at a time."""
    _check_lazy_allowed(sender, source)
    _check_arena_forwarding(sender, on_request)
    if chunk_bytes is None:
        chunk_bytes = default_chunk_bytes(sender)
    chunks = _iter_chunks(source, chunk_bytes=chunk_bytes, group_depth=group_depth,
                          dtype=dtype, device=device, make_contiguous=make_contiguous,
                          aliases=aliases, split=split,
                          parts_refused=getattr(sender, "delta", False))
    requests: List[bytes] = []
    try:
        while True:
            # Through a box the worker empties: a worker thread's finished work item (and its
            # future's result) can outlive the call for a moment, and must not keep a chunk's
            # gathered tensors alive while the next chunk is gathered.
            box = await asyncio.to_thread(_next_boxed, chunks)
            if not box:
                break
            chunk = box.pop()
            with _contiguity_hint(make_contiguous):
                request = await asyncio.to_thread(
                    _send_boxed, sender, [chunk.tensors, chunk.last, chunk.parts])
            del chunk
            requests.append(request)
            if on_request is not None:
                result = on_request(request)
                if inspect.isawaitable(result):
                    await result
    except BaseException:
        await asyncio.to_thread(_abandon_quietly, sender)
        raise
    flush_timeout_s = _flush_timeout(sender, flush_timeout_s)
    if flush_timeout_s is not None:
        await sender.flush_async(flush_timeout_s)
    return requests


def _next_boxed(chunks) -> list:
    """The next chunk in a one-element list ([] at the end), for :func:`send_model_async`."""
    chunk = next(chunks, None)
    return [] if chunk is None else [chunk]


def _send_boxed(sender: Sender, box: list) -> bytes:
    """Sends ``box`` = [tensors, last, parts] and empties it first, for
    :func:`send_model_async`: the worker's work item then refers to no tensor once the send
    returns."""
    tensors, last, parts = box
    box.clear()
    return sender.send_chunk(tensors, last=last, parts=parts)


@contextlib.contextmanager
def _contiguity_hint(make_contiguous: bool):
    """Adds to the library's refusal of a non-contiguous tensor how send_model sends one."""
    try:
        yield
    except WsyncError as exc:
        if (make_contiguous or exc.status != Status.INVALID_ARGUMENT
                or "not contiguous" not in exc.message):
            raise
        raise error(exc.status, exc.message + " (make_contiguous=True sends a contiguous copy)",
                    exc.failures) from None


def _check_lazy_allowed(sender: Sender, source) -> None:
    """A lazy source's tensors are dropped once their chunk is sent: refuse a strategy that
    shares the trainer's memory instead of copying it (``cuda_ipc`` with ``packed: false``)."""
    if not isinstance(source, LazySource):
        return
    body = sender.init_description.get("body", {})
    if isinstance(body, dict) and body.get("packed") is False:
        raise invalid("a LazySource cannot be sent with a strategy that shares the trainer's "
                      "memory (packed: false): its gathered tensors are freed after each chunk; "
                      "use packed: true")


def _abandon_quietly(sender: Sender) -> None:
    try:
        sender.abandon()
    except Exception:  # the sender is closed or broken: the original error matters more
        pass
