"""Receiver.dest_table / Iteration.apply (wsync_dest_table_create / wsync_recv_apply): a chunk
loaded into declared destinations by one call, and ModuleLoader's use of it."""

import numpy as np
import pytest
import torch

import wsync
from wsync import Dest, Status, WsyncError
from wsync.engine import ModuleLoader


def test_a_chunk_loads_into_fused_and_tied_destinations_by_one_call(sync):
    q, k, v, emb = torch.randn(4, 8), torch.randn(2, 8), torch.randn(2, 8), torch.randn(16, 8)
    qkv, head, emb_dst = torch.zeros(8, 8), torch.zeros(16, 8), torch.zeros(16, 8)
    table = sync.receiver.dest_table([
        ("q", qkv[0:4]), ("k", qkv[4:6]), ("v", qkv[6:8]), ("emb", emb_dst), Dest("emb", head)])
    request = sync.sender.send_chunk({"q": q, "k": k, "v": v, "emb": emb}, last=True)
    with sync.receiver.receive(request) as it:
        r = it.apply(table, complete=True)
    assert (r.tensors, r.writes, r.unmatched, r.launches) == (4, 5, 0, 0)
    assert r.bytes == (32 + 16 + 16 + 2 * 128) * 4
    assert torch.equal(qkv, torch.cat([q, k, v])) and torch.equal(emb_dst, emb) and torch.equal(head, emb)
    assert sync.receiver.completed_version == 1
    table.close()
    table.close()  # idempotent


def test_a_refusal_names_the_tensor_moves_nothing_and_the_iteration_goes_on(sync):
    x = torch.randn(3, 4)
    dst = torch.zeros(4, 3)  # the same bytes in another shape
    table = sync.receiver.dest_table([("x", dst)])
    request = sync.sender.send_chunk({"x": x, "y": torch.ones(2)}, last=True)
    out = torch.zeros(3, 4)
    with sync.receiver.receive(request) as it:
        with pytest.raises(WsyncError) as e:
            it.apply(table)
        assert e.value.status is Status.MISMATCH and "'x'" in e.value.message and "[4, 3]" in e.value.message
        assert not dst.any()
        it.copy_into(0, out)
        it.copy_into(1, torch.zeros(2))
    assert torch.equal(out, x)
    assert sync.receiver.completed_version == 1


def test_partial_leaves_the_tensors_without_destination_for_the_views(sync):
    a, b = torch.arange(6, dtype=torch.int32), np.arange(5, dtype=np.float64)
    dst = np.zeros(6, np.int32)
    table = sync.receiver.dest_table([Dest("a", dst)])
    request = sync.sender.send_chunk({"a": a, "b": b}, last=True)
    with sync.receiver.receive(request, framework="numpy") as it:
        with pytest.raises(WsyncError, match="'b'.*has no destination"):
            it.apply(table)
        r = it.apply(table, partial=True)
        assert (r.tensors, r.unmatched) == (1, 1)
        assert [name for name, _ in it] == ["b"]
    assert dst.tolist() == list(range(6))


def test_a_table_refuses_what_it_cannot_fill_by_name(sync):
    with pytest.raises(WsyncError) as e:
        sync.receiver.dest_table([Dest("x", torch.zeros(4), nbytes=20)])
    assert e.value.status is Status.INVALID_ARGUMENT and "'x'" in e.value.message
    buf = torch.zeros(8)
    with pytest.raises(WsyncError, match="overlaps"):
        sync.receiver.dest_table([("x", buf[0:4]), ("x", buf[2:6])])
    with pytest.raises(WsyncError, match="no destinations"):
        sync.receiver.dest_table([])


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 8)
        self.b = torch.nn.Linear(8, 4, bias=False)


def test_module_loader_takes_the_one_call_path_after_a_version_and_stays_exact(sync, monkeypatch):
    trainer, engine = _Model(), _Model()
    loader = ModuleLoader(engine)
    calls = {"apply": 0, "copy_into": 0}
    real_apply, real_copy = wsync.Iteration.apply, wsync.Iteration.copy_into

    def counting_apply(self, *a, **k):
        calls["apply"] += 1
        return real_apply(self, *a, **k)

    def counting_copy(self, *a, **k):
        calls["copy_into"] += 1
        return real_copy(self, *a, **k)

    monkeypatch.setattr(wsync.Iteration, "apply", counting_apply)
    monkeypatch.setattr(wsync.Iteration, "copy_into", counting_copy)
    for version in range(1, 5):
        with torch.no_grad():
            for p in trainer.parameters():
                p.add_(torch.randn_like(p))
        sd = trainer.state_dict()
        requests = [sync.sender.send_chunk({k: sd[k] for k in ("a.weight", "a.bias")}),
                    sync.sender.send_chunk({"b.weight": sd["b.weight"]}, last=True)]
        before = dict(calls)
        for r in requests:
            loader.load(sync.receiver, r)
        assert sync.receiver.completed_version == version
        for name, t in engine.state_dict().items():
            assert torch.equal(t, sd[name]), (version, name)
        if version == 1:  # the first version takes the per-tensor path and learns the layout
            assert calls["copy_into"] - before["copy_into"] == 3
        else:  # then one call per chunk
            assert calls["apply"] - before["apply"] == 2
            assert calls["copy_into"] == before["copy_into"]


def test_module_loader_one_call_path_still_refuses_a_version_that_misses_a_tensor(sync):
    trainer, engine = _Model(), _Model()
    loader = ModuleLoader(engine)
    sd = trainer.state_dict()
    loader.load(sync.receiver, sync.sender.send_chunk(dict(sd), last=True))
    assert sync.receiver.completed_version == 1
    before = engine.b.weight.detach().clone()
    with torch.no_grad():
        trainer.a.weight.add_(1)
    with pytest.raises(WsyncError) as e:
        loader.load(sync.receiver, sync.sender.send_chunk(
            {"a.weight": trainer.a.weight.detach(), "a.bias": trainer.a.bias.detach()}, last=True))
    assert e.value.status is Status.MISMATCH and "b.weight" in e.value.message
    assert sync.receiver.completed_version == 1
    assert torch.equal(engine.b.weight, before)
    with pytest.raises(WsyncError):
        sync.sender.flush(2.0)


def test_module_loader_rebuilds_its_table_when_the_module_is_converted(sync):
    trainer, engine = _Model(), _Model()
    loader = ModuleLoader(engine, allow_cast=True)
    for version in range(1, 4):
        with torch.no_grad():
            for p in trainer.parameters():
                p.add_(1.0)
        if version == 3:
            engine.double()  # new storages, another dtype: the table made over the old is stale
        loader.load(sync.receiver, sync.sender.send_chunk(dict(trainer.state_dict()), last=True))
        for name, t in engine.state_dict().items():
            assert torch.equal(t, trainer.state_dict()[name].to(t.dtype)), (version, name)
