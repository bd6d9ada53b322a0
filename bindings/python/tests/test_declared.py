"""send_model's declared sources: a module sent as it is is planned and described once per
sender, and described again as soon as it holds other tensors (replaced, converted, moved,
added), so every version is what the module holds."""

import pytest
import torch

import wsync
from wsync.engine import ModuleLoader
from wsync.trainer import send_model


class _Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.a = torch.nn.Linear(16, 8)
        self.b = torch.nn.Linear(8, 4, bias=False)
        self.register_buffer("steps", torch.zeros(3))


@pytest.fixture
def counted(monkeypatch):
    calls = {"describe": 0}
    inner = wsync.Sender._describe_chunk

    def counting(self, *a, **k):
        calls["describe"] += 1
        return inner(self, *a, **k)

    monkeypatch.setattr(wsync.Sender, "_describe_chunk", counting)
    return calls


def _sync(sync, trainer, loader):
    for request in send_model(sync.sender, trainer, chunk_bytes=1 << 20):
        loader.load(sync.receiver, request)


def _same(engine, trainer):
    for name, t in trainer.state_dict().items():
        got = engine.state_dict()[name]
        assert got.dtype == t.dtype and torch.equal(got, t), name


def test_a_module_is_described_once_and_each_version_carries_its_bytes(sync, counted):
    trainer, engine = _Model(), _Model()
    loader = ModuleLoader(engine)
    _sync(sync, trainer, loader)
    first = counted["describe"]
    assert first >= 1
    for step in range(3):
        with torch.no_grad():
            for p in trainer.parameters():
                p.mul_(1.5).add_(step)
            trainer.steps += 1
        _sync(sync, trainer, loader)
        _same(engine, trainer)
    assert counted["describe"] == first  # sent from the declared chunks


@pytest.mark.parametrize("change", ["replace_parameter", "convert", "add_buffer", "set_data"])
def test_a_module_holding_other_tensors_is_described_again(sync, counted, change):
    trainer, engine = _Model(), _Model()
    loader = ModuleLoader(engine, strict=False, allow_cast=True)
    _sync(sync, trainer, loader)
    first = counted["describe"]
    if change == "replace_parameter":
        trainer.a.weight = torch.nn.Parameter(torch.randn(8, 16))
    elif change == "convert":
        trainer.double()
        engine.double()
    elif change == "add_buffer":
        trainer.a.register_buffer("extra", torch.ones(2))
        engine.a.register_buffer("extra", torch.zeros(2))
    else:
        trainer.b.weight.data = torch.randn(4, 8)
    _sync(sync, trainer, loader)
    assert counted["describe"] > first
    _same(engine, trainer)


def test_casts_and_moves_are_never_declared(sync, counted):
    trainer, engine = _Model(), _Model().to(torch.bfloat16)
    loader = ModuleLoader(engine)
    for _ in range(2):
        for request in send_model(sync.sender, trainer, chunk_bytes=1 << 20, dtype=torch.bfloat16):
            loader.load(sync.receiver, request)
    assert counted["describe"] >= 2


def test_a_change_only_a_later_chunk_shows_abandons_that_version_and_sends_it_anew(sync, counted):
    """The first chunk's tensors are checked before it goes, the rest's after: a module changed
    only in a later chunk's tensors has its version abandoned once the first chunk went (the
    engine, which took it, keeps its last complete version) and sent again, planned anew, so
    the engine ends bit-identical and the trainer's flush is clean."""
    trainer, engine = _Model(), _Model()
    loader = ModuleLoader(engine, strict=False)
    chunk = 600  # several chunks; b.weight is not in the first
    refused = []

    def load(request):
        try:
            loader.load(sync.receiver, request)
        except wsync.WsyncError as exc:  # a chunk of the abandoned version
            refused.append(exc.status)

    def sync_once():
        out = send_model(sync.sender, trainer, chunk_bytes=chunk, on_request=load)
        sync.sender.flush(10)
        return out

    first = sync_once()
    assert len(first) >= 2
    described = counted["describe"]
    before = sync.receiver.completed_version
    with torch.no_grad():
        trainer.b.weight.data = torch.randn(4, 8)  # in chunk 1 only
    again = sync_once()
    assert len(again) == len(first)             # the resent version's chunks only
    assert counted["describe"] > described      # planned and described anew
    assert sync.receiver.completed_version == before + 2  # one abandoned, one complete
    assert all(s == wsync.Status.ABANDONED for s in refused)
    _same(engine, trainer)
