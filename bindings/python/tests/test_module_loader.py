"""ModuleLoader: strict by default (a version that misses a tensor of the module never
commits), tied tensors, and the map_name hook (renames, skips, q/k/v into a fused qkv)."""

import pytest
import torch

from wsync import Status, WsyncError
from wsync.engine import ModuleLoader
from wsync.trainer import send_model

H = 16


class Tied(torch.nn.Module):
    """An embedding tied to the LM head, one linear layer and a persistent buffer."""

    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(8, H)
        self.proj = torch.nn.Linear(H, H)
        self.head = torch.nn.Linear(H, 8, bias=False)
        self.head.weight = self.embed.weight
        self.register_buffer("scale", torch.ones(H))


class Separate(torch.nn.Module):
    """A trainer's attention: q, k and v as separate projections."""

    def __init__(self):
        super().__init__()
        self.q = torch.nn.Linear(H, H)
        self.k = torch.nn.Linear(H, H)
        self.v = torch.nn.Linear(H, H)


class Fused(torch.nn.Module):
    """An inference engine's attention: one qkv projection (rows q, then k, then v)."""

    def __init__(self):
        super().__init__()
        self.qkv = torch.nn.Linear(H, 3 * H)


QKV_ROWS = {"q": slice(0, H), "k": slice(H, 2 * H), "v": slice(2 * H, 3 * H)}


def qkv_map(name):
    """q.weight -> qkv.weight[0:H], k.bias -> qkv.bias[H:2H], ..."""
    part, kind = name.split(".")
    return f"qkv.{kind}", QKV_ROWS[part]


def send(sync, tensors, chunk_bytes=1 << 20):
    return send_model(sync.sender, tensors, chunk_bytes=chunk_bytes)


def test_a_version_missing_a_parameter_is_refused_on_its_last_chunk_and_never_commits(sync):
    engine = Tied()
    before = engine.proj.bias.detach().clone()
    trainer = Tied()
    sent = {k: v for k, v in trainer.state_dict().items() if k != "proj.bias"}
    [request] = send(sync, sent)
    with pytest.raises(WsyncError) as info:
        ModuleLoader(engine).load(sync.receiver, request)
    assert info.value.status is Status.MISMATCH
    assert "version 1 does not load 1 tensor(s) of the model (strict): missing 'proj.bias'" in str(info.value)
    # Refused before the chunk was copied, and the version did not commit.
    assert torch.equal(engine.proj.bias, before)
    assert not torch.equal(engine.proj.weight, trainer.proj.weight)
    state = sync.receiver.poll()
    assert (state.completed_version, state.failed_version, state.failed_status) == (0, 1, Status.MISMATCH)
    with pytest.raises(WsyncError) as flushed:
        sync.sender.flush(5)
    assert "missing 'proj.bias'" in flushed.value.failures[0].message


def test_a_missing_tensor_in_an_earlier_chunk_is_found_on_the_last(make_sync):
    s = make_sync(buckets=4)
    engine = Tied()
    sent = {k: v for k, v in Tied().state_dict().items() if k != "scale"}
    requests = send(s, sent, chunk_bytes=H * H * 4)
    assert len(requests) > 1
    loader = ModuleLoader(engine)
    for request in requests[:-1]:
        loader.load(s.receiver, request)
    with pytest.raises(WsyncError, match="missing 'scale'"):
        loader.load(s.receiver, requests[-1])
    assert s.receiver.completed_version == 0


def test_strict_false_loads_a_partial_version(sync):
    engine = Tied()
    trainer = Tied()
    [request] = send(sync, {"proj.weight": trainer.proj.weight})
    ModuleLoader(engine, strict=False).load(sync.receiver, request)
    assert torch.equal(engine.proj.weight, trainer.proj.weight)
    assert sync.receiver.completed_version == 1


def test_a_tied_tensor_sent_once_under_either_name_loads_both(make_sync):
    for name in ("embed.weight", "head.weight"):
        s = make_sync()
        engine, trainer = Tied(), Tied()
        sent = dict(trainer.named_parameters())  # tied: embed.weight only
        sent["scale"] = trainer.scale
        if name == "head.weight":
            sent["head.weight"] = sent.pop("embed.weight")
        [request] = send(s, sent)
        ModuleLoader(engine).load(s.receiver, request)
        assert torch.equal(engine.head.weight, trainer.embed.weight)
        assert engine.head.weight is engine.embed.weight
        assert s.receiver.completed_version == 1


def test_the_missing_list_names_tied_tensors_together(sync):
    loader = ModuleLoader(Tied())
    assert loader.missing() == ["scale", "embed.weight=head.weight", "proj.weight", "proj.bias"]


def test_map_name_loads_q_k_v_into_a_fused_qkv_bit_exact(make_sync):
    trainer, engine = Separate(), Fused()
    loader = ModuleLoader(engine, map_name=qkv_map)
    s = make_sync(buckets=4)
    for version in (1, 2):
        with torch.no_grad():
            for p in trainer.parameters():
                p.add_(torch.randn_like(p))
        # Small chunks: the qkv parts arrive in several chunks, and the fused tensor counts
        # as loaded only once all three are in.
        requests = send_model(s.sender, trainer.state_dict(), chunk_bytes=H * H * 4,
                              on_request=lambda r: loader.load(s.receiver, r))
        assert len(requests) > 3
        assert s.receiver.completed_version == version
        want_w = torch.cat([trainer.q.weight, trainer.k.weight, trainer.v.weight])
        want_b = torch.cat([trainer.q.bias, trainer.k.bias, trainer.v.bias])
        assert torch.equal(engine.qkv.weight, want_w)
        assert torch.equal(engine.qkv.bias, want_b)


def test_a_fused_parameter_missing_one_part_is_refused_by_the_strict_check(sync):
    trainer = Separate()
    sent = {k: v for k, v in trainer.state_dict().items() if k != "v.weight"}
    [request] = send(sync, sent)
    with pytest.raises(WsyncError, match="missing 'qkv.weight'"):
        ModuleLoader(Fused(), map_name=qkv_map).load(sync.receiver, request)


def test_a_part_loaded_twice_does_not_make_up_for_a_missing_one(sync):
    trainer = Separate()
    sent = {k: v for k, v in trainer.state_dict().items() if k != "v.weight"}
    sent["q_again.weight"] = trainer.q.weight  # as many elements as the missing v part
    [request] = send(sync, sent)

    def mapping(name):
        return qkv_map(name.replace("q_again", "q"))

    with pytest.raises(WsyncError, match="missing 'qkv.weight'"):
        ModuleLoader(Fused(), map_name=mapping).load(sync.receiver, request)


def test_map_name_renames_and_skips(sync):
    engine, trainer = Tied(), Tied()
    sent = {f"model.{k}": v for k, v in trainer.state_dict().items()}
    sent["model.optimizer_step"] = torch.tensor(3)

    def strip(name):
        return None if name == "model.optimizer_step" else name[len("model."):]

    [request] = send(sync, sent)
    ModuleLoader(engine, map_name=strip).load(sync.receiver, request)
    for k, v in trainer.state_dict().items():
        assert torch.equal(engine.state_dict()[k], v), k
    assert sync.receiver.completed_version == 1


def test_a_mapped_part_of_the_wrong_shape_is_a_mismatch_naming_both_names(sync):
    trainer = Separate()
    [request] = send(sync, trainer.state_dict())

    def wrong(name):
        part, kind = name.split(".")
        return f"qkv.{kind}", slice(0, H // 2)

    with pytest.raises(WsyncError) as info:
        ModuleLoader(Fused(), map_name=wrong).load(sync.receiver, request)
    assert info.value.status is Status.MISMATCH
    assert "tensor 'q.weight' (-> 'qkv.weight'): shape differs: request has (16, 16), model has (8, 16)" in str(info.value)


def test_map_name_must_return_none_a_name_or_a_pair(sync):
    [request] = send(sync, {"a": torch.ones(2)})
    with pytest.raises(WsyncError, match=r"map_name\('a'\) returned 3"):
        ModuleLoader({"a": torch.zeros(2)}, map_name=lambda n: 3).load(sync.receiver, request)


def test_a_repeated_chunk_layout_is_resolved_once_and_a_new_layout_is_checked_again(make_sync):
    # The loader works out names, checks and destinations once per chunk layout: over three
    # versions of the same plan map_name sees each name once, the fused qkv stays bit-exact
    # (views into the target are made fresh each time), and a chunk of a new layout that does
    # not fit is still refused by name before any byte moves.
    trainer, engine = Separate(), Fused()
    calls = []

    def counting_map(name):
        calls.append(name)
        return qkv_map(name)

    loader = ModuleLoader(engine, map_name=counting_map)
    s = make_sync(buckets=4)
    after = {}
    for version in (1, 2, 3):
        with torch.no_grad():
            for p in trainer.parameters():
                p.add_(torch.randn_like(p))
        send_model(s.sender, trainer.state_dict(), chunk_bytes=H * H * 4,
                   on_request=lambda r: loader.load(s.receiver, r))
        assert s.receiver.completed_version == version
        assert torch.equal(engine.qkv.weight,
                           torch.cat([trainer.q.weight, trainer.k.weight, trainer.v.weight]))
        after[version] = len(calls)
    assert sorted(set(calls)) == sorted(trainer.state_dict())
    assert after[1] == 2 * len(trainer.state_dict())  # the check and the plan, once a name
    assert after[3] == after[1]  # versions 2 and 3: no name resolved again
    before = engine.qkv.weight.detach().clone()
    bad = {"q.weight": torch.ones(H, H + 1)}  # a new layout, of the wrong shape
    request = s.sender.send_chunk(bad, last=True)
    with pytest.raises(WsyncError) as info:
        loader.load(s.receiver, request)
    assert info.value.status is Status.MISMATCH and "'q.weight'" in info.value.message
    assert torch.equal(engine.qkv.weight, before)


class WithNorm(torch.nn.Module):
    """A linear layer and a batch norm: parameters and persistent buffers."""

    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(H, H)
        self.norm = torch.nn.BatchNorm1d(H)


def test_a_module_converted_after_the_loader_was_made_is_loaded_as_it_is_now(make_sync):
    # An engine makes its loader, then picks its serving dtype (module.float()): the
    # parameters change dtype in place and every buffer becomes a new tensor. The next version
    # is checked against the module as it is then: without allow_cast the bf16 wire is refused
    # naming float32 (before, its raw bytes were copied into the fp32 storage), with it the
    # values arrive cast, in the buffers the module now holds.
    trainer = WithNorm()
    with torch.no_grad():
        for t in trainer.state_dict().values():
            if t.is_floating_point():
                t.copy_(torch.randn_like(t))
    s = make_sync(buckets=4)
    strict_engine, casting_engine = WithNorm().bfloat16(), WithNorm().bfloat16()
    strict = ModuleLoader(strict_engine)
    casting = ModuleLoader(casting_engine, allow_cast=True)
    strict_engine.float()
    casting_engine.float()
    before = {n: t.clone() for n, t in strict_engine.state_dict().items()}
    request, = send_model(s.sender, trainer, dtype=torch.bfloat16)
    with pytest.raises(WsyncError) as info:
        strict.load(s.receiver, request)
    assert info.value.status is Status.MISMATCH
    assert "tensor 'proj.weight': dtype differs: request has bfloat16, model has float32" in info.value.message
    assert all(torch.equal(strict_engine.state_dict()[n], t) for n, t in before.items())

    s2 = make_sync(buckets=4)
    request, = send_model(s2.sender, trainer, dtype=torch.bfloat16)
    casting.load(s2.receiver, request)
    s2.sender.flush(5)
    for name, t in trainer.state_dict().items():
        want = t.to(torch.bfloat16).float() if t.is_floating_point() else t
        assert torch.equal(casting_engine.state_dict()[name], want), name


def test_a_buffer_replaced_between_versions_is_loaded_where_the_module_holds_it(make_sync):
    trainer, engine = WithNorm(), WithNorm()
    s = make_sync(buckets=4)
    loader = ModuleLoader(engine)
    send_model(s.sender, trainer, on_request=lambda r: loader.load(s.receiver, r))
    engine.norm.running_mean = torch.zeros(H)  # a new buffer object, as module.to() makes
    with torch.no_grad():
        trainer.norm.running_mean.add_(3)
        trainer.proj.weight.add_(1)
    send_model(s.sender, trainer, on_request=lambda r: loader.load(s.receiver, r))
    assert s.receiver.completed_version == 2
    assert torch.equal(engine.norm.running_mean, trainer.norm.running_mean)
    assert torch.equal(engine.proj.weight, trainer.proj.weight)


class _Attn(torch.nn.Module):
    def __init__(self, fused):
        super().__init__()
        if fused:
            self.qkv = torch.nn.Linear(H, 3 * H)
        else:
            self.q_proj, self.k_proj, self.v_proj = (torch.nn.Linear(H, H) for _ in range(3))


class _LM(torch.nn.Module):
    """Names as real checkpoints have them: layers.0.attn.{q,k,v}_proj or qkv, and lm_head."""

    def __init__(self, fused):
        super().__init__()
        self.layers = torch.nn.ModuleList([torch.nn.ModuleDict({"attn": _Attn(fused)})])
        self.lm_head = torch.nn.Linear(H, 8, bias=False)


def test_the_readme_to_fused_hook_loads_a_model_with_an_lm_head(sync):
    # The package README's map_name example, run as written (it once crashed on
    # lm_head.weight, whose name has two dotted parts).
    import re
    from pathlib import Path

    readme = (Path(__file__).resolve().parents[1] / "README.md").read_text()
    block = re.search(r"```python\n(H = model\.config\.hidden_size.*?)```", readme, re.S)
    assert block, "the README's to_fused example moved"
    trainer, engine = _LM(fused=False), _LM(fused=True)
    engine.config = type("Config", (), {"hidden_size": H})()
    scope = {"model": engine, "ModuleLoader": ModuleLoader}
    exec(block.group(1), scope)
    loader = scope["loader"]
    send_model(sync.sender, trainer, on_request=lambda r: loader.load(sync.receiver, r))
    assert sync.receiver.completed_version == 1
    attn = trainer.layers[0]["attn"]
    assert torch.equal(engine.layers[0]["attn"].qkv.weight,
                       torch.cat([attn.q_proj.weight, attn.k_proj.weight, attn.v_proj.weight]))
    assert torch.equal(engine.lm_head.weight, trainer.lm_head.weight)


def test_an_exception_in_map_name_fails_the_chunk_naming_the_tensor(sync):
    trainer, engine = _LM(fused=False), _LM(fused=True)
    before = {n: t.clone() for n, t in engine.state_dict().items()}
    loader = ModuleLoader(engine, map_name=lambda name: name.split(".")[4])  # IndexError on lm_head
    request, = send(sync, trainer.state_dict())
    with pytest.raises(WsyncError) as info:
        loader.load(sync.receiver, request)
    assert info.value.status is Status.MISMATCH
    assert "map_name('lm_head.weight') raised IndexError: list index out of range" in info.value.message
    assert all(torch.equal(engine.state_dict()[n], t) for n, t in before.items())
    with pytest.raises(WsyncError) as flush:
        sync.sender.flush(5)
    assert "map_name('lm_head.weight') raised IndexError" in flush.value.failures[0].message


class _TwoOverOne(torch.nn.Module):
    """Two parameters made over one storage: tied by memory, not by object."""

    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(4, 4, bias=False)
        self.b = torch.nn.Linear(4, 4, bias=False)
        self.b.weight = torch.nn.Parameter(self.a.weight.data)


def test_parameters_untied_by_a_conversion_after_the_loader_was_made_each_load_the_tied_wire_tensor(sync):
    # A conversion there and back (or a move to a GPU) gives each parameter a storage of its
    # own while keeping objects, dtypes and shapes: the trainer's one tied wire tensor must
    # then reach both (review: only one was loaded and the version committed with a mix).
    trainer, engine = _TwoOverOne(), _TwoOverOne()
    loader = ModuleLoader(engine)
    engine.double()
    engine.float()
    assert engine.a.weight.data_ptr() != engine.b.weight.data_ptr()
    with torch.no_grad():
        trainer.a.weight.fill_(7.0)
    send_model(sync.sender, trainer, on_request=lambda r: loader.load(sync.receiver, r))
    sync.sender.flush(5)
    assert sync.receiver.completed_version == 1
    assert torch.equal(engine.a.weight, trainer.a.weight)
    assert torch.equal(engine.b.weight, trainer.b.weight)
