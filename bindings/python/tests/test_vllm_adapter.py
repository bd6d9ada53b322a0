"""The vLLM WeightTransferEngine adapter, driven exactly as vLLM drives an engine: construct it
with (config, parallel_config, model), parse_init_info -> init_transfer_engine once, then per
update parse_update_info -> receive_weights(update_info, model.load_weights), and shutdown; the
trainer calls the static trainer_send_weights(iterator, trainer_args)."""

import dataclasses
import inspect
import queue
import subprocess
import sys
import threading
from types import SimpleNamespace

import pytest
import torch

import wsync
from wsync import Status, WsyncError
from wsync.vllm_adapter import (
    USING_VLLM_BASES,
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
    WsyncInitInfo,
    WsyncTrainerSendArgs,
    WsyncUpdateInfo,
    WsyncWeightTransferEngine,
    encode_blob,
)
from conftest import PACKAGE_ROOT
from _models import TinyLM, model_digests, train_steps

Engine = WsyncWeightTransferEngine


def make_engine(model, rank=0):
    return Engine(SimpleNamespace(backend="wsync"), SimpleNamespace(rank=rank), model)


def test_adapter_imports_without_vllm():
    code = ("import sys, wsync.vllm_adapter as a; "
            "assert 'vllm' not in sys.modules; assert not a.USING_VLLM_BASES; "
            "assert issubclass(a.WsyncWeightTransferEngine, a.WeightTransferEngine)")
    done = subprocess.run([sys.executable, "-c", code], cwd=str(PACKAGE_ROOT), timeout=60,
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr


def test_interface_matches_vllms_base():
    assert not USING_VLLM_BASES
    for method in ("parse_init_info", "parse_update_info", "init_transfer_engine",
                   "receive_weights", "receive_sparse_weights", "shutdown",
                   "trainer_send_weights", "trainer_send_sparse_weights"):
        assert callable(getattr(Engine, method)), method
    assert Engine.init_info_cls is WsyncInitInfo and Engine.update_info_cls is WsyncUpdateInfo
    assert isinstance(Engine.__dict__["trainer_send_weights"], staticmethod)
    # The parameter names vLLM's base class documents (callers may pass them by keyword).
    params = {m: list(inspect.signature(getattr(Engine, m)).parameters)
              for m in ("__init__", "parse_init_info", "parse_update_info", "init_transfer_engine",
                        "receive_weights", "shutdown", "trainer_send_weights")}
    assert params == {
        "__init__": ["self", "config", "parallel_config", "model"],
        "parse_init_info": ["self", "init_dict"],
        "parse_update_info": ["self", "update_dict"],
        "init_transfer_engine": ["self", "init_info"],
        "receive_weights": ["self", "update_info", "load_weights"],
        "shutdown": ["self"],
        "trainer_send_weights": ["iterator", "trainer_args"],
    }
    assert dataclasses.is_dataclass(WsyncInitInfo) and dataclasses.is_dataclass(WsyncUpdateInfo)
    assert issubclass(WsyncInitInfo, WeightTransferInitInfo)
    assert issubclass(WsyncUpdateInfo, WeightTransferUpdateInfo)
    with pytest.raises(TypeError):
        WeightTransferEngine(None, None, None)  # abstract
    with pytest.raises(NotImplementedError):
        make_engine(None).receive_sparse_weights(None, None)
    with pytest.raises(NotImplementedError):
        Engine.trainer_send_sparse_weights(iter(()), {})


@pytest.fixture
def trainer_side():
    strategy = wsync.Strategy("shm", receivers=2, buckets=2, bucket_bytes=64 << 10, timeout_ms=5000)
    init = strategy.create_init_info()
    sender = strategy.sender(init)
    yield strategy, init, sender
    sender.close()
    strategy.close()


# --- parse_init_info / parse_update_info -------------------------------------------------------
def test_parse_init_info_accepts_bytes_or_base64(trainer_side):
    _, init, _ = trainer_side
    engine = make_engine(None)
    info = engine.parse_init_info(Engine.init_dict(init, receiver_offset=1, options={"verify": False}))
    assert isinstance(info, WsyncInitInfo)
    assert info.init_info == init and info.receiver_offset == 1 and info.options == {"verify": False}
    assert info.kind == "shm"
    assert engine.parse_init_info({"init_info": init}).init_info == init


@pytest.mark.parametrize("bad,match", [
    ({}, "Invalid init_info"),
    ({"init_info": "AAAA", "surprise": 1}, "Invalid init_info"),
    ({"init_info": "not base64!"}, "not base64"),
    ({"init_info": ""}, "empty|not base64"),
    ({"init_info": encode_blob(b"random bytes")}, "not a wsync blob"),
    ({"init_info": 42}, "bytes or base64"),
])
def test_parse_init_info_rejects_bad_input(bad, match):
    with pytest.raises(ValueError, match=match):
        make_engine(None).parse_init_info(bad)


def test_parse_init_info_rejects_bad_fields(trainer_side):
    _, init, sender = trainer_side
    engine = make_engine(None)
    with pytest.raises(ValueError, match="receiver_offset"):
        engine.parse_init_info({"init_info": init, "receiver_offset": -1})
    with pytest.raises(ValueError, match="options must be a dict"):
        engine.parse_init_info({"init_info": init, "options": "verify"})
    request = sender.send_chunk({"a": torch.ones(1)})
    with pytest.raises(ValueError, match="request blob, expected init"):
        engine.parse_init_info({"init_info": request})


def test_parse_update_info(trainer_side):
    _, init, sender = trainer_side
    engine = make_engine(None)
    request = sender.send_chunk({"a": torch.ones(1)})
    info = engine.parse_update_info(Engine.update_dict([request]))
    assert isinstance(info, WsyncUpdateInfo) and info.requests == [request]
    assert info.update_kind == "dense"
    with pytest.raises(ValueError, match="Invalid update_info"):
        engine.parse_update_info({})
    with pytest.raises(ValueError, match="non-empty list"):
        engine.parse_update_info({"requests": []})
    with pytest.raises(ValueError, match="init blob, expected request"):
        engine.parse_update_info({"requests": [init]})
    with pytest.raises(ValueError, match=r"requests\[1\] is not a wsync blob"):
        engine.parse_update_info({"requests": [request, b"junk"]})
    with pytest.raises(ValueError, match="dense"):
        engine.parse_update_info({"requests": [request], "update_kind": "sparse_flat",
                                  "num_updates_list": [1]})
    with pytest.raises(ValueError, match="update_kind"):
        engine.parse_update_info({"requests": [request], "update_kind": "diagonal"})
    with pytest.raises(ValueError, match="one entry per tensor"):
        engine.parse_update_info({"requests": [request], "names": ["a"], "shapes": [[1], [2]]})


def test_receive_before_init_is_an_error():
    with pytest.raises(RuntimeError, match="not initialised"):
        make_engine(None).receive_weights(None, lambda w: None)


def test_trainer_args_are_validated():
    with pytest.raises(ValueError, match="invalid trainer_args"):
        Engine.trainer_send_weights(iter(()), {"sender": None, "bogus": 1})
    with pytest.raises(ValueError, match="wsync.Sender"):
        Engine.trainer_send_weights(iter(()), {"sender": "not a sender"})
    with pytest.raises(ValueError, match="dict or WsyncTrainerSendArgs"):
        Engine.trainer_send_weights(iter(()), 7)


# --- the full flow -----------------------------------------------------------------------------
def _run_trainer(sender, model, steps, forward, errors, dtype=None):
    """The trainer thread: after each step, every request, then ("synced", digests) computed
    here, before the next step changes the weights."""
    try:
        for _ in train_steps(model, steps):
            Engine.trainer_send_weights(
                ((n, p) for n, p in model.state_dict().items()),
                {"sender": sender, "on_request": forward, "chunk_bytes": 16 << 10,
                 "dtype": dtype, "flush_timeout_s": 10})
            forward(("synced", model_digests(model)))
    except BaseException as exc:  # handed to the test thread
        errors.append(exc)
        forward(("synced", None))


def test_two_workers_receive_every_step_bit_for_bit(trainer_side):
    _, init, sender = trainer_side
    trainer = TinyLM(seed=0)
    workers = [TinyLM(seed=10), TinyLM(seed=11)]
    engines = [make_engine(m, rank=r) for r, m in enumerate(workers)]
    init_dict = Engine.init_dict(init)  # JSON-safe, as vLLM's HTTP API would carry it
    for engine in engines:
        engine.init_transfer_engine(engine.parse_init_info(init_dict))
    assert [e.receiver_index for e in engines] == [0, 1]

    inbox, errors = queue.Queue(), []
    steps = 3
    thread = threading.Thread(target=_run_trainer,
                              args=(sender, trainer, steps, inbox.put, errors), daemon=True)
    thread.start()
    calls = [0, 0]
    try:
        for step in range(1, steps + 1):
            while True:
                request = inbox.get(timeout=30)
                if isinstance(request, tuple):
                    trainer_digests = request[1]
                    break
                update = Engine.update_dict([request])
                for k, (engine, model) in enumerate(zip(engines, workers)):
                    def load_weights(weights, model=model, k=k):
                        assert isinstance(weights, list) and all(isinstance(n, str) for n, _ in weights)
                        calls[k] += 1
                        model.load_weights(weights)
                    engine.receive_weights(engine.parse_update_info(update), load_weights)
            assert not errors, errors
            for engine, model in zip(engines, workers):
                assert engine.completed_version == step
                assert model_digests(model) == trainer_digests
        assert calls[0] == calls[1] > steps  # incrementally: once per chunk
    finally:
        thread.join(timeout=30)
        assert not thread.is_alive()
        for engine in engines:
            engine.shutdown()
            engine.shutdown()  # idempotent
    with pytest.raises(RuntimeError, match="not initialised"):
        engines[0].receive_weights(None, lambda w: None)


def test_expected_tensors_are_checked_before_loading(trainer_side):
    _, init, sender = trainer_side
    trainer, worker = TinyLM(seed=0), TinyLM(seed=3)
    engine = make_engine(worker, rank=1)
    engine.init_transfer_engine(engine.parse_init_info({"init_info": init}))
    other = wsync.Strategy("shm").receiver(init, 0)  # the second worker, keeping up
    try:
        args = WsyncTrainerSendArgs(sender=sender, chunk_bytes=64 << 10)
        Engine.trainer_send_weights(iter(trainer.state_dict().items()), args)
        assert len(args.requests) == 2
        names = list(trainer.state_dict())
        shapes = [list(t.shape) for t in trainer.state_dict().values()]
        shapes[3] = [1, 2, 3]
        update = engine.parse_update_info({"requests": [encode_blob(r) for r in args.requests],
                                           "names": names, "shapes": shapes})
        before = model_digests(worker)
        loaded = []
        with pytest.raises(WsyncError) as info:
            engine.receive_weights(update, loaded.extend)
        assert info.value.status is Status.MISMATCH
        assert f"tensor '{names[3]}': shape {tuple(trainer.state_dict()[names[3]].shape)}, expected (1, 2, 3)" in info.value.message
        assert loaded == [] and model_digests(worker) == before
        for request in args.requests:
            with other.receive(request) as it:
                list(it)
        with pytest.raises(WsyncError) as flush:
            sender.flush(5)
        assert flush.value.status is Status.PEER and "receiver 1" in flush.value.message
        assert engine.completed_version == 0 and other.completed_version == 1
    finally:
        other.close()
        engine.shutdown()


def test_error_in_load_weights_fails_the_chunk(trainer_side):
    _, init, sender = trainer_side
    engine = make_engine(TinyLM(seed=3), rank=0)
    engine.init_transfer_engine(engine.parse_init_info({"init_info": init, "receiver_offset": 0}))
    try:
        request = sender.send_chunk({"a": torch.ones(2), "b": torch.ones(2)}, last=True)

        def broken(weights):
            assert [name for name, _ in weights] == ["a", "b"]  # every view was taken
            raise KeyError("no such parameter")

        with pytest.raises(KeyError):
            engine.receive_weights(engine.parse_update_info({"requests": [request]}), broken)
        assert engine.completed_version == 0  # the worker keeps serving its old weights
        with pytest.raises(WsyncError) as flush:
            sender.flush(5)
        assert flush.value.status is Status.PEER
        [failure] = flush.value.failures
        assert failure.what is wsync.FailureKind.FAILED and failure.receiver == 0
        assert (failure.status, failure.version, failure.chunk_index) == (Status.MISMATCH, 1, 0)
        assert failure.message == "KeyError: 'no such parameter'"
        state = engine.poll()
        assert (state.failed_version, state.failed_status) == (1, Status.MISMATCH)
    finally:
        engine.shutdown()


def test_copy_option_hands_out_owned_tensors(trainer_side):
    _, init, sender = trainer_side
    engine = make_engine(None)
    engine.init_transfer_engine(engine.parse_init_info({"init_info": init, "copy": True}))
    try:
        request = sender.send_chunk({"a": torch.arange(4.0)}, last=True)
        kept = []
        engine.receive_weights(engine.parse_update_info({"requests": [request]}), kept.extend)
        kept[0][1].add_(1)  # writable and still valid after the chunk ended
        assert torch.equal(kept[0][1], torch.arange(4.0) + 1)
    finally:
        engine.shutdown()


def test_init_twice_is_refused(trainer_side):
    _, init, _ = trainer_side
    engine = make_engine(None)
    info = engine.parse_init_info({"init_info": init})
    engine.init_transfer_engine(info)
    try:
        with pytest.raises(RuntimeError, match="already initialised"):
            engine.init_transfer_engine(info)
    finally:
        engine.shutdown()


def test_receiver_index_out_of_range_is_named(trainer_side):
    _, init, _ = trainer_side
    engine = make_engine(None, rank=1)
    with pytest.raises(WsyncError, match="receiver index 3 is out of range"):
        engine.init_transfer_engine(engine.parse_init_info({"init_info": init, "receiver_offset": 2}))
