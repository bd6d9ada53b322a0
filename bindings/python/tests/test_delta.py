"""Delta sync from Python (docs/delta.md): a trainer with the ``delta`` option sends patches
after the first version, a ModuleLoader engine (which loads with copy-into) applies them and
stays bit-identical, and an engine that takes zero-copy views is refused by name."""

import math

import pytest
import torch

import wsync
from wsync import Status, WsyncError
from wsync.engine import ModuleLoader
from wsync.trainer import send_model


class Model(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = torch.nn.Embedding(64, 32)
        self.proj = torch.nn.Linear(32, 32)
        self.head = torch.nn.Linear(32, 64, bias=False)
        self.head.weight = self.embed.weight  # tied


def bits(t):
    """The tensor's bytes as integers, so NaN payloads and -0.0 compare exactly."""
    return t.detach().contiguous().view(torch.int32)


def patched_tensors(requests):
    names = []
    for r in requests:
        body = wsync.describe(r)["body"]
        patches = body["tensors"].get("patches")
        if patches:
            names += [body["tensors"]["names"][i] for i in patches["tensor"]]
    return names


def step(model, version, gen):
    """What an optimizer step might leave: a few elements changed, including the awkward ones
    (a NaN with another payload, -0.0 where 0.0 was)."""
    with torch.no_grad():
        flat = model.proj.weight.view(-1)
        idx = torch.randperm(flat.numel(), generator=gen)[:8]
        flat[idx] += 0.5
        if version == 3:
            flat[0] = float("nan")
        if version == 4:
            flat[0] = struct_nan()
            model.proj.bias[1] = 0.0
        if version == 5:
            model.proj.bias[1] = -0.0


def struct_nan():
    """A NaN whose payload differs from torch's default NaN."""
    return torch.tensor([0x7FC00123], dtype=torch.int32).view(torch.float32)[0].item()


@pytest.mark.parametrize("mode", ["auto", "on"])
def test_module_loader_engine_stays_bit_identical_through_patches(make_sync, mode):
    sync = make_sync(bucket_bytes=1 << 20, delta=mode)
    gen = torch.Generator().manual_seed(7)
    torch.manual_seed(0)
    trainer, engine = Model(), Model()
    loader = ModuleLoader(engine)
    patched = []
    for version in range(1, 7):
        if version > 1:
            step(trainer, version, gen)
        requests = send_model(sync.sender, trainer, chunk_bytes=1 << 20)
        for r in requests:
            loader.load(sync.receiver, r)
        sync.sender.flush(5.0)
        assert sync.receiver.completed_version == version
        for (name, a), (_, b) in zip(trainer.state_dict().items(), engine.state_dict().items()):
            assert torch.equal(bits(a), bits(b)), f"version {version}: {name} differs"
        patched.append(patched_tensors(requests))
    assert patched[0] == []  # no base yet: the first version is dense
    assert all("proj.weight" in p for p in patched[1:]), patched
    assert math.isnan(engine.proj.weight.view(-1)[0].item())


def test_views_of_a_patched_tensor_are_refused_by_name(make_sync):
    sync = make_sync(bucket_bytes=1 << 20, delta="on")
    trainer, engine = Model(), Model()
    loader = ModuleLoader(engine)
    for r in send_model(sync.sender, trainer, chunk_bytes=1 << 20):
        loader.load(sync.receiver, r)
    with torch.no_grad():
        trainer.proj.weight.view(-1)[3] += 1.0
    requests = send_model(sync.sender, trainer, chunk_bytes=1 << 20)
    with pytest.raises(WsyncError) as info:
        with sync.receiver.receive(requests[0]) as it:
            for _name, _view in it:
                pass
    assert info.value.status is Status.UNSUPPORTED
    assert "patch" in str(info.value)
