"""Legacy: a vLLM ``WeightTransferEngine`` for vLLM's earlier weight-transfer interface.

For vLLM 0.33 use :mod:`wsync.vllm_backend` (the ``wsync`` backend, registered through the
``vllm.general_plugins`` entry point). This module targets the older interface (engine built
as ``(config, parallel_config, model)``, ``receive_weights(update_info, load_weights)``, a
static ``trainer_send_weights``) that vLLM 0.33 no longer has; it is kept for code written
against it and may be removed.

vLLM's weight-transfer interface (``vllm.distributed.weight_transfer.base``) has an engine
object per inference worker with ``parse_init_info`` / ``init_transfer_engine`` (once),
``parse_update_info`` / ``receive_weights(update_info, load_weights)`` (every sync),
``shutdown``, and a static ``trainer_send_weights(iterator, trainer_args)`` for the trainer.
:class:`WsyncWeightTransferEngine` implements it over any libwsync strategy:

- init info: the strategy's init-info blob (bytes, or base64 text for JSON transports), the
  receiver options, and ``receiver_offset``; a worker's receiver index is
  ``receiver_offset + parallel_config.rank``;
- update info: the request blobs of one sync (or of part of it), in order;
- ``receive_weights`` receives each request and calls ``load_weights`` once per chunk with that
  chunk's ``(name, tensor)`` list. The tensors are zero-copy views valid only during that call
  (``copy=True`` in the init info passes owned copies instead).

This module never imports vLLM. When vLLM is already imported (as it is inside a vLLM worker)
the classes derive from vLLM's own base classes; otherwise from local ones with the same
methods, so trainers, controllers and tests can use the adapter without vLLM installed.
Register it in vLLM with::

    from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory
    WeightTransferEngineFactory.register_engine("wsync", "wsync.vllm_adapter",
                                                "WsyncWeightTransferEngine")
"""

from __future__ import annotations

import base64
import binascii
import sys
from abc import ABC, abstractmethod
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Callable, Dict, Generic, Iterator, List, Optional, Tuple, TypeVar, Union

from . import _dtypes
from ._core import Receiver, Sender, Strategy, describe
from ._errors import Status, WrongStateError, WsyncError
from .trainer import send_model


def _vllm_bases():
    """vLLM's base classes when vLLM is already imported in this process, else None."""
    if "vllm" not in sys.modules:
        return None
    try:
        from vllm.distributed.weight_transfer import base
    except ImportError:
        return None
    return base.WeightTransferEngine, base.WeightTransferInitInfo, base.WeightTransferUpdateInfo


_bases = _vllm_bases()
#: True when the classes below derive from vLLM's own base classes.
USING_VLLM_BASES = _bases is not None

if _bases is not None:
    WeightTransferEngine, WeightTransferInitInfo, WeightTransferUpdateInfo = _bases
else:
    TInitInfo = TypeVar("TInitInfo")
    TUpdateInfo = TypeVar("TUpdateInfo")

    @dataclass
    class WeightTransferInitInfo(ABC):  # noqa: B024 - a marker base, as in vLLM
        """Base of a backend's typed init info (local stand-in for vLLM's)."""

    @dataclass
    class WeightTransferUpdateInfo(ABC):  # noqa: B024
        """Base of a backend's typed update info (local stand-in for vLLM's): the update kind
        (``"dense"`` or ``"sparse_flat"``) and, for sparse updates, the entry counts."""

        _: KW_ONLY
        update_kind: str = "dense"
        num_updates_list: Optional[List[int]] = None

        def __post_init__(self) -> None:
            if self.update_kind not in ("dense", "sparse_flat"):
                raise ValueError(f"unsupported update_kind {self.update_kind!r}")
            if self.update_kind == "dense":
                if self.num_updates_list is not None:
                    raise ValueError("num_updates_list is only for update_kind='sparse_flat'")
                return
            if not self.num_updates_list:
                raise ValueError("sparse updates need a non-empty num_updates_list")
            if any(n < 0 for n in self.num_updates_list):
                raise ValueError("num_updates_list entries must be non-negative")

    class WeightTransferEngine(ABC, Generic[TInitInfo, TUpdateInfo]):
        """Local stand-in for vLLM's ``WeightTransferEngine`` with the same methods."""

        init_info_cls: type
        update_info_cls: type

        def __init__(self, config, parallel_config, model) -> None:
            self.config = config
            self.parallel_config = parallel_config
            self.model = model

        def parse_init_info(self, init_dict: Dict[str, Any]):
            """Typed init info from a dict; ValueError when the dict does not fit."""
            try:
                return self.init_info_cls(**init_dict)
            except TypeError as exc:
                raise ValueError(f"Invalid init_info for {type(self).__name__}: {exc}") from exc

        def parse_update_info(self, update_dict: Dict[str, Any]):
            """Typed update info from a dict; ValueError when the dict does not fit."""
            try:
                return self.update_info_cls(**update_dict)
            except TypeError as exc:
                raise ValueError(f"Invalid update_info for {type(self).__name__}: {exc}") from exc

        @abstractmethod
        def init_transfer_engine(self, init_info) -> None:
            """Sets up the transfer, once per worker."""

        @abstractmethod
        def receive_weights(self, update_info, load_weights) -> None:
            """Receives one update and hands the weights to ``load_weights`` incrementally."""

        def receive_sparse_weights(self, update_info, apply_patches) -> None:
            """Sparse patches; not supported unless a backend overrides it."""
            raise NotImplementedError(f"{type(self).__name__} does not support sparse weight updates")

        @abstractmethod
        def shutdown(self) -> None:
            """Releases the transfer's resources."""

        @staticmethod
        @abstractmethod
        def trainer_send_weights(iterator, trainer_args) -> None:
            """Trainer side: sends (name, tensor) pairs to the inference workers."""

        @staticmethod
        def trainer_send_sparse_weights(_iterator, _trainer_args) -> None:
            """Sparse patches from the trainer; not supported unless overridden."""
            raise NotImplementedError("Sparse weight updates are not supported")


def encode_blob(blob: bytes) -> str:
    """A blob as base64 text, for init/update dicts that travel as JSON (vLLM's HTTP API)."""
    return base64.b64encode(blob).decode("ascii")


def _decode_blob(value, what: str, expect_type: str) -> bytes:
    """bytes (as they are) or base64 text -> bytes of a wsync blob of ``expect_type``."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        blob = bytes(value)
    elif isinstance(value, str):
        try:
            blob = base64.b64decode(value.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError) as exc:
            raise ValueError(f"{what} is text but not base64: {exc}") from None
    else:
        raise ValueError(f"{what} must be bytes or base64 text, not {type(value).__name__}")
    if not blob:
        raise ValueError(f"{what} is empty")
    try:
        parsed = describe(blob)
    except WsyncError as exc:
        raise ValueError(f"{what} is not a wsync blob: {exc}") from None
    if parsed.get("type") != expect_type:
        raise ValueError(f"{what} is a wsync {parsed.get('type')} blob, expected {expect_type}")
    return blob


@dataclass
class WsyncInitInfo(WeightTransferInitInfo):
    """Typed init info: the init-info blob and how this worker's receiver is made.

    ``init_info``: the blob from ``Strategy.create_init_info()`` (bytes or base64 text);
    ``options``: receiver-side strategy options (e.g. ``{"verify": True}``);
    ``receiver_offset``: added to the worker's rank to give its receiver index;
    ``copy``: pass owned copies to ``load_weights`` instead of views.
    """

    init_info: Union[bytes, str]
    options: Dict[str, Any] = field(default_factory=dict)
    receiver_offset: int = 0
    copy: bool = False

    def __post_init__(self) -> None:
        self.init_info = _decode_blob(self.init_info, "init_info", "init")
        if not isinstance(self.options, dict):
            raise ValueError(f"options must be a dict, not {type(self.options).__name__}")
        if (not isinstance(self.receiver_offset, int) or isinstance(self.receiver_offset, bool)
                or self.receiver_offset < 0):
            raise ValueError(f"receiver_offset must be a non-negative int, got {self.receiver_offset!r}")
        if not isinstance(self.copy, bool):
            raise ValueError(f"copy must be a bool, got {self.copy!r}")

    @property
    def kind(self) -> str:
        """The strategy kind the init info is for."""
        return describe(self.init_info)["kind"]


@dataclass
class WsyncUpdateInfo(WeightTransferUpdateInfo):
    """Typed update info: the request blobs to receive, in the order they were sent.

    ``names``, ``dtype_names`` and ``shapes`` (optional, as in vLLM's NCCL update info) list
    the tensors the requests must carry, in order; when given, every request is checked
    against them before any byte is loaded.
    """

    requests: List[Union[bytes, str]]
    names: Optional[List[str]] = None
    dtype_names: Optional[List[str]] = None
    shapes: Optional[List[List[int]]] = None

    def __post_init__(self) -> None:
        super().__post_init__()
        if self.update_kind != "dense":
            raise ValueError("the wsync engine moves dense weights only (update_kind='dense')")
        if not isinstance(self.requests, (list, tuple)) or not self.requests:
            raise ValueError("requests must be a non-empty list of request blobs")
        self.requests = [_decode_blob(r, f"requests[{i}]", "request")
                         for i, r in enumerate(self.requests)]
        given = [x for x in (self.names, self.dtype_names, self.shapes) if x is not None]
        if given and len({len(x) for x in given}) != 1:
            raise ValueError("names, dtype_names and shapes must have one entry per tensor")


@dataclass
class WsyncTrainerSendArgs:
    """``trainer_args`` of :meth:`WsyncWeightTransferEngine.trainer_send_weights`.

    ``sender``: the trainer's :class:`wsync.Sender`; ``on_request``: called with each request
    blob as soon as its chunk is sent (forward it to the workers); ``requests``: every request
    sent is appended here too; ``chunk_bytes``, ``group_depth``, ``dtype``, ``device``: as in
    :func:`wsync.trainer.send_model`; ``flush_timeout_s``: wait this long for every worker's
    acknowledgement before returning (None: do not wait).
    """

    sender: Sender
    on_request: Optional[Callable[[bytes], Any]] = None
    requests: List[bytes] = field(default_factory=list)
    chunk_bytes: Optional[int] = None
    group_depth: int = 2
    dtype: Any = None
    device: Any = None
    flush_timeout_s: Optional[float] = None


class WsyncWeightTransferEngine(WeightTransferEngine):
    """vLLM weight-transfer engine over libwsync (see the module documentation)."""

    init_info_cls = WsyncInitInfo
    update_info_cls = WsyncUpdateInfo

    def __init__(self, config, parallel_config, model=None) -> None:
        super().__init__(config, parallel_config, model)
        self._strategy: Optional[Strategy] = None
        self._receiver: Optional[Receiver] = None
        self._copy = False

    # -- helpers for controllers -------------------------------------------------------------
    @staticmethod
    def init_dict(init_info: bytes, *, receiver_offset: int = 0, options=None, copy=False,
                  as_text: bool = True) -> Dict[str, Any]:
        """The init dict for ``WeightTransferInitRequest(init_info=...)``; base64 text by
        default so it can travel as JSON."""
        return {"init_info": encode_blob(init_info) if as_text else bytes(init_info),
                "options": dict(options or {}), "receiver_offset": receiver_offset, "copy": copy}

    @staticmethod
    def update_dict(requests, *, as_text: bool = True) -> Dict[str, Any]:
        """The update dict for ``WeightTransferUpdateRequest(update_info=...)``."""
        return {"requests": [encode_blob(r) if as_text else bytes(r) for r in requests]}

    # -- inference side ----------------------------------------------------------------------
    @property
    def receiver(self) -> Receiver:
        """This worker's receiver; :class:`wsync.WrongStateError` (a ``RuntimeError``) before
        :meth:`init_transfer_engine`."""
        if self._receiver is None:
            raise WrongStateError(Status.WRONG_STATE,
                                  "the wsync transfer engine is not initialised "
                                  "(init_transfer_engine was not called, or shutdown was)")
        return self._receiver

    @property
    def receiver_index(self) -> int:
        """The receiver index this worker uses."""
        return self.receiver.index

    def init_transfer_engine(self, init_info: WsyncInitInfo) -> None:
        """Creates this worker's receiver (index ``receiver_offset + parallel_config.rank``)."""
        if self._receiver is not None:
            raise WrongStateError(Status.WRONG_STATE,
                                  "the wsync transfer engine is already initialised")
        rank = int(getattr(self.parallel_config, "rank", 0) or 0)
        strategy = Strategy.for_init_info(init_info.init_info, **init_info.options)
        try:
            self._receiver = strategy.receiver(init_info.init_info, init_info.receiver_offset + rank)
        except BaseException:
            strategy.close()
            raise
        self._strategy = strategy
        self._copy = init_info.copy

    def _expected(self, info: WsyncUpdateInfo) -> Optional[List[Tuple[str, Optional[str], Optional[tuple]]]]:
        if info.names is None and info.dtype_names is None and info.shapes is None:
            return None
        n = len(next(x for x in (info.names, info.dtype_names, info.shapes) if x is not None))
        return [(info.names[i] if info.names is not None else None,
                 info.dtype_names[i] if info.dtype_names is not None else None,
                 tuple(info.shapes[i]) if info.shapes is not None else None) for i in range(n)]

    def _dry_run(self, info: WsyncUpdateInfo) -> List[str]:
        """Differences between the requests' tensor tables and the expected tensors."""
        expected = self._expected(info)
        if expected is None:
            return []
        got = []
        for request in info.requests:
            body = describe(request)["body"]
            table = body["tensors"]
            dims = iter(table["shapes"])
            for k, name in enumerate(table["names"]):
                code, bits, lanes = table["dtypes"][3 * k: 3 * k + 3]
                shape = tuple(next(dims) for _ in range(table["ndims"][k]))
                got.append((name, _dtypes.DType(code, bits, lanes).name, shape))
        problems = []
        if len(got) != len(expected):
            problems.append(f"the requests carry {len(got)} tensors, the update info lists {len(expected)}")
        for k, ((name, dtype, shape), (want_name, want_dtype, want_shape)) in enumerate(zip(got, expected)):
            if want_name is not None and name != want_name:
                problems.append(f"tensor {k} is '{name}', expected '{want_name}'")
            if want_dtype is not None and dtype != str(want_dtype).replace("torch.", ""):
                problems.append(f"tensor '{name}': dtype {dtype}, expected {want_dtype}")
            if want_shape is not None and shape != want_shape:
                problems.append(f"tensor '{name}': shape {shape}, expected {want_shape}")
        return problems

    def receive_weights(self, update_info: WsyncUpdateInfo,
                        load_weights: Callable[[List[Tuple[str, Any]]], None]) -> None:
        """Receives every request of ``update_info`` in order, calling ``load_weights`` once
        per chunk with its ``(name, tensor)`` list (views valid during that call only, unless
        the init info asked for copies).

        If ``update_info`` lists expected names, dtypes or shapes and the requests differ, no
        weight is loaded: each request is received and failed with ``MISMATCH`` and the
        differences (so the trainer's flush reports them as a :class:`wsync.Failure`) and
        :class:`wsync.WsyncError` (``MISMATCH``) is raised.

        Every view of a chunk is taken before ``load_weights`` is called, so the iteration
        stays open until ``load_weights`` has returned: then it is ended (acknowledged), or,
        if ``load_weights`` raised, failed through ``Iteration.fail`` with the status
        :func:`wsync.status_for_exception` gives and the exception's text, and the exception
        propagates. The trainer's flush then fails with ``PEER`` carrying this worker's status
        and message in ``failures``, and the version does not complete on this worker (see
        :meth:`poll` to decide whether to roll back).
        """
        receiver = self.receiver
        problems = self._dry_run(update_info)
        if problems:
            message = "the update does not match its update info: " + "; ".join(problems[:10])
            for request in update_info.requests:
                try:
                    receiver.receive(request).fail(Status.MISMATCH, message)
                except WsyncError:
                    break
            raise WsyncError(Status.MISMATCH, message)
        torch = _dtypes.torch_module()
        for request in update_info.requests:
            # The with block keeps the iteration open until load_weights has returned (the
            # views live that long); an exception fails the chunk with its text (see above).
            with receiver.receive(request, framework="torch", copy=self._copy) as it:
                batch = list(it)
                load_weights(batch)
                del batch
                if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
                    torch.cuda.synchronize()  # copies out of the views are done before they go

    @property
    def completed_version(self) -> int:
        """The newest sync version fully received by this worker (0 if none)."""
        return self.receiver.completed_version

    def poll(self):
        """This worker's :class:`wsync.ReceiverState` (``Receiver.poll``): whether the version
        it began failed or was abandoned, to decide whether to roll back."""
        return self.receiver.poll()

    def shutdown(self) -> None:
        """Closes the receiver (the trainer learns that this worker detached); idempotent."""
        receiver, self._receiver = self._receiver, None
        strategy, self._strategy = self._strategy, None
        if receiver is not None:
            receiver.close()
        if strategy is not None:
            strategy.close()

    # -- trainer side ------------------------------------------------------------------------
    @staticmethod
    def trainer_send_weights(iterator: Iterator[Tuple[str, Any]],
                             trainer_args: Union[Dict[str, Any], WsyncTrainerSendArgs]) -> None:
        """Sends ``(name, tensor)`` pairs as one sync version through ``trainer_args.sender``.

        ``trainer_args`` is a :class:`WsyncTrainerSendArgs` or a dict of its fields. Each
        request goes to ``on_request`` as soon as its chunk is sent and is appended to
        ``trainer_args.requests``.
        """
        if isinstance(trainer_args, dict):
            try:
                args = WsyncTrainerSendArgs(**trainer_args)
            except TypeError as exc:
                raise ValueError(f"invalid trainer_args for the wsync engine: {exc}") from exc
        elif isinstance(trainer_args, WsyncTrainerSendArgs):
            args = trainer_args
        else:
            raise ValueError("trainer_args must be a dict or WsyncTrainerSendArgs, not "
                             f"{type(trainer_args).__name__}")
        if not isinstance(args.sender, Sender):
            raise ValueError(f"trainer_args.sender must be a wsync.Sender, not {type(args.sender).__name__}")

        def forward(request: bytes) -> None:
            args.requests.append(request)
            if args.on_request is not None:
                args.on_request(request)

        send_model(args.sender, list(iterator), chunk_bytes=args.chunk_bytes,
                   group_depth=args.group_depth, dtype=args.dtype, device=args.device,
                   on_request=forward, flush_timeout_s=args.flush_timeout_s)
