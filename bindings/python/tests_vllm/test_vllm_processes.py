"""The wsync backend across processes: a trainer (this process) syncs a small model with tied
embeddings to two vLLM workers, each a process of its own running vLLM 0.33.0's ``Worker``
update session (see ``_vllm_worker.py``), with the engines built by vLLM's factories. Then
recovery: a worker's load failure, and the trainer's own failure, each fail the version with a
named error, close every worker's session, and the next version reaches both workers
bit-exact; with staging, a failed transfer changes no worker at all."""

import multiprocessing
import os

import pytest
import torch
from vllm.distributed.weight_transfer import ModuleSource, WeightTransferTrainerFactory
from vllm.plugins import load_general_plugins

import wsync
import _vllm_spawn
from _vllm_models import HIDDEN, TiedModel
from wsync.integrations.vllm import WsyncTrainerInitInfo, WsyncTrainerWeightTransferEngine

WORKERS = 2
HERE = os.path.dirname(os.path.abspath(__file__))
#: Worker start-up imports vLLM's worker module once, in the fork server (tens of seconds on a
#: loaded 2-core host); every call after that is fast.
START_TIMEOUT_S = 600
CALL_TIMEOUT_S = 120


class WorkerCallError(RuntimeError):
    """A worker's vLLM call raised; the message names the worker and its error."""


class ProcessClient:
    """A ``VLLMWeightSyncClient`` over worker processes: each call goes to every worker at
    once and waits for all of them, then raises the first error (as vLLM's Ray client and its
    collective RPCs do)."""

    def __init__(self, conns):
        self.conns = conns

    def call_each(self, method, args_for):
        for rank, conn in enumerate(self.conns):
            conn.send((method, args_for(rank)))
        replies = []
        for rank, conn in enumerate(self.conns):
            if not conn.poll(CALL_TIMEOUT_S):
                raise TimeoutError(f"worker {rank} did not answer {method} in {CALL_TIMEOUT_S} s")
            replies.append(conn.recv())
        errors = [f"worker {rank}: {r[1]}: {r[2]}" for rank, r in enumerate(replies) if r[0] != "ok"]
        if errors:
            raise WorkerCallError(f"{method} failed: " + "; ".join(errors))
        return [r[1] for r in replies]

    def call(self, method, *args):
        return self.call_each(method, lambda rank: args)

    def init_weight_transfer_engine(self, init_info):
        self.call("init_weight_transfer_engine", init_info)

    def start_weight_update(self):
        self.call("start_weight_update")

    def update_weights(self, update_info):
        self.call("update_weights", update_info)

    def finish_weight_update(self, weight_version=None):
        self.call("finish_weight_update")


class BreakableSource(ModuleSource):
    """vLLM's ModuleSource that raises (the trainer's own error) at one parameter when armed."""

    def __init__(self, module, break_at):
        super().__init__(module)
        self.break_at = break_at
        self.armed = False

    def iter_full(self):
        for name, tensor in super().iter_full():
            if self.armed and name == self.break_at:
                raise RuntimeError("the trainer lost a shard")
            yield name, tensor


@pytest.fixture(scope="module")
def cluster():
    """Two worker processes (TP ranks 0 and 1) and the trainer engine, made by vLLM's
    factories; torn down after the module's tests."""
    load_general_plugins()
    # The fork server imports vLLM's worker module (_vllm_worker) once and forks both workers
    # from it. It preloads before it takes this process's sys.path, so it finds the module
    # through PYTHONPATH, set while it starts.
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["_vllm_worker"])
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = HERE + (os.pathsep + saved if saved else "")
    conns, procs = [], []
    try:
        try:
            for rank in range(WORKERS):
                parent, child = ctx.Pipe()
                proc = ctx.Process(target=_vllm_spawn.run_worker, args=(child, rank, WORKERS),
                                   daemon=True)
                proc.start()
                child.close()
                conns.append(parent)
                procs.append(proc)
        finally:
            if saved is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = saved
        for rank, conn in enumerate(conns):
            assert conn.poll(START_TIMEOUT_S), f"worker {rank} did not start"
            assert conn.recv() == ("ok", rank)
        client = ProcessClient(conns)
        source_model = TiedModel()
        source = BreakableSource(source_model, break_at="layers.1.weight")
        # 4 KiB chunks: a layer's weight and its bias land in different chunks, so layerwise
        # reload holds a chunk's tensors past that chunk's update_weights call.
        trainer = WeightTransferTrainerFactory.trainer_init(
            WsyncTrainerInitInfo(rank=0, receivers=WORKERS, chunk_bytes=HIDDEN * HIDDEN * 4,
                                 flush_timeout_s=30.0),
            client=client, source=source)
        yield client, source_model, source, trainer
        trainer.shutdown()
        client.call("stop")
    finally:
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
                proc.join()


def perturb(model):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))


def assert_workers_match(client, source_model):
    want = source_model.state_dict()
    for rank, got in enumerate(client.call("state_dict")):
        assert sorted(got) == sorted(want), rank
        for name, tensor in want.items():
            assert torch.equal(got[name], tensor), f"worker {rank}: {name} differs"


def assert_sessions_closed(probes, completed_version):
    for rank, p in enumerate(probes):
        assert p["session_active"] is False, rank
        assert p["completed_version"] == completed_version, (rank, p)
        assert p["open_version"] == 0, (rank, p)
        assert p["layers_waiting"] == 0, (rank, p)
        assert p["meta_tensors"] == [], (rank, p)
        assert p["tied"], rank


def test_vllm_factories_build_wsync_engines_in_both_worker_processes(cluster):
    client, _, _, trainer = cluster
    assert type(trainer) is WsyncTrainerWeightTransferEngine
    probes = client.call("probe")
    assert [p["engine"] for p in probes] == ["WsyncWeightTransferEngine"] * WORKERS
    assert [p["receiver_index"] for p in probes] == list(range(WORKERS))


def test_several_versions_reach_two_worker_processes_bit_exact_with_tied_embeddings(cluster):
    client, source_model, _, trainer = cluster
    start = client.call("probe")[0]["completed_version"]
    for k in range(1, 4):
        perturb(source_model)
        trainer.send_weights()
        assert_workers_match(client, source_model)
        probes = client.call("probe")
        assert_sessions_closed(probes, start + k)
        assert all(p["lora_resets"] == start + k for p in probes)  # vLLM's finish ran


def test_a_worker_load_failure_fails_the_version_by_name_and_the_next_reaches_both(cluster):
    client, source_model, _, trainer = cluster
    perturb(source_model)
    trainer.send_weights()
    before = client.call("state_dict")
    good = client.call("probe")[0]["completed_version"]

    client.call_each("fail_on", lambda rank: ("layers.1.weight" if rank == 1 else None,))
    perturb(source_model)
    try:
        with pytest.raises(wsync.WsyncError) as caught:
            trainer.send_weights()
    finally:
        client.call_each("fail_on", lambda rank: (None,))
    err = caught.value
    assert err.status is wsync.Status.PEER
    assert isinstance(err.__cause__, WorkerCallError) and "worker 1: KeyError" in str(err.__cause__)
    [failure] = [f for f in err.failures if f.receiver == 1]
    assert failure.status is wsync.Status.MISMATCH
    assert "load_weights failed: KeyError" in failure.message
    # Every session is closed (worker 1's by its own error, worker 0's by the trainer's
    # abort), nothing is left buffered, both are still on the last good version, and layers
    # the failed version never completed kept their values.
    probes = client.call("probe")
    assert_sessions_closed(probes, good)
    assert [p["failed_version"] for p in probes] == [good + 1] * WORKERS
    assert probes[1]["failed_status"] == "MISMATCH"
    assert probes[0]["failed_status"] == "ABANDONED"
    for rank, got in enumerate(client.call("state_dict")):
        for name in ("layers.1.weight", "layers.1.bias"):
            assert torch.equal(got[name], before[rank][name]), (rank, name)

    perturb(source_model)
    trainer.send_weights()
    assert_workers_match(client, source_model)
    assert_sessions_closed(client.call("probe"), good + 2)


def test_a_trainer_failure_mid_version_closes_every_session_and_the_next_reaches_both(cluster):
    client, source_model, source, trainer = cluster
    perturb(source_model)
    trainer.send_weights()
    good = client.call("probe")[0]["completed_version"]

    source.armed = True
    perturb(source_model)
    try:
        with pytest.raises(RuntimeError, match="the trainer lost a shard"):
            trainer.send_weights()
    finally:
        source.armed = False
    probes = client.call("probe")
    assert_sessions_closed(probes, good)
    assert all(p["failed_status"] == "ABANDONED" for p in probes)

    perturb(source_model)
    trainer.send_weights()
    assert_workers_match(client, source_model)
    assert_sessions_closed(client.call("probe"), good + 2)


def test_a_session_left_open_by_a_trainer_that_died_is_closed_by_the_next_sync(cluster):
    client, source_model, _, trainer = cluster
    good = client.call("probe")[0]["completed_version"]
    client.start_weight_update()  # a trainer that started and died: vLLM refuses a new start
    with pytest.raises(WorkerCallError, match="already active"):
        client.start_weight_update()
    perturb(source_model)
    trainer.send_weights()
    assert_workers_match(client, source_model)
    assert_sessions_closed(client.call("probe"), good + 1)


def test_a_staged_version_that_fails_mid_transfer_changes_no_worker_at_all(cluster):
    client, source_model, _, first = cluster
    # The workers leave the first trainer and join a staged one (vLLM's shutdown and init RPCs).
    client.call("shutdown_weight_transfer_engine")
    first.shutdown()
    source = BreakableSource(source_model, break_at="layers.1.weight")
    trainer = WeightTransferTrainerFactory.trainer_init(
        WsyncTrainerInitInfo(rank=0, receivers=WORKERS, chunk_bytes=HIDDEN * HIDDEN * 4,
                             flush_timeout_s=30.0, staged=True),
        client=client, source=source)
    try:
        perturb(source_model)
        trainer.send_weights()
        assert_workers_match(client, source_model)
        before = client.call("state_dict")

        source.armed = True
        perturb(source_model)
        try:
            with pytest.raises(RuntimeError, match="the trainer lost a shard"):
                trainer.send_weights()
        finally:
            source.armed = False
        # Not one tensor changed on either worker, though chunks before the failure had
        # arrived (without staging, layers they completed would hold the failed version).
        for rank, got in enumerate(client.call("state_dict")):
            for name, tensor in before[rank].items():
                assert torch.equal(got[name], tensor), (rank, name)
        probes = client.call("probe")
        assert_sessions_closed(probes, 1)
        assert all(p["failed_status"] == "ABANDONED" for p in probes)

        perturb(source_model)
        trainer.send_weights()
        assert_workers_match(client, source_model)
        assert_sessions_closed(client.call("probe"), 3)
    finally:
        trainer.shutdown()
