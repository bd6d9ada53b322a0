"""Trainer helper (module -> planned chunks -> requests) and engine helper (dry run, then
in-place copy into an nn.Module), in one process."""

import numpy as np
import pytest
import torch

import wsync
from wsync import Status, WsyncError
from wsync.engine import ModuleLoader, load_into_module
from wsync.trainer import DEFAULT_CHUNK_BYTES, default_chunk_bytes, iter_chunks, named_tensors, send_model
from _models import TinyLM, model_digests, train_steps


def test_named_tensors_of_module_mapping_and_pairs():
    model = TinyLM()
    names = [n for n, _ in named_tensors(model)]
    assert names == list(model.state_dict())
    assert "rope_inv_freq" in names and "trained_steps" in names
    assert named_tensors({"a": torch.ones(1)})[0][0] == "a"
    assert [n for n, _ in named_tensors(model.named_parameters())] == [n for n, _ in model.named_parameters()]
    with pytest.raises(wsync.InvalidArgumentError, match="nn.Module, a mapping or"):
        named_tensors([torch.ones(1)])


def test_chunks_keep_modules_together_and_the_last_is_flagged():
    model = TinyLM()
    chunks = list(iter_chunks(model, chunk_bytes=20 << 10, group_depth=2))
    assert len(chunks) > 1
    assert [c.last for c in chunks] == [False] * (len(chunks) - 1) + [True]
    assert [c.index for c in chunks] == list(range(len(chunks)))
    where = {name: c.index for c in chunks for name, _ in c.tensors}
    assert list(where) == list(model.state_dict())  # every tensor once, in order
    for proj in ("k_proj", "v_proj", "o_proj"):
        assert where[f"layers.0.self_attn.{proj}.weight"] == where["layers.0.self_attn.q_proj.weight"]
    for c in chunks:
        assert c.bytes == sum(t.numel() * t.element_size() for _, t in c.tensors)
        assert c.bytes <= 20 << 10 or len(c.tensors) == 1


def test_cast_applies_to_floating_point_tensors_only():
    model = TinyLM()
    chunks = list(iter_chunks(model, dtype=torch.bfloat16))
    sent = dict(t for c in chunks for t in c.tensors)
    assert sent["lm_head.weight"].dtype == torch.bfloat16
    assert sent["rope_inv_freq"].dtype == torch.bfloat16
    assert sent["trained_steps"].dtype == torch.int64
    assert torch.equal(sent["lm_head.weight"], model.lm_head.weight.detach().to(torch.bfloat16))
    assert sum(c.bytes for c in chunks) == sum(t.numel() * t.element_size() for t in sent.values())


def test_planning_counts_bytes_after_the_cast():
    model = TinyLM()
    full = list(iter_chunks(model, chunk_bytes=8 << 10, group_depth=0))
    half = list(iter_chunks(model, chunk_bytes=8 << 10, group_depth=0, dtype=torch.float16))
    assert len(half) < len(full)


def test_non_contiguous_tensors_are_refused_unless_asked_to_copy(sync):
    source = {"t": torch.arange(6.0).view(2, 3).t()}
    with pytest.raises(wsync.InvalidArgumentError,
                       match=r"'t'.*not contiguous.*make_contiguous=True sends a contiguous copy"):
        send_model(sync.sender, source)
    assert sync.sender.version == 1  # nothing was published
    requests = send_model(sync.sender, source, make_contiguous=True)
    with sync.receiver.receive(requests[0]) as it:
        assert torch.equal(dict(it.items())["t"], source["t"])


def test_empty_source_is_an_invalid_argument(sync):
    with pytest.raises(wsync.InvalidArgumentError, match="nothing to send"):
        send_model(sync.sender, {})


def test_default_chunk_size_comes_from_the_buckets(make_sync):
    s = make_sync(bucket_bytes=1 << 16)
    assert default_chunk_bytes(s.sender) == 1 << 16
    assert DEFAULT_CHUNK_BYTES == 256 << 20


def _sync_model(sync, trainer, engine, **kwargs):
    forwarded = []
    loader = ModuleLoader(engine)

    def forward(request):
        forwarded.append(request)
        loader.load(sync.receiver, request)  # the engine loads while the trainer packs on

    requests = send_model(sync.sender, trainer, on_request=forward, flush_timeout_s=10, **kwargs)
    assert requests == forwarded
    return requests


def test_model_syncs_bit_for_bit_every_step(make_sync):
    s = make_sync(buckets=2, bucket_bytes=16 << 10)
    trainer, engine = TinyLM(seed=0), TinyLM(seed=123)
    assert model_digests(trainer) != model_digests(engine)
    for step in train_steps(trainer, 3):
        requests = _sync_model(s, trainer, engine)
        assert len(requests) > 2  # more chunks than buckets: packing waited on loading
        assert s.receiver.completed_version == step
        assert model_digests(engine) == model_digests(trainer)
        assert int(engine.trained_steps) == step


def test_requests_without_callback_need_enough_buckets(make_sync):
    s = make_sync(buckets=8, bucket_bytes=64 << 10)
    trainer, engine = TinyLM(seed=0), TinyLM(seed=5)
    requests = send_model(s.sender, trainer, chunk_bytes=32 << 10)
    assert 1 < len(requests) <= 8
    assert ModuleLoader(engine).load_all(s.receiver, requests) == 1
    s.sender.flush(5)
    assert model_digests(engine) == model_digests(trainer)


def test_cast_model_loads_into_a_bfloat16_engine(sync):
    trainer, engine = TinyLM(seed=0), TinyLM(seed=9).to(torch.bfloat16)
    _sync_model(sync, trainer, engine, dtype=torch.bfloat16)
    assert model_digests(engine) == model_digests(trainer, dtype=torch.bfloat16)


def test_shape_mismatch_is_caught_before_any_byte_is_copied(make_sync):
    s = make_sync(buckets=4, bucket_bytes=1 << 20)
    trainer = TinyLM(seed=0)
    engine = TinyLM(seed=1, hidden=48)  # mlp shapes differ
    before = model_digests(engine)
    requests = send_model(s.sender, trainer, chunk_bytes=1 << 20)
    assert len(requests) == 1
    with pytest.raises(WsyncError) as info:
        load_into_module(s.receiver, requests[0], engine)
    err = info.value
    assert err.status is Status.MISMATCH
    assert "tensor 'layers.0.mlp.gate_proj.weight': shape differs: request has (64, 32), model has (48, 32)" in err.message
    assert "layers.1.mlp.down_proj.weight" in err.message
    assert model_digests(engine) == before  # nothing was copied
    with pytest.raises(WsyncError) as flush:
        s.sender.flush(5)
    assert flush.value.status is Status.PEER
    assert s.receiver.completed_version == 0


def test_dtype_and_name_mismatches_are_named(sync):
    engine = {"w": torch.zeros(4, dtype=torch.float16)}
    requests = send_model(sync.sender, {"w": torch.ones(4), "extra.bias": torch.ones(2)})
    with pytest.raises(WsyncError) as info:
        load_into_module(sync.receiver, requests[0], engine)
    assert "tensor 'w': dtype differs: request has float32, model has float16" in info.value.message
    assert "tensor 'extra.bias' is not a parameter or buffer of the model" in info.value.message
    assert torch.equal(engine["w"], torch.zeros(4, dtype=torch.float16))


def test_allow_cast_and_ignore_unknown(sync):
    engine = {"w": torch.zeros(4, dtype=torch.float16)}
    requests = send_model(sync.sender, {"w": torch.full((4,), 1.5), "extra.bias": torch.ones(2)})
    info = load_into_module(sync.receiver, requests[0], engine, allow_cast=True, ignore_unknown=True)
    assert info.last and info.count == 2
    assert torch.equal(engine["w"], torch.full((4,), 1.5, dtype=torch.float16))
    sync.sender.flush(5)
    assert sync.receiver.completed_version == 1


def test_mismatch_message_lists_ten_problems_then_counts_the_rest(make_sync):
    s = make_sync(bucket_bytes=1 << 16)
    engine = {f"t{i}": torch.zeros(2) for i in range(30)}
    requests = send_model(s.sender, {f"t{i}": torch.ones(3) for i in range(30)})
    with pytest.raises(WsyncError) as info:
        load_into_module(s.receiver, requests[0], engine)
    message = info.value.message
    assert info.value.status is Status.MISMATCH
    assert message.count("shape differs") == 10
    assert "tensor 't9': shape differs" in message and "'t10'" not in message
    assert message.endswith("; and 20 more")
    assert len(ModuleLoader(engine).check(
        [wsync.TensorMeta(f"t{i}", wsync.DType.of("float32"), (3,)) for i in range(30)])) == 30


def test_loader_refuses_non_modules():
    with pytest.raises(wsync.InvalidArgumentError, match="nn.Module or a mapping"):
        ModuleLoader([torch.ones(1)])


def test_dtype_without_dlpack_code_is_named_when_planning():
    q = torch.quantize_per_tensor(torch.ones(2), 0.1, 0, torch.quint8)
    with pytest.raises(WsyncError) as info:
        list(iter_chunks({"ok": torch.ones(1), "q": q}))
    assert info.value.status is Status.INVALID_ARGUMENT
    assert "tensor 'q'" in info.value.message and "torch.quint8" in info.value.message


def test_numpy_state_dict_can_be_sent(sync):
    source = {"a.w": np.arange(6, dtype=np.float32).reshape(2, 3)}
    engine = {"a.w": torch.zeros(2, 3)}
    requests = send_model(sync.sender, source)
    load_into_module(sync.receiver, requests[0], engine)
    assert torch.equal(engine["a.w"], torch.arange(6.0).view(2, 3))
