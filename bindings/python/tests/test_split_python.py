"""Split tensors from Python: a tensor larger than a bucket travels as byte-range parts in
consecutive chunks (plan(split=True), Sender.send_chunk(parts=), Iteration.part/iter_parts,
trainer.send_model and engine.ModuleLoader)."""

import pytest

torch = pytest.importorskip("torch")
from torch import nn  # noqa: E402

import wsync  # noqa: E402
from wsync import Status  # noqa: E402
from wsync.engine import ModuleLoader  # noqa: E402
from wsync.trainer import LazySource, iter_chunks, send_model, send_model_async  # noqa: E402

from test_producers import Gathers  # noqa: E402

MiB = 1 << 20
VOCAB, DIM = 1024, 896  # float32: 3.5 MiB, four parts of at most 1 MiB


class SplitLM(nn.Module):
    """An embedding larger than a 1 MiB bucket, a small layer, and an optionally tied head."""

    def __init__(self, tied=False, seed=0, dtype=torch.float32):
        super().__init__()
        g = torch.Generator().manual_seed(seed)
        self.emb = nn.Embedding(VOCAB, DIM)
        self.proj = nn.Linear(DIM, 64)
        self.head = nn.Linear(DIM, VOCAB, bias=False)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=g))
        if tied:
            self.head.weight = self.emb.weight
        self.to(dtype)


def perturb(model, seed):
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=g).to(p.dtype))


def state_equal(engine, trainer, dtype=None):
    a, b = engine.state_dict(), trainer.state_dict()
    assert a.keys() == b.keys()
    for name in a:
        want = b[name] if dtype is None else b[name].to(dtype)
        assert torch.equal(a[name], want), name


def part_entries(request):
    """(names, parts) of a request as describe() renders it: parts maps an entry index to its
    byte range."""
    body = wsync.describe(request)["body"]["tensors"]
    parts = body.get("parts") or {"tensor": [], "offset": [], "bytes": []}
    return body["names"], {t: (o, b) for t, o, b in zip(parts["tensor"], parts["offset"],
                                                         parts["bytes"])}


def test_plan_split_gives_parts_and_plain_plan_does_not():
    metas = [("emb.weight", torch.float32, (VOCAB, DIM)), ("x.bias", torch.float32, (10,))]
    chunks = wsync.plan(metas, chunk_bytes=MiB, split=True)
    size = VOCAB * DIM * 4
    emb = [c for c in chunks if 0 in c.indices]
    assert len(emb) == 4
    ranges = [c.parts[c.indices.index(0)] for c in emb]
    assert ranges[0][0] == 0 and sum(r[1] for r in ranges) == size
    assert all(a[0] + a[1] == b[0] for a, b in zip(ranges, ranges[1:]))
    assert all(r[1] <= MiB for r in ranges)
    assert all(c.parts is None for c in wsync.plan(metas, chunk_bytes=8 * MiB, split=True))
    assert all(c.parts is None for c in wsync.plan(metas, chunk_bytes=MiB))


@pytest.mark.parametrize("dtype,framework", [(torch.float32, "torch"),
                                              (torch.bfloat16, "torch"),
                                              (torch.float32, "numpy")])
def test_iteration_part_and_iter_parts(make_sync, dtype, framework):
    s = make_sync(buckets=2)
    rows = VOCAB if dtype == torch.float32 else 2 * VOCAB  # 3.5 MiB either way
    emb = torch.randn(rows, DIM).to(dtype)
    items = [("emb.weight", emb), ("x.bias", torch.arange(10.0))]
    chunks = wsync.plan(items, chunk_bytes=MiB, split=True)
    out = torch.zeros_like(emb)
    seen = []
    for k, c in enumerate(chunks):
        request = s.sender.send_chunk([items[i] for i in c.indices], last=k == len(chunks) - 1,
                                      parts=c.parts)
        with s.receiver.receive(request, framework=framework) as it:
            for i in range(len(it)):
                meta, part = it.peek(i), it.part(i)
                if meta.name == "emb.weight":
                    assert meta.shape == (rows, DIM)  # the whole tensor's shape
                    assert part == c.parts[i]
                    seen.append(part)
                else:
                    assert part == wsync.TensorPart(0, 40)  # whole: (0, its size)
            for pv in it.iter_parts():
                view = torch.from_numpy(pv.view.copy()) if framework == "numpy" else pv.view
                assert view.dim() == 1 and view.numel() == pv.stop - pv.start
                if pv.name == "emb.weight":
                    assert not pv.whole and pv.shape == (rows, DIM)
                    assert pv.offset == seen[-1].offset and pv.nbytes == seen[-1].nbytes
                    assert view.dtype == dtype and pv.itemsize == emb.element_size()
                    out.view(-1)[pv.start:pv.stop].copy_(view)
                else:
                    assert pv.whole and torch.equal(view.view(pv.shape), torch.arange(10.0))
    assert len(seen) == 4 and torch.equal(out, emb)
    assert s.receiver.completed_version == 1


def test_plain_iteration_refuses_a_part_by_name(make_sync):
    s = make_sync(buckets=2)
    emb = torch.randn(VOCAB, DIM)
    c = wsync.plan([("emb.weight", emb)], chunk_bytes=MiB, split=True)[0]
    request = s.sender.send_chunk([("emb.weight", emb)], parts=c.parts)
    it = s.receiver.receive(request)
    with pytest.raises(wsync.WsyncError, match="emb.weight") as err:
        list(it)
    assert err.value.status is Status.UNSUPPORTED
    it.abort()


def test_send_parts_checks_its_argument(sync):
    with pytest.raises(wsync.InvalidArgumentError, match="2 parts for 1 tensors"):
        sync.sender.send_chunk([("a", torch.ones(4))], parts=[(0, 0), (0, 0)])
    with pytest.raises(wsync.InvalidArgumentError, match="a"):  # the library: out of range
        sync.sender.send_chunk([("a", torch.ones(4))], parts=[(0, 64)])


def send(sync, trainer, loader, **kwargs):
    """send_model with each request loaded as it comes; returns the requests."""
    return send_model(sync.sender, trainer, on_request=lambda r: loader.load(sync.receiver, r),
                      flush_timeout_s=10, **kwargs)


def emb_parts(requests, name="emb.weight"):
    out = []
    for r in requests:
        names, parts = part_entries(r)
        out += [parts[i] for i, n in enumerate(names) if n == name and i in parts]
    return out


def test_send_model_splits_an_oversized_tensor_into_a_module_loader(make_sync):
    s = make_sync(buckets=2, bucket_bytes=MiB)
    trainer, engine = SplitLM(seed=0), SplitLM(seed=5)
    loader = ModuleLoader(engine)
    for v in (1, 2):
        perturb(trainer, v)
        requests = send(s, trainer, loader)
        assert len(requests) > 4
        parts = emb_parts(requests)
        assert len(parts) == 4 and parts[0][0] == 0
        assert sum(b for _, b in parts) == VOCAB * DIM * 4
        assert len(emb_parts(requests, "head.weight")) == 4
        assert s.receiver.completed_version == v
        state_equal(engine, trainer)


def test_send_model_split_into_a_cast_engine_goes_through_the_part_views(make_sync, monkeypatch):
    s = make_sync(buckets=2, bucket_bytes=MiB)
    trainer, engine = SplitLM(seed=0), SplitLM(seed=5, dtype=torch.bfloat16)
    loader = ModuleLoader(engine, allow_cast=True)
    used = []
    real = wsync.Iteration.iter_parts

    def spy(self):
        for pv in real(self):
            used.append((pv.name, pv.whole))
            yield pv

    monkeypatch.setattr(wsync.Iteration, "iter_parts", spy)
    for v in (1, 2):
        perturb(trainer, v)
        requests = send(s, trainer, loader)
        assert len(emb_parts(requests)) == 4
        assert s.receiver.completed_version == v
        state_equal(engine, trainer, torch.bfloat16)
    assert used.count(("emb.weight", False)) == 8


def test_trainer_cast_is_prepared_once_for_all_parts(make_sync):
    trainer = SplitLM(seed=1)
    chunks = list(iter_chunks(trainer, chunk_bytes=MiB // 2, dtype=torch.bfloat16))
    emb = [dict(c.tensors)["emb.weight"] for c in chunks if "emb.weight" in dict(c.tensors)]
    assert len(emb) == 4  # 1.75 MiB of bf16 in parts of 512 KiB
    assert all(t is emb[0] for t in emb) and emb[0].dtype == torch.bfloat16
    # Sent so, into a bf16 engine: bit-exact with the trainer's cast.
    s = make_sync(buckets=2, bucket_bytes=MiB // 2)
    engine = SplitLM(seed=3, dtype=torch.bfloat16)
    requests = send(s, trainer, ModuleLoader(engine), dtype=torch.bfloat16)
    assert len(emb_parts(requests)) == 4
    state_equal(engine, trainer, torch.bfloat16)


@pytest.mark.parametrize("engine_tied", [False, True])
def test_a_tied_split_tensor_loads_under_both_names(make_sync, engine_tied):
    s = make_sync(buckets=2, bucket_bytes=MiB)
    trainer, engine = SplitLM(tied=True, seed=0), SplitLM(tied=engine_tied, seed=7)
    loader = ModuleLoader(engine)
    for v in (1, 2):
        perturb(trainer, v)
        requests = send(s, trainer, loader)
        assert len(emb_parts(requests, "emb.weight=head.weight")) == 4
        assert emb_parts(requests, "head.weight") == []  # the bytes crossed once
        assert s.receiver.completed_version == v
        state_equal(engine, trainer)
    if not engine_tied:
        assert engine.emb.weight.data_ptr() != engine.head.weight.data_ptr()


def test_a_lazy_split_tensor_is_gathered_once(make_sync):
    s = make_sync(buckets=2, bucket_bytes=MiB)
    trainer, engine = SplitLM(tied=True, seed=0), SplitLM(seed=2)
    state = trainer.state_dict()
    metas = [(n, t.dtype, t.shape) for n, t in state.items() if n != "head.weight"]
    gather = Gathers(state)
    source = LazySource(metas, gather, aliases={"head.weight": "emb.weight"})
    requests = send(s, source, ModuleLoader(engine))
    assert len(emb_parts(requests, "emb.weight=head.weight")) == 4
    assert sum(names.count("emb.weight") for names in gather.calls) == 1
    assert len(gather.calls) < len(requests)
    # The split tensor is held for its four chunks and dropped after its last part, before
    # the next chunk's gather: the gathered bytes alive at once never exceed it.
    assert gather.peak == VOCAB * DIM * 4
    assert gather.live == 0
    state_equal(engine, trainer)


def test_send_model_async_sends_parts(make_sync):
    import asyncio

    s = make_sync(buckets=2, bucket_bytes=MiB)
    trainer, engine = SplitLM(seed=0), SplitLM(seed=9)
    loader = ModuleLoader(engine)

    async def load(request):
        loader.load(s.receiver, request)

    requests = asyncio.run(send_model_async(s.sender, trainer, on_request=load,
                                            flush_timeout_s=10))
    assert len(emb_parts(requests)) == 4
    state_equal(engine, trainer)


def test_split_false_keeps_the_error_naming_the_tensor(make_sync):
    s = make_sync(buckets=8, bucket_bytes=MiB)
    with pytest.raises(wsync.InvalidArgumentError, match="emb.weight.*raise bucket_bytes"):
        send_model(s.sender, SplitLM(), split=False)


def test_a_split_tensor_into_a_non_contiguous_destination(make_sync):
    """A map_name index that makes a non-contiguous destination (columns of a fused tensor)
    takes each part's flat range through views of its rows."""
    s = make_sync(buckets=2, bucket_bytes=MiB)
    emb = torch.randn(VOCAB, DIM)
    fused = torch.zeros(VOCAB, 2 * DIM)
    loader = ModuleLoader({"fused.weight": fused}, strict=False,
                          map_name=lambda n: ("fused.weight", (slice(None), slice(DIM, 2 * DIM))))
    requests = send(s, {"emb.weight": emb}, loader)
    assert len(emb_parts(requests)) == 4
    assert torch.equal(fused[:, DIM:], emb) and torch.count_nonzero(fused[:, :DIM]) == 0


def test_a_strict_loader_counts_a_split_tensor_as_loaded(make_sync):
    s = make_sync(buckets=2, bucket_bytes=MiB)
    engine = {"emb.weight": torch.zeros(VOCAB, DIM), "other.weight": torch.zeros(3)}
    loader = ModuleLoader(engine)
    with pytest.raises(wsync.WsyncError, match="missing 'other.weight'") as err:
        send(s, {"emb.weight": torch.randn(VOCAB, DIM)}, loader)
    assert "emb.weight" not in str(err.value).split("missing", 1)[1]
    assert s.receiver.completed_version == 0
    s = make_sync(buckets=2, bucket_bytes=MiB)  # the failed receiver stays failed for its sender
    src = {"emb.weight": torch.randn(VOCAB, DIM), "other.weight": torch.ones(3)}
    send(s, src, loader)
    assert s.receiver.completed_version == 1
    assert torch.equal(engine["emb.weight"], src["emb.weight"])


def test_delta_refuses_parts_and_split_false_names_the_tensor(make_sync):
    s = make_sync(buckets=8, bucket_bytes=MiB, delta="on")
    # send_model refuses the plan before sending anything (the library itself refuses the
    # first part it is given: test_split.c).
    with pytest.raises(wsync.WsyncError, match="delta sync does not take split tensors: tensor "
                       "'emb.weight'.*nothing of this version was sent") as err:
        send_model(s.sender, SplitLM())
    assert err.value.status is Status.UNSUPPORTED and s.sender.version == 1
    with pytest.raises(wsync.InvalidArgumentError, match="emb.weight.*raise bucket_bytes"):
        send_model(s.sender, SplitLM(), split=False)
    # Tensors within the bucket still go with delta on (nothing is split).
    small = {"a.weight": torch.randn(64, 64)}
    assert len(send_model(s.sender, small)) == 1


def test_a_non_strided_destination_of_a_split_tensor_is_refused_before_any_copy(make_sync):
    s = make_sync(buckets=2, bucket_bytes=MiB)
    dense = torch.zeros(VOCAB, DIM)
    engine = {"emb.weight": torch.zeros(VOCAB, DIM).to_sparse(), "x.weight": dense}
    loader = ModuleLoader(engine, strict=False)
    src = {"x.weight": torch.ones(VOCAB, DIM), "emb.weight": torch.randn(VOCAB, DIM)}
    with pytest.raises(wsync.WsyncError,
                       match="'emb.weight' arrives in parts.*not a strided") as err:
        send(s, src, loader)
    assert err.value.status is Status.UNSUPPORTED
    # x.weight (split too, its chunks came first) loaded; emb.weight's first chunk failed.
    assert torch.equal(dense, torch.ones(VOCAB, DIM))


@pytest.mark.parametrize("how", ["ignore_unknown", "map_name_skips"])
def test_a_split_tensor_the_loader_skips_is_taken_unread(make_sync, how):
    s = make_sync(buckets=2, bucket_bytes=MiB)
    engine = {"x.weight": torch.zeros(8, 8)}
    if how == "ignore_unknown":
        loader = ModuleLoader(engine, ignore_unknown=True)
    else:
        loader = ModuleLoader(engine, map_name=lambda n: None if n == "emb.weight" else n)
    src = {"emb.weight": torch.randn(VOCAB, DIM), "x.weight": torch.randn(8, 8)}
    requests = send(s, src, loader)
    assert len(emb_parts(requests)) == 4
    assert s.receiver.completed_version == 1
    assert torch.equal(engine["x.weight"], src["x.weight"])
