"""The ``wsync`` checkpoint engine for verl 0.9.1 (``verl.checkpoint_engine``).

Selecting it in verl's config::

    actor_rollout_ref.rollout.checkpoint_engine.backend=wsync
    actor_rollout_ref.rollout.checkpoint_engine.custom_backend_module=wsync.integrations.verl
    # optional, passed to the constructor as keyword arguments:
    +actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.wsync.kind=shm

verl imports ``custom_backend_module`` (``verl.utils.import_utils.import_external_libs``) on the
actor workers, in ``CheckpointEngineManager`` and in every ``CheckpointEngineWorker`` before it
calls ``CheckpointEngineRegistry.new("wsync", bucket_size=..., **engine_kwargs)`` (actor
workers also pass ``is_master=(rank == 0)``); importing this module registers
:class:`WsyncCheckpointEngine` under ``"wsync"``.

verl 0.9.1's contract, as this engine follows it (``CheckpointEngineManager.update_weights``),
once per weight update:

1. ``prepare()`` on every actor worker, then on every rollout worker (sync; Ray collects the
   results in that order). Each returns a small dict of plain values (:data:`METADATA_KEYS`):
   host, node, device, pid, and for the master (actor rank 0) the address of its request
   channel, a TCP socket it listens on from its first ``prepare``, and the channel's secret
   (32 random bytes, new at every ``prepare``).
2. ``build_topology(actor_world_size, rollout_world_size, metadata)`` (a classmethod, run by
   the manager): actor rank 0 is the sender, every other actor worker sits the sync out
   (rank -1, as verl's ``nccl`` and ``nixl`` engines), rollout worker ``i`` is wsync receiver
   ``i``; it picks the kind (``kind="auto"``, below) and gives every worker the master's
   address, and the rollout workers (only them) the secret.
3. ``init_process_group(rank=..., world_size=..., master_address=..., kind=..., role=...)``
   (sync, all workers at once): each rollout worker connects to the master, both prove they
   hold the secret (below) and the worker says *hello*
   (its index, pid, host); the master makes the wsync strategy (``receivers`` = the number of
   rollout workers, ``bucket_bytes`` = verl's bucket size) the first time, or again when that
   number or the kind changed, and answers with the init info; the worker makes its receiver
   (or keeps the one it has for the same init info) and says *ready*. The master returns once
   every rollout worker is ready, or raises naming the ones that did not come
   (``connect_timeout_s``).
4. ``send_weights(weights, global_steps)`` (async) on the actor workers and
   ``receive_weights(global_steps)`` (an async generator) on the rollout workers, at the same
   time. The master streams verl's ``(name, tensor)`` generator into chunks of at most
   ``bucket_size`` bytes (a larger tensor is split into byte-range parts, one chunk each, as
   verl's own ``split_weight_chunks`` does), sends each with ``Sender.send_chunk`` and writes
   its request blob to every rollout worker's channel; then ``Sender.flush``. Each rollout
   worker receives the requests in order and yields ``(name, tensor)``: zero-copy views of the
   chunk (valid until the consumer asks for the item after the chunk's last tensor, the same
   lifetime verl's ``nccl`` engine gives its bucket views), or a tensor assembled from the
   parts of a split one; ``copy=True`` yields owned copies. Non-master actor workers walk the
   generator (producing a weight is collective across the actor group) and send nothing.
5. ``finalize()`` (sync): the channels close. Strategy, sender and receivers stay: the next
   update is the next wsync version (versions count per init info, from 1).

Kinds (``kind`` engine kwarg). ``"auto"`` (the default) picks from the placement ``prepare``
reported: every rollout worker on the master's node -> ``cuda_ipc`` when the master and all
rollout workers have CUDA (colocated or one-node disaggregated), else ``shm``; some rollout
worker on another node -> ``nccl_broadcast`` with CUDA everywhere, else ``ucx``. Any kind the
library has can be named instead; ``options`` are the strategy's sender-side options
(``wsync.describe_options(kind)``) and ``receiver_options`` the receivers'. With the host kinds
(``shm``, ``ucx``) CUDA tensors of the trainer are copied to host memory one chunk at a time; with
the GPU kinds each rollout worker receives on its current CUDA device (``device`` option).

What crosses the request channel is ours, never pickled: frames of a type byte and a 32-bit
length, with JSON for *hello*, *init*, *ready* and *abort* and the raw request blobs. What
``prepare`` returns crosses Ray as a plain dict of str/int values.

The request channel is authenticated (trust model: docs/integrations/verl.md). On accepting a
connection the master sends a challenge (a fresh 32-byte nonce); the worker answers with its
receiver index, a nonce of its own and HMAC-SHA256(secret, "worker-proof", :data:`PROTOCOL`,
index, both nonces); the master checks it and answers HMAC-SHA256(secret, "master-proof", ...),
which the worker checks. Every later frame carries HMAC-SHA256 under a key derived from the
secret, the index and both nonces, over the direction, the frame's sequence number, its type and
payload, checked before the frame is used. A connection that fails is closed having received
only the master's nonce, and the master logs it (``refused``, logger ``wsync.integrations.verl``)
with its address; a rollout worker whose master fails to prove itself, or that gets a frame
whose HMAC is wrong, raises naming the address (with a bad frame it also closes its receiver,
so the master names it ``DETACHED``). Handshakes run at most ``max_pending`` at a time, each
for at most ``handshake_timeout_s``; handshake frames are at most 256 bytes, a worker's frames
64 KiB.

Failures. Every libwsync failure reaches verl's caller as a :class:`wsync.WsyncError` (the
subclass for its status, :func:`wsync._errors.error`), its message prefixed by this engine's
context: the side, ``global_steps`` and version, and for receiver failures each rollout
worker as ``rollout worker <i> (pid <p> on <host>)`` with the library's own record
(``failures``: died, failed, timed out, its status and message). On the master (``send_weights``
raised inside verl's ``ActorRolloutRefWorker.update_weights``, so ``ray.get`` in
``CheckpointEngineManager.update_weights`` raises it) any failure abandons the version (no
rollout worker completes it; each keeps its previous weights as its completed version, though
tensors of the failed version its server adapter already loaded stay loaded) and sends every
rollout worker still connected an *abort*, so their ``receive_weights`` raise
``AbandonedError`` instead of waiting. A rollout worker that died (``DIED``) or went away
(``DETACHED``) is dropped from the sender (``drop_receiver``), so a fresh rollout worker with
the same index re-attaches at the next update's ``init_process_group`` and takes part from
that version on. On a rollout worker, a receive error, an abort, the trainer's channel
closing or ``recv_timeout_s`` without a request raises from ``receive_weights`` naming the
worker; if its server adapter stops consuming, the open chunk is failed with that reason, which
the master reports.

This module imports verl and torch; import it only where verl is installed.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import json
import logging
import os
import queue
import secrets
import socket
import struct
import threading
import time
from typing import Any, AsyncGenerator, Dict, List, Optional, Set, Tuple

import torch
from verl.checkpoint_engine.base import CheckpointEngine, CheckpointEngineRegistry
from verl.workers.rollout.utils import ensure_async_iterator

from .._core import Receiver, Sender, Strategy, describe
from .._errors import FailureKind, Status, WsyncError, error

#: The backend name in ``checkpoint_engine.backend``.
BACKEND = "wsync"

#: Strategies that move GPU memory: a rollout worker receives on its own CUDA device.
GPU_KINDS = ("cuda_ipc", "nccl_broadcast")
#: Strategies that move host memory: CUDA tensors are copied to the host one chunk at a time.
HOST_KINDS = ("shm", "ucx")
#: Kinds whose strategy takes a ``bucket_bytes`` option (verl's bucket size).
BUCKET_KINDS = ("shm", "cuda_ipc", "nccl_broadcast")

#: The keys of the dict ``prepare`` returns.
METADATA_KEYS = ("backend", "host", "node", "pid", "device", "master_address", "master_secret",
                 "kind")

_log = logging.getLogger(__name__)

# Request-channel frames: one type byte, a big-endian 32-bit length, the payload; after the
# handshake each frame is followed by its HMAC-SHA256 tag (_Channel).
_HELLO, _INIT, _READY, _REQUEST, _ABORT = b"H", b"I", b"Y", b"R", b"A"
# The handshake: the master's challenge (its nonce), a rollout worker's proof (index, its nonce,
# its HMAC), the master's proof (its HMAC).
_CHALLENGE, _PROOF, _CONFIRM = b"C", b"P", b"K"
_HEADER = struct.Struct("!cI")
_INDEX = struct.Struct("!I")
_SEQ = struct.Struct("!Q")
#: The protocol tag every handshake and frame HMAC covers.
PROTOCOL = b"wsync-verl-request-channel/1"
_SECRET_BYTES = 32
_NONCE_BYTES = 32
_MAC_BYTES = hashlib.sha256().digest_size
#: The largest frame before the handshake (a proof is 68 bytes).
_MAX_HANDSHAKE_FRAME = 256
#: The largest authenticated frame a rollout worker sends the master (hello, ready).
_MAX_UP_FRAME = 64 << 10
#: The largest authenticated frame the master sends a rollout worker (init info, requests).
_MAX_FRAME = 1 << 30


class ChannelAuthError(ConnectionError):
    """A peer of the request channel failed authentication (handshake or a frame's HMAC)."""


def _mac(key: bytes, *parts: bytes) -> bytes:
    """HMAC-SHA256 over ``parts``, each prefixed by its length (no two part lists collide)."""
    h = hmac.new(key, digestmod=hashlib.sha256)
    for part in parts:
        h.update(_INDEX.pack(len(part)))
        h.update(part)
    return h.digest()


def _handshake_macs(secret: bytes, index: int, master_nonce: bytes, worker_nonce: bytes
                    ) -> Tuple[bytes, bytes, bytes]:
    """(the rollout worker's proof, the master's proof, the connection's frame key)."""
    common = (PROTOCOL, _INDEX.pack(index), master_nonce, worker_nonce)
    return (_mac(secret, b"worker-proof", *common), _mac(secret, b"master-proof", *common),
            _mac(secret, b"frame-key", *common))


def _node_id() -> str:
    """This machine: hostname plus the kernel's boot id (two containers with one hostname on
    different machines differ)."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
    except OSError:
        boot = ""
    return f"{socket.gethostname()}/{boot}"


def _node_ip() -> str:
    """The address other nodes reach this one at (verl's engines use Ray's view of it)."""
    override = os.environ.get("WSYNC_VERL_HOST")
    if override:
        return override
    try:
        import ray

        return ray.util.get_node_ip_address().strip("[]")
    except Exception:
        return "127.0.0.1"


def _send_frame(sock: socket.socket, kind: bytes, payload: bytes) -> None:
    sock.sendall(_HEADER.pack(kind, len(payload)) + payload)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray()
    while len(buf) < n:
        part = sock.recv(min(n - len(buf), 1 << 20))
        if not part:
            raise ConnectionError("the peer closed the channel")
        buf += part
    return bytes(buf)


def _recv_frame(sock: socket.socket, limit: int = _MAX_HANDSHAKE_FRAME) -> Tuple[bytes, bytes]:
    """One unauthenticated (handshake) frame of at most ``limit`` bytes."""
    kind, length = _HEADER.unpack(_recv_exact(sock, _HEADER.size))
    if length > limit:
        raise ConnectionError(f"a frame of {length} bytes is larger than the {limit} bytes the "
                              "channel allows here")
    return kind, _recv_exact(sock, length)


class _Channel:
    """An authenticated connection: every frame carries HMAC-SHA256(key, direction, sequence
    number, type, payload), checked before the frame is returned. The master's frames and the
    rollout worker's are numbered apart, from 0 each."""

    def __init__(self, sock: socket.socket, key: bytes, master: bool, peer: str, limit: int):
        self.sock, self.key, self.peer, self.limit = sock, key, peer, limit
        self._out, self._in = (b"M", b"W") if master else (b"W", b"M")
        self._sent = self._received = 0

    def send(self, kind: bytes, payload: bytes) -> None:
        tag = _mac(self.key, PROTOCOL, self._out, _SEQ.pack(self._sent), kind, payload)
        self.sock.sendall(_HEADER.pack(kind, len(payload)) + payload + tag)
        self._sent += 1

    def recv(self) -> Tuple[bytes, bytes]:
        kind, length = _HEADER.unpack(_recv_exact(self.sock, _HEADER.size))
        if length > self.limit:
            raise ChannelAuthError(f"{self.peer} sent a frame of {length} bytes, more than the "
                                   f"{self.limit} the channel allows")
        payload = _recv_exact(self.sock, length)
        tag = _recv_exact(self.sock, _MAC_BYTES)
        want = _mac(self.key, PROTOCOL, self._in, _SEQ.pack(self._received), kind, payload)
        if not hmac.compare_digest(tag, want):
            raise ChannelAuthError(f"frame {self._received} from {self.peer} failed its HMAC "
                                   "check (tampered, replayed or out of order)")
        self._received += 1
        return kind, payload

    def settimeout(self, t: Optional[float]) -> None:
        self.sock.settimeout(t)

    def close(self) -> None:
        try:
            self.sock.close()
        except OSError:
            pass


def _json(payload: Dict[str, Any]) -> bytes:
    return json.dumps(payload).encode("utf-8")


def _with_context(exc: WsyncError, context: str) -> WsyncError:
    """The same kind of error (status, failures) with ``context`` before its message."""
    return error(exc.status, f"{context}: {exc.message}", exc.failures)


class _Peer:
    """The master's view of one rollout worker for one update."""

    def __init__(self, chan: _Channel, index: int, pid: int, host: str):
        self.chan = chan
        self.index = index
        self.pid = pid
        self.host = host
        self.broken: Optional[str] = None

    def __str__(self) -> str:
        return f"rollout worker {self.index} (pid {self.pid} on {self.host})"


@CheckpointEngineRegistry.register(BACKEND)
class WsyncCheckpointEngine(CheckpointEngine):
    """verl checkpoint engine over libwsync (see the module documentation).

    Args:
        bucket_size: verl's ``update_weights_bucket_megabytes << 20``: the largest chunk, and
            the strategy's ``bucket_bytes`` for the kinds that have buckets.
        is_master: True on actor rank 0, the sender.
        kind: ``"auto"`` or a libwsync kind (``shm``, ``cuda_ipc``, ``nccl_broadcast``,
            ``ucx``).
        options: sender-side strategy options (``buckets``, ``checksum``, ``timeout_ms``...).
        receiver_options: receiver-side options (``verify``...).
        host: the address the master's request channel listens on (default: ``$WSYNC_VERL_HOST``
            or Ray's node address).
        flush_timeout_s: how long ``send_weights`` waits for every rollout worker.
        connect_timeout_s: how long ``init_process_group`` waits for every rollout worker to
            connect and make its receiver.
        recv_timeout_s: how long a rollout worker waits for the next request.
        copy: rollout workers yield owned copies instead of views of the chunk.
        handshake_timeout_s: how long the master gives one connection to authenticate.
        max_pending: how many connections may be authenticating at once on the master; more
            are closed at once (the rollout workers retry until ``connect_timeout_s``).
    """

    def __init__(
        self,
        bucket_size: int,
        is_master: bool = False,
        kind: str = "auto",
        options: Optional[Dict[str, Any]] = None,
        receiver_options: Optional[Dict[str, Any]] = None,
        host: Optional[str] = None,
        flush_timeout_s: float = 60.0,
        connect_timeout_s: float = 60.0,
        recv_timeout_s: float = 600.0,
        copy: bool = False,
        handshake_timeout_s: float = 5.0,
        max_pending: int = 16,
    ) -> None:
        if not isinstance(bucket_size, int) or bucket_size <= 0:
            raise ValueError(f"bucket_size must be a positive number of bytes, not {bucket_size!r}")
        options = dict(options or {})
        receiver_options = dict(receiver_options or {})
        if str(options.get("delta", "off")) != "off" and not receiver_options.get("delta_mirror"):
            # Patches need the receiver's previous tensors; verl's adapters load whole ones.
            raise ValueError(f"options['delta'] = {options['delta']!r}: verl's server adapters "
                             "load whole tensors; add receiver_options={'delta_mirror': True} "
                             "(each rollout worker keeps a host copy of the model and hands "
                             "verl whole tensors) or leave delta 'off'")
        self.bucket_size = bucket_size
        self.is_master = bool(is_master)
        self.kind = kind
        self.options = options
        self.receiver_options = receiver_options
        self.host = host
        self.flush_timeout_s = float(flush_timeout_s)
        self.connect_timeout_s = float(connect_timeout_s)
        self.recv_timeout_s = float(recv_timeout_s)
        self.copy = bool(copy)
        self.handshake_timeout_s = float(handshake_timeout_s)
        self.max_pending = int(max_pending)
        if self.handshake_timeout_s <= 0 or self.max_pending < 1:
            raise ValueError("handshake_timeout_s must be positive and max_pending at least 1")

        self.role: Optional[str] = None  # "trainer" or "rollout" once init_process_group ran
        self.rank: Optional[int] = None
        self.world_size: Optional[int] = None
        # master
        self._listener: Optional[socket.socket] = None
        self._secret: Optional[bytes] = None  # the request channel's secret, new each prepare()
        #: Connections the master refused: (peer address, reason), the latest 64.
        self.refused: List[Tuple[str, str]] = []
        self._strategy: Optional[Strategy] = None
        self._sender: Optional[Sender] = None
        self._init_blob: Optional[bytes] = None
        self._key: Optional[Tuple[str, int]] = None
        self._peers: List[_Peer] = []
        # rollout worker
        self._conn: Optional[_Channel] = None
        self._receiver: Optional[Receiver] = None
        self._receiver_blob: Optional[bytes] = None
        self._receiver_strategy: Optional[Strategy] = None

    # -- verl's contract ---------------------------------------------------------------------

    def prepare(self) -> Dict[str, Any]:
        """Opens the master's request channel (once) and reports where this worker is."""
        device = "cuda" if torch.cuda.is_available() else "cpu"
        meta = {"backend": BACKEND, "host": _node_ip() if self.host is None else self.host,
                "node": _node_id(), "pid": os.getpid(), "device": device,
                "master_address": None, "master_secret": None, "kind": self.kind}
        if self.is_master:
            if self._listener is None:
                listener = socket.socket(socket.AF_INET6 if ":" in meta["host"] else socket.AF_INET)
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                listener.bind((meta["host"], 0))
                listener.listen(64)
                self._listener = listener
            meta["master_address"] = [meta["host"], self._listener.getsockname()[1]]
            # A new secret for this update's channels: only the rollout workers get it, through
            # verl's metadata -> build_topology -> init_process_group path.
            self._secret = secrets.token_bytes(_SECRET_BYTES)
            meta["master_secret"] = self._secret.hex()
        return meta

    @classmethod
    def build_topology(cls, actor_wg_world_size: int, rollout_world_size: int,
                       metadata: List[Dict[str, Any]]):
        """Actor rank 0 sends, other actor workers sit out (rank -1); rollout worker ``i`` is
        receiver ``i``. Picks the kind for ``kind="auto"`` from the placement."""
        if len(metadata) != actor_wg_world_size + rollout_world_size:
            raise ValueError(f"build_topology: {len(metadata)} metadata for "
                             f"{actor_wg_world_size} actor and {rollout_world_size} rollout workers")
        master = metadata[0]
        if not isinstance(master, dict) or master.get("backend") != BACKEND or \
                not master.get("master_address"):
            raise ValueError("build_topology: actor rank 0 must be the wsync checkpoint engine "
                             f"master (is_master=True), its prepare() returned {master!r}")
        if rollout_world_size < 1:
            raise ValueError("build_topology: no rollout worker to send weights to")
        secret = master.get("master_secret")
        if not isinstance(secret, str) or len(secret) != 2 * _SECRET_BYTES:
            raise ValueError("build_topology: actor rank 0's prepare() returned no request-channel "
                             "secret ('master_secret')")
        rollout = metadata[actor_wg_world_size:]
        kind = cls.choose_kind(master, rollout)
        address = list(master["master_address"])
        actor_kwargs = {
            "rank": [0] + [-1] * (actor_wg_world_size - 1),
            "world_size": [rollout_world_size] * actor_wg_world_size,
            "master_address": [address] * actor_wg_world_size,
            "kind": [kind] * actor_wg_world_size,
            "role": ["trainer"] * actor_wg_world_size,
        }
        rollout_kwargs = {
            "rank": list(range(rollout_world_size)),
            "world_size": [rollout_world_size] * rollout_world_size,
            "master_address": [address] * rollout_world_size,
            "kind": [kind] * rollout_world_size,
            "role": ["rollout"] * rollout_world_size,
            # Rollout workers only: the other actor workers never connect.
            "master_secret": [secret] * rollout_world_size,
        }
        return actor_kwargs, rollout_kwargs

    @staticmethod
    def choose_kind(master: Dict[str, Any], rollout: List[Dict[str, Any]]) -> str:
        """The master's ``kind``, or for ``"auto"``: one node -> ``cuda_ipc`` (CUDA
        everywhere) or ``shm``; several -> ``nccl_broadcast`` (CUDA everywhere) or ``ucx``."""
        kind = master.get("kind") or "auto"
        if kind != "auto":
            return kind
        cuda = master.get("device") == "cuda" and all(m.get("device") == "cuda" for m in rollout)
        one_node = all(m.get("node") == master.get("node") for m in rollout)
        if one_node:
            return "cuda_ipc" if cuda else "shm"
        return "nccl_broadcast" if cuda else "ucx"

    def init_process_group(self, rank: int, world_size: int, master_address, kind: str,
                           role: str = "rollout", master_secret: Optional[str] = None):
        """Meets the other side (see the module documentation, step 3)."""
        self.rank, self.world_size, self.role = rank, world_size, role
        if role == "trainer":
            if rank < 0:
                return
            if not self.is_master:
                raise ValueError("init_process_group: actor rank 0 must be the master "
                                 "(is_master=True)")
            self._meet_rollout(world_size, kind)
        elif role == "rollout":
            self._meet_master(rank, tuple(master_address), kind, master_secret)
        else:
            raise ValueError(f"init_process_group: role must be 'trainer' or 'rollout', not {role!r}")

    def finalize(self):
        """Closes this update's channels; the strategy, sender and receivers stay."""
        for peer in self._peers:
            peer.chan.close()
        self._peers = []
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    @torch.no_grad()
    async def send_weights(self, weights, global_steps: Optional[int] = None):
        """Sends one version (module documentation, step 4); returns verl metrics."""
        if self.role == "rollout":
            raise RuntimeError("send_weights on a rollout worker: rollout workers receive")
        if self.rank is None:
            raise error(Status.WRONG_STATE, "wsync checkpoint engine: send_weights before "
                        "init_process_group")
        if self.rank < 0:
            async for _ in ensure_async_iterator(weights):
                pass
            return {}
        sender = self._sender
        if sender is None:
            raise error(Status.WRONG_STATE, "wsync checkpoint engine: send_weights before "
                        "init_process_group made the sender")
        version = sender.version
        where = f"wsync checkpoint engine: send_weights (global_steps={global_steps}, version {version})"
        start = time.monotonic()
        sent = patched = 0
        try:
            async for chunk, parts, last in self._chunks(weights):
                request = await asyncio.to_thread(sender.send_chunk, chunk, last, parts)
                if sender.delta:
                    body = describe(request).get("body", {})
                    patched += len(body.get("tensors", {}).get("patches", {}).get("tensor", ()))
                sent += sum(n for _, n in parts) if parts else sum(_nbytes(t) for _, t in chunk)
                del chunk
                await asyncio.to_thread(self._broadcast, _REQUEST, request)
            await asyncio.to_thread(sender.flush, self.flush_timeout_s)
            broken = [p for p in self._peers if p.broken]
            if broken:
                raise error(Status.PEER, "; ".join(f"{p}: request channel failed: {p.broken}"
                                                   for p in broken))
        except BaseException as exc:
            raise self._fail_version(exc, where) from exc
        seconds = time.monotonic() - start
        metrics = {"wsync/version": version, "wsync/bytes": sent, "wsync/send_s": seconds}
        if sender.delta:
            metrics["wsync/patched_tensors"] = patched
        return metrics

    @torch.no_grad()
    async def receive_weights(self, global_steps: Optional[int] = None
                              ) -> AsyncGenerator[Tuple[str, torch.Tensor], None]:
        """Yields one version's ``(name, tensor)`` pairs (module documentation, step 4)."""
        receiver, conn = self._receiver, self._conn
        who = f"rollout worker {self.rank} (receiver {self.rank}, pid {os.getpid()})"
        where = f"wsync checkpoint engine: receive_weights (global_steps={global_steps}) on {who}"
        if receiver is None or conn is None:
            raise error(Status.WRONG_STATE, f"{where}: init_process_group has not connected "
                        "this worker to the trainer")
        partial: Optional[Tuple[str, torch.Tensor, int]] = None  # a split tensor being filled
        while True:
            try:
                kind, payload = await asyncio.to_thread(self._next_frame, conn)
            except ChannelAuthError as exc:
                # Nothing of the frame was used. The connection is closed and so is the
                # receiver (the master hears DETACHED and names this worker); the next
                # init_process_group makes a new one.
                self.finalize()
                self._close_receiver()
                raise error(Status.INTEGRITY, f"{where}: {exc}; the channel and the receiver "
                            "are closed, the version is not complete here") from exc
            except (OSError, ConnectionError) as exc:
                raise error(Status.PEER, f"{where}: the trainer's request channel failed "
                            f"({exc}); the version is not complete here") from exc
            if kind == _ABORT:
                text = json.loads(payload.decode("utf-8")).get("message", "")
                raise error(Status.ABANDONED, f"{where}: the trainer abandoned the version: {text}")
            if kind != _REQUEST:
                raise error(Status.MALFORMED, f"{where}: unexpected frame {kind!r} on the "
                            "request channel")
            try:
                it = await asyncio.to_thread(receiver.receive, payload)
            except WsyncError as exc:
                raise _with_context(exc, where) from exc
            try:
                gpu = it.cuda_index
                for pv in it.iter_parts():
                    whole = pv.offset == 0 and pv.whole
                    if whole and partial is None:
                        t = pv.view.view(pv.shape)
                        yield pv.name, (t.clone() if self.copy else t)
                        continue
                    if partial is None:
                        if pv.offset != 0:
                            raise error(Status.MALFORMED, f"{where}: part of '{pv.name}' at "
                                        f"byte {pv.offset} without its first part")
                        full = torch.empty(pv.shape, dtype=pv.view.dtype, device=pv.view.device)
                        partial = (pv.name, full, 0)
                    name, full, filled = partial
                    if pv.name != name or pv.offset != filled:
                        raise error(Status.MALFORMED, f"{where}: part of '{pv.name}' at byte "
                                    f"{pv.offset} where '{name}' continues at byte {filled}")
                    full.view(-1)[pv.start:pv.stop].copy_(pv.view)
                    filled += pv.nbytes
                    if filled >= full.numel() * full.element_size():
                        partial = None
                        yield name, full
                    else:
                        partial = (name, full, filled)
                info = it.info
                if gpu is not None:
                    # The consumer's copies out of the chunk are done before it is released,
                    # as verl's nccl engine synchronizes before reusing its bucket.
                    torch.cuda.synchronize(gpu)
                await asyncio.to_thread(it.end)
            except GeneratorExit:
                it.abort(Status.WRONG_STATE, f"{who}: the server adapter stopped consuming the "
                         f"weights of global_steps={global_steps} mid-chunk")
                raise
            except WsyncError as exc:
                it.abort(exc.status, f"{who}: {exc.message}")
                raise _with_context(exc, where) from exc
            except BaseException as exc:
                it.abort(Status.INTERNAL, f"{who}: {type(exc).__name__}: {exc}")
                raise
            if info.last:
                return

    # -- the master's side -------------------------------------------------------------------

    def _meet_rollout(self, world_size: int, kind: str) -> None:
        if self._listener is None:
            raise error(Status.WRONG_STATE, "wsync checkpoint engine: init_process_group before "
                        "prepare() opened the master's request channel")
        self.finalize()  # channels a failed update left open
        key = (kind, world_size)
        if self._key != key:
            self._close_sender()
            options = dict(self.options)
            if kind in BUCKET_KINDS:
                options.setdefault("bucket_bytes", self.bucket_size)
            if kind == "nccl_broadcast" and "device" not in options and torch.cuda.is_available():
                options["device"] = torch.cuda.current_device()
            strategy = Strategy(kind, receivers=world_size, **options)
            try:
                self._init_blob = strategy.create_init_info()
            except BaseException:
                strategy.close()
                raise
            self._strategy, self._key = strategy, key
        secret = self._secret
        if secret is None:
            raise error(Status.WRONG_STATE, "wsync checkpoint engine: init_process_group before "
                        "prepare() made the request channel's secret")
        deadline = time.monotonic() + self.connect_timeout_s
        peers: Dict[int, _Peer] = {}
        met: "queue.Queue[Tuple[_Channel, int, Dict[str, Any]]]" = queue.Queue()
        pending: Set[socket.socket] = set()
        lock = threading.Lock()
        done = threading.Event()
        try:
            while len(peers) < world_size:
                while True:  # connections that authenticated and said hello
                    try:
                        chan, index, hello = met.get_nowait()
                    except queue.Empty:
                        break
                    if index in peers:
                        # Only a holder of the secret gets here: an authenticated refusal.
                        try:
                            chan.send(_ABORT, _json({"message": f"receiver index {index} is taken "
                                                     f"({world_size} rollout workers)"}))
                        except OSError:
                            pass
                        self._refuse(chan.peer, f"receiver index {index} is taken")
                        chan.close()
                        continue
                    peers[index] = _Peer(chan, index, int(hello.get("pid", 0)),
                                         str(hello.get("host", "?")))
                if len(peers) >= world_size:
                    break
                accepted = self._accept(deadline, world_size, peers)
                if accepted is None:
                    continue
                sock, address = accepted
                with lock:
                    full = len(pending) >= self.max_pending
                    if not full:
                        pending.add(sock)
                if full:
                    self._refuse(address, f"{self.max_pending} connections are already "
                                 "authenticating (max_pending)")
                    sock.close()
                    continue
                threading.Thread(target=self._handshake, name=f"wsync-verl-auth {address}",
                                 args=(sock, address, secret, world_size, deadline, met,
                                       pending, lock, done), daemon=True).start()
            init = _json({"init_info": base64.b64encode(self._init_blob).decode("ascii"),
                          "options": self.receiver_options})
            for peer in peers.values():
                peer.chan.send(_INIT, init)
            if self._sender is None:
                self._sender = self._strategy.sender(self._init_blob)
            for peer in sorted(peers.values(), key=lambda p: p.index):
                peer.chan.settimeout(max(0.1, deadline - time.monotonic()))
                try:
                    kind_, payload = peer.chan.recv()
                    ready = json.loads(payload.decode("utf-8"))
                except (OSError, ConnectionError, ValueError) as exc:
                    raise error(Status.PEER, f"wsync checkpoint engine: init_process_group: {peer} "
                                f"did not report its receiver ({exc})") from exc
                if kind_ != _READY or not isinstance(ready, dict) or ready.get("error"):
                    raise error(Status.PEER, f"wsync checkpoint engine: init_process_group: "
                                f"{peer} could not make its receiver: "
                                f"{ready.get('error') if isinstance(ready, dict) else ready!r}")
                peer.chan.settimeout(None)
        except BaseException:
            for peer in peers.values():
                peer.chan.close()
            raise
        finally:
            # Connections still authenticating are cut; ones that finished meanwhile closed.
            with lock:
                done.set()
                for sock in pending:
                    try:
                        sock.shutdown(socket.SHUT_RDWR)
                    except OSError:
                        pass
            while True:
                try:
                    met.get_nowait()[0].close()
                except queue.Empty:
                    break
        self._peers = [peers[i] for i in range(world_size)]

    def _refuse(self, address: str, reason: str) -> None:
        """Logs (and keeps, in ``refused``) a connection the master closed."""
        _log.warning("wsync checkpoint engine: refused the connection from %s: %s", address, reason)
        self.refused = (self.refused + [(address, reason)])[-64:]

    def _handshake(self, sock: socket.socket, address: str, secret: bytes, world_size: int,
                   deadline: float, met: "queue.Queue", pending: Set[socket.socket],
                   lock: threading.Lock, done: threading.Event) -> None:
        """One connection on the master (its own thread): challenge, the rollout worker's
        proof, the master's proof, then the worker's authenticated hello. Anything else closes
        the connection, which got nothing but the master's nonce."""
        chan = None
        try:
            sock.settimeout(max(0.05, min(self.handshake_timeout_s, deadline - time.monotonic())))
            master_nonce = secrets.token_bytes(_NONCE_BYTES)
            _send_frame(sock, _CHALLENGE, master_nonce)
            kind, payload = _recv_frame(sock, _MAX_HANDSHAKE_FRAME)
            if kind != _PROOF or len(payload) != _INDEX.size + _NONCE_BYTES + _MAC_BYTES:
                raise ChannelAuthError(f"a {kind!r} frame of {len(payload)} bytes instead of a proof")
            (index,) = _INDEX.unpack_from(payload)
            worker_nonce = payload[_INDEX.size:_INDEX.size + _NONCE_BYTES]
            proof = payload[_INDEX.size + _NONCE_BYTES:]
            want, mine, key = _handshake_macs(secret, index, master_nonce, worker_nonce)
            if not hmac.compare_digest(proof, want):
                raise ChannelAuthError("its handshake HMAC is wrong (no secret, a wrong one, or a "
                                       "replayed transcript)")
            if index >= world_size:
                raise ChannelAuthError(f"receiver index {index} is out of range ({world_size} "
                                       "rollout workers)")
            _send_frame(sock, _CONFIRM, mine)
            chan = _Channel(sock, key, master=True, peer=f"rollout worker {index} at {address}",
                            limit=_MAX_UP_FRAME)
            kind, payload = chan.recv()
            hello = json.loads(payload.decode("utf-8")) if kind == _HELLO else None
            if not isinstance(hello, dict):
                raise ChannelAuthError(f"a {kind!r} frame instead of its hello")
            with lock:
                if not done.is_set():
                    sock.settimeout(None)
                    met.put((chan, index, hello))
                    pending.discard(sock)
                    return
            raise ConnectionError("init_process_group ended before it said hello")
        except BaseException as exc:
            if isinstance(exc, ChannelAuthError):
                reason = str(exc)
            elif done.is_set():
                reason = "init_process_group ended before it authenticated"
            else:
                reason = f"{type(exc).__name__}: {exc}"
            self._refuse(address, reason)
            try:
                sock.close()
            except OSError:
                pass
        finally:
            with lock:
                pending.discard(sock)

    def _accept(self, deadline: float, world_size: int, peers: Dict[int, _Peer]
                ) -> Optional[Tuple[socket.socket, str]]:
        left = deadline - time.monotonic()
        if left <= 0:
            missing = [i for i in range(world_size) if i not in peers]
            raise error(Status.TIMEOUT, f"wsync checkpoint engine: init_process_group: rollout "
                        f"workers {missing} did not connect within {self.connect_timeout_s} s")
        self._listener.settimeout(min(left, 0.05))
        try:
            sock, address = self._listener.accept()
        except socket.timeout:
            return None
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock, f"{address[0]}:{address[1]}"

    async def _chunks(self, weights):
        """verl's generator -> (pairs, parts, last) chunks of at most ``bucket_size`` bytes (a
        larger tensor split into parts, one chunk each; with delta sync, which takes no parts,
        in a chunk of its own), holding one chunk back so the last one is known when it is
        sent."""
        limit = self.bucket_size
        host = self._key[0] in HOST_KINDS
        split = not self._sender.delta
        pending: List[Tuple[str, torch.Tensor]] = []
        pending_bytes = 0
        held = None  # a complete chunk waiting for the next one (or the end)
        async for name, tensor in ensure_async_iterator(weights):
            tensor = tensor.detach()
            if host and tensor.device.type != "cpu":
                tensor = tensor.to("cpu")
            if not tensor.is_contiguous():
                tensor = tensor.contiguous()
            size = _nbytes(tensor)
            if size > limit:
                if pending:
                    if held is not None:
                        yield held + (False,)
                    held, pending, pending_bytes = (pending, None), [], 0
                if not split:  # delta sync takes no parts: the tensor gets a chunk of its own
                    if held is not None:
                        yield held + (False,)
                    held = ([(name, tensor)], None)
                    continue
                for offset in range(0, size, limit):
                    if held is not None:
                        yield held + (False,)
                    held = ([(name, tensor)], ((offset, min(limit, size - offset)),))
                continue
            if pending and pending_bytes + size > limit:
                if held is not None:
                    yield held + (False,)
                held, pending, pending_bytes = (pending, None), [], 0
            pending.append((name, tensor))
            pending_bytes += size
        if pending:
            if held is not None:
                yield held + (False,)
            held = (pending, None)
        if held is None:
            raise error(Status.INVALID_ARGUMENT, "the weights generator yielded no tensor")
        yield held + (True,)

    def _broadcast(self, kind: bytes, payload: bytes) -> None:
        """Writes one frame to every rollout worker whose channel works (a broken one is
        noted; the library names a dead worker at the next send or flush)."""
        for peer in self._peers:
            if peer.broken:
                continue
            try:
                peer.chan.send(kind, payload)
            except OSError as exc:
                peer.broken = str(exc) or type(exc).__name__

    def _fail_version(self, exc: BaseException, where: str) -> BaseException:
        """Abandons the version, tells the rollout workers, drops dead ones; returns the
        error to raise (a ``WsyncError`` naming the rollout workers it is about)."""
        sender = self._sender
        try:
            sender.abandon()
        except Exception:
            pass
        if isinstance(exc, WsyncError):
            names = {p.index: str(p) for p in self._peers}
            lines = []
            for f in exc.failures:
                lines.append(f"{names.get(f.receiver, f'rollout worker {f.receiver}')}: {f}")
                if f.what in (FailureKind.DIED, FailureKind.DETACHED):
                    try:
                        sender.drop_receiver(f.receiver)
                    except Exception:
                        pass
            text = f"{where}: " + ("; ".join(lines) + " (" + exc.message + ")" if lines else exc.message)
            result: BaseException = error(exc.status, text, exc.failures)
        else:
            result = exc
        if self._key is not None and self._key[0] == "nccl_broadcast":
            # Its group is fixed (no drop_receiver, no re-attach): the next init_process_group
            # makes a new strategy, and every rollout worker a new receiver.
            self._key = None
        message = str(result) if isinstance(result, WsyncError) else f"{type(exc).__name__}: {exc}"
        try:
            self._broadcast(_ABORT, _json({"message": message}))
        except Exception:
            pass
        return result

    def _close_sender(self) -> None:
        sender, self._sender = self._sender, None
        strategy, self._strategy = self._strategy, None
        self._key = None
        if sender is not None:
            sender.close()
        if strategy is not None:
            strategy.close()

    # -- a rollout worker's side -------------------------------------------------------------

    def _meet_master(self, index: int, address: Tuple[str, int], kind: str,
                     secret_hex: Optional[str]) -> None:
        self.finalize()
        who = f"rollout worker {index} (pid {os.getpid()})"
        trainer = f"the trainer at {address[0]}:{address[1]}"
        try:
            secret = bytes.fromhex(secret_hex) if isinstance(secret_hex, str) else b""
        except ValueError:
            secret = b""
        if len(secret) != _SECRET_BYTES:
            raise error(Status.INVALID_ARGUMENT, f"wsync checkpoint engine: {who}: no request-"
                        "channel secret ('master_secret' from build_topology)")
        deadline = time.monotonic() + self.connect_timeout_s
        while True:
            try:
                sock = socket.create_connection(address, timeout=max(0.1, deadline - time.monotonic()))
            except OSError as exc:
                if time.monotonic() >= deadline:
                    raise error(Status.UNAVAILABLE, f"wsync checkpoint engine: {who} could not "
                                f"reach {trainer}: {exc}") from exc
                time.sleep(0.05)
                continue
            try:
                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                sock.settimeout(max(0.1, deadline - time.monotonic()))
                kind_, master_nonce = _recv_frame(sock, _MAX_HANDSHAKE_FRAME)
            except (OSError, ConnectionError) as exc:
                # Closed before its challenge: the master is busy with other connections
                # (max_pending); try again until the deadline.
                sock.close()
                if time.monotonic() >= deadline:
                    raise error(Status.UNAVAILABLE, f"wsync checkpoint engine: {who}: {trainer} "
                                f"closed every connection before its challenge: {exc}") from exc
                time.sleep(0.05)
                continue
            break
        try:
            if kind_ != _CHALLENGE or len(master_nonce) != _NONCE_BYTES:
                raise ChannelAuthError(f"{trainer} sent a {kind_!r} frame instead of its challenge")
            worker_nonce = secrets.token_bytes(_NONCE_BYTES)
            mine, want, key = _handshake_macs(secret, index, master_nonce, worker_nonce)
            _send_frame(sock, _PROOF, _INDEX.pack(index) + worker_nonce + mine)
            try:
                kind_, proof = _recv_frame(sock, _MAX_HANDSHAKE_FRAME)
            except ConnectionError as exc:
                raise ChannelAuthError(f"{trainer} refused this worker's proof ({exc}): a "
                                       "secret from another update?") from exc
            if kind_ != _CONFIRM or not hmac.compare_digest(proof, want):
                raise ChannelAuthError(f"{trainer} failed to prove it holds the secret")
            chan = _Channel(sock, key, master=False, peer=trainer, limit=_MAX_FRAME)
            chan.send(_HELLO, _json({"index": index, "pid": os.getpid(),
                                     "host": socket.gethostname()}))
            frame, payload = chan.recv()
            message = json.loads(payload.decode("utf-8"))
            if frame == _ABORT:
                raise error(Status.WRONG_STATE, f"wsync checkpoint engine: the trainer refused "
                            f"{who}: {message.get('message')}")
            if frame != _INIT:
                raise error(Status.MALFORMED, f"wsync checkpoint engine: {who}: unexpected frame "
                            f"{frame!r} instead of the init info")
            blob = base64.b64decode(message["init_info"])
            try:
                self._ensure_receiver(blob, index, dict(message.get("options") or {}))
            except BaseException as exc:
                chan.send(_READY, _json({"error": f"{type(exc).__name__}: {exc}"}))
                raise
            chan.send(_READY, _json({"error": None}))
            chan.settimeout(None)
        except ChannelAuthError as exc:
            sock.close()
            raise error(Status.PEER, f"wsync checkpoint engine: {who}: request channel "
                        f"authentication failed: {exc}") from exc
        except BaseException:
            sock.close()
            raise
        self._conn = chan

    def _ensure_receiver(self, blob: bytes, index: int, options: Dict[str, Any]) -> None:
        if self._receiver is not None and self._receiver_blob == blob and \
                self._receiver.index == index:
            return
        self._close_receiver()
        kind = describe(blob).get("kind")
        options = {**options, **self.receiver_options}
        if kind in GPU_KINDS and "device" not in options and torch.cuda.is_available():
            options["device"] = torch.cuda.current_device()
        strategy = Strategy.for_init_info(blob, **options)
        try:
            self._receiver = strategy.receiver(blob, index)
        except BaseException:
            strategy.close()
            raise
        self._receiver_strategy, self._receiver_blob = strategy, blob

    def _next_frame(self, conn: _Channel) -> Tuple[bytes, bytes]:
        conn.settimeout(self.recv_timeout_s)
        try:
            return conn.recv()
        except socket.timeout:
            raise ConnectionError(f"no request within recv_timeout_s={self.recv_timeout_s}") from None

    def _close_receiver(self) -> None:
        receiver, self._receiver = self._receiver, None
        strategy, self._receiver_strategy = self._receiver_strategy, None
        self._receiver_blob = None
        if receiver is not None:
            receiver.close()
        if strategy is not None:
            strategy.close()

    # -- both ----------------------------------------------------------------------------------

    @property
    def completed_version(self) -> int:
        """A rollout worker's newest complete wsync version (0 if none or not a receiver)."""
        return self._receiver.completed_version if self._receiver is not None else 0

    @property
    def version(self) -> int:
        """The master's next wsync version (0 if it has no sender yet)."""
        return self._sender.version if self._sender is not None else 0

    def shutdown(self) -> None:
        """Closes channels, sender, receiver and the listener (idempotent)."""
        self.finalize()
        self._close_sender()
        self._close_receiver()
        if self._listener is not None:
            self._listener.close()
            self._listener = None


def _nbytes(t: torch.Tensor) -> int:
    return t.numel() * t.element_size()
