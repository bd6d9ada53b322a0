"""A libwsync weight transfer for TRL 1.16.0's ``AsyncGRPOTrainer(weight_transfer=...)``.

TRL's async GRPO trainer syncs its policy into a vLLM server through an object with five
methods (``WeightTransferProtocol`` in ``trl/experimental/async_grpo/async_grpo_trainer.py``);
its default, ``WeightTransferClient`` (``trl/experimental/async_grpo/weight_transfer.py``),
drives vLLM's RL HTTP endpoints with TRL's ``VLLMClient`` and moves the bytes over NCCL.
:class:`WsyncWeightTransfer` keeps that HTTP path and that contract and moves the bytes with
libwsync instead, through the wsync vLLM backend (:mod:`wsync.integrations.vllm`) that the
server's workers load:

- ``init_weight_transfer()`` (called once on train begin, main process only): waits for the
  server (``/health``), warns when the server's dtype differs from the weights' (as TRL's
  client does), reads the number of workers (``/get_world_size``: one wsync receiver each),
  creates the wsync strategy and sender here and sends the workers their init info
  (``POST /init_weight_transfer_engine``).
- ``pause()`` / ``resume()``: ``POST /pause?mode=keep`` / ``POST /resume`` (TRL's client's own
  calls, bounded by the same 300 s control timeout).
- ``send_weights(iterator)``: one version. ``POST /start_weight_update``, then the
  ``(name, tensor)`` pairs from ``iterator`` packed into chunks by the wsync sender, one
  ``POST /update_weights`` per chunk carrying that chunk's wsync request, the sender's flush
  (every worker acknowledged every chunk), then ``POST /finish_weight_update``. Before each
  version the workers' init info is re-sent (a no-op for a worker that holds it), so an engine
  restarted since the last version rejoins on its own.
- ``destroy()`` (train end): releases the workers' receivers (``POST
  /shutdown_weight_transfer_engine``: the server keeps serving and takes a later trainer's
  init info), then closes the sender and strategy.

Like TRL's client, ``send_weights`` before ``init_weight_transfer`` or after ``destroy`` sends
nothing and returns.

The server is vLLM 0.33's OpenAI server started with ``VLLM_SERVER_DEV_MODE=1`` and
``--weight-transfer-config '{"backend": "wsync"}'`` in an environment where this package is
installed (its ``vllm.general_plugins`` entry point registers the backend).

Failures. A version that fails raises, and nothing is left half-open:

- a libwsync failure (a worker's receive or load failed, a worker's process died, a flush
  timed out) raises the library's own exception class (a :class:`wsync.WsyncError` subclass,
  with its ``status`` and its ``failures``), re-made with a message that names the engine: the
  server's URL, the receiver index and the worker's pid, with the worker's own status and
  message. It is chained (``__cause__``) to the original error, itself chained to the HTTP
  error that revealed it.
- any other failure (the server unreachable, an HTTP error without a wsync failure behind it)
  raises ``RuntimeError`` naming the server's URL, chained to the original error.

In both cases the wsync version is abandoned and every worker's update session is closed (the
vLLM backend's abort), so the next ``send_weights`` starts cleanly; when the server itself died,
the next ``send_weights`` waits for it to answer ``/health`` again (up to the ``VLLMClient``'s
``server_timeout``) and re-sends the init info before starting. If ``iterator`` itself did not
fail, its remaining pairs are drained before raising, so that FSDP2 ranks, whose
``full_tensor()`` gathers are collectives, are not left waiting. A failed version is not
retried: it is the next ``send_weights`` (the trainer's next sync) that sends a whole new
version. What the workers' models hold after a failed version is as for the vLLM backend
(layers the failed version completed keep its values; with ``staged=True`` nothing changes);
TRL does not resume generation after a failed sync, because the exception leaves its
``_sync_weight`` before ``resume()``.

This module imports TRL and vLLM; import it only where both are installed.
"""

from __future__ import annotations

import functools
import logging
import time
from collections import Counter
from dataclasses import dataclass
from typing import Any, Dict, Iterable, Iterator, List, Optional, Tuple, Union

import torch
from vllm.distributed.weight_transfer.base import ParamMeta, WeightSource

from .._errors import WsyncError, error
from .vllm import WsyncTrainerInitInfo, WsyncTrainerWeightTransferEngine

logger = logging.getLogger(__name__)


def _vllm_client(server: Any, server_timeout: float):
    """TRL's own ``VLLMClient`` for a URL; a client object passes through."""
    if isinstance(server, str):
        from trl.experimental.async_grpo.vllm_client import VLLMClient

        return VLLMClient(server, server_timeout)
    return server


def weight_update_info(model: torch.nn.Module) -> Dict[str, List[Any]]:
    """The manifest TRL's trainer builds for its NCCL client (``names``, ``dtype_names``,
    ``shapes``), from the same walk over the model the trainer streams
    (``_iter_vllm_named_params``): the parameters vLLM receives, under their checkpoint names."""
    from trl.experimental.async_grpo.async_grpo_trainer import _iter_vllm_named_params

    names, dtype_names, shapes = [], [], []
    for name, param in _iter_vllm_named_params(model):
        names.append(name)
        dtype_names.append(str(param.dtype).split(".")[-1])
        shapes.append(list(param.shape))
    return {"names": names, "dtype_names": dtype_names, "shapes": shapes}


def _dtype(name: str) -> torch.dtype:
    value = getattr(torch, str(name).removeprefix("torch."), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"weight_update_info: unknown dtype name {name!r}")
    return value


def _where(failure) -> str:
    """``chunk 3 of version 2`` (as much of it as the sender knows)."""
    where = f"version {failure.version}" if failure.version else "no version"
    return where if failure.chunk_index is None else f"chunk {failure.chunk_index} of {where}"


class _IteratorSource(WeightSource):
    """A vLLM ``WeightSource`` over one ``send_weights`` iterator and the manifest: the metadata
    the wsync sender plans its chunks from, and the pairs in manifest order (checked by name)."""

    def __init__(self, metadata: List[ParamMeta], iterator: Iterable[Tuple[str, torch.Tensor]]):
        self._metadata = metadata
        self._iterator = iter(iterator)
        self.pulled = 0
        self.exhausted = False
        self.failed = False

    @functools.cached_property
    def metadata(self) -> List[ParamMeta]:
        return list(self._metadata)

    def iter_full(self) -> Iterator[Tuple[str, torch.Tensor]]:
        for meta in self._metadata:
            try:
                name, tensor = next(self._iterator)
            except StopIteration:
                self.exhausted = True
                raise RuntimeError(
                    f"send_weights: the iterator ended after {self.pulled} tensors; the manifest "
                    f"(weight_update_info) lists {len(self._metadata)}, next '{meta.name}'") from None
            except BaseException:
                self.failed = True
                raise
            self.pulled += 1
            if tuple(tensor.shape) != tuple(meta.shape) or tensor.dtype != meta.dtype:
                raise RuntimeError(
                    f"send_weights: '{name}' is {tensor.dtype} {tuple(tensor.shape)}; the manifest "
                    f"(weight_update_info) says {meta.dtype} {tuple(meta.shape)}")
            yield name, tensor

    def drain(self) -> None:
        """Consumes what is left of the iterator (FSDP2 ranks gather each parameter together)."""
        if self.failed or self.exhausted:
            return
        for _ in self._iterator:
            pass


class _HttpClient:
    """vLLM's weight-sync client protocol (what the wsync trainer engine calls) over TRL's
    ``VLLMClient``, with TRL's timeouts: the control timeout to open a session, the weight-sync
    timeout for the steps that scale with the model."""

    def __init__(self, vllm, control_timeout: float, sync_timeout: float):
        self.vllm = vllm
        self.control_timeout = control_timeout
        self.sync_timeout = sync_timeout

    def init_weight_transfer_engine(self, init_info: Dict[str, Any]) -> None:
        self.vllm.init_weight_transfer_engine(init_info, timeout=self.sync_timeout)

    def start_weight_update(self) -> None:
        self.vllm.start_weight_update(timeout=self.control_timeout)

    def update_weights(self, update_info: Dict[str, Any]) -> None:
        self.vllm.update_weights(update_info, timeout=self.sync_timeout)

    def finish_weight_update(self, weight_version: Optional[str] = None) -> None:
        self.vllm.finish_weight_update(timeout=self.sync_timeout)


@dataclass
class _Settings:
    kind: str
    options: Dict[str, Any]
    worker_options: Dict[str, Any]
    copy: bool
    staged: bool
    chunk_bytes: Optional[int]
    group_depth: int
    flush_timeout_s: float


class WsyncWeightTransfer:
    """TRL 1.16.0's ``WeightTransferProtocol`` over libwsync (see the module documentation).

    Args:
        vllm_client: TRL's ``VLLMClient`` for the server, or the server's base URL (a
            ``VLLMClient`` is made with ``server_timeout``).
        weight_update_info: the manifest TRL's trainer builds, ``{"names", "dtype_names",
            "shapes"}``, in the order the trainer streams (:func:`weight_update_info` builds it
            from the model the way the trainer does; :meth:`from_model` does both).
        weight_sync_timeout: seconds for the HTTP calls that scale with the model (init info,
            each chunk's ``/update_weights``, ``/finish_weight_update``), as TRL's client's
            argument of that name (``AsyncGRPOConfig.weight_sync_timeout``).
        kind, options: the wsync strategy and its sender-side options (``shm`` for a server on
            this host; ``cuda_ipc`` for GPUs on this host; ``ucx`` across hosts).
        worker_options, copy, staged, chunk_bytes, group_depth: as in
            :class:`wsync.integrations.vllm.WsyncTrainerInitInfo`.
        flush_timeout_s: how long a version waits for every worker's acknowledgement.
        server_timeout: ``VLLMClient``'s wait for ``/health`` when a URL is given.
    """

    #: TRL's client bounds pause, resume and the reload setup by this (seconds).
    _CONTROL_TIMEOUT = 300

    def __init__(self, vllm_client: Any, weight_update_info: Dict[str, List[Any]],
                 weight_sync_timeout: int = 1800, *, kind: str = "shm",
                 options: Optional[Dict[str, Any]] = None,
                 worker_options: Optional[Dict[str, Any]] = None, copy: bool = True,
                 staged: bool = False, chunk_bytes: Optional[int] = None, group_depth: int = 2,
                 flush_timeout_s: float = 60.0, server_timeout: float = 240.0):
        self.vllm = _vllm_client(vllm_client, server_timeout)
        self.weight_sync_timeout = weight_sync_timeout
        info = weight_update_info
        try:
            names, dtypes, shapes = info["names"], info["dtype_names"], info["shapes"]
        except (KeyError, TypeError):
            raise ValueError("weight_update_info must be a dict with 'names', 'dtype_names' "
                             "and 'shapes' (as AsyncGRPOTrainer builds it)") from None
        if not (len(names) == len(dtypes) == len(shapes)) or not names:
            raise ValueError(f"weight_update_info: {len(names)} names, {len(dtypes)} dtype_names, "
                             f"{len(shapes)} shapes; they must be as many, and not none")
        self._weight_update_info = info
        self._metadata = [ParamMeta(n, _dtype(d), tuple(int(x) for x in s))
                          for n, d, s in zip(names, dtypes, shapes)]
        self._settings = _Settings(kind, dict(options or {}), dict(worker_options or {}), copy,
                                   staged, chunk_bytes, group_depth, flush_timeout_s)
        self._client = _HttpClient(self.vllm, self._CONTROL_TIMEOUT, weight_sync_timeout)
        self.engine: Optional[WsyncTrainerWeightTransferEngine] = None
        self.receivers = 0
        self._failed = False

    @classmethod
    def from_model(cls, vllm_client: Any, model: torch.nn.Module, **kwargs) -> "WsyncWeightTransfer":
        """For the model the trainer trains (before the trainer wraps it, or
        ``trainer.accelerator.unwrap_model(trainer.model)``)."""
        return cls(vllm_client, weight_update_info(model), **kwargs)

    @classmethod
    def from_pretrained(cls, vllm_client: Any, model_name_or_path: str,
                        dtype: Union[str, torch.dtype, None] = "float32",
                        trust_remote_code: bool = False, **kwargs) -> "WsyncWeightTransfer":
        """For the model ``AsyncGRPOTrainer(model=model_name_or_path, ...)`` will load with
        ``AsyncGRPOConfig(dtype=dtype)``: the manifest comes from the model built from its
        config on the meta device (no weights loaded, no memory), walked as the trainer walks
        it. ``dtype="auto"`` (or ``None``) takes the config's dtype. Not for a PEFT model or a
        vision-language model whose frozen parts the trainer skips: use :meth:`from_model`."""
        from transformers import AutoConfig, AutoModelForCausalLM

        config = AutoConfig.from_pretrained(model_name_or_path, trust_remote_code=trust_remote_code)
        if dtype in (None, "auto"):
            dtype = getattr(config, "dtype", None) or getattr(config, "torch_dtype", None) or torch.float32
        if isinstance(dtype, str):
            dtype = _dtype(dtype)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config, trust_remote_code=trust_remote_code,
                                                     dtype=dtype)
        return cls(vllm_client, weight_update_info(model), **kwargs)

    @property
    def server_url(self) -> str:
        return str(getattr(self.vllm, "server_url", self.vllm))

    # -- TRL's WeightTransferProtocol ------------------------------------------------------------

    def init_weight_transfer(self) -> None:
        """Creates the wsync sender for the server's workers and initialises them (once)."""
        if self.engine is not None:
            return
        self.vllm.wait_for_server_ready()
        self._check_dtype()
        try:
            self.receivers = int(self.vllm.get_world_size())
            s = self._settings
            info = WsyncTrainerInitInfo(
                rank=0, kind=s.kind, options=s.options, receivers=self.receivers,
                worker_options=s.worker_options, copy=s.copy, staged=s.staged,
                chunk_bytes=s.chunk_bytes, group_depth=s.group_depth,
                flush_timeout_s=s.flush_timeout_s)
            self.engine = WsyncTrainerWeightTransferEngine.trainer_init(info, client=self._client)
        except WsyncError as exc:
            raise self._named(exc, "setting up the wsync weight transfer") from exc
        except Exception as exc:
            raise RuntimeError(
                f"Failed to set up the wsync weight transfer with the vLLM server at "
                f"{self.server_url}: {exc}. Check that the server was started with "
                "VLLM_SERVER_DEV_MODE=1 and --weight-transfer-config '{\"backend\":\"wsync\"}', "
                "with the wsync package installed in its environment.") from exc
        logger.info("wsync weight transfer initialised with the vLLM server at %s (%d worker%s, %s)",
                    self.server_url, self.receivers, "" if self.receivers == 1 else "s",
                    self._settings.kind)

    def send_weights(self, iterator: Iterable[Tuple[str, torch.Tensor]]) -> None:
        """One version: every ``(name, tensor)`` of ``iterator`` to every worker."""
        engine = self.engine
        if engine is None:
            return
        source = _IteratorSource(self._metadata, iterator)
        began = time.time()
        try:
            if self._failed:
                # The server may have been restarted: wait for it (bounded by server_timeout).
                self.vllm.wait_for_server_ready()
            # A no-op for workers that hold the init info; attaches a restarted one.
            engine.reinit_workers()
            engine.source = source
            engine.send_weights()
        except BaseException as exc:
            self._failed = True
            if not isinstance(exc, Exception):
                raise
            try:
                source.drain()
            except Exception:  # the iterator's own failure: the sync's error matters more
                pass
            if isinstance(exc, WsyncError):
                raise self._named(exc, "weight sync") from exc
            raise RuntimeError(f"Weight sync to the vLLM server at {self.server_url} failed: "
                               f"{type(exc).__name__}: {exc}") from exc
        finally:
            engine.source = None
        self._failed = False
        logger.debug("[weight_sync] wsync send_weights took %.1fs", time.time() - began)

    def pause(self) -> None:
        self.vllm.pause(timeout=self._CONTROL_TIMEOUT)

    def resume(self) -> None:
        self.vllm.resume(timeout=self._CONTROL_TIMEOUT)

    def destroy(self) -> None:
        """Releases the workers' receivers (``POST /shutdown_weight_transfer_engine``, best
        effort: the server keeps serving, and a later trainer can initialise it again), then
        closes the sender and strategy. Idempotent."""
        engine, self.engine = self.engine, None
        if engine is None:
            return
        try:
            import requests

            requests.post(f"{self.server_url}/shutdown_weight_transfer_engine",
                          timeout=self._CONTROL_TIMEOUT)
        except Exception:  # a server that is gone has nothing to release
            pass
        engine.shutdown()

    # -- helpers ---------------------------------------------------------------------------------

    def _check_dtype(self) -> None:
        """TRL's warning when the server's dtype is not the weights' (best effort: a server
        without ``/server_info`` is not refused)."""
        try:
            served = str(self.vllm.get_dtype()).removeprefix("torch.")
        except Exception:
            return
        sent = Counter(self._weight_update_info["dtype_names"]).most_common(1)[0][0]
        if served != sent:
            logger.warning("The vLLM server serves in %s but the weights sent to it are %s. Set "
                           "`dtype` in `AsyncGRPOConfig` to '%s', or start the server with "
                           "`--dtype %s`.", served, sent, served, sent)

    def _named(self, exc: WsyncError, what: str) -> WsyncError:
        """``exc``'s class, status and failures, with a message naming the engine: the server
        and, for each failed receiver, its index, its worker's pid and its own message."""
        if exc.failures:
            who = "; ".join(f"wsync receiver {f.receiver} (vLLM worker pid {f.pid}) "
                            f"{f.what.name.lower()} ({_where(f)}): {f.status.c_name}: {f.message}"
                            for f in exc.failures)
        else:
            who = exc.message
        message = f"{what} to the vLLM engine at {self.server_url} failed: {who}"
        return error(exc.status, message, exc.failures)
