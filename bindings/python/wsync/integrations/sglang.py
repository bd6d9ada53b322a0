"""libwsync for SGLang 0.5.23: an engine-side custom weight loader and the trainer helper that
drives SGLang's HTTP weight-update endpoints.

SGLang has no transport plug-in. What it offers (verified in the sglang 0.5.23 wheel) is a
*custom loader* for ``update_weights_from_tensor``: a function named by its dotted path,
allow-listed at launch with ``--custom-weight-loader wsync.integrations.sglang.load_weights``
and selected per call with ``load_format="wsync.integrations.sglang.load_weights"``.
``model_executor/model_runner_components/weight_updater.py`` (``update_weights_from_tensor``)
calls it as ``dynamic_import(load_format)(model, named_tensors)`` with the call's deserialized
``(name, tensor)`` pairs (``tensor.to(device)``), and SGLang's scheduler only accepts the call
inside an engine-owned session, ``/begin_weight_update`` ... ``/end_weight_update``
(``managers/scheduler_components/weight_updater.py``).

So the wsync request blobs ride *inside* that payload: each ``/update_weights_from_tensor``
call carries one tensor, :data:`PAYLOAD_NAME`, whose uint8 bytes are a small JSON document
(the strategy's init info, receiver-side options, this TP rank's receiver index, and the
chunk's request blobs, base64). ``serialized_named_tensors`` has one entry per TP rank (each
rank deserializes only its own), pickled with the standard pickler (the tensor's bytes inline;
SGLang's ``SafeUnpickler`` admits ``torch._utils._rebuild_tensor_v2`` and torch's storage
loader), base64 for JSON.

Engine side, :func:`load_weights` (the custom loader):

- keeps one wsync receiver per model (created from the first payload's init info; a payload
  with another init info, i.e. a new trainer, closes the old receiver and opens a new one);
- receives each request of the call, copying every tensor out of the library's memory
  (:meth:`wsync.Iteration.copy_into`, checksum verified in the same pass; split tensors are
  assembled), and *stages* the copies: the model is not touched while a version is in flight;
- on the chunk that commits the version, loads the staged tensors with the model's own
  ``load_weights`` (SGLang's stacked ``qkv_proj``/``gate_up_proj`` mapping, its weight
  loaders). Before that it snapshots the model's parameters and buffers (``rollback=True``,
  the default: one model's worth of memory on the model's device during the load); if
  ``load_weights`` raises (a shape that does not fit) or SGLang skipped a name it does not know
  (it only logs "Parameter ... not found in params_dict"), the snapshot is copied back and the
  chunk fails with ``MISMATCH`` naming the tensor. The version then never completes on this
  receiver, and SGLang serves the previous complete version, bit for bit.

Failures never raise into SGLang. SGLang ignores the loader's return value (it answers
``success: true`` whatever happened) and does not catch the loader's exceptions: one escaping
``update_weights_from_tensor`` leaves the scheduler's event loop (``Scheduler.
process_input_requests`` calls the dispatcher without a handler) and takes the server down. So
the loader logs, fails the wsync chunk with the error's status and a message naming the
receiver, the engine's pid and the tensor, discards the staged version, and returns. The
trainer hears it through libwsync: its ``Sender.flush`` raises with that receiver's failure.

Trainer side, :class:`SGLangWeightSync`: ``init()`` (strategy and sender, ``/health``),
``update(source, weight_version=...)`` (one version: ``/begin_weight_update``, one
``/update_weights_from_tensor`` per chunk, ``Sender.flush``, ``/end_weight_update``), and
``destroy()`` (detaches the engine's receivers, closes the sender). Every HTTP call has a
bounded timeout, and a call that timed out is not waited on again (see
:meth:`SGLangWeightSync.update`).

This module imports torch, not SGLang: the loader runs inside SGLang's process, and the trainer
helper speaks SGLang's HTTP API with ``requests``.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import pickle
import threading
from typing import Any, Dict, List, Optional, Tuple

import torch

from .._core import Strategy, describe, status_for_exception
from .._errors import Status, WsyncError, error
from ..trainer import iter_chunks

logger = logging.getLogger(__name__)

#: The loader's dotted name: ``--custom-weight-loader`` and ``load_format`` take this.
LOADER = "wsync.integrations.sglang.load_weights"
#: The name of the uint8 tensor that carries the wsync payload in ``named_tensors``.
PAYLOAD_NAME = "__wsync_payload__"
#: Kinds whose receivers hand over GPU memory: the library cannot copy out of it into a
#: tensor, so their chunks are staged as device clones of the views (no split tensors).
GPU_KINDS = ("cuda_ipc", "nccl_broadcast")


def _b64(blob: bytes) -> str:
    return base64.b64encode(bytes(blob)).decode("ascii")


def encode_payload(payload: Dict[str, Any]) -> str:
    """One TP rank's ``serialized_named_tensors`` entry: ``[(PAYLOAD_NAME, uint8 tensor of the
    JSON payload)]``, pickled (bytes inline) and base64 encoded for SGLang's JSON API."""
    data = bytearray(json.dumps(payload, sort_keys=True).encode("utf-8"))
    tensor = torch.frombuffer(data, dtype=torch.uint8).clone()
    return _b64(pickle.dumps([(PAYLOAD_NAME, tensor)], protocol=pickle.HIGHEST_PROTOCOL))


def decode_payload(named_tensors) -> Dict[str, Any]:
    """The payload a call carries (``ValueError`` when it carries none, or something else)."""
    pairs = list(named_tensors)
    if len(pairs) != 1 or pairs[0][0] != PAYLOAD_NAME:
        raise ValueError(f"the wsync loader takes one tensor named {PAYLOAD_NAME!r}, got "
                         f"{[name for name, _ in pairs][:4]}")
    tensor = pairs[0][1]
    if not isinstance(tensor, torch.Tensor) or tensor.dtype != torch.uint8 or tensor.dim() != 1:
        raise ValueError(f"{PAYLOAD_NAME} must be a 1-D uint8 tensor")
    payload = json.loads(bytes(tensor.cpu().numpy()).decode("utf-8"))
    if not isinstance(payload, dict) or not isinstance(payload.get("index"), int):
        raise ValueError(f"{PAYLOAD_NAME} is not a wsync payload (no receiver index)")
    return payload


# -- engine side -------------------------------------------------------------------------------

class _Engine:
    """One model's receiver and its staged version."""

    def __init__(self) -> None:
        self.key: Optional[str] = None
        self.strategy: Optional[Strategy] = None
        self.receiver = None
        self.staged: List[Tuple[str, torch.Tensor]] = []
        self.partial: Optional[Tuple[str, torch.Tensor]] = None
        self.rollback = True
        self.gpu = False

    def attach(self, payload: Dict[str, Any]) -> None:
        key = json.dumps([payload.get("init_info"), payload.get("options", {}), payload["index"]],
                         sort_keys=True)
        if key == self.key:
            return
        self.detach()
        init_info = base64.b64decode(payload["init_info"], validate=True)
        options = dict(payload.get("options", {}))
        gpu = describe(init_info).get("kind") in GPU_KINDS
        if gpu and "device" not in options:
            options["device"] = torch.cuda.current_device()  # this TP rank's GPU
        strategy = Strategy.for_init_info(init_info, **options)
        try:
            self.receiver = strategy.receiver(init_info, payload["index"])
        except BaseException:
            strategy.close()
            raise
        self.strategy, self.key, self.gpu = strategy, key, gpu

    def detach(self) -> None:
        self.discard()
        receiver, self.receiver = self.receiver, None
        strategy, self.strategy = self.strategy, None
        self.key = None
        if receiver is not None:
            receiver.close()
        if strategy is not None:
            strategy.close()

    def discard(self) -> None:
        self.staged, self.partial = [], None

    def stage(self, it) -> None:
        """Copies every entry of the chunk into fresh tensors (split tensors assembled); for
        the GPU kinds, takes the iteration's device clones (``receive(copy=True)``)."""
        if self.gpu:
            self.staged.extend(it)
            return
        for i in range(len(it)):
            meta = it.peek(i)
            offset, nbytes = it.part(i)
            held = self.partial is not None and self.partial[0] == meta.name
            dst = self.partial[1] if held else torch.empty(meta.shape, dtype=meta.dtype.to_torch())
            whole = dst.numel() * dst.element_size()
            if (offset, nbytes) != (0, whole) and self.partial is not None and not held:
                raise error(Status.MISMATCH, f"a part of tensor '{meta.name}' arrived while split "
                            f"tensor '{self.partial[0]}' was still incomplete")
            it.copy_into(i, dst)
            if offset + nbytes < whole:
                self.partial = (meta.name, dst)
                continue
            if held:
                self.partial = None
            self.staged.append((meta.name, dst))

    def commit(self, model: torch.nn.Module) -> None:
        """Loads the staged version with ``model.load_weights``; on any failure (or a name
        SGLang skipped) restores the snapshot and raises."""
        staged, self.staged = self.staged, []
        snapshot = None
        if self.rollback:
            snapshot = [(t, t.detach().clone()) for t in _tensors(model)]
        skipped = _SkippedNames(model)
        current: List[Any] = [None]

        def pairs():
            for name, tensor in staged:
                current[0] = (name, tensor)
                yield name, tensor

        try:
            with torch.no_grad(), skipped:
                try:
                    model.load_weights(pairs())
                except Exception as exc:
                    if isinstance(exc, (MemoryError, WsyncError)) or current[0] is None:
                        raise
                    name, tensor = current[0]
                    raise error(Status.MISMATCH, f"SGLang's {type(model).__name__}.load_weights "
                                f"failed on tensor '{name}' ({str(tensor.dtype).removeprefix('torch.')} "
                                f"{list(tensor.shape)}): {type(exc).__name__}: {exc}") from exc
            if skipped.names:
                raise error(Status.MISMATCH, f"SGLang's {type(model).__name__}.load_weights does "
                            f"not know tensor '{skipped.names[0]}'"
                            + (f" (and {len(skipped.names) - 1} more)" if len(skipped.names) > 1 else ""))
        except BaseException:
            if snapshot is not None:
                with torch.no_grad():
                    for live, saved in snapshot:
                        live.copy_(saved)
            raise
        finally:
            # A raised error's traceback keeps this frame: drop the version and the snapshot.
            staged.clear()
            snapshot = current[0] = None


def _tensors(model: torch.nn.Module) -> List[torch.Tensor]:
    seen, out = set(), []
    for t in list(model.parameters()) + list(model.buffers()):
        if id(t) not in seen:
            seen.add(id(t))
            out.append(t.data)
    return out


class _SkippedNames(logging.Handler):
    """Collects the names SGLang's model ``load_weights`` skips: SGLang models log
    ``Parameter <name> not found in params_dict`` on their module's logger and go on."""

    MARK = " not found in params_dict"

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__(logging.WARNING)
        self.logger = logging.getLogger(type(model).__module__)
        self.names: List[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        text = record.getMessage()
        if self.MARK in text:
            self.names.append(text.split(self.MARK)[0].removeprefix("Parameter ").strip())

    def __enter__(self):
        self.logger.addHandler(self)
        return self

    def __exit__(self, *exc) -> None:
        self.logger.removeHandler(self)


_engines: Dict[int, _Engine] = {}
_engines_lock = threading.Lock()


def _engine_for(model: torch.nn.Module) -> _Engine:
    with _engines_lock:
        engine = _engines.get(id(model))
        if engine is None:
            engine = _engines[id(model)] = _Engine()
        return engine


def load_weights(model: torch.nn.Module, named_tensors) -> None:
    """SGLang's custom loader (``load_format=LOADER``): receives the call's wsync requests into
    ``model`` (see the module documentation). Never raises: failures are logged and reported to
    the trainer through the wsync chunk."""
    try:
        payload = decode_payload(named_tensors)
        engine = _engine_for(model)
        if payload.get("detach"):
            engine.detach()
            return
        engine.attach(payload)
        engine.rollback = bool(payload.get("rollback", True))
    except Exception as exc:
        logger.error("wsync loader (pid %d): refused a payload: %s: %s", os.getpid(),
                     type(exc).__name__, exc)
        return
    receiver = engine.receiver
    for request in payload.get("requests", []):
        try:
            blob = base64.b64decode(request, validate=True)
            with receiver.receive(blob, framework="torch", copy=engine.gpu) as it:
                try:
                    engine.stage(it)
                    if it.info.last:
                        engine.commit(model)
                except BaseException as exc:
                    engine.discard()
                    text = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
                    it.fail(status_for_exception(exc),
                            f"SGLang engine (receiver {receiver.index}, pid {os.getpid()}) "
                            f"version {it.info.version}: {text}")
                    raise
        except Exception as exc:
            engine.discard()
            logger.error("wsync loader (receiver %d, pid %d): %s: %s", receiver.index,
                         os.getpid(), type(exc).__name__, exc)
            return


# -- trainer side ------------------------------------------------------------------------------

class SGLangWeightSync:
    """Drives one SGLang server's weight updates over libwsync (see the module documentation).

    Args:
        url: the server's base URL (``http://host:port``), started with
            ``--custom-weight-loader wsync.integrations.sglang.load_weights``.
        kind, options: the wsync strategy and its sender-side options (``shm`` for a server on
            this host, ``cuda_ipc`` for GPUs on this host, ``ucx`` across hosts). ``receivers``
            defaults to ``tp_size``.
        engine_options: receiver-side strategy options, sent to every TP rank.
        tp_size: the server's tensor-parallel size: one receiver per TP rank, index
            ``rank_offset + tp_rank``.
        chunk_bytes, group_depth: the planner's (:func:`wsync.trainer.iter_chunks`).
        rollback: the engine snapshots its weights before loading a version and restores them
            if the load fails (default); ``False`` saves that memory and leaves a failed
            load's partial writes in place.
        http_timeout_s: the bound of every HTTP call (connect and read).
        flush_timeout_s: how long a version waits for every receiver's acknowledgement.
    """

    def __init__(self, url: str, *, kind: str = "shm", options: Optional[Dict[str, Any]] = None,
                 engine_options: Optional[Dict[str, Any]] = None, tp_size: int = 1,
                 rank_offset: int = 0, chunk_bytes: Optional[int] = None, group_depth: int = 2,
                 rollback: bool = True, http_timeout_s: float = 300.0,
                 flush_timeout_s: float = 60.0):
        if not isinstance(tp_size, int) or tp_size < 1:
            raise ValueError(f"tp_size must be a positive int, got {tp_size!r}")
        self.url = url.rstrip("/")
        self.kind = kind
        self.options = dict(options or {})
        self.options.setdefault("receivers", rank_offset + tp_size)
        self.engine_options = dict(engine_options or {})
        self.tp_size, self.rank_offset = tp_size, rank_offset
        self.chunk_bytes, self.group_depth = chunk_bytes, group_depth
        self.rollback = rollback
        self.http_timeout_s, self.flush_timeout_s = http_timeout_s, flush_timeout_s
        self.strategy: Optional[Strategy] = None
        self.sender = None
        self._init_info = b""
        self._session_unknown = False
        self._attached = False

    # -- HTTP ---------------------------------------------------------------------------------

    def _call(self, method: str, path: str, body: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
        """One HTTP call bounded by ``http_timeout_s``; ``RuntimeError`` naming the server, the
        endpoint and SGLang's message on any failure (a refused ``success: false`` too)."""
        import requests

        where = f"SGLang server at {self.url} ({method} {path})"
        try:
            response = requests.request(method, self.url + path, json=body,
                                        timeout=self.http_timeout_s)
        except requests.Timeout as exc:
            raise TimeoutError(f"{where}: no answer within {self.http_timeout_s:g} s") from exc
        except requests.RequestException as exc:
            raise RuntimeError(f"{where}: {type(exc).__name__}: {exc}") from exc
        if response.status_code != 200:
            raise RuntimeError(f"{where}: HTTP {response.status_code}: {response.text[:500]}")
        try:
            answer = response.json() if response.content else {}
        except ValueError:
            answer = {}
        if isinstance(answer, dict) and answer.get("success") is False:
            raise RuntimeError(f"{where}: {answer.get('message')}")
        return answer if isinstance(answer, dict) else {}

    def _payload(self, tp_rank: int, **extra: Any) -> Dict[str, Any]:
        return {"init_info": _b64(self._init_info), "options": self.engine_options,
                "index": self.rank_offset + tp_rank, "rollback": self.rollback, **extra}

    def _post_tensor(self, *, final: bool = False, weight_version: Optional[str] = None,
                     **extra: Any) -> None:
        """``/update_weights_from_tensor`` with the wsync payload. SGLang flushes its cache and
        records ``weight_version`` after any call that returns (whatever the loader did), so
        both ride only on the ``final`` call, made once every receiver acknowledged the
        version."""
        body = {"serialized_named_tensors": [encode_payload(self._payload(r, **extra))
                                             for r in range(self.tp_size)],
                "load_format": LOADER, "selector": "target", "flush_cache": final}
        if final and weight_version is not None:
            body["weight_version"] = weight_version
        self._call("POST", "/update_weights_from_tensor", body)

    def _end(self) -> None:
        try:
            self._call("POST", "/end_weight_update", {})
        except BaseException:
            self._session_unknown = True
            raise

    def _begin(self) -> None:
        try:
            self._call("POST", "/begin_weight_update", {"selector": "target"})
        except TimeoutError:
            self._session_unknown = True  # it may have opened after all
            raise
        except RuntimeError as exc:
            # A session the trainer could not close (a call that timed out) is closed once.
            if not self._session_unknown or "already open" not in str(exc):
                raise
            self._call("POST", "/end_weight_update", {})
            self._call("POST", "/begin_weight_update", {"selector": "target"})
        self._session_unknown = False

    # -- lifecycle ----------------------------------------------------------------------------

    def init(self) -> None:
        """Creates the strategy and sender and checks that the server answers ``/health``.
        The engine's receivers attach at the start of the first version, whose
        ``/begin_weight_update`` closes a session that a previous trainer left open (SGLang
        keeps one per server). Idempotent."""
        if self.sender is not None:
            return
        self._call("GET", "/health")
        strategy = Strategy(self.kind, **self.options)
        try:
            self._init_info = strategy.create_init_info()
            self.sender = strategy.sender(self._init_info)
        except BaseException:
            strategy.close()
            raise
        self.strategy = strategy
        # A session a previous trainer left open (it died between begin and end) is closed by
        # the first update, once.
        self._session_unknown = True

    def update(self, source, *, weight_version: Optional[str] = None) -> int:
        """Sends ``source`` (an ``nn.Module``, a state dict, ``(name, tensor)`` pairs or a
        :class:`wsync.trainer.LazySource`, under checkpoint names) as one version and returns
        its number once every receiver acknowledged it (SGLang then serves it).

        Raises, with nothing left open: the library's exception re-made naming the server and
        each failed receiver with its engine's message (a load that failed, a name or shape
        SGLang refused, an engine process that died), chained to the original; ``TimeoutError``
        when an HTTP call got no answer within ``http_timeout_s`` (that call is not waited on
        again: the version is abandoned, the session is not closed by a second wait, and the
        next ``update`` closes it first); ``RuntimeError`` naming the server and endpoint for
        any other HTTP failure. A failed version leaves the engine serving the previous one."""
        if self.sender is None:
            raise error(Status.WRONG_STATE, "SGLangWeightSync.update before init() or after destroy()")
        sender = self.sender
        self._begin()
        try:
            if not self._attached:
                # Receivers join at a version's start: attach them before its first chunk
                # (a no-op for a receiver that holds this init info).
                self._post_tensor(requests=[])
                self._attached = True
            for chunk in iter_chunks(source, chunk_bytes=self.chunk_bytes,
                                     group_depth=self.group_depth):
                request = sender.send_chunk(chunk.tensors, last=chunk.last, parts=chunk.parts)
                try:
                    self._post_tensor(requests=[_b64(request)])
                except RuntimeError as exc:  # not a timeout: did an engine fail or die?
                    self._engine_failure(exc)
                    raise
            sender.flush(timeout_s=self.flush_timeout_s)
            version = sender.version
            # The version is served: now SGLang's cache flush and its weight_version label.
            self._post_tensor(final=True, weight_version=weight_version, requests=[])
        except BaseException as exc:
            self._attached = False  # an engine restarted since attaches before the next version
            self._abandon(exc)
            if isinstance(exc, WsyncError):
                raise self._named(exc) from exc
            raise
        self._end()
        return version

    def _engine_failure(self, exc: BaseException) -> None:
        """After an HTTP error: if a receiver failed its chunk or died, raise the sender's
        error naming it (with the engine's own message), chained to ``exc``."""
        try:
            self.sender.flush(timeout_s=min(5.0, self.flush_timeout_s))
        except WsyncError as failure:
            if failure.failures:
                raise failure from exc

    def _abandon(self, exc: BaseException) -> None:
        """Abandons the version and closes the session, unless the server stopped answering."""
        try:
            self.sender.abandon()
        except WsyncError:
            pass  # nothing open (the failure came after the commit)
        if isinstance(exc, TimeoutError):
            self._session_unknown = True
            return
        try:
            self._call("POST", "/end_weight_update", {})
        except Exception:  # a dead server has no session to close
            self._session_unknown = True

    def _named(self, exc: WsyncError) -> WsyncError:
        if exc.failures:
            who = "; ".join(f"receiver {f.receiver} (pid {f.pid}) {f.what.name.lower()}: "
                            f"{f.status.c_name}: {f.message}" for f in exc.failures)
        else:
            who = exc.message
        return error(exc.status, f"weight update to the SGLang server at {self.url} failed: {who}",
                     exc.failures)

    def destroy(self) -> None:
        """Detaches the engine's receivers (best effort, bounded: a server that is gone has
        nothing to release) and closes the sender and strategy. Idempotent."""
        sender, self.sender = self.sender, None
        strategy, self.strategy = self.strategy, None
        if sender is None:
            return
        try:
            self._begin()
            self._post_tensor(detach=True)
            self._end()
        except Exception as exc:
            logger.warning("wsync: detaching the SGLang server at %s: %s", self.url, exc)
        sender.close()
        if strategy is not None:
            strategy.close()
