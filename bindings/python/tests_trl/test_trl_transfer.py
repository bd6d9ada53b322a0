"""WsyncWeightTransfer against TRL 1.16.0's contract: TRL's own ``VLLMClient`` (HTTP) drives a
vLLM 0.33.0 server process (``_trl_server.py``) whose worker receives over wsync's ``shm`` kind;
several versions bit-exact, TRL's no-op before init and after destroy, a bad iterator, and the
engine process SIGKILLed mid-version (named within a deadline; the next version reaches the
restarted engine)."""

import inspect
import os
import signal
import time

import pytest
import requests
import torch

import wsync
from conftest import served_matches
from _trl_models import load_model
from trl.experimental.async_grpo.async_grpo_trainer import WeightTransferProtocol
from trl.experimental.async_grpo.vllm_client import VLLMClient
from wsync.integrations.trl import WsyncWeightTransfer, weight_update_info

#: Small chunks, so a version of the tiny model is several chunks (a kill lands mid-version).
CHUNK_BYTES = 4096
#: How long the TRL-side call may take to report a killed engine.
DEADLINE_S = 30


def perturb(model):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))


def stream(model):
    """What ``AsyncGRPOTrainer._streaming_iter`` yields for a plain (non-FSDP) model."""
    from trl.experimental.async_grpo.async_grpo_trainer import _iter_vllm_named_params

    for name, param in _iter_vllm_named_params(model):
        yield name, param.detach()


def is_paused(server):
    return requests.get(f"{server.url}/is_paused", timeout=30).json()["is_paused"]


@pytest.fixture
def trained(model_dir):
    return load_model(model_dir)


@pytest.fixture
def transfer(server, trained):
    wt = WsyncWeightTransfer(VLLMClient(server.url), weight_update_info(trained),
                             chunk_bytes=CHUNK_BYTES, flush_timeout_s=20.0)
    yield wt
    wt.destroy()


def test_it_has_every_method_of_trls_weight_transfer_protocol_with_its_signature():
    members = [n for n in vars(WeightTransferProtocol) if not n.startswith("_")]
    assert sorted(members) == ["destroy", "init_weight_transfer", "pause", "resume", "send_weights"]
    for name in members:
        want = inspect.signature(getattr(WeightTransferProtocol, name))
        got = inspect.signature(getattr(WsyncWeightTransfer, name))
        assert list(got.parameters) == list(want.parameters), name


def test_the_manifest_is_the_one_trls_trainer_builds(trained):
    info = weight_update_info(trained)
    names = [n for n, _ in trained.named_parameters()]
    assert info["names"] == names
    assert info["dtype_names"] == ["float32"] * len(names)
    assert info["shapes"][0] == list(trained.model.embed_tokens.weight.shape)


def test_send_weights_before_init_and_after_destroy_sends_nothing_as_trls_client(server, trained):
    wt = WsyncWeightTransfer(server.url, weight_update_info(trained))
    pulled = []
    wt.send_weights(pulled.append(x) or x for x in stream(trained))
    assert pulled == []
    wt.destroy()
    wt.destroy()


def test_several_versions_reach_the_engine_bit_exact_with_pause_and_resume(server, transfer, trained):
    transfer.init_weight_transfer()
    assert transfer.receivers == 1
    for _ in range(3):
        perturb(trained)
        transfer.pause()
        assert is_paused(server)
        transfer.send_weights(stream(trained))
        transfer.resume()
        assert not is_paused(server)
        assert served_matches(server, trained) == {"match": True, "mismatches": []}


def test_bf16_weights_reach_the_engine_bit_exact_through_a_new_trainer(server, model_dir):
    """A second trainer after the first's destroy (the server released its receiver)."""
    trained = load_model(model_dir)
    wt = WsyncWeightTransfer(server.url, weight_update_info(trained), chunk_bytes=CHUNK_BYTES)
    try:
        wt.init_weight_transfer()
        perturb(trained)
        # bf16 values sent into the fp32 engine are loaded as vLLM loads them (a cast copy).
        wt.send_weights((n, t.to(torch.bfloat16).to(torch.float32)) for n, t in stream(trained))
        with torch.no_grad():
            for p in trained.parameters():
                p.copy_(p.to(torch.bfloat16).to(torch.float32))
        assert served_matches(server, trained)["match"]
    finally:
        wt.destroy()


def test_an_iterator_that_breaks_the_manifest_fails_the_version_by_name_and_the_next_arrives(
        server, transfer, trained):
    transfer.init_weight_transfer()
    perturb(trained)
    transfer.send_weights(stream(trained))
    good = served_matches(server, trained)
    assert good["match"]

    def renamed():
        for i, (name, t) in enumerate(stream(trained)):
            yield (f"{name}.typo" if i == 7 else name), t

    perturb(trained)
    with pytest.raises(RuntimeError) as caught:
        transfer.send_weights(renamed())
    assert server.url in str(caught.value)
    assert ".typo" in str(caught.value.__cause__)
    perturb(trained)
    transfer.send_weights(stream(trained))
    assert served_matches(server, trained)["match"]


def test_the_engine_sigkilled_mid_version_is_named_within_a_deadline_and_a_restarted_one_takes_the_next(
        server, transfer, trained):
    transfer.init_weight_transfer()
    perturb(trained)
    transfer.send_weights(stream(trained))
    pid = server.proc.pid

    def killing(at):
        """The trainer's stream, with the engine process SIGKILLed before tensor ``at``
        (several chunks into the version)."""
        for i, pair in enumerate(stream(trained)):
            if i == at:
                os.kill(pid, signal.SIGKILL)
                server.proc.wait(30)
            yield pair

    perturb(trained)
    began = time.monotonic()
    with pytest.raises(Exception) as caught:
        transfer.send_weights(killing(at=12))
    took = time.monotonic() - began
    err = caught.value
    assert took < DEADLINE_S, took
    assert server.url in str(err), err
    # The library's failure, re-raised naming the engine: its status, the receiver and the
    # dead worker's pid.
    assert isinstance(err, wsync.WsyncError), repr(err)
    assert err.status == wsync.Status.PEER
    assert [(f.receiver, f.what.name) for f in err.failures] == [(0, "DIED")], err.failures
    assert f"wsync receiver 0 (vLLM worker pid {pid}) died" in str(err), err

    server.start().wait_ready()
    for _ in range(2):
        perturb(trained)
        transfer.pause()
        transfer.send_weights(stream(trained))
        transfer.resume()
        assert served_matches(server, trained) == {"match": True, "mismatches": []}


def test_an_engine_that_fails_to_load_a_chunk_is_named_with_its_own_message(server, model_dir):
    """A tensor the served model has no place for: the worker's ``load_weights`` raises, its
    receiver fails the chunk, and the library's failure (``FAILED``, the worker's message)
    reaches the TRL caller naming the engine. A later trainer's versions arrive."""
    trained = load_model(model_dir)
    info = weight_update_info(trained)
    extra = {"names": info["names"] + ["extra.weight"], "dtype_names": info["dtype_names"] + ["float32"],
             "shapes": info["shapes"] + [[4, 4]]}
    wt = WsyncWeightTransfer(server.url, extra, chunk_bytes=CHUNK_BYTES, flush_timeout_s=20.0)
    try:
        wt.init_weight_transfer()
        with pytest.raises(wsync.WsyncError) as caught:
            wt.send_weights([*stream(trained), ("extra.weight", torch.zeros(4, 4))])
    finally:
        wt.destroy()
    err = caught.value
    assert server.url in str(err) and server.proc.pid in [f.pid for f in err.failures], err
    assert [(f.receiver, f.what.name) for f in err.failures] == [(0, "FAILED")], err.failures
    assert "extra.weight" in str(err), err

    wt = WsyncWeightTransfer(server.url, info, chunk_bytes=CHUNK_BYTES)
    try:
        wt.init_weight_transfer()
        perturb(trained)
        wt.send_weights(stream(trained))
        assert served_matches(server, trained)["match"]
    finally:
        wt.destroy()
