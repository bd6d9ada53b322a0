"""Bit-exact sparse patches through a model's checkpoint loader (``load_weights``).

An engine whose parameters are not the checkpoint tensors (vLLM: tensor-parallel shards, fused
q/k/v or gate/up parameters, tied embeddings) cannot apply a wsync delta patch
(:meth:`wsync.Iteration.patch`: flat indices + values in *checkpoint* coordinates) itself: only
the model's ``load_weights`` knows where each checkpoint element lands. vLLM's own sparse
engine (``vllm/model_executor/model_loader/checkpoint_weight_patch.py``, vLLM 0.33) stages a
checkpoint-shaped tensor with NaN at every unchanged element, runs ``load_weights`` on it, and
replaces ``Tensor.copy_`` by ``where(isnan(src), dst, src)``. That cannot carry a changed value
that is itself a NaN (it refuses patches holding NaN values), so a NaN payload the trainer
wrote never arrives.

:func:`apply_checkpoint_patch` keeps the staging but marks the changed elements with a separate
boolean *mask* of the same shape instead of a sentinel value, so every bit pattern (NaN
payloads, -0.0) is a value. While ``load_weights`` runs, a ``TorchDispatchMode`` watches every
ATen operation that touches the staging tensor's storage:

* view operations (``slice``/``narrow``, ``view``, ``t``, ``select``, ...) are allowed: they
  are how the loaders pick a shard or a fused part;
* ``copy_(dst, src)`` with ``src`` a view of the staging tensor becomes a masked write: the
  mask viewed with ``src``'s own sizes, strides and offset says which elements of ``dst`` take
  ``src``'s (changed) element; the others are left as they are. When ``dst`` and ``src`` have
  one dtype the write is done on same-size integer views, so bits are copied, never converted;
  otherwise ``src`` is cast to ``dst``'s dtype first, as the dense ``copy_`` would;
* anything else that reads or writes the staging tensor (a ``clone``/``contiguous``, a dtype
  conversion, arithmetic, a copy *into* it) raises :class:`PatchRefused` naming the checkpoint
  tensor and the operation, before it runs: such a loader would move unchanged (meaningless)
  staging elements into the model, so the patch cannot be applied exactly there.

So the staging's unchanged elements never reach the model, and the changed ones arrive bit for
bit wherever the dense load would have put them. The caller must still hold the patch's base
version in the parameters (the receiver checks the version; the result is not checkable by the
library on a sharded model) and must not run a post-load transformation (quantization,
repacking) over the parameters, which would leave them in another coordinate system.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, List, Optional, Tuple

import torch
from torch.utils._python_dispatch import TorchDispatchMode

__all__ = ["PatchRefused", "apply_checkpoint_patch"]

_INT_OF_SIZE = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


class PatchRefused(RuntimeError):
    """A checkpoint patch cannot be applied exactly through this model's loader (the message
    names the tensor and why)."""


def _storage_key(t: torch.Tensor) -> Optional[int]:
    """The address of the tensor's storage (shared by all its views), or None."""
    try:
        if hasattr(t, "untyped_storage"):  # torch >= 2.0
            ptr = t.untyped_storage().data_ptr()
        else:  # torch 1.x: the typed storage of a view shares its base's address
            ptr = t.storage().data_ptr()
    # Sparse layouts raise NotImplementedError ("Cannot access storage"); a wrapper subclass
    # without storage raises RuntimeError on torch 2.x (both tested).
    except (NotImplementedError, RuntimeError):
        return None
    return ptr or None


def _is_view(func) -> bool:
    """An ATen op whose result aliases its input without writing it (a view)."""
    returns = func._schema.returns
    if len(returns) != 1 or returns[0].alias_info is None:
        return False
    return not returns[0].alias_info.is_write


def _tensors(x) -> Iterable[torch.Tensor]:
    if isinstance(x, torch.Tensor):
        yield x
    elif isinstance(x, (list, tuple)):
        for y in x:
            yield from _tensors(y)
    elif isinstance(x, dict):
        for y in x.values():
            yield from _tensors(y)


class _MaskedCopies(TorchDispatchMode):
    def __init__(self, name: str, stage: torch.Tensor, mask: torch.Tensor):
        super().__init__()
        self.name = name
        self.stage = stage
        self.mask = mask
        self.key = _storage_key(stage)
        if self.key is None:  # without it no use of the staging could be seen: refuse
            raise PatchRefused(f"checkpoint tensor '{name}': its staging tensor's storage "
                               "cannot be identified on this torch")
        self.copies = 0
        self.written = 0

    def _touches(self, t: torch.Tensor) -> bool:
        return self.key is not None and _storage_key(t) == self.key

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        involved = [t for t in _tensors((args, kwargs)) if self._touches(t)]
        if not involved:
            return func(*args, **kwargs)
        if _is_view(func):
            return func(*args, **kwargs)
        if func is torch.ops.aten.copy_.default and len(args) >= 2:
            dst, src = args[0], args[1]
            if not self._touches(dst) and self._touches(src):
                return self._masked_copy(dst, src)
        raise PatchRefused(
            f"checkpoint tensor '{self.name}': its loader applies {func} to it (a sparse patch "
            "is exact only through views and a final copy_); use delta 'off' for this model")

    def _masked_copy(self, dst: torch.Tensor, src: torch.Tensor) -> torch.Tensor:
        if src.dtype != self.stage.dtype:
            raise PatchRefused(f"checkpoint tensor '{self.name}': the loader reinterprets it as "
                               f"{src.dtype} before copying it")
        if tuple(dst.shape) != tuple(src.shape):
            raise PatchRefused(f"checkpoint tensor '{self.name}': the loader's copy_ broadcasts "
                               f"{tuple(src.shape)} into {tuple(dst.shape)}")
        # The same sizes, strides and offset select the same elements of the mask (stage and
        # mask are fresh, contiguous and of one shape, so element offsets correspond).
        m = self.mask.as_strided(src.size(), src.stride(), src.storage_offset())
        if m.device != dst.device:
            m = m.to(dst.device)
        if dst.dtype == src.dtype and dst.element_size() in _INT_OF_SIZE:
            as_int = _INT_OF_SIZE[dst.element_size()]
            d, s = dst.view(as_int), src.to(dst.device).view(as_int)
            d.copy_(torch.where(m, s, d))  # integers: bits, never a float conversion
        else:
            s = src.to(device=dst.device, dtype=dst.dtype)
            dst.copy_(torch.where(m, s, dst))
        self.copies += 1
        self.written += int(m.sum())
        return dst


def apply_checkpoint_patch(load_weights: Callable[[List[Tuple[str, torch.Tensor]]], Any],
                           name: str, shape: Tuple[int, ...], indices: torch.Tensor,
                           values: torch.Tensor, device: Optional[torch.device] = None) -> int:
    """Applies one sparse patch of checkpoint tensor ``name`` (``shape``, flat ``indices``,
    ``values`` in the tensor's dtype, bit for bit) through ``load_weights`` (called once with
    ``[(name, staging)]``), exactly, as the module documentation describes. The staging lives
    on ``device`` (default: the values' device), which should be the parameters' device so
    that the loaders' own ``.to(device)`` is a no-op.

    Returns how many destination elements took a changed value (0 on a rank that holds none of
    the changed elements). An empty patch loads nothing; a patch of every element is a plain
    dense load (no staging element is unchanged, so any loader is exact). Raises :class:`PatchRefused` naming the tensor when the loader does
    anything with the staging tensor but view it and copy out of it (before that operation
    runs; earlier masked writes of this call stay written), or for a dtype whose elements are
    not 1, 2, 4 or 8 bytes."""
    device = values.device if device is None else torch.device(device)
    dtype = values.dtype
    esize = torch.empty((), dtype=dtype).element_size()
    if esize not in _INT_OF_SIZE:
        raise PatchRefused(f"checkpoint tensor '{name}': {dtype} elements of {esize} bytes")
    if indices.dim() != 1 or values.dim() != 1 or indices.numel() != values.numel():
        raise PatchRefused(f"checkpoint tensor '{name}': indices and values must be 1-D and "
                           "of one length")
    numel = 1
    for extent in shape:
        numel *= int(extent)
    if indices.numel() == 0:
        return 0  # nothing changed: the parameters already hold this version
    stage = torch.empty(tuple(shape), dtype=dtype, device=device)
    if indices.numel() == numel:  # every element changed: the staging is the whole tensor
        stage.view(-1).view(_INT_OF_SIZE[esize]).index_copy_(
            0, indices.to(device=device, dtype=torch.long), values.to(device).view(_INT_OF_SIZE[esize]))
        with torch.no_grad():
            load_weights([(name, stage)])
        return numel
    mask = torch.zeros(tuple(shape), dtype=torch.bool, device=device)
    if indices.numel():
        idx = indices.to(device=device, dtype=torch.long)
        as_int = _INT_OF_SIZE[esize]
        stage.view(-1).view(as_int).index_copy_(0, idx, values.to(device).view(as_int))
        mask.view(-1).index_fill_(0, idx, True)
    mode = _MaskedCopies(name, stage, mask)
    with torch.no_grad(), mode:
        load_weights([(name, stage)])
    return mode.written
