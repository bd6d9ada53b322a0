"""Producers as real trainers are: tied weights sent once (and loaded under every name), and
lazy sources that gather each chunk's tensors only when that chunk is sent (peak memory about
one chunk). The engines of the end-to-end tests are real processes (spawned), loading with a
strict ModuleLoader; the trainer is this process."""

import gc
import multiprocessing
import queue
import time
import tracemalloc
import weakref

import numpy as np
import pytest
import torch

import wsync
from wsync import Status, WsyncError
from wsync.engine import ModuleLoader
from wsync.trainer import (ALIAS_SEPARATOR, MAX_NAME_BYTES, LazySource, alias_groups,
                           iter_chunks, join_alias_names, send_model, split_alias_name)
import _producer_workers
from _mp_workers import snapshot
from _models import TinyLM, model_digests, train_steps
from _producer_workers import TiedLM

CTX = multiprocessing.get_context("spawn")
DEADLINE_S = 90


def nbytes(t) -> int:
    return t.numel() * t.element_size() if isinstance(t, torch.Tensor) else t.nbytes


def wire(requests):
    """(names, total bytes, tensor count) of a version, from its requests as the library
    describes them (what crosses to the engines)."""
    names = []
    for r in requests:
        names += wsync.describe(r)["body"]["tensors"]["names"]
    manifest = wsync.describe(requests[-1])["body"]["manifest"]
    return names, manifest["bytes"], manifest["tensors"]


# -- aliases: detection and naming -------------------------------------------------------------

def test_a_tied_weight_is_one_wire_tensor_named_by_both_names():
    model = TiedLM()
    sent = [(n, t) for c in iter_chunks(model) for n, t in c.tensors]
    names = [n for n, _ in sent]
    assert "wte.weight=lm_head.weight" in names
    assert "wte.weight" not in names and "lm_head.weight" not in names
    assert len(names) == len(model.state_dict()) - 1
    # The wire tensor is the parameter itself (no copy), and the plan counts it once.
    tensor = dict(sent)["wte.weight=lm_head.weight"]
    assert tensor.data_ptr() == model.wte.weight.data_ptr()
    unique = sum(nbytes(p) for p in model.parameters())  # parameters() lists a tied one once
    assert sum(c.bytes for c in iter_chunks(model)) == unique


def test_repeat_sends_every_name_with_its_bytes():
    model = TiedLM()
    chunks = list(iter_chunks(model, aliases="repeat"))
    assert [n for c in chunks for n, _ in c.tensors] == list(model.state_dict())
    assert sum(c.bytes for c in chunks) == sum(nbytes(t) for t in model.state_dict().values())
    with pytest.raises(wsync.InvalidArgumentError, match="aliases must be 'join' or 'repeat'"):
        list(iter_chunks(model, aliases="first"))


def test_only_true_aliases_are_joined():
    base = torch.arange(24.0)
    items = [("a", base), ("b", base.view(24)), ("c", base.view(4, 6)), ("d", base[:12]),
             ("e", base.view(torch.int32)), ("f", base.clone()), ("g", base),
             ("n", base.numpy()), ("m", base.numpy())]
    # Same memory seen the same way: a, b, g (torch) and n, m (numpy); a reshape, a part, a
    # reinterpretation or a copy of it are other tensors.
    assert alias_groups(items) == [[0, 1, 6], [2], [3], [4], [5], [7, 8]]
    names = [n for c in iter_chunks(items, group_depth=0) for n, _ in c.tensors]
    assert names == ["a=b=g", "c", "d", "e", "f", "n=m"]
    empty = torch.empty(0)
    assert alias_groups([("x", empty), ("y", empty)]) == [[0], [1]]


def test_joined_names_stay_within_the_librarys_limit():
    long = [f"{'x' * 400}.{i}" for i in range(5)]
    joined = join_alias_names(long)
    assert all(len(n.encode()) <= MAX_NAME_BYTES for n in joined)
    assert len(joined) == 3 and [p for n in joined for p in split_alias_name(n)] == long
    # A name with the separator in it is never joined (it would split wrongly).
    assert join_alias_names(["a", "odd=name", "b"]) == ["a=b", "odd=name"]
    assert split_alias_name("odd=") == ["odd="] and split_alias_name("a=b") == ["a", "b"]
    assert ALIAS_SEPARATOR == "="


def test_a_long_alias_list_is_sent_in_several_wire_tensors_and_loads_everywhere(sync):
    t = torch.arange(6.0)
    names = [f"{'p' * 400}.{i}" for i in range(6)]  # two fit in one name
    requests = send_model(sync.sender, [(n, t) for n in names])
    wire_names, _, count = wire(requests)
    assert count == 3 and all(len(n) <= MAX_NAME_BYTES for n in wire_names)
    engine = {n: torch.zeros(6) for n in names}
    ModuleLoader(engine).load_all(sync.receiver, requests)
    assert sync.receiver.completed_version == 1
    assert all(torch.equal(engine[n], t) for n in names)


# -- aliases: in-process loading -------------------------------------------------------------

def test_a_tied_module_loads_the_joined_tensor_once(sync):
    trainer, engine = TiedLM(seed=0), TiedLM(seed=7)
    loader = ModuleLoader(engine)
    send_model(sync.sender, trainer, on_request=lambda r: loader.load(sync.receiver, r))
    assert sync.receiver.completed_version == 1
    assert engine.lm_head.weight is engine.wte.weight
    assert model_digests(engine) == model_digests(trainer)
    assert loader.missing() == []


def test_an_untied_module_gets_the_bytes_in_both_parameters(sync):
    trainer, engine = TiedLM(seed=0), TiedLM(tied=False, seed=7)
    loader = ModuleLoader(engine)
    send_model(sync.sender, trainer, on_request=lambda r: loader.load(sync.receiver, r))
    assert sync.receiver.completed_version == 1
    assert engine.lm_head.weight.data_ptr() != engine.wte.weight.data_ptr()
    assert torch.equal(engine.lm_head.weight, trainer.wte.weight)
    assert torch.equal(engine.wte.weight, trainer.wte.weight)
    assert model_digests(engine) == model_digests(trainer)


def test_one_name_alone_does_not_satisfy_an_untied_modules_strict_check(sync):
    # The control for the test above: sending the tied weight under one name only (as
    # named_parameters() lists it) leaves the untied lm_head unloaded, and strict refuses.
    trainer, engine = TiedLM(seed=0), TiedLM(tied=False, seed=7)
    [request] = send_model(sync.sender, dict(trainer.named_parameters()))
    with pytest.raises(WsyncError, match="missing 'lm_head.weight'"):
        ModuleLoader(engine).load(sync.receiver, request)


def test_untied_destinations_of_another_dtype_copy_from_the_view(sync):
    trainer, engine = TiedLM(seed=0), TiedLM(tied=False, seed=7).to(torch.bfloat16)
    [request] = send_model(sync.sender, trainer)
    ModuleLoader(engine, allow_cast=True).load(sync.receiver, request)
    want = trainer.wte.weight.detach().to(torch.bfloat16)
    assert torch.equal(engine.wte.weight, want) and torch.equal(engine.lm_head.weight, want)


def test_an_alias_the_module_lacks_is_named_with_its_wire_tensor(sync):
    trainer = TiedLM(seed=0)
    engine = {k: v.clone() for k, v in trainer.state_dict().items() if k != "lm_head.weight"}
    [request] = send_model(sync.sender, trainer)
    with pytest.raises(WsyncError) as info:
        ModuleLoader(engine).load(sync.receiver, request)
    assert ("tensor 'lm_head.weight' (of 'wte.weight=lm_head.weight') is not a parameter or "
            "buffer of the model") in info.value.message


def test_map_name_sees_each_alias_on_its_own(sync):
    trainer = TiedLM(seed=0)
    engine = TiedLM(tied=False, seed=3)
    seen = []

    def strip(name):
        seen.append(name)
        return name[len("model."):]

    source = {f"model.{k}": v for k, v in trainer.state_dict().items()}
    [request] = send_model(sync.sender, source)
    ModuleLoader(engine, map_name=strip).load(sync.receiver, request)
    assert "model.wte.weight" in seen and "model.lm_head.weight" in seen
    assert not any(ALIAS_SEPARATOR in n for n in seen)
    assert model_digests(engine) == model_digests(trainer)


# -- processes ---------------------------------------------------------------------------------

class Engines:
    """Engine processes (one per model spec) fed by this process, the trainer; always cleaned
    up (joined with a timeout, killed if they overstay)."""

    def __init__(self, specs):
        self.deadline = time.monotonic() + DEADLINE_S
        self.outbox = CTX.Queue()
        self.inboxes = [CTX.Queue() for _ in specs]
        self.procs = [CTX.Process(target=_producer_workers.engine_main, name=f"engine {i}",
                                  args=(i, spec, q, self.outbox), daemon=True)
                      for i, (spec, q) in enumerate(zip(specs, self.inboxes))]

    def __enter__(self):
        for p in self.procs:
            p.start()
        return self

    def __exit__(self, *exc):
        for q in self.inboxes:
            q.put(("stop",))
        for p in self.procs:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        for q in [self.outbox, *self.inboxes]:
            q.close()
            q.cancel_join_thread()

    def get(self):
        while True:
            left = self.deadline - time.monotonic()
            assert left > 0, "the scenario ran past its deadline"
            try:
                msg = self.outbox.get(timeout=min(left, 0.25))
                break
            except queue.Empty:
                dead = [p.name for p in self.procs if not p.is_alive()]
                if dead and self.outbox.empty():
                    raise AssertionError(f"engines exited early: {dead}") from None
        if msg[0] == "error":
            raise AssertionError(f"{msg[1]} failed:\n{msg[2]}")
        return msg

    def start(self, init):
        for q in self.inboxes:
            q.put(("init", init))
        assert sorted(self.get()[1] for _ in self.procs) == list(range(len(self.procs)))

    def forward(self, request):
        for q in self.inboxes:
            q.put(("request", request))

    def reports(self):
        for q in self.inboxes:
            q.put(("check",))
        out = {}
        for _ in self.procs:
            msg = self.get()
            out[msg[1]] = dict(zip(("completed", "chunks", "weights", "tied", "errors"), msg[2:]))
        return out


def shm_sender(receivers, bucket_bytes=1 << 20, buckets=2):
    strategy = wsync.Strategy("shm", receivers=receivers, buckets=buckets,
                              bucket_bytes=bucket_bytes, timeout_ms=20000)
    init = strategy.create_init_info()
    return strategy, strategy.sender(init), init


def test_tied_weights_cross_once_and_load_into_tied_and_untied_engine_processes():
    trainer = TiedLM(seed=0)
    state = trainer.state_dict()
    embed = nbytes(trainer.wte.weight)
    unique = sum(nbytes(p) for p in trainer.parameters()) + sum(nbytes(b) for b in trainer.buffers())
    assert sum(nbytes(t) for t in state.values()) == unique + embed  # state_dict lists it twice
    strategy, sender, init = shm_sender(receivers=2, bucket_bytes=64 << 10)
    try:
        with Engines([("tied", {"seed": 11}), ("untied", {"seed": 12})]) as engines:
            engines.start(init)
            for version, aliases in ((1, "join"), (2, "repeat")):
                with torch.no_grad():
                    trainer.wte.weight.add_(1.0)
                requests = send_model(sender, trainer, on_request=engines.forward,
                                      aliases=aliases, flush_timeout_s=30)
                names, wire_bytes, wire_count = wire(requests)
                reports = engines.reports()
                for index, report in reports.items():
                    assert report["errors"] == [], (index, report["errors"])
                    assert report["completed"] == version
                    # Bit for bit under every name, on both engines.
                    assert report["weights"] == snapshot(trainer), index
                    # What each engine received, counted by the library on its side.
                    assert sum(c for c, _ in report["chunks"]) == wire_count
                    assert sum(b for _, b in report["chunks"]) == wire_bytes
                assert reports[0]["tied"] and not reports[1]["tied"]
                if aliases == "join":
                    # The tied weight crossed once, its bytes once.
                    assert wire_bytes == unique
                    assert wire_count == len(state) - 1
                    assert "wte.weight=lm_head.weight" in names
                else:
                    # The control: sent under each name, it crosses twice.
                    assert wire_bytes == unique + embed
                    assert wire_count == len(state)
    finally:
        sender.close()
        strategy.close()


# -- lazy sources ------------------------------------------------------------------------------

class Gathers:
    """A lazy source's gather over a trainer's state dict: every call makes fresh copies (an
    all-gather would), and the live gathered bytes are counted through weakref finalizers, so
    ``peak`` is the most gathered bytes that were ever alive at once."""

    def __init__(self, state, everything=False):
        self.state = state
        self.everything = everything  # the control: gather the whole model every time
        self.calls = []
        self.live = self.peak = 0

    def _gone(self, size):
        self.live -= size

    def __call__(self, names):
        self.calls.append(list(names))
        out = {}
        for name in (self.state if self.everything else names):
            t = self.state[name].detach().clone()
            size = nbytes(t)
            self.live += size
            self.peak = max(self.peak, self.live)
            weakref.finalize(t, self._gone, size)
            out[name] = t
        return out


def lazy(model, **kwargs):
    state = model.state_dict()
    gather = Gathers(state, **kwargs)
    metas = [(n, t.dtype, tuple(t.shape)) for n, t in state.items()]
    return LazySource(metas, gather), gather


def test_lazy_source_gathers_per_chunk_and_holds_about_one_chunk(make_sync):
    s = make_sync(buckets=2, bucket_bytes=64 << 10)
    trainer, engine = TinyLM(vocab=256, dim=64, hidden=128, layers=4, seed=0), \
        TinyLM(vocab=256, dim=64, hidden=128, layers=4, seed=5)
    model_bytes = sum(nbytes(t) for t in trainer.state_dict().values())
    source, gather = lazy(trainer)
    chunks = wsync.plan(source.metas, chunk_bytes=64 << 10)
    largest = max(c.bytes for c in chunks)
    assert len(chunks) >= 6 and model_bytes >= 4 * largest  # several chunks' worth
    loader = ModuleLoader(engine)
    requests = send_model(s.sender, source, on_request=lambda r: loader.load(s.receiver, r),
                          flush_timeout_s=10)
    assert len(requests) == len(chunks) == len(gather.calls)
    assert gather.calls == [[source.metas[i].name for i in c.indices] for c in chunks]
    assert gather.live == 0  # everything gathered was freed
    print(f"lazy peak {gather.peak} B, largest chunk {largest} B, model {model_bytes} B")
    assert largest <= gather.peak <= largest  # exactly one chunk at a time, never two
    assert model_digests(engine) == model_digests(trainer)  # bit-exact
    assert s.receiver.completed_version == 1


def test_the_meter_sees_a_source_that_gathers_everything(make_sync):
    # The control for the peak above: a gather that materialises the whole model is seen.
    s = make_sync(buckets=2, bucket_bytes=64 << 10)
    trainer, engine = TinyLM(vocab=256, dim=64, hidden=128, layers=4), TinyLM(vocab=256, dim=64, hidden=128, layers=4, seed=2)
    model_bytes = sum(nbytes(t) for t in trainer.state_dict().values())
    source, gather = lazy(trainer, everything=True)
    loader = ModuleLoader(engine)
    send_model(s.sender, source, on_request=lambda r: loader.load(s.receiver, r))
    assert gather.peak >= model_bytes


def test_lazy_source_peak_traced_by_tracemalloc_with_numpy_tensors(make_sync):
    """The same bound measured on real allocations: numpy reports its buffers to tracemalloc,
    so the traced peak during the send is the gathered arrays plus small Python objects (the
    library's shm buckets are mapped memory, not traced)."""
    s = make_sync(buckets=2, bucket_bytes=1 << 20)
    rng = np.random.default_rng(0)
    state = {f"layers.{i}.{p}.weight": rng.standard_normal((256, 256), dtype=np.float32)
             for i in range(8) for p in ("a", "b", "c", "d")}
    model_bytes = sum(a.nbytes for a in state.values())
    metas = [(n, a.dtype, a.shape) for n, a in state.items()]
    source = LazySource(metas, lambda names: {n: state[n].copy() for n in names})
    chunks = wsync.plan(source.metas, chunk_bytes=1 << 20)
    largest = max(c.bytes for c in chunks)
    engine = {n: torch.zeros(a.shape) for n, a in state.items()}
    loader = ModuleLoader(engine)
    gc.collect()
    tracemalloc.start()
    try:
        base = tracemalloc.get_traced_memory()[0]
        tracemalloc.reset_peak()
        send_model(s.sender, source, on_request=lambda r: loader.load(s.receiver, r),
                   flush_timeout_s=10)
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    print(f"tracemalloc peak {peak} B, largest chunk {largest} B, model {model_bytes} B, "
          f"{len(chunks)} chunks")
    assert len(chunks) >= 8 and model_bytes >= 6 * largest
    # One chunk of arrays plus the send's own small objects (about 60 KB here); two chunks
    # alive at once would be twice the chunk.
    assert largest <= peak < largest + largest // 4
    assert all(torch.equal(engine[n], torch.from_numpy(a)) for n, a in state.items())


def test_lazy_source_is_bit_exact_on_an_engine_process_every_step():
    spec = {"vocab": 256, "dim": 64, "hidden": 128, "layers": 4}
    trainer = TinyLM(seed=0, **spec)
    strategy, sender, init = shm_sender(receivers=1, bucket_bytes=96 << 10)
    try:
        with Engines([("tinylm", dict(spec, seed=9))]) as engines:
            engines.start(init)
            for step in train_steps(trainer, 2):
                source, gather = lazy(trainer)
                requests = send_model(sender, source, on_request=engines.forward,
                                      flush_timeout_s=30)
                assert len(requests) > 4 and len(gather.calls) == len(requests)
                [report] = engines.reports().values()
                assert report["errors"] == []
                assert report["completed"] == step
                assert report["weights"] == snapshot(trainer)
    finally:
        sender.close()
        strategy.close()


def test_lazy_aliases_are_not_gathered_and_load_under_both_names(sync):
    trainer, engine = TiedLM(seed=0), TiedLM(tied=False, seed=4)
    state = trainer.state_dict()
    asked = []

    def gather(names):
        asked.extend(names)
        return [state[n].clone() for n in names]  # a sequence in the order of names

    metas = [(n, t.dtype, t.shape) for n, t in state.items() if n != "lm_head.weight"]
    source = LazySource(metas, gather, aliases={"lm_head.weight": "wte.weight"})
    requests = send_model(sync.sender, source, dtype=torch.bfloat16)
    names, wire_bytes, _ = wire(requests)
    assert "lm_head.weight" not in asked and "wte.weight=lm_head.weight" in names
    assert wire_bytes == sum(nbytes(t) for n, t in state.items() if n != "lm_head.weight") // 2
    ModuleLoader(engine.to(torch.bfloat16)).load_all(sync.receiver, requests)
    want = trainer.wte.weight.detach().to(torch.bfloat16)
    assert torch.equal(engine.lm_head.weight, want) and torch.equal(engine.wte.weight, want)


def test_a_gather_that_returns_the_wrong_tensor_abandons_the_version(make_sync):
    s = make_sync(buckets=4)
    state = {"a.w": torch.ones(4), "b.w": torch.ones(4)}
    metas = [("a.w", torch.float32, (4,)), ("b.w", "float32", (4,))]
    wrong = LazySource(metas, lambda names: {n: torch.ones(5) for n in names})
    with pytest.raises(wsync.InvalidArgumentError,
                       match=r"gather returned tensor 'a.w' as float32\[5\], its metadata says float32\[4\]"):
        send_model(s.sender, wrong)
    short = LazySource(metas, lambda names: {})
    with pytest.raises(wsync.InvalidArgumentError, match="gather returned no tensor for 'a.w'"):
        send_model(s.sender, short)
    # Sent part-way (chunk 0 of two), then the gather fails: the version is abandoned.
    calls = []

    def flaky(names):
        calls.append(names)
        if len(calls) == 2:
            raise RuntimeError("all-gather failed")
        return {n: state[n] for n in names}

    engine = {"a.w": torch.zeros(4), "b.w": torch.zeros(4)}
    loader = ModuleLoader(engine)
    with pytest.raises(RuntimeError, match="all-gather failed"):
        send_model(s.sender, LazySource(metas, flaky), chunk_bytes=16, group_depth=0,
                   on_request=lambda r: loader.load(s.receiver, r))
    assert len(calls) == 2
    polled = s.receiver.poll()
    assert (polled.completed_version, polled.failed_version, polled.failed_status) == \
        (0, 1, Status.ABANDONED)


def test_lazy_source_arguments_are_checked():
    with pytest.raises(wsync.InvalidArgumentError, match="gather must be callable"):
        LazySource([], None)
    with pytest.raises(wsync.InvalidArgumentError, match="more than once"):
        LazySource([("a", "float32", (1,)), ("a", "float32", (1,))], list)
    with pytest.raises(wsync.InvalidArgumentError, match="alias 'b' names 'c'"):
        LazySource([("a", "float32", (1,))], list, aliases={"b": "c"})
    with pytest.raises(wsync.InvalidArgumentError, match="tensor 'a'"):
        LazySource([("a", "nonsense", (1,))], list)
    with pytest.raises(wsync.InvalidArgumentError, match="nothing to send"):
        list(iter_chunks(LazySource([], list)))


def test_a_strategy_that_shares_trainer_memory_refuses_a_lazy_source():
    class SharingSender:  # what cuda_ipc with packed: false describes
        init_description = {"kind": "cuda_ipc", "body": {"packed": False}}

    with pytest.raises(wsync.InvalidArgumentError, match="packed: false"):
        send_model(SharingSender(), LazySource([("a", "float32", (1,))], list))


def test_lazy_numpy_tensors_are_cast_as_planned(sync):
    state = {"a.w": np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4),
             "a.steps": np.arange(3, dtype=np.int64)}
    source = LazySource([(n, a.dtype, a.shape) for n, a in state.items()],
                        lambda names: {n: state[n].copy() for n in names})
    [chunk] = list(iter_chunks(source, dtype=torch.bfloat16))
    sent = dict(chunk.tensors)
    assert sent["a.w"].dtype == torch.bfloat16 and sent["a.steps"].dtype == torch.int64
    assert chunk.bytes == 12 * 2 + 3 * 8
    engine = {"a.w": torch.zeros(3, 4, dtype=torch.bfloat16),
              "a.steps": torch.zeros(3, dtype=torch.int64)}
    [request] = send_model(sync.sender, source, dtype=torch.bfloat16)
    ModuleLoader(engine).load(sync.receiver, request)
    assert torch.equal(engine["a.w"], torch.from_numpy(state["a.w"]).to(torch.bfloat16))
    assert torch.equal(engine["a.steps"], torch.arange(3))


def test_dtype_may_be_named_as_everywhere_else_in_the_binding(sync):
    model = {"w": torch.linspace(-1, 1, 6), "steps": torch.arange(2)}
    for name in ("bfloat16", wsync.DType.of("bfloat16")):
        [chunk] = list(iter_chunks(model, dtype=name))
        sent = dict(chunk.tensors)
        assert sent["w"].dtype == torch.bfloat16 and sent["steps"].dtype == torch.int64
    with pytest.raises(wsync.InvalidArgumentError, match="dtype 'bf17'"):
        send_model(sync.sender, model, dtype="bf17")
    assert sync.sender.version == 1  # nothing was published


def test_send_model_async_sends_a_lazy_tied_source(make_sync):
    import asyncio

    from wsync.trainer import send_model_async

    s = make_sync(buckets=4, bucket_bytes=64 << 10)
    trainer, engine = TiedLM(seed=0), TiedLM(tied=False, seed=4)
    state = trainer.state_dict()
    metas = [(n, t.dtype, t.shape) for n, t in state.items() if n != "lm_head.weight"]
    gather = Gathers(state)
    source = LazySource(metas, gather, aliases={"lm_head.weight": "wte.weight"})
    loader = ModuleLoader(engine)

    async def load(request):
        loader.load(s.receiver, request)

    # split=False: wte (over 32 KiB) keeps a chunk of its own here, so every chunk is one
    # gather (test_split_python.py covers a lazy split tensor).
    requests = asyncio.run(send_model_async(s.sender, source, chunk_bytes=32 << 10,
                                            on_request=load, flush_timeout_s=10, split=False))
    assert len(requests) == len(gather.calls) > 1
    assert gather.peak <= max(c.bytes for c in wsync.plan(source.metas, chunk_bytes=32 << 10))
    assert s.receiver.completed_version == 1
    assert model_digests(engine) == model_digests(trainer)


def test_a_cast_copy_replaces_its_gathered_original_before_the_send(sync):
    # With dtype=, each gathered float32 tensor is dropped as soon as its bfloat16 copy exists:
    # when the chunk is sent, none of the gathered originals is alive any more.
    trainer = TiedLM(seed=0)
    source, gather = lazy(trainer)
    live_at_send = []

    def sent(request):
        live_at_send.append(gather.live)

    chunks = list(iter_chunks(source, dtype=torch.bfloat16))
    assert gather.live == 0 and len(chunks) == 1
    source, gather = lazy(trainer)
    send_model(sync.sender, source, dtype=torch.bfloat16, on_request=sent)
    assert live_at_send == [0]
    # The control: without a cast the gathered tensors are what is sent, alive at the send.
    source, gather = lazy(trainer)
    send_model(sync.sender, source, on_request=sent)
    assert live_at_send[-1] == sum(nbytes(t) for t in trainer.state_dict().values())


def test_alias_keys_join_only_tensors_with_plain_memory_seen_the_same_way():
    from wsync.trainer import alias_key

    class NoStorage(torch.Tensor):
        """A tensor subclass without plain memory (as wrapper subclasses are): data_ptr raises."""

        def data_ptr(self):
            raise RuntimeError("this tensor has no storage")

    w = torch.ones(4, 4)
    assert alias_key(w) == alias_key(w.detach()) is not None  # same memory, same view
    assert alias_key(w) != alias_key(w.t())  # same memory, other strides
    assert alias_key(w[:2]) != alias_key(w)  # part of it
    assert alias_key(torch.ones(0)) is None
    assert alias_key(torch.ones(4, device="meta")) is None
    assert alias_key(w.as_subclass(NoStorage)) is None  # never joined, never raises
