"""The ``wsync`` weight-transfer backend for vLLM 0.33.0 (``vllm.distributed.weight_transfer``).

(Formerly ``wsync.vllm_backend``, which still imports as this same module.)

Worker side, :class:`WsyncWeightTransferEngine` (a ``WeightTransferEngine``): one per vLLM
worker, built by ``WeightTransferEngineFactory.create_engine`` when the engine is configured
with ``weight_transfer_config={"backend": "wsync"}``. Trainer side,
:class:`WsyncTrainerWeightTransferEngine` (a ``TrainerWeightTransferEngine``), built by
``WeightTransferTrainerFactory.trainer_init(WsyncTrainerInitInfo(...), client=..., source=...)``
and driven by a ``WeightSource`` (e.g. vLLM's ``ModuleSource``). It owns one sync end to end,
as vLLM's ``ipc`` and ``nccl`` trainer engines do: ``start_weight_update`` -> one
``update_weights`` per chunk (the chunk's wsync request, forwarded through vLLM's client) ->
``Sender.flush`` -> ``finish_weight_update``.

Registration: :func:`register` adds ``"wsync"`` to both factories. It is the
``vllm.general_plugins`` entry point of this package, so vLLM calls it in every process
(``vllm.plugins.load_general_plugins``) once ``wsync`` is installed in vLLM's environment. An
entry point exists only for an installed distribution: with the package on ``PYTHONPATH``
alone nothing registers it, and ``register()`` must be called in every vLLM process.

vLLM 0.33.0's engine contract, as this backend follows it:

- draft model: ``supports_draft_weight_update`` is true. vLLM's worker re-aims the engine with
  ``set_weight_update_target`` for a ``start_draft_weight_update`` session; every session reads
  ``self.model``/``self.model_config`` at its start, so the draft takes the version.
  :meth:`WsyncTrainerWeightTransferEngine.send_draft_weights` drives such a session (refused
  with delta sync: patches apply onto the target's base).
- ``shutdown`` releases the trainer connection (the receiver) without stopping inference
  (vLLM's ``shutdown_weight_transfer_engine``); a later ``init_transfer_engine`` joins a new
  trainer. An ``init_transfer_engine`` with the init info the engine already holds is a no-op,
  so a trainer can re-send its init info to a replaced worker through a collective client
  (:meth:`WsyncTrainerWeightTransferEngine.reinit_workers`).
- list payloads: vLLM's worker picks its own entry out of a ``list[dict]`` update payload
  (``data_parallel_index * world_size + rank``) before the engine sees it; every wsync worker
  takes the same request, so the trainer sends one dict.
- ``defers_processing`` is false: ``update_weights`` returns once the chunk is loaded (or held,
  with ``staged=True``, until ``finish_weight_update``), so ``drain_pending`` has nothing to wait
  for (the base class's no-op).

What travels through vLLM's client is JSON-safe (vLLM's HTTP client posts JSON): the init info
is ``{"init_info": <base64 of the strategy's init blob>, "options": {...}, "rank_offset": n,
"copy": bool, "staged": bool}``, each update info ``{"requests": [<base64 of one request
blob>]}``, and an abort ``{"abort": true}``.

Why the worker hands ``load_weights`` copies by default (``copy=True``): vLLM's layerwise
reload (``initialize_layerwise_reload`` in ``start_weight_update``, as vLLM's own engines do)
keeps the tensors ``load_weights`` is given until the layer they belong to is complete, or
until ``finish_weight_update``, so a layer split across two chunks reads its first chunk's
tensors after that chunk's ``update_weights`` returned. A wsync view is only valid until its
iteration ends (the slot is then reused for a later chunk). Measured with vLLM 0.33.0 on CPU
(a layer's weight in chunk 0, its bias in chunk 1, one reused staging slot NaN-filled after
each chunk, 3 versions): views gave a wrong ``layers.0.weight`` every round; copies were
bit-exact. So copies are the default; ``copy=False`` (zero-copy views) is only safe when
no layer spans two chunks or the model does not use layerwise reload. For the host kinds
(``shm``, ``ucx``) a copy is a fresh torch tensor filled by the library's copy loop
(``wsync_recv_copy``, :meth:`wsync.Iteration.copy_into`), which verifies the checksum in the
same pass; for the GPU kinds, which the library cannot copy into, it is a clone of the view on
the worker's device.

Failed versions. vLLM's worker (``gpu_worker.Worker``) closes its update session when
``update_weights`` raises and refuses ``start_weight_update`` while a session is open. The
worker engine therefore discards its open layerwise reload whenever ``update_weights`` raises
(layers still waiting get their own tensors back, nothing buffered for the failed version is
kept), and the trainer engine, on any failure of a sync, abandons the wsync version and sends
``update_weights({"abort": True})``, which closes the session of every worker whose session is
still open. The next ``send_weights`` starts cleanly everywhere and, being a full version,
overwrites every parameter. Between the two, layers the failed version had completed hold its
values (layerwise reload writes a completed layer in place): keep generation paused until a
``send_weights`` succeeds, as vLLM's pause/resume around a weight update does.

``staged=True`` (trainer init info) makes the update two-phase: workers hold the version's
tensors as copies (one model's worth of memory on the worker's device) and load them in
``finish_weight_update``, which the trainer calls only after every worker acknowledged every
chunk. A failed transfer (the trainer's error, a worker's receive failure or death, an
abandoned version) then changes no worker's model at all. A ``load_weights`` error at finish
still leaves that worker's completed layers written, and workers that finished before it on
the new version; the trainer's abort closes the sessions as above.

Delta sync (trainer ``options={"delta": "auto"}``, kind ``shm`` or ``ucx``): the worker takes
each patch with :meth:`wsync.Iteration.patch` (``wsync_recv_patch``) and applies it in place through
``load_weights`` with :func:`wsync.checkpoint_patch.apply_checkpoint_patch` (bit-exact: a mask,
not vLLM's NaN sentinel, marks the changed elements); dense tensors of such a version load in
place. There is no layerwise reload then (patches need the live parameters at their base
version, as in vLLM's sparse engine), so layers whose weights vLLM processes after loading are
refused by name at init (:func:`refuse_delta_for`) and ``staged=True`` is refused by the
trainer. Workers with a mirror (``worker_options={"delta_mirror": True}``, the receiver
option of docs/delta.md) lift all three limits: their receivers keep their own copy of every
tensor (host memory of the model's size per worker), apply each patch onto it and verify the
result, and hand ``load_weights`` whole tensors, so a delta version loads exactly like a dense
one (layerwise reload, any layer, ``staged=True`` allowed) while only the patches cross.

This module imports vLLM; import it only where vLLM is installed.
"""

from __future__ import annotations

import base64
import binascii
from ctypes import byref
from dataclasses import dataclass, field
from typing import Any, ClassVar, Dict, Iterator, List, Optional, Tuple, Union

import torch
from vllm.distributed.weight_transfer.base import (
    TrainerInitInfo,
    TrainerWeightTransferEngine,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)

from .. import _lib
from .._core import Receiver, Sender, Strategy, TensorMeta, describe, plan, status_for_exception
from ..checkpoint_patch import apply_checkpoint_patch
from .._dtypes import DType
from .._errors import AbandonedError, Status, WrongStateError, WsyncError, error, raise_for
from ..trainer import DEFAULT_CHUNK_BYTES

#: The backend name in ``WeightTransferConfig(backend=...)``.
BACKEND = "wsync"

#: Strategies that move GPU memory: a worker receives on its own device (``device`` option,
#: filled from the worker's device unless ``worker_options`` sets it).
GPU_KINDS = ("cuda_ipc", "nccl_broadcast")
#: Kinds that move host memory: a GPU trainer's tensors are copied to the CPU one chunk at a
#: time before they are sent. (The ucx kind can take CUDA tensors itself, packed by the GPU into
#: pinned staging memory; this backend keeps the copy until that path has run on a GPU with
#: vLLM, docs/gpu-validation.md.)
HOST_KINDS = ("shm", "ucx")


def encode_blob(blob: bytes) -> str:
    """A wsync blob as base64 text (the client payloads are JSON)."""
    return base64.b64encode(bytes(blob)).decode("ascii")


def decode_blob(value: Union[bytes, str], what: str, expect_type: str) -> bytes:
    """bytes (as they are) or base64 text -> a wsync blob of ``expect_type`` (``ValueError``
    otherwise, which vLLM's ``parse_*_info`` reports as a bad request)."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        blob = bytes(value)
    elif isinstance(value, str):
        try:
            blob = base64.b64decode(value.encode("ascii"), validate=True)
        except (binascii.Error, UnicodeEncodeError) as exc:
            raise ValueError(f"{what} is text but not base64: {exc}") from None
    else:
        raise ValueError(f"{what} must be bytes or base64 text, not {type(value).__name__}")
    try:
        parsed = describe(blob)
    except WsyncError as exc:
        raise ValueError(f"{what} is not a wsync blob: {exc}") from None
    if parsed.get("type") != expect_type:
        raise ValueError(f"{what} is a wsync {parsed.get('type')} blob, expected {expect_type}")
    return blob


def _entry_range(it, i: int) -> Tuple[int, int]:
    """(offset, bytes) of the whole tensor that entry ``i`` of an iteration carries
    (``wsync_recv_part``): ``(0, size)`` for a tensor sent whole."""
    part = _lib.Part()
    with it._lock:
        status = it._lib.wsync_recv_part(it._h(), i, byref(part))
        if status:
            raise_for(status, it._lib)
    return part.offset, part.bytes


def _delta_on(init_info) -> bool:
    """Whether the trainer's options turn delta sync on (``"auto"``/``"on"``)."""
    return str(init_info.options.get("delta", "off")) != "off"


#: Quant methods whose layers keep checkpoint-coordinate parameters that ``load_weights`` writes
#: straight into (no post-load transformation), so patches can apply in place.
UNQUANTIZED_METHODS = ("UnquantizedLinearMethod", "UnquantizedEmbeddingMethod",
                       "UnquantizedFusedMoEMethod")


def refuse_delta_for(model: torch.nn.Module) -> None:
    """Raises ``ValueError`` naming the first layer whose parameters a patch (or a dense tensor
    of a delta sync) cannot be written to in place. Delta sync runs without vLLM's layerwise
    reload, so nothing redoes vLLM's post-load processing
    (``model_loader.utils.process_weights_after_loading`` in vLLM 0.33) after an update; refused:

    - a layer whose quant method is not one of the unquantized ones (quantization, repacking:
      its parameters are not checkpoint tensors after loading);
    - an unquantized linear whose weight vLLM's CPU backend repacked for its GEMM
      (``dispatch_cpu_unquantized_gemm`` sets ``layer.cpu_linear``; on CUDA the unquantized
      methods leave the weight as loaded);
    - an MLA attention layer (its post-load step derives tensors from ``kv_b_proj``'s weight,
      which would go stale);
    - a model with a model-level ``process_weights_after_loading`` hook.
    """
    for name, module in model.named_modules():
        where = f"layer '{name}'" if name else f"model {type(module).__name__}"
        method = getattr(module, "quant_method", None)
        if method is not None and type(method).__name__ not in UNQUANTIZED_METHODS:
            why = (f"uses {type(method).__name__}, whose parameters are not checkpoint tensors "
                   "after loading")
        elif getattr(module, "cpu_linear", None) not in (None, torch.nn.functional.linear):
            why = "had its weight repacked for vLLM's CPU GEMM (cpu_linear) after loading"
        elif "MLA" in type(module).__name__ and hasattr(module, "process_weights_after_loading"):
            why = (f"is {type(module).__name__}, whose post-load step derives tensors from the "
                   "weights")
        elif not name and callable(getattr(module, "process_weights_after_loading", None)):
            why = "has a model-level process_weights_after_loading hook"
        else:
            continue
        raise ValueError(
            f"delta sync: {where} {why}, so patches cannot be applied to its parameters in "
            "place (there is no layerwise reload with delta); run the trainer with delta 'off' "
            "for this model")


def receiver_index(rank_offset: int, parallel_config) -> int:
    """A worker's receiver index, computed as vLLM's NCCL engine computes its group rank:
    ``rank_offset + data_parallel_index * world_size + rank`` (world_size = TP * PP)."""
    return (rank_offset + int(parallel_config.data_parallel_index) * int(parallel_config.world_size)
            + int(parallel_config.rank))


# -- worker side -------------------------------------------------------------------------------

@dataclass
class WsyncInitInfo(WeightTransferInitInfo):
    """Worker init info: the strategy's init blob (bytes or base64), receiver-side strategy
    options, the offset added to the worker's global index, whether ``load_weights`` gets
    copies (default, see the module documentation) or views, and whether a version is staged
    (held as copies and loaded only at ``finish_weight_update``)."""

    init_info: Union[bytes, str]
    options: Dict[str, Any] = field(default_factory=dict)
    rank_offset: int = 0
    copy: bool = True
    staged: bool = False
    delta: bool = False

    def __post_init__(self) -> None:
        self.init_info = decode_blob(self.init_info, "init_info", "init")
        if not isinstance(self.options, dict):
            raise ValueError(f"options must be a dict, not {type(self.options).__name__}")
        if not isinstance(self.rank_offset, int) or isinstance(self.rank_offset, bool) or self.rank_offset < 0:
            raise ValueError(f"rank_offset must be a non-negative int, got {self.rank_offset!r}")
        if not isinstance(self.copy, bool):
            raise ValueError(f"copy must be a bool, got {self.copy!r}")
        if not isinstance(self.staged, bool):
            raise ValueError(f"staged must be a bool, got {self.staged!r}")
        if not isinstance(self.delta, bool):
            raise ValueError(f"delta must be a bool, got {self.delta!r}")
        if self.delta and self.staged and not _mirrored(self.options):
            raise ValueError("delta and staged cannot be combined: patches apply in place "
                             "(unless the workers keep a mirror: options {'delta_mirror': True})")


@dataclass
class WsyncUpdateInfo(WeightTransferUpdateInfo):
    """Worker update info: request blobs (bytes or base64), received in order; or
    ``abort=True`` with no requests, which the trainer sends after a failed sync to close every
    worker's update session (see :meth:`WsyncWeightTransferEngine.update_weights`)."""

    requests: List[Union[bytes, str]] = field(default_factory=list)
    abort: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.abort, bool):
            raise ValueError(f"abort must be a bool, got {self.abort!r}")
        if self.abort:
            if self.requests:
                raise ValueError("an abort carries no requests")
            return
        if not isinstance(self.requests, (list, tuple)) or not self.requests:
            raise ValueError("requests must be a non-empty list of wsync request blobs")
        self.requests = [decode_blob(r, f"requests[{i}]", "request") for i, r in enumerate(self.requests)]


def _mirrored(worker_options: Dict[str, Any]) -> bool:
    """Whether the workers' receivers keep a mirror (receiver option ``delta_mirror``): the
    library then applies each patch onto its own copy of the tensor, verifies the result, and
    hands the worker whole tensors, so a delta sync loads exactly like a dense one."""
    return worker_options.get("delta_mirror") is True


def _fail_chunk(it, exc: BaseException, what: str) -> None:
    """Fails the chunk with the status the exception maps to and "<what>: <Type>: <message>"."""
    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
    it.fail(status_for_exception(exc), f"{what}: {text}")

class WsyncWeightTransferEngine(WeightTransferEngine[WsyncInitInfo, WsyncUpdateInfo]):
    """vLLM worker engine over libwsync: one wsync receiver per worker."""

    init_info_cls = WsyncInitInfo
    update_info_cls = WsyncUpdateInfo
    #: Sessions read ``self.model`` at their start, so vLLM's ``set_weight_update_target``
    #: (a ``start_draft_weight_update`` session) points a version at the draft model.
    supports_draft_weight_update = True
    #: ``update_weights`` loads before it returns: ``drain_pending`` (the base no-op) suffices.
    defers_processing = False

    def __init__(self, config, vllm_config, device: torch.device, model: torch.nn.Module) -> None:
        super().__init__(config, vllm_config, device, model)
        self._init_key: Optional[Tuple[bytes, str]] = None
        self._strategy: Optional[Strategy] = None
        self._receiver: Optional[Receiver] = None
        self._reload_open = False
        self._staged: List[Tuple[str, torch.Tensor]] = []
        # A split tensor being assembled across chunks: (name, whole tensor) until its last part.
        self._partial: Optional[Tuple[str, torch.Tensor]] = None
        self.copy = True
        self.staged = False
        self.delta = False
        self._host_copies = True

    @property
    def receiver(self) -> Receiver:
        """This worker's receiver (``WrongStateError`` before init or after shutdown)."""
        if self._receiver is None:
            raise WrongStateError(Status.WRONG_STATE, "the wsync weight-transfer engine is not "
                                  "initialised (init_transfer_engine not called, or shutdown)")
        return self._receiver

    @staticmethod
    def _key(init_info: WsyncInitInfo) -> Tuple[bytes, str]:
        import json

        return (init_info.init_info, json.dumps(
            [init_info.options, init_info.rank_offset, init_info.copy, init_info.staged,
             init_info.delta], sort_keys=True, default=str))

    def init_transfer_engine(self, init_info: WsyncInitInfo) -> None:
        """Creates the receiver at index ``rank_offset + dp_index * world_size + rank``.

        Already initialised: the same init info again (a trainer re-sending it to a replaced
        worker through a collective client) changes nothing; any other is refused with
        ``WRONG_STATE`` (release the first trainer with vLLM's
        ``shutdown_weight_transfer_engine`` before joining another)."""
        if self._receiver is not None:
            if self._init_key == self._key(init_info):
                return
            raise WrongStateError(Status.WRONG_STATE, f"the wsync weight-transfer engine "
                                  f"(receiver {self._receiver.index}) is already initialised "
                                  "with another trainer's init info; call vLLM's "
                                  "shutdown_weight_transfer_engine first")
        index = receiver_index(init_info.rank_offset, self.parallel_config)
        options = dict(init_info.options)
        kind = describe(init_info.init_info).get("kind")
        # With a mirror the library hands over whole tensors: any layer can take them.
        patches_here = init_info.delta and not _mirrored(options)
        if patches_here:
            refuse_delta_for(self.model)
        if kind in GPU_KINDS and "device" not in options and self.device.type == "cuda":
            # Each worker receives on its own GPU; the options are the same for all workers.
            options["device"] = (self.device.index if self.device.index is not None
                                 else torch.cuda.current_device())
        strategy = Strategy.for_init_info(init_info.init_info, **options)
        try:
            self._receiver = strategy.receiver(init_info.init_info, index)
        except BaseException:
            strategy.close()
            raise
        self._strategy = strategy
        self._init_key = self._key(init_info)
        self.copy = init_info.copy
        self.staged = init_info.staged
        self.delta = patches_here
        self._host_copies = kind not in GPU_KINDS

    def start_weight_update(self) -> None:
        """Begins vLLM's layerwise reload for one version. A reload a failed session left
        behind (its worker never reached ``finish_weight_update``) is discarded first, so no
        tensor buffered for an abandoned version is ever loaded into a later one."""
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        self.discard_weight_update()
        self._staged = []
        self._partial = None
        if self.delta and self.model is not self._default_model:
            raise ValueError(f"receiver {self.receiver.index}: a draft-model update session "
                             "with delta sync: patches apply onto the target model's base "
                             "version; sync the draft model with a trainer whose delta is 'off'")
        if self.delta:
            # Patches apply in place onto the parameters, which must hold the base version:
            # no layerwise reload (it would hand load_weights fresh tensors), as vLLM's own
            # sparse engine does; dense tensors of a delta sync load in place too.
            return
        self._reload_open = True  # before: layers a failed initialisation moved are restored
        try:
            initialize_layerwise_reload(self.model)
        except BaseException:
            self.discard_weight_update()
            raise

    def finish_weight_update(self) -> None:
        """Loads a staged version (``staged=True``: the copies ``update_weights`` held), then
        ends vLLM's layerwise reload (processing layers not yet processed).

        Refuses with ``WRONG_STATE`` (after discarding the reload) when this worker's receiver
        still has a version open: finishing would process half-loaded layers."""
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        state = self.receiver.poll()
        if state.open_version:
            self.discard_weight_update()
            raise WrongStateError(Status.WRONG_STATE, f"finish_weight_update: version "
                                  f"{state.open_version} is still open on receiver "
                                  f"{self.receiver.index}; the update was discarded")
        staged, self._staged = self._staged, []
        try:
            if staged:
                self.model.load_weights(staged)
                del staged
                if self.device.type == "cuda":
                    torch.cuda.current_stream(self.device).synchronize()
            if self._reload_open:
                finalize_layerwise_reload(self.model, self.model_config)
        except BaseException:
            self.discard_weight_update()
            raise
        self._reload_open = False

    def discard_weight_update(self) -> None:
        """Drops an unfinished layerwise reload: every layer still waiting for weights gets
        its own tensors back, unprocessed, and the weights buffered for it are dropped (what
        vLLM's ``sharded_rdt`` engine does after its dry run). Layers the reload already
        processed keep the values they received. A no-op when no reload is open."""
        self._staged = []
        self._partial = None
        if not self._reload_open:
            return
        from vllm.model_executor.model_loader.reload.layerwise import (
            LAYERWISE_INFO,
            LOADING_LAYERS,
            _place_kernel_tensors,
        )

        model = self.model
        for layer in model.modules():
            info = LAYERWISE_INFO.get(layer)
            if info is not None and info.can_load():
                if info.kernel_tensors is not None:
                    _place_kernel_tensors(layer, info)
                info.reset()
        LOADING_LAYERS.clear()
        if hasattr(model, "_original_do_torchao_reload"):
            model._do_torchao_reload = model._original_do_torchao_reload
        self._reload_open = False

    def receive_weights(self, update_info: WsyncUpdateInfo) -> None:
        """Receives each request in order and passes its ``(name, tensor)`` pairs to
        ``self.model.load_weights`` (copies unless the init info said ``copy=False``: for the host
        kinds taken with :meth:`wsync.Iteration.copy_into` into fresh tensors, see
        :meth:`_copies`).

        If ``load_weights`` raises, the chunk is failed with ``Iteration.fail`` (the status
        :func:`wsync.status_for_exception` gives, and a message naming this receiver and the
        error), so the trainer's ``flush`` raises ``PEER`` carrying that message. Whatever
        fails here, the open layerwise reload is discarded before the error propagates:
        vLLM's worker closes its update session on any ``update_weights`` error and will not
        call ``finish_weight_update``.
        """
        try:
            self._receive(update_info)
        except BaseException:
            self.discard_weight_update()
            raise

    def _receive(self, update_info: WsyncUpdateInfo) -> None:
        receiver = self.receiver
        if update_info.abort:
            state = receiver.poll()
            raise AbandonedError(Status.ABANDONED, f"the trainer aborted the weight update "
                                 f"(receiver {receiver.index}: completed version "
                                 f"{state.completed_version}); the update session is closed")
        if self.delta:
            self._receive_delta(update_info)
            return
        # Owned tensors: for host kinds copied once by the library (_copies); for GPU kinds,
        # which it cannot copy into, views cloned on the device by the iteration (copy=True).
        owned = self.copy or self.staged
        library_copies = owned and self._host_copies
        for request in update_info.requests:
            with receiver.receive(request, framework="torch", copy=owned and not library_copies) as it:
                batch = self._copies(it) if library_copies else list(it)
                if self.staged:
                    self._staged.extend(batch)
                    continue
                try:
                    self.model.load_weights(batch)
                    if self.device.type == "cuda":
                        torch.cuda.current_stream(self.device).synchronize()
                except BaseException as exc:
                    _fail_chunk(it, exc, f"vLLM worker (receiver {receiver.index}) load_weights failed")
                    raise
                finally:
                    del batch

    def _receive_delta(self, update_info: WsyncUpdateInfo) -> None:
        """A delta sync's requests (trainer option ``delta``): dense entries are copied by the
        library and loaded in place with ``load_weights``; each patch (``wsync_recv_patch``,
        :meth:`wsync.Iteration.patch`: int32/int64 flat indices + values in checkpoint
        coordinates, checked by the library against this receiver's completed version) is
        applied through ``load_weights`` bit for bit by
        :func:`wsync.checkpoint_patch.apply_checkpoint_patch` (a mask, not vLLM's NaN sentinel,
        marks the changed elements, so NaN payloads and -0.0 arrive exactly). Any failure fails
        the chunk with the error's status, so the version does not complete on this worker and
        the trainer's next version is dense (which rewrites every parameter)."""
        receiver = self.receiver
        for request in update_info.requests:
            with receiver.receive(request, framework="torch") as it:
                dense, patches = [], []
                for i in range(len(it)):
                    if it.is_patch(i):
                        patches.append(it.patch(i))  # views, valid inside this block
                        continue
                    meta = it.peek(i)
                    dst = torch.empty(meta.shape, dtype=meta.dtype.to_torch())
                    it.copy_into(i, dst)
                    dense.append((meta.name, dst))
                try:
                    if dense:
                        self.model.load_weights(dense)
                    for p in patches:
                        apply_checkpoint_patch(self.model.load_weights, p.name, p.shape,
                                               p.indices, p.values, device=self.device)
                    if self.device.type == "cuda":
                        torch.cuda.current_stream(self.device).synchronize()
                except BaseException as exc:
                    _fail_chunk(it, exc, f"vLLM worker (receiver {receiver.index}) delta load")
                    raise
                finally:
                    del dense, patches

    def _copies(self, it) -> List[Tuple[str, torch.Tensor]]:
        """Every tensor of the chunk as a fresh torch tensor that stays valid after the
        iteration ends, filled by the library's copy loop (``wsync_recv_copy`` through
        :meth:`wsync.Iteration.copy_into`), which verifies the tensor's checksum in the same
        pass: one copy, no zero-copy view in between.

        A split tensor (larger than a chunk, sent as consecutive parts, one per chunk) is
        assembled: its first part allocates the whole tensor, each part's ``copy_into`` writes
        its own range, and the tensor joins the batch with its last part, so ``load_weights``
        only ever sees whole tensors. The library refuses parts out of order or a version that
        leaves a tensor incomplete, so at most one tensor is being assembled at a time; a
        discarded update drops it."""
        pairs = []
        for i in range(len(it)):
            meta = it.peek(i)
            offset, nbytes = _entry_range(it, i)
            held = self._partial is not None and self._partial[0] == meta.name
            dst = self._partial[1] if held else torch.empty(meta.shape, dtype=meta.dtype.to_torch())
            whole = dst.numel() * dst.element_size()
            if (offset, nbytes) != (0, whole) and self._partial is not None and not held:
                raise error(Status.MISMATCH, f"a part of tensor '{meta.name}' arrived while split "
                            f"tensor '{self._partial[0]}' was still incomplete")
            it.copy_into(i, dst)  # the whole range: a part writes only its own share
            if offset + nbytes < whole:
                self._partial = (meta.name, dst)
                continue
            if held:
                self._partial = None
            pairs.append((meta.name, dst))
        return pairs

    def update_weights(self, update_info: Dict[str, Any]) -> None:
        """vLLM's ``update_weights`` without its unconditional ``torch.accelerator.synchronize()``
        (which raises on a CPU-only host with a CUDA build of torch).

        ``{"abort": True}`` discards the open reload and raises :class:`wsync.AbandonedError`:
        vLLM's worker closes its update session on that error, so after a failed sync the
        trainer's abort leaves every worker with no session open (workers whose own error
        already closed theirs refuse the abort before it reaches the engine)."""
        self.receive_weights(self.parse_update_info(update_info))
        if self.device.type != "cpu":
            torch.accelerator.synchronize()

    @property
    def completed_version(self) -> int:
        """The newest version this worker received completely (0 if none)."""
        return self.receiver.completed_version

    def shutdown(self) -> None:
        """Closes the receiver (the trainer sees this worker detach) without touching the model
        or inference; idempotent. vLLM's ``shutdown_weight_transfer_engine`` calls it (and
        refuses while an update session is open); ``init_transfer_engine`` may follow."""
        self._init_key = None
        receiver, self._receiver = self._receiver, None
        strategy, self._strategy = self._strategy, None
        if receiver is not None:
            receiver.close()
        if strategy is not None:
            strategy.close()


# -- trainer side ------------------------------------------------------------------------------

@dataclass
class WsyncTrainerInitInfo(TrainerInitInfo):
    """Trainer init info.

    - ``kind``, ``options``: the wsync strategy and its sender-side options (``shm`` for one
      host; ``cuda_ipc`` or ``nccl_broadcast`` as for any wsync strategy; ``ucx`` for workers on
      other hosts, pulling over UCX);
    - ``receivers``: how many vLLM workers receive (DP * TP * PP of the engine);
    - ``worker_options``, ``rank_offset``, ``copy``, ``staged``: sent to the workers (see
      :class:`WsyncInitInfo` and the module documentation);
    - ``chunk_bytes``, ``group_depth``: the chunk plan (default: the strategy's
      ``bucket_bytes`` for ``shm``, else 256 MiB);
    - ``flush_timeout_s``: how long a sync waits for every worker's acknowledgement.
    """

    backend: ClassVar[str] = BACKEND
    kind: str = "shm"
    options: Dict[str, Any] = field(default_factory=dict)
    receivers: int = 1
    worker_options: Dict[str, Any] = field(default_factory=dict)
    rank_offset: int = 0
    copy: bool = True
    staged: bool = False
    chunk_bytes: Optional[int] = None
    group_depth: int = 2
    flush_timeout_s: float = 60.0


class WsyncTrainerWeightTransferEngine(TrainerWeightTransferEngine[WsyncTrainerInitInfo]):
    """vLLM trainer engine over libwsync (see the module documentation)."""

    init_info_cls = WsyncTrainerInitInfo

    def __init__(self, *, client, source=None, is_sender: bool = True, rank: int = 0) -> None:
        super().__init__(client=client, source=source, is_sender=is_sender, rank=rank)
        self.init_info: Optional[WsyncTrainerInitInfo] = None
        self.strategy: Optional[Strategy] = None
        self.sender: Optional[Sender] = None
        self._worker_init: Optional[Dict[str, Any]] = None

    @classmethod
    def trainer_init(cls, init_info: WsyncTrainerInitInfo, *, client, source=None):
        """Creates the strategy and sender on the sending rank and initialises every worker's
        engine through ``client.init_weight_transfer_engine``; other ranks only keep the
        source (``send_weights`` then iterates it for the collectives)."""
        engine = cls(client=client, source=source, is_sender=init_info.is_sender, rank=init_info.rank)
        engine.init_info = init_info
        if not engine.is_sender:
            return engine
        delta = _delta_on(init_info)
        if delta and init_info.staged and not _mirrored(init_info.worker_options):
            # Staged versions load at finish from held copies; patches apply in place.
            raise ValueError(f"options['delta'] = {init_info.options['delta']!r} with "
                             "staged=True: delta patches apply in place as they arrive; use "
                             "staged=False, delta 'off', or workers with a mirror "
                             "(worker_options={'delta_mirror': True})")
        strategy = Strategy(init_info.kind, receivers=init_info.receivers, **init_info.options)
        try:
            blob = strategy.create_init_info()
            engine.sender = strategy.sender(blob)
            engine.strategy = strategy
            engine._worker_init = {
                "init_info": encode_blob(blob), "options": dict(init_info.worker_options),
                "rank_offset": init_info.rank_offset, "copy": init_info.copy,
                "staged": init_info.staged, "delta": delta}
            client.init_weight_transfer_engine(dict(engine._worker_init))
        except BaseException:
            engine.shutdown()
            strategy.close()
            raise
        return engine

    def _chunk_bytes(self) -> int:
        if self.init_info.chunk_bytes is not None:
            return self.init_info.chunk_bytes
        body = self.sender.init_description.get("body", {})
        value = body.get("bucket_bytes") if isinstance(body, dict) else None
        return int(value) if isinstance(value, int) and value > 0 else DEFAULT_CHUNK_BYTES

    def _split(self) -> bool:
        """Whether to plan split tensors (a tensor larger than a chunk cut into parts): only
        where workers assemble parts (host kinds, with copies: see
        :meth:`WsyncWeightTransferEngine._copies`); otherwise such a tensor gets a chunk of its
        own, which a sender whose buckets are smaller refuses by name."""
        info = self.init_info
        if _delta_on(info):
            return False  # delta sync does not take split tensors (docs/delta.md)
        return bool(info.copy or info.staged) and info.kind in HOST_KINDS

    def _planned(self, source=None) -> List[Tuple[List[str], Optional[Tuple[Tuple[int, int], ...]]]]:
        """The source's parameters grouped into chunks, by name, from its metadata, with each
        chunk's byte ranges (``None`` when every tensor in it is whole)."""
        source = self.source if source is None else source
        metas = [TensorMeta(m.name, DType.from_torch(m.dtype), tuple(m.shape)) for m in source.metadata]
        chunks = plan(metas, chunk_bytes=self._chunk_bytes(),
                      group_depth=self.init_info.group_depth, split=self._split())
        return [([metas[i].name for i in c.indices], c.parts) for c in chunks]

    def _plan(self) -> List[List[str]]:
        """The source's parameters grouped into chunks, by name, from its metadata."""
        return [names for names, _ in self._planned()]

    def _chunks(self, source=None) -> Iterator[Tuple[List[Tuple[str, torch.Tensor]], bool, Any]]:
        """Streams ``source.iter_full()`` into the planned chunks (one chunk's tensors held
        at a time, and a split tensor until its last part); yields (pairs, last, parts)."""
        source = self.source if source is None else source
        chunks = self._planned(source)
        full = source.iter_full()
        held = None  # (name, tensor) of a split tensor whose later parts are still to send
        for k, (names, parts) in enumerate(chunks):
            pairs = []
            for j, want in enumerate(names):
                if held is not None and held[0] == want:
                    pairs.append(held)
                    if parts is None or sum(parts[j]) >= held[1].numel() * held[1].element_size():
                        held = None  # its last part
                    continue
                name, tensor = next(full)
                if name != want:
                    raise RuntimeError(f"the weight source yielded '{name}' where its metadata "
                                       f"lists '{want}'")
                tensor = tensor.detach()
                if self.init_info.kind in HOST_KINDS and tensor.device.type != "cpu":
                    tensor = tensor.to("cpu")  # host-memory kinds: one chunk at a time
                pairs.append((name, tensor))
                if parts is not None and parts[j][1] and \
                        sum(parts[j]) < tensor.numel() * tensor.element_size():
                    held = (name, tensor)  # the first part of a split tensor
            yield pairs, k == len(chunks) - 1, parts

    def send_weights(self) -> None:
        """One sync: start -> each chunk sent and its request forwarded -> flush -> finish.

        On any failure after ``start_weight_update`` was asked for, the version is abandoned
        (workers keep the previous version as their completed one) and every worker's update
        session is closed with an abort (``update_weights({"abort": True})``, see
        :meth:`WsyncWeightTransferEngine.update_weights`), so the next ``send_weights`` starts
        cleanly on every worker. If a worker failed a chunk or died, the error raised is the
        sender's ``WsyncError`` (``PEER``) whose ``failures`` carry that worker's status and
        message, chained to the client's error.

        A client call that timed out (an exception of a ``*Timeout*`` class, e.g. Python's
        ``TimeoutError`` or ``requests``' ``Timeout``, anywhere in its cause chain: vLLM's HTTP
        client waits up to 300 s for a server whose worker died) is not followed by another
        call through that client: no abort, no retry. The sessions it leaves open are closed
        by the next ``send_weights``, whose refused ``start_weight_update`` is retried once
        after an abort (as for a session a trainer that died mid-sync left open).
        """
        self._sync(None, draft=False)

    def send_draft_weights(self, source=None) -> None:
        """One sync into the workers' speculative draft model: as :meth:`send_weights`, but the
        session starts with ``client.start_draft_weight_update()`` (vLLM 0.33's ``LLM``,
        ``AsyncLLM`` and worker have it; its HTTP and Ray clients do not, so a client without
        it is refused by name before anything is sent). ``source`` is the draft's
        ``WeightSource`` (default: the engine's own). Refused with delta sync, whose patches
        apply onto the target model's base version."""
        if _delta_on(self.init_info):
            raise ValueError("send_draft_weights with delta sync: patches apply onto the "
                             "target model's base version; use a trainer engine whose "
                             "options['delta'] is 'off' for the draft model")
        if self.is_sender and not callable(getattr(self.client, "start_draft_weight_update", None)):
            raise TypeError(f"the client {type(self.client).__name__} has no "
                            "start_draft_weight_update(); vLLM 0.33's HTTP and Ray clients "
                            "lack it: use a client over LLM/AsyncLLM, which have it")
        self._sync(source, draft=True)

    def _sync(self, source, draft: bool) -> None:
        source = self.source if source is None else source
        if source is None:
            raise ValueError("the wsync trainer engine needs a WeightSource (source=...)")
        if not self.is_sender:
            for _ in source.iter_full():
                pass
            return
        sender = self.sender
        if sender is None:
            raise WrongStateError(Status.WRONG_STATE, "the wsync trainer engine is shut down")
        start = self.client.start_draft_weight_update if draft else self.client.start_weight_update
        timed_out = False
        try:
            try:
                start()
            except Exception as exc:
                if _timed_out(exc):
                    timed_out = True
                    self._raise_worker_failure(exc)
                    raise
                self.abort_workers()
                start()
            for pairs, last, parts in self._chunks(source):
                request = sender.send_chunk(pairs, last=last, parts=parts)
                del pairs
                try:
                    self.client.update_weights({"requests": [encode_blob(request)]})
                except BaseException as exc:
                    timed_out = _timed_out(exc)
                    self._raise_worker_failure(exc)
                    raise
            sender.flush(self.init_info.flush_timeout_s)
            try:
                self.client.finish_weight_update()
            except BaseException as exc:
                timed_out = _timed_out(exc)
                raise
        except BaseException:
            try:
                sender.abandon()
            except Exception:  # a closed or broken sender: the original error matters more
                pass
            if not timed_out:
                self.abort_workers()
            raise

    def abort_workers(self) -> None:
        """Closes every worker's update session, discarding what it buffered for an
        unfinished version. Errors are ignored: a worker whose own failure already closed its
        session refuses the abort, and one that is gone has nothing to close."""
        try:
            self.client.update_weights({"abort": True})
        except Exception:
            pass

    def reinit_workers(self) -> None:
        """Sends this engine's worker init info again through the client
        (``init_weight_transfer_engine``): a worker that replaced a dead one (same DP/TP
        position, so the same receiver index) attaches and takes part from the next version;
        workers that already hold this init info ignore it. Versions go on from where they
        were; no new ``trainer_init`` is needed (for ``shm``, ``cuda_ipc`` and ``ucx``;
        ``nccl_broadcast``'s group is fixed: make a new trainer engine)."""
        if not self.is_sender:
            return
        if self._worker_init is None or self.sender is None:
            raise WrongStateError(Status.WRONG_STATE, "the wsync trainer engine is shut down")
        self.client.init_weight_transfer_engine(dict(self._worker_init))

    def _raise_worker_failure(self, exc: BaseException) -> None:
        """After a client error: if a worker failed its chunk, raise the sender's error
        naming it (the worker's own message), chained to ``exc``."""
        try:
            self.sender.flush(min(5.0, self.init_info.flush_timeout_s))
        except WsyncError as failure:
            if failure.failures:
                raise failure from exc

    def shutdown(self) -> None:
        """Closes the sender and strategy (workers see the sender go); idempotent."""
        sender, self.sender = self.sender, None
        strategy, self.strategy = self.strategy, None
        if sender is not None:
            sender.close()
        if strategy is not None:
            strategy.close()


def _timed_out(exc: BaseException) -> bool:
    """Whether a client error is a timeout: an exception whose class (or a base class) is named
    ``*Timeout*`` (``TimeoutError``, ``socket.timeout``, ``requests.Timeout``,
    ``httpx.TimeoutException``, Ray's ``GetTimeoutError``) in its cause/context chain."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        seen.add(id(exc))
        if any("timeout" in cls.__name__.lower() for cls in type(exc).__mro__):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def register() -> None:
    """Registers ``wsync`` in vLLM's worker and trainer factories (idempotent). vLLM calls
    it through the ``vllm.general_plugins`` entry point."""
    from vllm.distributed.weight_transfer.factory import (
        WeightTransferEngineFactory,
        WeightTransferTrainerFactory,
    )

    if BACKEND not in WeightTransferEngineFactory._registry:
        WeightTransferEngineFactory.register_engine(BACKEND, __name__, "WsyncWeightTransferEngine")
    if BACKEND not in WeightTransferTrainerFactory._registry:
        WeightTransferTrainerFactory.register_engine(BACKEND, __name__, "WsyncTrainerWeightTransferEngine")
