"""Engine-side helpers: load received chunks into an ``nn.Module`` in place.

For every request, :class:`ModuleLoader` first checks the chunk's names, dtypes and shapes
against the module's parameters and buffers (a dry run through ``wsync_recv_peek``: no tensor
byte is read). On any difference it raises :class:`wsync.WsyncError` (``MISMATCH``) naming each
tensor and what differs, and the iteration is failed with that status and message
(``Iteration.fail``), so the sender's ``flush`` reports them as a :class:`wsync.Failure` and the
version never completes on this engine. Only then are the bytes copied into the module's
tensors, under ``torch.no_grad()``; a copy that fails, even after the last view, fails the
chunk the same way (with the status :func:`wsync.status_for_exception` gives).
"""

from __future__ import annotations

from typing import Dict, Iterable, List, Mapping

from . import _dtypes
from ._core import Receiver, RecvInfo, TensorMeta
from ._dtypes import DType
from ._errors import Status, WsyncError, invalid

#: How many differences a mismatch error lists before summarising the rest.
MAX_LISTED_PROBLEMS = 10


def _shape_text(shape) -> str:
    return "(" + ", ".join(str(s) for s in shape) + ("," if len(shape) == 1 else "") + ")"


class ModuleLoader:
    """Loads chunks into a module's parameters and buffers (by ``state_dict`` name) in place.

    Contiguous CPU targets of the chunk's own dtype receive the bytes straight into their
    storage through :meth:`wsync.Iteration.copy_into` (the library's copy loop, checksum
    verified in the same pass); other targets (CUDA, casts) copy from the views.

    - ``allow_cast``: accept a dtype different from the module's (the copy converts); by
      default a dtype difference is a mismatch.
    - ``ignore_unknown``: skip tensors the module does not have instead of failing.
    """

    def __init__(self, module, *, allow_cast: bool = False, ignore_unknown: bool = False):
        torch = _dtypes.require_torch()
        if isinstance(module, torch.nn.Module):
            self.targets: Dict[str, object] = dict(module.state_dict(keep_vars=True))
        elif isinstance(module, Mapping):
            self.targets = dict(module)
        else:
            raise invalid(f"module must be an nn.Module or a mapping of tensors, not "
                          f"{type(module).__name__}")
        self.allow_cast = allow_cast
        self.ignore_unknown = ignore_unknown
        self._dtypes = {name: DType.from_torch(t.dtype) for name, t in self.targets.items()}

    def check(self, metas: Iterable[TensorMeta]) -> List[str]:
        """The differences between a chunk's tensors and the module, one line each (empty when
        the chunk fits)."""
        problems = []
        for m in metas:
            target = self.targets.get(m.name)
            if target is None:
                if not self.ignore_unknown:
                    problems.append(f"tensor '{m.name}' is not a parameter or buffer of the model")
                continue
            want_dtype = self._dtypes[m.name]
            if m.dtype != want_dtype and not self.allow_cast:
                problems.append(f"tensor '{m.name}': dtype differs: request has {m.dtype.name}, "
                                f"model has {want_dtype.name}")
            want_shape = tuple(target.shape)
            if tuple(m.shape) != want_shape:
                problems.append(f"tensor '{m.name}': shape differs: request has "
                                f"{_shape_text(m.shape)}, model has {_shape_text(want_shape)}")
        return problems

    def load(self, receiver: Receiver, request: bytes) -> RecvInfo:
        """Receives one request into the module; returns the chunk's :class:`wsync.RecvInfo`.

        Raises ``MISMATCH`` before any byte is copied when the chunk does not fit the model,
        or the error of a copy that failed; either way the chunk is failed with that status and
        message, which the trainer's flush reports. Raises the library's error when receiving
        or verifying fails.
        """
        torch = _dtypes.require_torch()
        with receiver.receive(request, framework="torch") as it:
            info = it.info
            metas = it.metas()
            problems = self.check(metas)
            if problems:
                listed = problems[:MAX_LISTED_PROBLEMS]
                more = len(problems) - len(listed)
                raise WsyncError(
                    Status.MISMATCH,
                    f"chunk {info.chunk_index} of version {info.version} does not match the model: "
                    + "; ".join(listed) + (f"; and {more} more" if more > 0 else ""))
            cuda_devices = set()
            with torch.no_grad():
                # Host targets of the chunk's own dtype get the bytes straight into their
                # storage (the library's copy, checksum verified in the same pass); the rest
                # (GPU targets, casts, unknown tensors) come as views, which skip those copied.
                for i, m in enumerate(metas):
                    target = self.targets.get(m.name)
                    if (isinstance(target, torch.Tensor) and target.device.type == "cpu"
                            and target.is_contiguous() and m.dtype == self._dtypes[m.name]):
                        it.copy_into(i, target.detach())
                for name, view in it:
                    target = self.targets.get(name)
                    if target is None:
                        continue
                    target.copy_(view)
                    if target.is_cuda:
                        cuda_devices.add(target.device)
            # The views die when the iteration ends: make sure no copy still reads them.
            for device in cuda_devices:
                torch.cuda.current_stream(device).synchronize()
        return info

    def load_all(self, receiver: Receiver, requests: Iterable[bytes]) -> int:
        """Loads every request in order; returns the receiver's completed version after."""
        for request in requests:
            self.load(receiver, request)
        return receiver.completed_version


def load_into_module(receiver: Receiver, request: bytes, module, *, allow_cast: bool = False,
                     ignore_unknown: bool = False) -> RecvInfo:
    """One-call form of :meth:`ModuleLoader.load` (builds the name table each call; keep a
    :class:`ModuleLoader` when loading many chunks)."""
    return ModuleLoader(module, allow_cast=allow_cast, ignore_unknown=ignore_unknown).load(
        receiver, request)
