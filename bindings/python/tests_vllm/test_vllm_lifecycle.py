"""vLLM 0.33.0's current engine contract through its real ``Worker`` in two worker processes
(``_vllm_worker.py``): a draft-model session, list payloads, and a worker that dies behind a
client that notices only by timeout (as vLLM's HTTP client does when a server's worker died):
``send_weights`` raises naming it after one wait, sends nothing more through that client, and
a replacement worker joins through ``reinit_workers`` with versions going on."""

import multiprocessing
import os
import signal
import time

import pytest
import torch
from vllm.distributed.weight_transfer import ModuleSource, WeightTransferTrainerFactory
from vllm.plugins import load_general_plugins

import wsync
import _vllm_spawn
from _vllm_models import HIDDEN, TiedModel
from test_vllm_processes import (ProcessClient, assert_sessions_closed, assert_workers_match,
                                 perturb, START_TIMEOUT_S)
from wsync.integrations.vllm import WsyncTrainerInitInfo, WsyncWeightTransferEngine

WORKERS = 2
HERE = os.path.dirname(os.path.abspath(__file__))
#: The client's per-call timeout: how long it takes to notice a dead worker.
TIMEOUT_S = 4.0


class TimeoutClient(ProcessClient):
    """A client that notices a dead worker only when its call times out, and logs its calls."""

    def __init__(self, conns):
        super().__init__(conns)
        self.log = []

    def call_each(self, method, args_for):
        self.log.append((method, args_for(0)))
        sent = []
        for rank, conn in enumerate(self.conns):
            try:
                conn.send((method, args_for(rank)))
                sent.append(True)
            except OSError:
                sent.append(False)
        replies = []
        for rank, conn in enumerate(self.conns):
            start = time.monotonic()
            try:
                if sent[rank] and conn.poll(TIMEOUT_S):
                    replies.append(conn.recv())
                    continue
            except (EOFError, OSError):
                pass
            time.sleep(max(0.0, TIMEOUT_S - (time.monotonic() - start)))
            raise TimeoutError(f"worker {rank} did not answer {method} in {TIMEOUT_S} s")
        errors = [f"worker {rank}: {r[1]}: {r[2]}" for rank, r in enumerate(replies) if r[0] != "ok"]
        if errors:
            raise RuntimeError(f"{method} failed: " + "; ".join(errors))
        return [r[1] for r in replies]

    def start_draft_weight_update(self):
        self.call("start_draft_weight_update")


def start_worker(ctx, rank):
    parent, child = ctx.Pipe()
    proc = ctx.Process(target=_vllm_spawn.run_worker, args=(child, rank, WORKERS), daemon=True)
    proc.start()
    child.close()
    return parent, proc


@pytest.fixture(scope="module")
def cluster():
    load_general_plugins()
    ctx = multiprocessing.get_context("forkserver")
    ctx.set_forkserver_preload(["_vllm_worker"])
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = HERE + (os.pathsep + saved if saved else "")
    procs = []
    try:
        try:
            conns = []
            for rank in range(WORKERS):
                conn, proc = start_worker(ctx, rank)
                conns.append(conn)
                procs.append(proc)
        finally:
            if saved is None:
                del os.environ["PYTHONPATH"]
            else:
                os.environ["PYTHONPATH"] = saved
        for rank, conn in enumerate(conns):
            assert conn.poll(START_TIMEOUT_S), f"worker {rank} did not start"
            assert conn.recv() == ("ok", rank)
        client = TimeoutClient(conns)
        source_model = TiedModel()
        trainer = WeightTransferTrainerFactory.trainer_init(
            WsyncTrainerInitInfo(rank=0, receivers=WORKERS, chunk_bytes=HIDDEN * HIDDEN * 4,
                                 flush_timeout_s=30.0),
            client=client, source=ModuleSource(source_model))
        yield ctx, client, source_model, trainer, procs
        trainer.shutdown()
        for conn in client.conns:
            try:
                conn.send(("stop", ()))
            except OSError:
                pass
    finally:
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
                proc.join()


def test_the_engine_follows_vllm_033s_contract_flags():
    assert WsyncWeightTransferEngine.supports_draft_weight_update is True
    assert WsyncWeightTransferEngine.defers_processing is False


def test_a_draft_session_loads_the_draft_model_and_leaves_the_target_as_it_was(cluster):
    _, client, source_model, trainer, _ = cluster
    trainer.send_weights()
    target_before = client.call("state_dict")
    draft_source = TiedModel()
    for _ in range(2):
        perturb(draft_source)
        trainer.send_draft_weights(ModuleSource(draft_source))
        want = draft_source.state_dict()
        for rank, got in enumerate(client.call("draft_state_dict")):
            for name, tensor in want.items():
                assert torch.equal(got[name], tensor), (rank, name)
        for rank, got in enumerate(client.call("state_dict")):
            for name, tensor in target_before[rank].items():
                assert torch.equal(got[name], tensor), (rank, name)
    # The next target session goes to the target again (vLLM reset the engine's target).
    perturb(source_model)
    trainer.send_weights()
    assert_workers_match(client, source_model)
    assert all(not p["session_active"] for p in client.call("probe"))


def test_a_client_without_start_draft_weight_update_is_refused_by_name(cluster):
    _, client, _, trainer, _ = cluster

    class Plain:  # vLLM 0.33's HTTP and Ray clients have no start_draft_weight_update
        init_weight_transfer_engine = start_weight_update = update_weights = None
        finish_weight_update = None

    saved, trainer.client = trainer.client, Plain()
    try:
        with pytest.raises(TypeError, match="Plain has no start_draft_weight_update"):
            trainer.send_draft_weights()
    finally:
        trainer.client = saved


def test_list_payloads_are_split_by_vllms_worker_and_reach_both_bit_exact(cluster):
    _, client, source_model, trainer, _ = cluster

    class ListClient:
        """Sends every update payload as vLLM's rank-indexed list."""

        def __getattr__(self, name):
            return getattr(client, name)

        def update_weights(self, update_info):
            client.update_weights([update_info] * WORKERS)

    saved, trainer.client = trainer.client, ListClient()
    try:
        perturb(source_model)
        trainer.send_weights()
    finally:
        trainer.client = saved
    assert_workers_match(client, source_model)


def test_the_same_init_info_again_is_ignored_and_another_is_refused_by_name(cluster):
    _, client, source_model, trainer, _ = cluster
    good = client.call("probe")[0]["completed_version"]
    trainer.reinit_workers()  # both workers hold it already
    other = wsync.Strategy("shm", receivers=WORKERS)
    try:
        blob = other.create_init_info()
        with pytest.raises(RuntimeError, match="already initialised with another trainer"):
            client.init_weight_transfer_engine(
                {"init_info": wsync.integrations.vllm.encode_blob(blob)})
    finally:
        other.close()
    perturb(source_model)
    trainer.send_weights()
    assert_workers_match(client, source_model)
    assert_sessions_closed(client.call("probe"), good + 1)


def test_a_dead_worker_behind_a_timing_out_client_costs_one_wait_and_a_replacement_rejoins(cluster):
    ctx, client, source_model, trainer, procs = cluster
    perturb(source_model)
    trainer.send_weights()
    good = client.call("probe")[0]["completed_version"]

    os.kill(procs[1].pid, signal.SIGKILL)
    procs[1].join(30)
    client.log.clear()
    perturb(source_model)
    began = time.monotonic()
    with pytest.raises(Exception) as caught:
        trainer.send_weights()
    took = time.monotonic() - began
    # One timeout, then nothing more through the client: no abort, no retried start.
    assert client.log == [("start_weight_update", ())], client.log
    assert took < 2 * TIMEOUT_S, took
    err = caught.value
    chain = [err, err.__cause__]
    assert any(isinstance(e, TimeoutError) and "worker 1" in str(e) for e in chain), chain
    if isinstance(err, wsync.WsyncError):
        assert [f.receiver for f in err.failures] == [1]

    # A replacement for worker 1 (same TP rank: the same receiver index) joins through the
    # trainer's init info re-sent; worker 0 keeps its receiver, the next sync closes the
    # session the timed-out start left open on it, and versions go on from the last good one.
    saved = os.environ.get("PYTHONPATH")
    os.environ["PYTHONPATH"] = HERE + (os.pathsep + saved if saved else "")
    try:
        conn, proc = start_worker(ctx, 1)
    finally:
        if saved is None:
            del os.environ["PYTHONPATH"]
        else:
            os.environ["PYTHONPATH"] = saved
    procs[1] = proc
    assert conn.poll(START_TIMEOUT_S) and conn.recv() == ("ok", 1)
    client.conns[1] = conn
    trainer.reinit_workers()
    for _ in range(2):
        perturb(source_model)
        trainer.send_weights()
        assert_workers_match(client, source_model)
    probes = client.call("probe")
    assert [p["receiver_index"] for p in probes] == [0, 1]
    assert probes[0]["completed_version"] == probes[1]["completed_version"] > good
    assert all(not p["session_active"] and p["open_version"] == 0 for p in probes)


def test_the_readmes_cpu_recipe_runs_and_syncs_three_versions_bit_exact():
    import subprocess
    import sys

    script = os.path.join(HERE, "..", "examples", "vllm_cpu.py")
    done = subprocess.run([sys.executable, script], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "3 versions bit-exact" in done.stdout
