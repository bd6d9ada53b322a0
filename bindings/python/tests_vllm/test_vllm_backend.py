"""The wsync backend built by vLLM 0.33.0's own factories, syncing a small model (tied
embeddings) from a trainer engine to two worker engines on CPU."""

import copy
import importlib.metadata

import pytest
import torch

import vllm
from vllm.config import ParallelConfig, VllmConfig
from vllm.config.weight_transfer import WeightTransferConfig
from vllm.distributed.weight_transfer import (
    ModuleSource,
    VLLMWeightSyncClient,
    WeightTransferEngineFactory,
    WeightTransferTrainerFactory,
)
from vllm.distributed.weight_transfer.nccl_common import _worker_group_rank
from vllm.model_executor.model_loader.reload import record_metadata_for_reloading
from vllm.model_executor.model_loader.weight_utils import default_weight_loader
from vllm.plugins import load_general_plugins

import wsync
from _vllm_models import HIDDEN, TiedModel
from wsync.integrations import vllm as vllm_backend
from wsync.integrations.vllm import (
    WsyncTrainerInitInfo,
    WsyncTrainerWeightTransferEngine,
    WsyncWeightTransferEngine,
)

class InProcessClient:
    """A VLLMWeightSyncClient over worker engines in this process, with the worker's
    semantics (gpu_worker.py): an engine error ends that worker's session and reaches the
    trainer as the RPC's error."""

    def __init__(self, engines):
        self.engines = engines

    def init_weight_transfer_engine(self, init_info):
        for e in self.engines:
            e.init_transfer_engine(e.parse_init_info(init_info))

    def start_weight_update(self):
        for e in self.engines:
            e.start_weight_update()

    def update_weights(self, update_info):
        # Every worker gets the call (a collective RPC), then the first error is raised.
        errors = []
        for i, e in enumerate(self.engines):
            try:
                e.update_weights(update_info[i] if isinstance(update_info, list) else update_info)
            except Exception as exc:
                errors.append(RuntimeError(f"worker {i}: update_weights failed: {exc}"))
                errors[-1].__cause__ = exc
        if errors:
            raise errors[0]

    def finish_weight_update(self, weight_version=None):
        for e in self.engines:
            e.finish_weight_update()


def vllm_config(rank=0, world_size=1, data_parallel_index=0):
    """The VllmConfig a worker sees (model_config None: no real checkpoint here)."""
    if data_parallel_index:
        vc = VllmConfig(parallel_config=ParallelConfig(data_parallel_size=data_parallel_index + 1,
                                                       data_parallel_rank=data_parallel_index))
    else:
        vc = VllmConfig()
    vc = copy.deepcopy(vc)
    vc.parallel_config.rank = rank
    vc.parallel_config.world_size = world_size
    return vc


def make_worker(vc, **model_kw):
    model = TiedModel(**model_kw)
    record_metadata_for_reloading(model)  # vLLM's loader does this when it builds a model
    engine = WeightTransferEngineFactory.create_engine(
        WeightTransferConfig(backend="wsync"), vc, torch.device("cpu"), model)
    return model, engine


def make_cluster(receivers=2, trainer_kw=None, **model_kw):
    """Two worker engines (TP ranks 0 and 1) and the trainer engine, all made by vLLM's factories."""
    workers = [make_worker(vllm_config(rank=r, world_size=receivers),
                           **(model_kw if r == receivers - 1 else {})) for r in range(receivers)]
    client = InProcessClient([e for _, e in workers])
    source_model = TiedModel()
    # 4 KiB chunks: a layer's weight (4 KiB) and its bias land in different chunks, the case
    # where layerwise reload reads a chunk's tensors after that chunk's call returned.
    init = WsyncTrainerInitInfo(**{"rank": 0, "receivers": receivers,
                                   "chunk_bytes": HIDDEN * HIDDEN * 4, **(trainer_kw or {})})
    trainer = WeightTransferTrainerFactory.trainer_init(init, client=client,
                                                       source=ModuleSource(source_model))
    return workers, source_model, trainer


def perturb(model):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p))


def assert_bit_exact(model, source):
    want, got = source.state_dict(), model.state_dict()
    assert sorted(want) == sorted(got)
    for name in want:
        assert torch.equal(got[name], want[name]), name
    assert model.lm_head.weight is model.embed.weight


@pytest.fixture
def cleanup():
    made = []
    yield made
    for obj in made:
        obj.shutdown()


def test_the_pinned_vllm_is_installed():
    assert vllm.__version__ == "0.33.0"
    assert importlib.metadata.version("vllm") == "0.33.0"


def test_vllm_general_plugins_entry_point_registers_wsync_in_both_factories():
    entry_points = importlib.metadata.entry_points(group="vllm.general_plugins")
    assert "wsync.integrations.vllm:register" in [ep.value for ep in entry_points]
    load_general_plugins()
    assert "wsync" in WeightTransferEngineFactory._registry
    assert "wsync" in WeightTransferTrainerFactory._registry
    vllm_backend.register()  # idempotent: vLLM calls it in every process
    assert WeightTransferEngineFactory._registry["wsync"]() is WsyncWeightTransferEngine
    assert WeightTransferTrainerFactory._registry["wsync"]() is WsyncTrainerWeightTransferEngine


def test_the_former_module_name_is_the_same_module_as_its_new_home():
    import wsync.vllm_backend as former
    from wsync.vllm_backend import register, WsyncTrainerInitInfo as Former

    assert former is vllm_backend
    assert register is vllm_backend.register
    assert Former is WsyncTrainerInitInfo
    # vLLM's factories import the registered module by name: the new home.
    assert WeightTransferEngineFactory._registry["wsync"]() is former.WsyncWeightTransferEngine


def test_factories_build_the_wsync_engines(cleanup):
    load_general_plugins()
    workers, _, trainer = make_cluster()
    cleanup.extend([trainer] + [e for _, e in workers])
    assert all(type(e) is WsyncWeightTransferEngine for _, e in workers)
    assert type(trainer) is WsyncTrainerWeightTransferEngine
    assert isinstance(trainer.client, VLLMWeightSyncClient)
    assert [e.receiver.index for _, e in workers] == [0, 1]


def test_three_versions_reach_two_workers_bit_exact_with_tied_embeddings(cleanup):
    load_general_plugins()
    workers, source, trainer = make_cluster()
    cleanup.extend([trainer] + [e for _, e in workers])
    chunks = trainer._plan()
    assert any("layers.0.weight" in c and "layers.0.bias" not in c for c in chunks), chunks
    for version in range(1, 4):
        perturb(source)
        trainer.send_weights()
        for model, engine in workers:
            assert_bit_exact(model, source)
            assert engine.completed_version == version


def test_a_tensor_larger_than_a_chunk_crosses_in_parts_and_workers_load_it_whole(cleanup):
    # A 64 KiB tied embedding with 16 KiB chunks: planned as 4 parts, assembled on each worker
    # (its copy_into writes each part's range into one tensor) and given to load_weights whole.
    load_general_plugins()
    vocab, chunk = 512, 16 << 10
    workers = [make_worker(vllm_config(rank=r, world_size=2), vocab=vocab) for r in range(2)]
    cleanup.extend(e for _, e in workers)
    loaded = []
    for model, _ in workers:
        original = model.load_weights

        def spy(weights, original=original):
            weights = list(weights)
            loaded.append([(n, tuple(w.shape)) for n, w in weights])
            return original(weights)

        model.load_weights = spy
    source = TiedModel(vocab=vocab)
    init = WsyncTrainerInitInfo(rank=0, receivers=2, chunk_bytes=chunk,
                                options={"bucket_bytes": chunk, "buckets": 2})
    trainer = WeightTransferTrainerFactory.trainer_init(
        init, client=InProcessClient([e for _, e in workers]), source=ModuleSource(source))
    cleanup.append(trainer)
    planned = trainer._planned()
    embed_parts = [parts[names.index("embed.weight")] for names, parts in planned
                   if "embed.weight" in names]
    assert len(embed_parts) == 4 and all(p[1] == chunk for p in embed_parts), embed_parts
    for version in range(1, 3):
        perturb(source)
        loaded.clear()
        trainer.send_weights()
        for model, engine in workers:
            assert_bit_exact(model, source)
            assert engine.completed_version == version
        # Each worker saw the embedding once per version, whole, in the batch of its last part.
        for w in range(2):
            seen = [s for batch in loaded[w::2] for s in batch if s[0] == "embed.weight"]
            assert seen == [("embed.weight", (vocab, HIDDEN))], loaded


def test_a_split_tensor_with_views_only_is_refused_by_the_sender_by_name(cleanup):
    # copy=False hands load_weights views, which cannot carry parts: the trainer does not split,
    # so a tensor larger than the bucket is refused when sent, naming it.
    load_general_plugins()
    vocab, chunk = 512, 16 << 10
    workers = [make_worker(vllm_config(rank=0, world_size=1), vocab=vocab)]
    cleanup.extend(e for _, e in workers)
    init = WsyncTrainerInitInfo(rank=0, receivers=1, chunk_bytes=chunk, copy=False,
                                options={"bucket_bytes": chunk, "buckets": 2})
    trainer = WeightTransferTrainerFactory.trainer_init(
        init, client=InProcessClient([e for _, e in workers]),
        source=ModuleSource(TiedModel(vocab=vocab)))
    cleanup.append(trainer)
    assert all(parts is None for _, parts in trainer._planned())
    with pytest.raises(wsync.WsyncError) as info:
        trainer.send_weights()
    assert "embed.weight" in info.value.message, info.value.message


def test_receiver_index_counts_data_parallel_replicas(cleanup):
    load_general_plugins()
    vc = vllm_config(data_parallel_index=1)
    pc = vc.parallel_config
    assert (pc.data_parallel_index, pc.world_size, pc.rank) == (1, 1, 0)
    strategy = wsync.Strategy("shm", receivers=3)
    blob = strategy.create_init_info()
    sender = strategy.sender(blob)
    _, engine = make_worker(vc)
    engine.init_transfer_engine(engine.parse_init_info(
        {"init_info": vllm_backend.encode_blob(blob), "rank_offset": 1}))
    cleanup.append(engine)
    assert engine.receiver.index == 2 == _worker_group_rank(1, pc)
    sender.close()
    strategy.close()


def test_a_worker_loader_failure_reaches_the_trainer_with_the_workers_message(cleanup):
    load_general_plugins()
    workers, source, trainer = make_cluster(fail_on="layers.1.weight")
    cleanup.extend([trainer] + [e for _, e in workers])
    with pytest.raises(wsync.WsyncError) as caught:
        trainer.send_weights()
    err = caught.value
    assert err.status is wsync.Status.PEER
    assert isinstance(err.__cause__, RuntimeError) and "worker 1" in str(err.__cause__)
    [failure] = [f for f in err.failures if f.receiver == 1]
    assert failure.status is wsync.Status.MISMATCH  # a KeyError: the chunk does not fit
    assert "load_weights failed: KeyError" in failure.message
    assert "has no home in this model" in failure.message
    assert workers[1][1].completed_version == 0


class FailingSource(ModuleSource):
    """A ModuleSource whose iteration breaks (the trainer's own error) at one parameter."""

    def __init__(self, module, fail_at):
        super().__init__(module)
        self.fail_at = fail_at

    def iter_full(self):
        for name, tensor in super().iter_full():
            if name == self.fail_at and self.armed:
                raise RuntimeError("trainer lost a shard")
            yield name, tensor

    armed = False


def test_a_version_abandoned_mid_way_leaves_workers_on_the_previous_version(cleanup):
    load_general_plugins()
    workers = [make_worker(vllm_config(rank=r, world_size=2)) for r in range(2)]
    client = InProcessClient([e for _, e in workers])
    source_model = TiedModel()
    source = FailingSource(source_model, fail_at="layers.1.weight")
    trainer = WeightTransferTrainerFactory.trainer_init(
        WsyncTrainerInitInfo(rank=0, receivers=2, chunk_bytes=HIDDEN * HIDDEN * 4),
        client=client, source=source)
    cleanup.extend([trainer] + [e for _, e in workers])
    perturb(source_model)
    trainer.send_weights()
    source.armed = True
    perturb(source_model)
    with pytest.raises(RuntimeError, match="trainer lost a shard"):
        trainer.send_weights()
    for model, engine in workers:
        state = engine.receiver.poll()
        assert state.completed_version == 1
        assert state.failed_version == 2
        assert state.failed_status is wsync.Status.ABANDONED
        # The trainer's abort discarded each worker's layerwise reload.
        assert not any(t.is_meta for t in model.state_dict(keep_vars=True).values())
    source.armed = False
    perturb(source_model)
    trainer.send_weights()
    for model, engine in workers:
        assert_bit_exact(model, source_model)
        assert engine.completed_version == 3


def test_finish_while_a_version_is_still_open_is_refused_and_discards_the_reload(cleanup):
    load_general_plugins()
    workers, source, trainer = make_cluster()
    cleanup.extend([trainer] + [e for _, e in workers])
    perturb(source)
    trainer.send_weights()
    model, engine = workers[0]
    before = {n: t.clone() for n, t in model.state_dict().items()}
    # A driver that calls finish before the version's last chunk: layerwise reload would
    # process half-loaded layers.
    perturb(source)
    trainer.client.start_weight_update()
    pairs, last, _ = next(trainer._chunks())
    assert not last
    request = trainer.sender.send_chunk(pairs, last=False)
    trainer.client.update_weights({"requests": [vllm_backend.encode_blob(request)]})
    with pytest.raises(wsync.WrongStateError, match="version 2 is still open on receiver 0"):
        engine.finish_weight_update()
    assert not any(t.is_meta for t in model.state_dict(keep_vars=True).values())
    # Layers the chunk completed were written in place; every other one has its own tensors
    # back, unchanged.
    sent = {name for name, _ in pairs}
    if "embed.weight" in sent:
        sent.add("lm_head.weight")  # tied
    assert len(sent) < len(before)
    for name, tensor in model.state_dict().items():
        if name not in sent:
            assert torch.equal(tensor, before[name]), name
    assert model.lm_head.weight is model.embed.weight
    trainer.sender.abandon()


def test_the_report_names_the_torch_and_vllm_versions(pytestconfig):
    want = f"torch {torch.__version__}, vllm {vllm.__version__}"
    lines = [line for result in pytestconfig.hook.pytest_report_header(
        config=pytestconfig, start_path=pytestconfig.rootpath) for line in
        ([result] if isinstance(result, str) else result)]
    assert want in lines, lines  # the header (pytest without -q)

    class Reporter:
        written = []

        def write_line(self, line, **kw):
            self.written.append(line)

    [conftest] = [p for p in pytestconfig.pluginmanager.get_plugins()
                  if str(getattr(p, "__file__", "")).endswith("tests_vllm/conftest.py")]
    conftest.pytest_terminal_summary(Reporter(), 0, pytestconfig)
    assert Reporter.written == [f"tested with {want}"]  # the summary (shown with -q too)


@pytest.mark.parametrize("rank_offset", [0, 2])
def test_receiver_index_with_data_parallel_replicas_of_several_ranks(cleanup, rank_offset):
    """2 DP replicas of TP 2 (world_size 2, as vLLM's ParallelConfig computes it): worker
    (dp, rank) is receiver rank_offset + dp * 2 + rank, as vLLM's NCCL engine numbers its group,
    and a real sync reaches all four, each bit-exact."""
    load_general_plugins()
    configs = [VllmConfig(parallel_config=ParallelConfig(
        tensor_parallel_size=2, data_parallel_size=2, data_parallel_rank=dp, rank=rank))
        for dp in range(2) for rank in range(2)]
    assert [(c.parallel_config.data_parallel_index, c.parallel_config.world_size,
             c.parallel_config.rank) for c in configs] == [(0, 2, 0), (0, 2, 1), (1, 2, 0), (1, 2, 1)]
    workers = [make_worker(vc) for vc in configs]
    cleanup.extend(e for _, e in workers)
    source = TiedModel()
    trainer = WeightTransferTrainerFactory.trainer_init(
        WsyncTrainerInitInfo(rank=0, receivers=rank_offset + 4, rank_offset=rank_offset,
                             chunk_bytes=HIDDEN * HIDDEN * 4, flush_timeout_s=30.0),
        client=InProcessClient([e for _, e in workers]), source=ModuleSource(source))
    cleanup.append(trainer)
    indices = [e.receiver.index for _, e in workers]
    assert indices == [rank_offset + dp * 2 + rank for dp in range(2) for rank in range(2)]
    assert indices == [_worker_group_rank(rank_offset, c.parallel_config) for c in configs]
    for i in range(rank_offset):  # the receivers below the offset belong to no worker here
        trainer.sender.drop_receiver(i)
    for version in (1, 2):
        perturb(source)
        trainer.send_weights()
        for model, engine in workers:
            assert_bit_exact(model, source)
            assert engine.completed_version == version


class RecordingLoads:
    """Wraps a model's load_weights: keeps every (name, tensor) it was given."""

    def __init__(self, model):
        self.seen = []
        inner = model.load_weights

        def load_weights(weights):
            weights = list(weights)
            self.seen.extend(weights)
            return inner(weights)

        model.load_weights = load_weights


@pytest.mark.parametrize("copy", [True, False], ids=["copy", "views"])
def test_load_weights_gets_library_copies_that_outlive_the_iteration_or_views(
        cleanup, monkeypatch, copy):
    """By default (copy=True) each tensor reaches load_weights as a fresh tensor the library's
    copy loop filled (Iteration.copy_into, i.e. wsync_recv_copy with the checksum fused), once
    per tensor and with no view in between, and keeps its value after its chunk's slot was
    reused by later chunks (layerwise reload may hold it until the layer completes).
    copy=False passes the zero-copy views (one chunk here, so no layer spans two)."""
    load_general_plugins()
    copied, iterated = [], []
    real_copy_into, real_iter = wsync.Iteration.copy_into, wsync.Iteration.__iter__

    def copy_into(self, i, dst, **kw):
        copied.append(self.peek(i).name)
        return real_copy_into(self, i, dst, **kw)

    def iterate(self):
        for name, tensor in real_iter(self):
            iterated.append(name)
            yield name, tensor

    monkeypatch.setattr(wsync.Iteration, "copy_into", copy_into)
    monkeypatch.setattr(wsync.Iteration, "__iter__", iterate)
    kw = {"copy": copy} if copy else {"copy": False, "chunk_bytes": 1 << 20}
    workers, source, trainer = make_cluster(trainer_kw=kw)
    cleanup.extend([trainer] + [e for _, e in workers])
    assert workers[0][1].copy is copy
    names = [n for n, _ in source.named_parameters()]
    chunks = trainer._plan()
    assert len(chunks) >= (4 if copy else 1), chunks
    records = [RecordingLoads(model) for model, _ in workers]
    for version in (1, 2, 3):
        perturb(source)
        want = {n: t.detach().clone() for n, t in source.named_parameters()}
        for r in records:
            r.seen.clear()
        copied.clear()
        iterated.clear()
        trainer.send_weights()
        for (model, _), r in zip(workers, records):
            assert_bit_exact(model, source)
            assert sorted(n for n, _ in r.seen) == sorted(names)
        if copy:
            assert sorted(copied) == sorted(names * len(workers))
            assert iterated == []
            for r in records:
                ptrs = set()
                for name, tensor in r.seen:
                    # Owned, dense, of the source's dtype and shape, and still holding what was
                    # sent after every chunk of the version was received and ended.
                    assert tensor._base is None and tensor.is_contiguous(), name
                    assert torch.equal(tensor, want[name]), name
                    ptrs.add(tensor.untyped_storage().data_ptr())
                assert len(ptrs) == len(names)
        else:
            assert copied == []
            assert sorted(iterated) == sorted(names * len(workers))


class Float8Model(torch.nn.Module):
    """Parameters of both float8 formats vLLM quantises with (every byte value, NaN, -0.0 and
    e5m2's infinities included) beside a float32 one."""

    def __init__(self):
        super().__init__()
        self.e4m3 = torch.nn.Parameter(torch.zeros(16, 16, dtype=torch.float8_e4m3fn),
                                       requires_grad=False)
        self.e5m2 = torch.nn.Parameter(torch.zeros(8, 32, dtype=torch.float8_e5m2),
                                       requires_grad=False)
        self.scale = torch.nn.Parameter(torch.ones(16), requires_grad=False)

    def load_weights(self, weights):
        params = dict(self.named_parameters())
        for name, w in weights:
            p = params[name]
            getattr(p, "weight_loader", default_weight_loader)(p, w)
        return {name for name, _ in weights}

    def scramble(self, seed):
        """Every byte pattern 0..255 once per float8 tensor, in a fresh order."""
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for p in (self.e4m3, self.e5m2):
                p.view(torch.uint8).copy_(torch.randperm(256, generator=g).to(torch.uint8).view(p.shape))
            self.scale.copy_(torch.randn(16, generator=g))


def assert_float8_bit_exact(model, source):
    for (name, got), (_, want) in zip(model.named_parameters(), source.named_parameters()):
        assert got.dtype == want.dtype, name
        assert torch.equal(got.view(torch.uint8) if got.element_size() == 1 else got,
                           want.view(torch.uint8) if want.element_size() == 1 else want), name


@pytest.mark.parametrize("copy", [True, False], ids=["copy", "views"])
def test_float8_tensors_reach_the_worker_bit_exact(cleanup, copy):
    """float8_e4m3fn and float8_e5m2 (modern torch has both) through a real sync: trainer engine
    -> shm -> worker engine with vLLM's layerwise reload, every byte value bit-exact."""
    load_general_plugins()
    model = Float8Model()
    record_metadata_for_reloading(model)
    engine = WeightTransferEngineFactory.create_engine(
        WeightTransferConfig(backend="wsync"), vllm_config(), torch.device("cpu"), model)
    cleanup.append(engine)
    source = Float8Model()
    trainer = WeightTransferTrainerFactory.trainer_init(
        WsyncTrainerInitInfo(rank=0, receivers=1, copy=copy,
                             chunk_bytes=256 if copy else 1 << 20),
        client=InProcessClient([engine]), source=ModuleSource(source))
    cleanup.append(trainer)
    assert [m.dtype for m in trainer.source.metadata] == [
        torch.float8_e4m3fn, torch.float8_e5m2, torch.float32]
    for version in (1, 2):
        source.scramble(version)
        trainer.send_weights()
        assert_float8_bit_exact(model, source)
        assert engine.completed_version == version
    # NaN and -0.0 are among the bytes sent (and e5m2's infinities).
    assert torch.isnan(model.e4m3.float()).any() and torch.isinf(model.e5m2.float()).any()


def test_a_part_is_held_until_its_tensor_is_whole_never_loaded_half_set(cleanup):
    """A trainer that splits a tensor across chunks (``Sender.send_chunk(..., parts=...)``, as
    the trainer engine does for a tensor larger than a chunk): the worker copies each part into
    one tensor and hands ``load_weights`` nothing of it until the last part has arrived, so no
    layer ever sees a tensor whose other bytes are unset; then it loads it whole, bit-exact."""
    load_general_plugins()
    model, engine = make_worker(vllm_config())
    cleanup.append(engine)
    calls = []
    original = model.load_weights

    def spy(weights):
        weights = list(weights)
        calls.append([n for n, _ in weights])
        return original(weights)

    model.load_weights = spy
    strategy = wsync.Strategy("shm", receivers=1)
    blob = strategy.create_init_info()
    sender = strategy.sender(blob)
    engine.init_transfer_engine(engine.parse_init_info({"init_info": vllm_backend.encode_blob(blob)}))
    weight = torch.randn(HIDDEN, HIDDEN)
    half = weight.numel() * weight.element_size() // 2
    try:
        engine.start_weight_update()
        first = sender.send_chunk([("layers.0.weight", weight)], parts=[(0, half)])
        engine.update_weights({"requests": [vllm_backend.encode_blob(first)]})
        assert calls == [[]] and engine._partial[0] == "layers.0.weight", calls
        # A whole tensor ahead of the last part in the same chunk loads beside it.
        bias = torch.randn(HIDDEN)
        second = sender.send_chunk([("layers.0.bias", bias), ("layers.0.weight", weight)],
                                   last=True, parts=[(0, 0), (half, half)])
        engine.update_weights({"requests": [vllm_backend.encode_blob(second)]})
        assert calls == [[], ["layers.0.bias", "layers.0.weight"]], calls
        assert engine._partial is None
        sender.flush(5.0)
        engine.finish_weight_update()
        assert torch.equal(model.layers[0].weight, weight)
        assert torch.equal(model.layers[0].bias, bias)
        assert engine.completed_version == 1
    finally:
        sender.close()
        strategy.close()


UCX_OPTIONS = dict(transports="tcp", net_devices="lo", timeout_ms=10000)


@pytest.mark.skipif(not any(k["kind"] == "ucx" and k["available"] for k in wsync.kinds()),
                    reason="ucx kind not built or libucp.so.0 missing")
def test_ucx_workers_take_their_copies_with_copy_into_bit_exact(cleanup, monkeypatch):
    """kind="ucx" (host memory pulled over UCX, here over TCP on lo in one process): a host
    kind, so the default copies are the library's (copy_into), and three versions reach both
    workers bit-exact with a layer spanning two chunks."""
    load_general_plugins()
    copied = []
    real_copy_into = wsync.Iteration.copy_into

    def copy_into(self, i, dst, **kw):
        copied.append(self.peek(i).name)
        return real_copy_into(self, i, dst, **kw)

    monkeypatch.setattr(wsync.Iteration, "copy_into", copy_into)
    workers, source, trainer = make_cluster(trainer_kw={
        "kind": "ucx", "options": UCX_OPTIONS, "worker_options": UCX_OPTIONS,
        "flush_timeout_s": 30.0})
    cleanup.extend([trainer] + [e for _, e in workers])
    names = [n for n, _ in source.named_parameters()]
    for version in (1, 2, 3):
        copied.clear()
        perturb(source)
        trainer.send_weights()
        for model, engine in workers:
            assert_bit_exact(model, source)
            assert engine.completed_version == version
        assert sorted(copied) == sorted(names * len(workers))
