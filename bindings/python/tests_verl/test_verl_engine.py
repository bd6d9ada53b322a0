"""The wsync checkpoint engine through verl 0.9.1's own code: registered by
``custom_backend_module``, built by verl's ``CheckpointEngineRegistry.new`` as the actor worker
builds it, and on the rollout side by verl's ``CheckpointEngineWorker``; the driver (this
process) plays ``CheckpointEngineManager``: prepare on every worker (actors first), the
engine class's ``build_topology``, ``init_process_group`` everywhere at once, the actor's
``send_weights`` with every rollout worker's ``update_weights`` at once, ``finalize``.
Kind ``shm`` on CPU; one trainer process and two rollout processes."""

import json
import time

import pytest

from conftest import Side

MODULE = "wsync.integrations.verl"
BUCKET_MB = 1
ENGINE_KWARGS = {"kind": "auto", "flush_timeout_s": 30.0, "connect_timeout_s": 60.0,
                 "recv_timeout_s": 60.0}
#: A dead rollout worker is named well before the flush deadline (the library checks
#: liveness every 100 ms); the bound leaves room for a loaded 2-core machine.
DEATH_DEADLINE_S = 10.0


def ok(reply):
    """Whether a side's reply says it succeeded; the whole reply in the message if not."""
    assert reply.get("ok"), json.dumps(reply, indent=1)
    return True


@pytest.fixture(scope="module")
def engine_cls():
    from verl.checkpoint_engine import CheckpointEngineRegistry
    from verl.utils.import_utils import import_external_libs

    import_external_libs(MODULE)  # what CheckpointEngineManager does with custom_backend_module
    return CheckpointEngineRegistry.get("wsync")


class Cluster:
    def __init__(self, log_dir, engine_kwargs=ENGINE_KWARGS, rollouts=2):
        self.log_dir = log_dir
        self.engine_kwargs = engine_kwargs
        self.trainer = Side("trainer", 0, BUCKET_MB, engine_kwargs, log_dir)
        self.rollouts = [Side("rollout", i, BUCKET_MB, engine_kwargs, log_dir) for i in range(rollouts)]
        for side in self.sides:
            side.ready()
        self.versions = 0  # wsync versions the trainer began

    @property
    def sides(self):
        return [self.trainer] + self.rollouts

    def replace_rollout(self, i):
        self.rollouts[i].close()
        self.rollouts[i] = Side("rollout", i, BUCKET_MB, self.engine_kwargs, self.log_dir)
        self.rollouts[i].ready()

    def rebuild(self, engine_kwargs):
        """New engines (and rollout workers) with ``engine_kwargs`` in the same processes."""
        all(ok(r) for r in self.all([{"op": "rebuild", "engine_kwargs": engine_kwargs}] * len(self.sides)))
        self.engine_kwargs = engine_kwargs
        self.versions = 0

    def all(self, cmds, timeout=120):
        for side, cmd in zip(self.sides, cmds):
            side.send(**cmd)
        return [side.get(timeout) for side in self.sides]

    def build_process_group(self, engine_cls, before_init=None):
        """CheckpointEngineManager.build_process_group, step by step; ``before_init(metadata,
        actor_kwargs, rollout_kwargs)`` runs (and may change the kwargs) before the inits."""
        n = len(self.rollouts)
        metas = self.all([{"op": "prepare"}] * (n + 1))
        all(ok(m) for m in metas)
        actor_kwargs, rollout_kwargs = engine_cls.build_topology(1, n, [m["metadata"] for m in metas])
        for k, v in actor_kwargs.items():
            assert len(v) == 1, k
        for k, v in rollout_kwargs.items():
            assert len(v) == n, k
        if before_init is not None:
            before_init([m["metadata"] for m in metas], actor_kwargs, rollout_kwargs)
        inits = [{"op": "init", "kwargs": {k: v[0] for k, v in actor_kwargs.items()}}] + \
                [{"op": "init", "kwargs": {k: v[i] for k, v in rollout_kwargs.items()}} for i in range(n)]
        replies = self.all(inits)
        all(ok(r) for r in replies)
        return actor_kwargs, rollout_kwargs

    def finalize(self):
        replies = self.all([{"op": "finalize"}] * len(self.sides))
        all(ok(r) for r in replies)

    def update(self, engine_cls, seed, global_steps, touch=0, before_init=None):
        self.build_process_group(engine_cls, before_init)
        replies = self.all([{"op": "update", "seed": seed, "global_steps": global_steps,
                             "touch": touch}] * len(self.sides))
        self.versions += 1
        self.finalize()
        return replies

    def close(self):
        for side in self.sides:
            side.close()


@pytest.fixture(scope="module")
def cluster(log_dir):
    c = Cluster(log_dir)
    yield c
    c.close()


def test_registered_by_custom_backend_module(engine_cls, cluster):
    from verl.checkpoint_engine.base import CheckpointEngine

    from wsync.integrations.verl import WsyncCheckpointEngine

    assert engine_cls is WsyncCheckpointEngine
    assert issubclass(engine_cls, CheckpointEngine)
    for side in cluster.sides:  # built by verl's registry from CheckpointEngineConfig
        assert side.hello["engine"] == f"{MODULE}.WsyncCheckpointEngine"
        assert side.hello["bucket_size"] == BUCKET_MB << 20


def test_build_topology_places_and_picks_kinds(engine_cls):
    def meta(node, device, master=False, kind="auto"):
        return {"backend": "wsync", "host": "10.0.0.1", "node": node, "pid": 1, "device": device,
                "master_address": ["10.0.0.1", 1234] if master else None,
                "master_secret": "ab" * 32 if master else None, "kind": kind}

    actor, rollout = engine_cls.build_topology(
        3, 2, [meta("a", "cpu", True), meta("a", "cpu"), meta("b", "cpu"), meta("a", "cpu"), meta("a", "cpu")])
    assert actor["rank"] == [0, -1, -1] and rollout["rank"] == [0, 1]
    assert actor["role"] == ["trainer"] * 3 and rollout["role"] == ["rollout"] * 2
    assert actor["master_address"] == [["10.0.0.1", 1234]] * 3 == rollout["master_address"] + [["10.0.0.1", 1234]]
    assert actor["kind"] == ["shm"] * 3 == rollout["kind"] + ["shm"]
    # the channel's secret goes to the rollout workers only, never to the other actor workers
    assert rollout["master_secret"] == ["ab" * 32] * 2 and "master_secret" not in actor
    pick = engine_cls.choose_kind
    assert pick(meta("a", "cuda", True), [meta("a", "cuda")] * 2) == "cuda_ipc"  # one node
    assert pick(meta("a", "cuda", True), [meta("a", "cuda"), meta("b", "cuda")]) == "nccl_broadcast"
    assert pick(meta("a", "cpu", True), [meta("b", "cpu")]) == "ucx"
    assert pick(meta("a", "cuda", True, kind="shm"), [meta("b", "cuda")]) == "shm"  # named wins
    with pytest.raises(ValueError, match="is_master"):
        engine_cls.build_topology(1, 1, [meta("a", "cpu"), meta("a", "cpu")])


def test_versions_bit_exact(engine_cls, cluster):
    for seed in (1, 2, 3):
        before = cluster.versions
        trainer, *rollouts = cluster.update(engine_cls, seed, global_steps=10 * seed)
        ok(trainer)
        assert trainer["metrics"]["wsync/version"] == before + 1
        assert trainer["metrics"]["wsync/bytes"] > 4 << 20
        for r in rollouts:
            assert r["ok"], r  # every tensor bit for bit (mismatches lists any that is not)
            assert r["tensors"] == 17
            assert r["completed_version"] == before + 1
            assert r["wire_formats"] == ["named_tensors"]


def test_rollout_killed_mid_version(engine_cls, cluster):
    if cluster.versions == 0:  # run alone: one good version first
        assert all(r["ok"] for r in cluster.update(engine_cls, 1, global_steps=1))
    good = cluster.versions
    cluster.build_process_group(engine_cls)
    victim = cluster.rollouts[1]
    cluster.trainer.send(op="update", seed=7, global_steps=70)
    cluster.rollouts[0].send(op="update", seed=7, global_steps=70)
    victim.send(op="update", seed=7, global_steps=70, stall_after=3)
    assert victim.get().get("stalled")
    victim.kill()  # SIGKILL while its server adapter holds the version's first chunk
    killed = time.monotonic()
    trainer = cluster.trainer.get(timeout=DEATH_DEADLINE_S + 30)
    named_after = time.monotonic() - killed
    cluster.versions += 1
    assert not trainer["ok"], trainer
    assert "WsyncError" in trainer["mro"] and trainer["status"] == "PEER", trainer
    assert f"rollout worker 1 (pid {victim.pid} on " in trainer["message"], trainer["message"]
    assert "died" in trainer["message"] and "global_steps=70" in trainer["message"], trainer["message"]
    assert any(f.startswith("receiver 1 died") for f in trainer["failures"]), trainer["failures"]
    assert named_after < DEATH_DEADLINE_S, named_after
    survivor = cluster.rollouts[0].get()
    assert not survivor["ok"] and survivor["status"] == "ABANDONED", survivor
    assert "AbandonedError" in survivor["mro"] and "rollout worker 0" in survivor["message"], survivor
    assert "rollout worker 1" in survivor["message"], survivor  # the trainer's reason
    # verl finalizes the survivors; the dead worker's replacement joins the next update.
    assert cluster.trainer.send(op="finalize") or cluster.trainer.get()["ok"]
    assert cluster.rollouts[0].send(op="finalize") or cluster.rollouts[0].get()["ok"]
    cluster.replace_rollout(1)
    trainer, *rollouts = cluster.update(engine_cls, 8, global_steps=80)
    ok(trainer)
    assert trainer["metrics"]["wsync/version"] == good + 2  # the failed version's number is spent
    for r in rollouts:
        ok(r)
        assert r["completed_version"] == good + 2


def test_trainer_error_abandons_version(engine_cls, cluster):
    """The trainer's weight generator raises mid-version: send_weights raises that error, every
    rollout worker's update raises ABANDONED with the trainer's reason, none completes the
    version, and the next one completes everywhere."""
    if cluster.versions == 0:
        assert all(ok(r) for r in cluster.update(engine_cls, 1, global_steps=1))
    good = cluster.versions
    cluster.build_process_group(engine_cls)
    cmds = [{"op": "update", "seed": 5, "global_steps": 50, "fail_after": 5}] + \
           [{"op": "update", "seed": 5, "global_steps": 50}] * 2
    trainer, *rollouts = cluster.all(cmds, timeout=60)
    cluster.versions += 1
    assert not trainer["ok"] and trainer["type"] == "RuntimeError", trainer
    assert "failed after 5 tensors" in trainer["message"], trainer
    for i, r in enumerate(rollouts):
        assert not r["ok"] and r["status"] == "ABANDONED", r
        assert f"rollout worker {i}" in r["message"] and "failed after 5 tensors" in r["message"], r
    cluster.finalize()
    trainer, *rollouts = cluster.update(engine_cls, 6, global_steps=60)
    ok(trainer)
    assert trainer["metrics"]["wsync/version"] == good + 2
    for r in rollouts:
        ok(r)
        assert r["completed_version"] == good + 2


def test_server_adapter_error_named_on_trainer(engine_cls, cluster):
    """A rollout worker's server adapter raises while loading: that worker's update raises it,
    the trainer's send_weights raises PEER naming that worker, the other worker's update
    raises ABANDONED, and the next version completes everywhere."""
    if cluster.versions == 0:
        assert all(ok(r) for r in cluster.update(engine_cls, 1, global_steps=1))
    good = cluster.versions
    cluster.build_process_group(engine_cls)
    pid = cluster.rollouts[0].hello["pid"]
    cmds = [{"op": "update", "seed": 9, "global_steps": 90},
            {"op": "update", "seed": 9, "global_steps": 90, "raise_after": 2},
            {"op": "update", "seed": 9, "global_steps": 90}]
    started = time.monotonic()
    trainer, failing, other = cluster.all(cmds, timeout=60)
    cluster.versions += 1
    assert time.monotonic() - started < ENGINE_KWARGS["flush_timeout_s"]
    assert not failing["ok"] and failing["type"] == "RuntimeError", failing
    assert not trainer["ok"] and trainer["status"] == "PEER", trainer
    assert f"rollout worker 0 (pid {pid} on " in trainer["message"], trainer["message"]
    assert "receiver 0 failed" in trainer["message"], trainer["message"]
    assert "server adapter stopped" in trainer["message"], trainer["message"]
    assert not other["ok"] and other["status"] == "ABANDONED", other
    cluster.finalize()
    trainer, *rollouts = cluster.update(engine_cls, 10, global_steps=100)
    ok(trainer)
    for r in rollouts:
        ok(r)
        assert r["completed_version"] == good + 2


def test_non_master_actor_walks_generator_and_sends_nothing(engine_cls):
    """An actor worker other than rank 0 (rank -1 from build_topology) walks verl's generator
    (producing a weight is collective over the actor group) and sends nothing; what prepare
    returns is plain JSON data."""
    import asyncio

    from verl.checkpoint_engine import CheckpointEngineRegistry

    import _verl_model

    engine = CheckpointEngineRegistry.new("wsync", is_master=False, bucket_size=1 << 20)
    meta = engine.prepare()
    assert json.loads(json.dumps(meta)) == meta and meta["master_address"] is None
    engine.init_process_group(rank=-1, world_size=2, master_address=["127.0.0.1", 1], kind="shm",
                              role="trainer")
    seen = []

    def weights():
        for name, t in _verl_model.weights(1):
            seen.append(name)
            yield name, t

    assert asyncio.run(engine.send_weights(weights(), global_steps=1)) == {}
    assert len(seen) == 17
    engine.finalize()
    engine.shutdown()


def test_receive_before_init_refused_by_name(engine_cls):
    import asyncio

    import wsync

    engine = engine_cls(bucket_size=1 << 20)

    async def drain():
        async for _ in engine.receive_weights(global_steps=3):
            pass

    with pytest.raises(wsync.WrongStateError, match="global_steps=3.*init_process_group"):
        asyncio.run(drain())


def test_delta_with_mirror_bit_exact(engine_cls, cluster):
    """options={'delta': 'on'} (every tensor with a base crosses as a patch) with
    receiver_options={'delta_mirror': True}: each rollout worker's receiver applies the patches
    to its own copy and verl gets whole tensors, bit-exact over 3 versions. Delta takes no
    split tensors, so the buckets hold the largest tensor (4 MiB) while chunks stay at verl's
    1 MiB."""
    kwargs = dict(ENGINE_KWARGS, kind="shm", options={"delta": "on", "bucket_bytes": 4 << 20},
                  receiver_options={"delta_mirror": True})
    c = cluster
    c.rebuild(kwargs)  # new engines in the same processes: new strategy, versions from 1
    try:
        for touch in (0, 1, 2):  # a few elements of every tensor change from one to the next
            trainer, *rollouts = c.update(engine_cls, 4, global_steps=touch, touch=touch)
            ok(trainer)
            # version 1 has no base; later every tensor crosses as a patch
            assert trainer["metrics"]["wsync/patched_tensors"] == (17 if touch else 0), trainer
            for r in rollouts:
                ok(r)
                assert r["completed_version"] == c.versions
    finally:
        c.rebuild(ENGINE_KWARGS)


def test_delta_without_mirror_refused(engine_cls):
    with pytest.raises(ValueError, match="delta_mirror"):
        engine_cls(bucket_size=1 << 20, is_master=True, options={"delta": "auto"})


def test_rollout_worker_that_never_connects_named(engine_cls):
    import wsync

    engine = engine_cls(bucket_size=1 << 20, is_master=True, connect_timeout_s=1.0,
                        host="127.0.0.1")
    meta = engine.prepare()
    started = time.monotonic()
    with pytest.raises(wsync.WsyncError, match=r"rollout workers \[0, 1\] did not connect") as info:
        engine.init_process_group(rank=0, world_size=2, master_address=meta["master_address"],
                                  kind="shm", role="trainer")
    assert info.value.status == wsync.Status.TIMEOUT
    assert time.monotonic() - started < 10
    engine.shutdown()


# -- the request channel's authentication (docs/integrations/verl.md, "Trust model") ----------


def _good_version(engine_cls, cluster):
    if cluster.versions == 0:  # run alone: one good version first
        assert all(ok(r) for r in cluster.update(engine_cls, 1, global_steps=1))
    return cluster.versions


def _refused_in_trainer_log(cluster, port, reason):
    log = cluster.trainer.log()
    lines = [line for line in log.splitlines()
             if "refused the connection from " in line and f":{port}: " in line]
    assert lines and all(reason in line for line in lines), (port, reason, log[-3000:])


def _all_complete(replies, version):
    trainer, *rollouts = replies
    ok(trainer)
    assert trainer["metrics"]["wsync/version"] == version, trainer
    for r in rollouts:
        ok(r)  # every tensor bit for bit
        assert r["tensors"] == 17 and r["completed_version"] == version, r


def test_client_without_secret_gets_nothing(engine_cls, cluster):
    """Raw TCP clients that connect to the master during init_process_group without the secret:
    one says nothing, one speaks the channel's framing without authenticating (a hello, as an
    unauthenticated rollout worker would), one sends a frame too large for the handshake. Each
    gets the master's challenge (its fresh nonce) and nothing else, no init info and no
    request bytes, and is closed; the honest rollout workers complete the version bit-exact."""
    import socket
    from concurrent.futures import ThreadPoolExecutor

    import _verl_channel as ch

    good = _good_version(engine_cls, cluster)
    raw, futures, relays = [], [], []
    pool = ThreadPoolExecutor(3)

    def before_init(metas, actor_kwargs, rollout_kwargs):
        address = tuple(metas[0]["master_address"])
        hello = json.dumps({"index": 0, "pid": 1, "host": "intruder"}).encode()
        for payload in (b"", ch.HEADER.pack(b"H", len(hello)) + hello, b"\xff" * 64):
            sock = socket.create_connection(address, timeout=30)
            sock.sendall(payload)
            raw.append(sock)
            futures.append(pool.submit(ch.recv_all, sock))
        # Rollout worker 1 (through a relay) goes on once the talking clients were closed, so the
        # master is still waiting for it while it handles them.
        relays.append(ch.Relay(rollout_kwargs["master_address"][1],
                               hold=lambda: [f.result(timeout=30) for f in futures[1:]]))
        rollout_kwargs["master_address"][1] = relays[-1].address

    try:
        replies = cluster.update(engine_cls, 11, global_steps=110, before_init=before_init)
        got = [f.result(timeout=60) for f in futures]
    finally:
        pool.shutdown()
        for relay in relays:
            relay.close()
    _all_complete(replies, good + 1)
    ports = [sock.getsockname()[1] for sock in raw]
    for i, ((data, closed), sock) in enumerate(zip(got, raw)):
        assert closed, "the master left an unauthenticated connection open"
        # the silent one may be cut before its challenge went out, when the workers were in
        assert ch.is_challenge(data) or (i == 0 and data == b""), data[:80]
        sock.close()
    _refused_in_trainer_log(cluster, ports[0], "init_process_group ended before it authenticated")
    _refused_in_trainer_log(cluster, ports[1], "instead of a proof")
    _refused_in_trainer_log(cluster, ports[2], "larger than the 256 bytes")


def test_client_with_wrong_hmac_refused(engine_cls, cluster):
    """A client that answers the challenge with a proof made with a wrong secret (one bit off)
    is closed without the master's proof, and the master logs the refusal naming its address;
    the version completes everywhere."""
    from concurrent.futures import ThreadPoolExecutor

    import _verl_channel as ch

    good = _good_version(engine_cls, cluster)
    futures, relays = [], []
    pool = ThreadPoolExecutor(1)

    def before_init(metas, actor_kwargs, rollout_kwargs):
        secret = bytes.fromhex(metas[0]["master_secret"])
        wrong = bytes([secret[0] ^ 1]) + secret[1:]
        futures.append(pool.submit(ch.send_after_challenge, metas[0]["master_address"],
                                   lambda nonce: ch.proof(wrong, 0, nonce)))
        # rollout worker 1 goes on once that client was closed (the master waits for it)
        relays.append(ch.Relay(rollout_kwargs["master_address"][1],
                               hold=lambda: futures[0].exception(timeout=30)))
        rollout_kwargs["master_address"][1] = relays[-1].address

    try:
        replies = cluster.update(engine_cls, 12, global_steps=120, before_init=before_init)
        challenge, rest, closed, port = futures[0].result(timeout=60)
    finally:
        pool.shutdown()
        for relay in relays:
            relay.close()
    _all_complete(replies, good + 1)
    assert ch.is_challenge(challenge) and rest == b"" and closed, (challenge, rest, closed)
    _refused_in_trainer_log(cluster, port, "handshake HMAC is wrong")


def test_replayed_handshake_refused(engine_cls, cluster):
    """An honest rollout worker's handshake, recorded by a relay between it and the master,
    replayed on another connection: in the same init_process_group (same secret; the relay
    holds the worker's proof back until the replay was refused) and in the next update (the
    worker's whole transcript: proof, hello, ready). Both get only a fresh challenge and are
    closed; the honest workers complete both versions bit-exact."""
    import _verl_channel as ch

    good = _good_version(engine_cls, cluster)
    relays = []
    transcript = None

    def through_relay(metas, actor_kwargs, rollout_kwargs):
        relays.append(ch.Relay(rollout_kwargs["master_address"][1], replay=transcript or True))
        rollout_kwargs["master_address"][1] = relays[-1].address

    try:
        _all_complete(cluster.update(engine_cls, 13, global_steps=130, before_init=through_relay),
                      good + 1)
    finally:
        for relay in relays:
            relay.close()
    relay = relays[0]
    assert relay.replayed is not None, relay.errors
    challenge, rest, closed, port = relay.replayed
    assert ch.is_challenge(challenge) and rest == b"" and closed, relay.replayed
    _refused_in_trainer_log(cluster, port, "handshake HMAC is wrong")
    transcript = bytes(relay.sent)
    assert len(transcript) > ch.HEADER.size + 68  # proof, hello, ready
    relays.clear()
    try:  # the whole recorded transcript, in the next update (a new secret, a fresh nonce)
        _all_complete(cluster.update(engine_cls, 14, global_steps=140, before_init=through_relay),
                      good + 2)
    finally:
        for relay in relays:
            relay.close()
    assert relays[0].replayed is not None, relays[0].errors
    challenge, rest, closed, port = relays[0].replayed
    assert ch.is_challenge(challenge) and rest == b"" and closed, relays[0].replayed
    _refused_in_trainer_log(cluster, port, "handshake HMAC is wrong")


def test_tampered_frame_fails_that_receiver(engine_cls, cluster):
    """A relay between rollout worker 1 and the master flips one bit of the first request frame
    on their authenticated connection: worker 1 refuses the frame before using it (INTEGRITY,
    naming itself, the peer and the HMAC), closes its receiver; the master's send_weights names
    rollout worker 1 (detached) and abandons the version, so worker 0 gets ABANDONED and keeps
    its previous version. The next update (no relay) completes bit-exact everywhere, worker 1
    with a new receiver."""
    import _verl_channel as ch

    good = _good_version(engine_cls, cluster)
    relays = []

    def through_relay(metas, actor_kwargs, rollout_kwargs):
        relays.append(ch.Relay(rollout_kwargs["master_address"][1], tamper_request=True))
        rollout_kwargs["master_address"][1] = relays[-1].address

    pid = cluster.rollouts[1].hello["pid"]
    try:
        cluster.build_process_group(engine_cls, through_relay)
        cmds = [{"op": "update", "seed": 15, "global_steps": 150}] * 3
        started = time.monotonic()
        trainer, other, tampered = cluster.all(cmds, timeout=60)
        cluster.versions += 1
    finally:
        for relay in relays:
            relay.close()
    assert relays[0].tampered is not None, relays[0].errors
    assert not tampered["ok"] and tampered["status"] == "INTEGRITY", tampered
    assert "rollout worker 1" in tampered["message"] and "HMAC" in tampered["message"], tampered
    assert f"the trainer at 127.0.0.1:{relays[0].address[1]}" in tampered["message"], tampered
    assert not trainer["ok"] and trainer["status"] == "PEER", trainer
    assert f"rollout worker 1 (pid {pid} on " in trainer["message"], trainer["message"]
    assert "detached" in trainer["message"], trainer["message"]
    assert time.monotonic() - started < ENGINE_KWARGS["flush_timeout_s"]
    assert not other["ok"] and other["status"] == "ABANDONED", other
    cluster.finalize()
    _all_complete(cluster.update(engine_cls, 16, global_steps=160), good + 2)


def test_missing_secret_refused(engine_cls):
    """A rollout worker given no secret does not connect; build_topology refuses a master whose
    metadata has none."""
    import wsync

    engine = engine_cls(bucket_size=1 << 20, connect_timeout_s=1.0)
    with pytest.raises(wsync.WsyncError, match="master_secret"):
        engine.init_process_group(rank=0, world_size=1, master_address=["127.0.0.1", 1],
                                  kind="shm", role="rollout")
    meta = {"backend": "wsync", "host": "127.0.0.1", "node": "a", "pid": 1, "device": "cpu",
            "master_address": ["127.0.0.1", 1], "kind": "shm"}
    with pytest.raises(ValueError, match="master_secret"):
        engine_cls.build_topology(1, 1, [meta, dict(meta, master_address=None)])


def test_pending_handshakes_bounded(engine_cls):
    """max_pending connections authenticate at once: further ones are closed at once, without
    even a challenge; each pending one is cut after handshake_timeout_s; every refusal is kept
    (``refused``) with the address; no rollout worker came, so init_process_group raises
    TIMEOUT naming it."""
    import socket

    import wsync

    import _verl_channel as ch

    engine = engine_cls(bucket_size=1 << 20, is_master=True, connect_timeout_s=3.0,
                        host="127.0.0.1", max_pending=2, handshake_timeout_s=1.0)
    meta = engine.prepare()
    address = tuple(meta["master_address"])
    socks = [socket.create_connection(address, timeout=10) for _ in range(4)]
    started = time.monotonic()
    with pytest.raises(wsync.WsyncError, match=r"rollout workers \[0\] did not connect") as info:
        engine.init_process_group(rank=0, world_size=1, master_address=meta["master_address"],
                                  kind="shm", role="trainer")
    assert info.value.status == wsync.Status.TIMEOUT
    assert time.monotonic() - started < 10
    got = [ch.recv_all(s, 10) for s in socks]
    assert all(closed for _, closed in got), got
    assert [ch.is_challenge(d) for d, _ in got] == [True, True, False, False], got
    assert [d for d, _ in got[2:]] == [b"", b""]
    reasons = dict(engine.refused)
    ports = [s.getsockname()[1] for s in socks]
    assert "timed out" in reasons[f"127.0.0.1:{ports[0]}"], reasons
    for port in ports[2:]:
        assert "max_pending" in reasons[f"127.0.0.1:{port}"], reasons
    for s in socks:
        s.close()
    engine.shutdown()
