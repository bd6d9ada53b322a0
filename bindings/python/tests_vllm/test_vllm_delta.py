"""Delta sync into vLLM workers (trainer option ``delta``): patches taken with
``wsync_recv_patch`` (``Iteration.patch``) and applied through the model's ``load_weights``
with vLLM 0.33.0's real layers (fused QKV with bias, merged gate/up, row-parallel, padded
vocab-parallel embedding; TP 1 in this process), bit for bit, NaN payloads and -0.0 included;
a loader a patch cannot pass through exactly and a quantized layer are refused by name."""

import os
import socket

import pytest
import torch

from vllm.config import VllmConfig, set_current_vllm_config
from vllm.config.weight_transfer import WeightTransferConfig
from vllm.distributed.weight_transfer import (
    ModuleSource,
    WeightTransferEngineFactory,
    WeightTransferTrainerFactory,
)
from vllm.model_executor.model_loader.reload import record_metadata_for_reloading
from vllm.plugins import load_general_plugins

import wsync
from _vllm_models import CheckpointLike, LlamaLike
from test_vllm_backend import InProcessClient, vllm_config
from wsync.integrations import vllm as vllm_backend
from wsync.integrations.vllm import WsyncTrainerInitInfo, WsyncTrainerWeightTransferEngine

_INT = {1: torch.int8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def bits(t):
    t = t.detach().contiguous()
    return t.view(_INT[t.element_size()])


@pytest.fixture(scope="module")
def tp1():
    """vLLM's distributed state for one process (gloo, TP 1), which its parallel layers need;
    torn down after this module so the other tests see none."""
    from vllm.distributed import (destroy_distributed_environment, destroy_model_parallel,
                                  init_distributed_environment, initialize_model_parallel)

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with set_current_vllm_config(VllmConfig()):
        init_distributed_environment(world_size=1, rank=0, local_rank=0, backend="gloo",
                                     distributed_init_method=f"tcp://127.0.0.1:{port}")
        initialize_model_parallel(1)
        try:
            yield
        finally:
            destroy_model_parallel()
            destroy_distributed_environment()


@pytest.fixture
def cleanup():
    made = []
    yield made
    for obj in made:
        obj.shutdown()


class RecordingClient(InProcessClient):
    """InProcessClient that keeps every request the trainer sent."""

    def __init__(self, engines):
        super().__init__(engines)
        self.requests = []

    def update_weights(self, update_info):
        infos = update_info if isinstance(update_info, list) else [update_info]
        for info in infos[:1]:
            self.requests += list(info["requests"] if isinstance(info, dict) else info.requests)
        return super().update_weights(update_info)


def make_delta_cluster(delta, receivers=2, worker_kw=None, source_kw=None, trainer_kw=None,
                       worker_options=None, staged=False, kind="shm"):
    """Workers built as vLLM's loader builds them (metadata recorded for reloads), the trainer
    over a RecordingClient (``trainer.client.requests``: every request it sent)."""
    load_general_plugins()
    workers = []
    for r in range(receivers):
        model = LlamaLike(**(worker_kw or {}))
        record_metadata_for_reloading(model)
        engine = WeightTransferEngineFactory.create_engine(
            WeightTransferConfig(backend="wsync"), vllm_config(rank=r, world_size=receivers),
            torch.device("cpu"), model)
        workers.append((model, engine))
    source = CheckpointLike(**(source_kw or {}))
    info = WsyncTrainerInitInfo(rank=0, kind=kind, receivers=receivers, chunk_bytes=8192,
                                # "size": every version compared, so patches run whatever
                                # this host's timing ("cost", the default, may go dense)
                                options={"delta": delta, **({"delta_decide": "size"}
                                                            if delta == "auto" else {}),
                                         **(trainer_kw or {})},
                                worker_options=dict(worker_options or {}), staged=staged)
    trainer = WeightTransferTrainerFactory.trainer_init(
        info, client=RecordingClient([e for _, e in workers]), source=ModuleSource(source))
    return workers, source, trainer


def assert_bit_exact(model, source):
    got = dict(model.named_parameters())
    for name, want in model.expected_from(source).items():
        have = got[name].detach()
        if name == "embed_tokens.weight":
            have = have[: want.shape[0]]
        assert torch.equal(bits(have), bits(want)), name


def step(source, version, gen):
    """A few elements of every tensor change, the awkward way included: a NaN with a payload
    of its own (a bf16 quiet NaN 0x7fc0 | version), and -0.0 where 0.0 was."""
    with torch.no_grad():
        for name, p in source.named_parameters():
            flat = p.view(-1)
            idx = torch.randperm(flat.numel(), generator=gen)[: max(1, flat.numel() // 50)]
            flat[idx] = flat[idx] * 0.5 + 0.125
            if name in ("q_proj.bias", "gate_proj.weight", "norm"):
                flat.view(torch.int16)[3] = 0x7FC0 | version  # a NaN payload
                flat[5] = -0.0 if version % 2 else 0.0


class CountingPatches:
    def __init__(self, monkeypatch):
        self.names = []
        real = vllm_backend.apply_checkpoint_patch

        def counting(load_weights, name, *args, **kwargs):
            self.names.append(name)
            return real(load_weights, name, *args, **kwargs)

        monkeypatch.setattr(vllm_backend, "apply_checkpoint_patch", counting)


@pytest.mark.parametrize("delta", ["auto", "on"])
def test_patches_reach_vllm_layers_bit_exact_with_nan_payloads_and_signed_zeros(
        tp1, cleanup, monkeypatch, delta):
    counting = CountingPatches(monkeypatch)
    workers, source, trainer = make_delta_cluster(delta)
    cleanup.extend([trainer] + [e for _, e in workers])
    gen = torch.Generator().manual_seed(11)
    for version in range(1, 6):
        if version > 1:
            step(source, version, gen)
        before = len(counting.names)
        trainer.send_weights()
        for model, engine in workers:
            assert engine.completed_version == version
            assert_bit_exact(model, source)
        patched = counting.names[before:]
        if version == 1:
            assert patched == []  # no base yet: dense
        elif delta == "on":  # every checkpoint tensor crossed as a patch, for both workers
            assert sorted(set(patched)) == sorted(n for n, _ in source.named_parameters())
            assert len(patched) == 2 * len(list(source.parameters()))
        else:  # "auto": the large tensors as patches; small ones (a bias) may cost less dense
            assert {"embed_tokens.weight", "gate_proj.weight", "down_proj.weight"} <= set(patched)
    # the NaN payload is the trainer's own, not torch's default NaN
    for model, _ in workers:
        assert int(bits(model.norm)[3]) == 0x7FC0 | 5


UCX_OPTIONS = dict(transports="tcp", net_devices="lo", timeout_ms=10000)


@pytest.mark.skipif(not any(k["kind"] == "ucx" and k["available"] for k in wsync.kinds()),
                    reason="ucx kind not built or libucp.so.0 missing")
def test_patches_pulled_over_ucx_reach_vllm_layers_bit_exact(tp1, cleanup, monkeypatch):
    """kind="ucx" (workers pull over TCP on lo, in this process): the same patches, the same
    bit-exact layers. Workers attach on their own time, so the first version or two are dense
    (a worker that attached after a version began is sent the next one dense); later versions
    carry every checkpoint tensor as a patch to both workers."""
    counting = CountingPatches(monkeypatch)
    workers, source, trainer = make_delta_cluster("on", kind="ucx", trainer_kw=UCX_OPTIONS,
                                                  worker_options=UCX_OPTIONS)
    cleanup.extend([trainer] + [e for _, e in workers])
    gen = torch.Generator().manual_seed(13)
    for version in range(1, 7):
        if version > 1:
            step(source, version, gen)
        before = len(counting.names)
        trainer.send_weights()
        for model, engine in workers:
            assert engine.completed_version == version
            assert_bit_exact(model, source)
        patched = counting.names[before:]
        if version == 1:
            assert patched == []
        elif version >= 3:
            assert len(patched) == 2 * len(list(source.parameters()))
    for model, _ in workers:
        assert int(bits(model.norm)[3]) == 0x7FC0 | 6


def test_a_loader_that_copies_the_checkpoint_tensor_is_refused_by_name_and_dense_recovers(
        tp1, cleanup):
    workers, source, trainer = make_delta_cluster(
        "on", receivers=1, worker_kw={"clone_in_loader": True})
    cleanup.extend([trainer] + [e for _, e in workers])
    (model, engine), = workers
    gen = torch.Generator().manual_seed(2)
    trainer.send_weights()  # version 1: dense, any loader is fine
    assert_bit_exact(model, source)
    step(source, 2, gen)
    with pytest.raises(wsync.WsyncError) as caught:
        trainer.send_weights()
    [failure] = caught.value.failures
    assert "checkpoint tensor 'norm'" in failure.message
    assert "aten.clone" in failure.message and "delta 'off'" in failure.message
    assert engine.completed_version == 1
    step(source, 3, gen)
    trainer.send_weights()  # dense after the failure: whole again
    assert engine.completed_version == 3
    assert_bit_exact(model, source)


@pytest.mark.parametrize("staged", [False, True], ids=["streamed", "staged"])
def test_workers_with_a_mirror_load_delta_versions_whole_through_any_loader(
        tp1, cleanup, monkeypatch, staged):
    """worker_options {"delta_mirror": True}: patches cross, the library applies them onto each
    worker's mirror and verifies them, and load_weights gets whole tensors, so a loader that
    copies the checkpoint tensor (refused by name without a mirror) stays bit-exact, with NaN
    payloads and -0.0, and staged versions work."""
    counting = CountingPatches(monkeypatch)
    workers, source, trainer = make_delta_cluster(
        "on", worker_kw={"clone_in_loader": True}, worker_options={"delta_mirror": True},
        staged=staged)
    cleanup.extend([trainer] + [e for _, e in workers])
    client = trainer.client
    gen = torch.Generator().manual_seed(5)
    for version in range(1, 6):
        if version > 1:
            step(source, version, gen)
        before = len(client.requests)
        trainer.send_weights()
        patched = 0
        for r in client.requests[before:]:
            blob = vllm_backend.decode_blob(r, "request", "request")
            patched += len(wsync.describe(blob)["body"]["tensors"].get("patches", {}).get("tensor", []))
        assert (patched > 0) == (version > 1), (version, patched)
        for model, engine in workers:
            assert engine.completed_version == version
            assert_bit_exact(model, source)
    assert counting.names == []  # no worker applied a patch itself: the library did
    for model, _ in workers:
        assert int(bits(model.norm)[3]) == 0x7FC0 | 5


class Fp8LinearMethod:  # stands for any quant method that transforms weights after loading
    pass


def _quantized(model):
    model.down_proj.quant_method = Fp8LinearMethod()


def _cpu_packed(model):
    from vllm.model_executor.layers.utils import dispatch_cpu_unquantized_gemm

    # what vLLM's CPU platform does to an unquantized linear after loading
    dispatch_cpu_unquantized_gemm(model.o_proj, remove_weight=False)
    if getattr(model.o_proj, "cpu_linear", None) in (None, torch.nn.functional.linear):
        model.o_proj.cpu_linear = lambda x, w, b=None: x  # a CPU without the packed kernels


def _model_hook(model):
    model.process_weights_after_loading = lambda: None


@pytest.mark.parametrize("alter,needle", [
    (_quantized, "layer 'down_proj' uses Fp8LinearMethod"),
    (_cpu_packed, "layer 'o_proj' had its weight repacked for vLLM's CPU GEMM"),
    (_model_hook, "model LlamaLike has a model-level process_weights_after_loading hook"),
], ids=["quantized", "cpu-packed", "model-hook"])
def test_layers_whose_weights_are_processed_after_loading_refuse_delta_by_name(
        tp1, cleanup, alter, needle):
    load_general_plugins()
    model = LlamaLike()
    alter(model)
    engine = WeightTransferEngineFactory.create_engine(
        WeightTransferConfig(backend="wsync"), vllm_config(), torch.device("cpu"), model)
    cleanup.append(engine)
    info = WsyncTrainerInitInfo(rank=0, receivers=1, options={"delta": "auto"})
    with pytest.raises(ValueError, match=needle):
        WsyncTrainerWeightTransferEngine.trainer_init(
            info, client=InProcessClient([engine]), source=ModuleSource(CheckpointLike()))


def test_delta_with_staged_versions_is_refused_before_any_worker_is_touched():
    class UntouchedClient:
        def __getattr__(self, name):
            raise AssertionError(f"the client was used ({name}) before the refusal")

    info = WsyncTrainerInitInfo(rank=0, kind="shm", options={"delta": "on"}, receivers=1,
                                staged=True)
    with pytest.raises(ValueError, match="delta patches apply in place"):
        WsyncTrainerWeightTransferEngine.trainer_init(info, client=UntouchedClient())


def tp_shards(source, rank, tp=2):
    """What rank ``rank`` of ``tp`` holds of each LlamaLike parameter after a dense load of
    ``source`` (vLLM's sharding: QKV and gate/up by output rows per head / half, o/down by
    input columns, the vocab by rows of the padded embedding, the norm replicated)."""
    s = {n: p.detach() for n, p in source.named_parameters()}
    rows = lambda t, r: t.chunk(tp, dim=0)[r]  # noqa: E731
    cols = lambda t, r: t.chunk(tp, dim=1)[r]  # noqa: E731
    vocab = s["embed_tokens.weight"]
    per = 64  # 100 rows padded to 128 (multiples of 64), 64 per rank
    return {
        "embed_tokens.weight": (vocab[rank * per:(rank + 1) * per], min(per, vocab.shape[0] - rank * per)),
        "qkv_proj.weight": (torch.cat([rows(s[f"{x}_proj.weight"], rank) for x in "qkv"]), None),
        "qkv_proj.bias": (torch.cat([rows(s[f"{x}_proj.bias"], rank) for x in "qkv"]), None),
        "o_proj.weight": (cols(s["o_proj.weight"], rank), None),
        "gate_up_proj.weight": (torch.cat([rows(s["gate_proj.weight"], rank),
                                           rows(s["up_proj.weight"], rank)]), None),
        "down_proj.weight": (cols(s["down_proj.weight"], rank), None),
        "norm": (s["norm"], None),
    }


def test_patches_reach_two_tensor_parallel_ranks_each_its_own_shard_bit_exact(monkeypatch):
    """Two worker processes at TP 2 (gloo): each rank's vLLM loaders narrow the patch's
    staging to their shard, and only the changed elements of that shard are written."""
    import multiprocessing

    from test_vllm_processes import ProcessClient

    here = os.path.dirname(os.path.abspath(__file__))
    ctx = multiprocessing.get_context("spawn")
    monkeypatch.setenv("PYTHONPATH", here + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    import _vllm_spawn

    conns, procs = [], []
    for rank in range(2):
        parent, child = ctx.Pipe()
        proc = ctx.Process(target=_vllm_spawn.run_tp_worker, args=(child, rank, 2, port),
                           daemon=True)
        proc.start()
        child.close()
        conns.append(parent)
        procs.append(proc)
    trainer = None
    try:
        for rank, conn in enumerate(conns):
            assert conn.poll(600), f"TP worker {rank} did not start"
            assert conn.recv() == ("ok", rank)
        client = ProcessClient(conns)
        source = CheckpointLike()
        load_general_plugins()
        trainer = WeightTransferTrainerFactory.trainer_init(
            WsyncTrainerInitInfo(rank=0, receivers=2, chunk_bytes=8192,
                                 options={"delta": "on"}),
            client=client, source=ModuleSource(source))
        gen = torch.Generator().manual_seed(5)
        for version in range(1, 4):
            if version > 1:
                step(source, version, gen)
            trainer.send_weights()
            assert client.call("completed_version") == [version, version]
            for rank, params in enumerate(client.call("params")):
                for name, (want, valid_rows) in tp_shards(source, rank).items():
                    have = params[name]
                    if valid_rows is not None:
                        have, want = have[:valid_rows], want[:valid_rows]
                    assert have.shape == want.shape, (rank, name)
                    assert torch.equal(bits(have), bits(want)), f"v{version} rank {rank} {name}"
    finally:
        if trainer is not None:
            trainer.shutdown()
        for conn in conns:
            try:
                conn.send(("stop", ()))
                conn.poll(30) and conn.recv()
            except (OSError, EOFError):
                pass
        for proc in procs:
            proc.join(30)
            if proc.is_alive():
                proc.kill()
