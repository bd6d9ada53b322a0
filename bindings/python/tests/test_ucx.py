"""The ucx kind through the Python binding: selected by its kind string like the others. The
trainer and the engine live in this one process (the sender's progress thread answers the
receiver's attach and serves its GETs); tests/ucx/scenarios.sh covers separate hosts."""

import pytest
import torch

import wsync
from wsync import Status, WsyncError


def _ucx_available():
    return any(k["kind"] == "ucx" and k["available"] for k in wsync.kinds())


pytestmark = pytest.mark.skipif(not _ucx_available(), reason="ucx kind not built or libucp.so.0 missing")

OPTIONS = dict(transports="tcp", net_devices="lo", timeout_ms=10000)


def test_ucx_versions_arrive_bit_exact_and_the_flush_sees_the_ack():
    with wsync.Strategy("ucx", receivers=1, **OPTIONS) as trainer, wsync.Strategy("ucx", **OPTIONS) as engine:
        init = trainer.create_init_info()
        with trainer.sender(init) as sender, engine.receiver(init, 0) as receiver:
            for step in (1, 2, 3):
                weights = {"w": torch.arange(1000, dtype=torch.float32) * step, "b": torch.full((7,), step)}
                request = sender.send_chunk(weights, last=True)
                with receiver.receive(request) as it:
                    got = {name: t.clone() for name, t in it}
                sender.flush(10.0)
                assert torch.equal(got["w"], weights["w"]) and torch.equal(got["b"], weights["b"])
                assert receiver.completed_version == step


def test_ucx_receiver_index_out_of_range_is_named():
    with wsync.Strategy("ucx", receivers=1, **OPTIONS) as trainer, wsync.Strategy("ucx", **OPTIONS) as engine:
        init = trainer.create_init_info()
        with trainer.sender(init):
            with pytest.raises(WsyncError) as info:
                engine.receiver(init, 5)
            assert info.value.status is Status.INVALID_ARGUMENT
            assert "receiver index 5" in info.value.message


def test_ucx_loader_failure_reaches_the_flush_as_data_naming_the_receiver():
    with wsync.Strategy("ucx", receivers=1, **OPTIONS) as trainer, wsync.Strategy("ucx", **OPTIONS) as engine:
        init = trainer.create_init_info()
        with trainer.sender(init) as sender, engine.receiver(init, 0) as receiver:
            request = sender.send_chunk({"w": torch.ones(8)}, last=True)
            it = receiver.receive(request)
            it.fail(Status.MISMATCH, "tensor 'w' has the wrong shape here")
            with pytest.raises(WsyncError) as info:
                sender.flush(10.0)
            assert info.value.status is Status.PEER
            assert "receiver 0 (" in info.value.message and "wrong shape" in info.value.message
            (failure,) = sender.failures
            assert failure.receiver == 0 and failure.version == 1 and failure.status is Status.MISMATCH
            assert receiver.completed_version == 0


def test_ucx_a_version_no_longer_kept_is_refused_naming_the_latest_and_the_latest_still_arrives():
    with wsync.Strategy("ucx", receivers=1, keep_versions=1, **OPTIONS) as trainer, \
            wsync.Strategy("ucx", **OPTIONS) as engine:
        init = trainer.create_init_info()
        with trainer.sender(init) as sender, engine.receiver(init, 0) as receiver:
            old = sender.send_chunk({"w": torch.ones(8)}, last=True)
            new = sender.send_chunk({"w": torch.full((8,), 2.0)}, last=True)
            with pytest.raises(WsyncError) as info:
                receiver.receive(old)
            assert info.value.status is Status.ABANDONED
            assert "no longer kept" in info.value.message and "the latest is 2" in info.value.message
            with receiver.receive(new) as it:
                got = {name: t.clone() for name, t in it}
            assert torch.equal(got["w"], torch.full((8,), 2.0)) and receiver.completed_version == 2
            # The engine lagged past keep_versions: the trainer retired version 1 itself and is
            # not told of it as a failure (the engine caught up with version 2).
            sender.flush(10.0)


def test_ucx_select_gives_each_engine_its_tp_shard_as_parts_bit_exact():
    """Partial pulls ("select"): two engines take rank 0 and rank 1 of 2 along dimension 0 of
    q and k; rank 1 also takes every other tensor whole ("select_rest": "whole"). Each yields
    only its entries, a shard as a part (offset, bytes within the whole tensor), bit-exact; the
    trainer's 4 KiB block checksums cover each 4 KiB shard, which is verified."""
    shard = lambda r: [{"tensors": ["q", "k"], "rank": r, "ranks": 2, "dtype": "float32", "shape": [64, 32]}]
    with wsync.Strategy("ucx", receivers=2, block_checksum_bytes=4096, **OPTIONS) as trainer, \
            wsync.Strategy("ucx", select=shard(0), **OPTIONS) as e0, \
            wsync.Strategy("ucx", select=shard(1), select_rest="whole", **OPTIONS) as e1:
        init = trainer.create_init_info()
        with trainer.sender(init) as sender, e0.receiver(init, 0) as r0, e1.receiver(init, 1) as r1:
            for step in (1, 2):
                weights = {"q": torch.arange(2048, dtype=torch.float32).reshape(64, 32) * step,
                           "k": -torch.arange(2048, dtype=torch.float32).reshape(64, 32) * step,
                           "norm": torch.full((32,), float(step))}
                request = sender.send_chunk(weights, last=True)
                for rank, receiver in ((0, r0), (1, r1)):
                    with receiver.receive(request) as it:
                        got = {pv.name: (pv.offset, pv.nbytes, pv.view.clone()) for pv in it.iter_parts()}
                    assert sorted(got) == (["k", "q"] if rank == 0 else ["k", "norm", "q"])
                    for name in ("q", "k"):
                        offset, nbytes, flat = got[name]
                        assert (offset, nbytes) == (rank * 4096, 4096)
                        assert torch.equal(flat, weights[name][32 * rank:32 * (rank + 1)].reshape(-1))
                    if rank == 1:
                        assert got["norm"][:2] == (0, 128) and torch.equal(got["norm"][2], weights["norm"])
                    assert receiver.completed_version == step
                sender.flush(10.0)


def test_ucx_select_naming_a_tensor_the_version_lacks_fails_by_name_and_a_bad_entry_is_refused():
    with wsync.Strategy("ucx", receivers=1, **OPTIONS) as trainer, \
            wsync.Strategy("ucx", select=[{"tensor": "w"}, {"tensor": "v"}], **OPTIONS) as engine:
        init = trainer.create_init_info()
        with trainer.sender(init) as sender, engine.receiver(init, 0) as receiver:
            request = sender.send_chunk({"w": torch.ones(8)}, last=True)
            with pytest.raises(WsyncError) as info:
                receiver.receive(request)
            assert info.value.status is Status.MISMATCH
            assert "tensor 'v' (select[1]) is not in version 1" in info.value.message
            assert receiver.completed_version == 0
    with pytest.raises(WsyncError) as info:
        wsync.Strategy("ucx", select=[{"tensor": "w", "offset": 0, "bytes": 0}], **OPTIONS)
    assert info.value.status is Status.INVALID_ARGUMENT and "select[0]" in info.value.message


def test_ucx_a_model_placed_in_the_arena_arrives_bit_exact_each_step():
    """The ucx sender's arena through the binding: place_in_arena moves the model in, and
    send_model (which flushes before returning, as arena tensors are borrowed until then)
    brings every step's weights to the engine bit for bit."""
    import queue
    import threading

    from wsync.trainer import place_in_arena, send_model

    model = torch.nn.Sequential(torch.nn.Linear(64, 300), torch.nn.LayerNorm(300), torch.nn.Linear(300, 7))
    with wsync.Strategy("ucx", receivers=1, arena_bytes=1 << 20, **OPTIONS) as trainer, \
            wsync.Strategy("ucx", **OPTIONS) as engine:
        init = trainer.create_init_info()
        with trainer.sender(init) as sender, engine.receiver(init, 0) as receiver:
            assert sender.arena is not None and len(sender.arena) == 1 << 20
            place_in_arena(sender, model)
            for step in (1, 2, 3):
                with torch.no_grad():  # the trainer's step, after the last flush
                    for p in model.parameters():
                        p.mul_(0.5).add_(step)
                got, requests = {}, queue.Queue()

                def load():
                    for request in iter(requests.get, None):
                        with receiver.receive(request) as it:
                            got.update({name: t.clone() for name, t in it})

                loader = threading.Thread(target=load)
                loader.start()
                send_model(sender, model, on_request=requests.put, flush_timeout_s=10.0)
                requests.put(None)
                loader.join(10.0)
                assert receiver.completed_version == step
                want = model.state_dict()
                assert set(got) == set(want)
                for name, t in want.items():
                    assert torch.equal(got[name], t), name


def test_ucx_a_module_with_buffers_between_its_parameters_is_sent_in_place():
    """place_in_arena lays a module out in the order send_model sends it (its state dict:
    BatchNorm's running statistics sit between the Linear weights), so each chunk lies in the
    arena as it would be packed and ucx serves it from there: a write to a parameter after its
    chunk was sent, before the engine reads it, is what the engine loads (with a staging copy it
    would load the old values). Over the data stream the chunk is hashed as it is first sent
    (its checksums follow the bytes), so the version verifies and the flush is OK; a write after
    an engine read it fails later readers (test_ucx_arena in the C suite)."""
    import queue
    import threading

    from wsync.trainer import place_in_arena, send_model

    model = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.BatchNorm1d(64), torch.nn.Linear(64, 16))
    with wsync.Strategy("ucx", receivers=1, arena_bytes=1 << 20, **OPTIONS) as trainer, \
            wsync.Strategy("ucx", **OPTIONS) as engine:
        init = trainer.create_init_info()
        with trainer.sender(init) as sender, engine.receiver(init, 0) as receiver:
            used = place_in_arena(sender, model)
            assert place_in_arena(sender, model) == 0 and sender.arena_used == used  # nothing moves twice
            requests, outcome, got = queue.Queue(), [], {}

            def load():
                for request in iter(requests.get, None):
                    try:
                        with receiver.receive(request) as it:
                            for name, view in it:
                                got[name] = view.clone()
                        outcome.append(None)
                    except WsyncError as e:
                        outcome.append(e.status)

            def write_then_forward(request):
                with torch.no_grad():
                    model[0].weight.add_(1.0)  # too early: the chunk is the engine's to read
                requests.put(request)

            loader = threading.Thread(target=load)
            loader.start()
            written = None
            try:
                send_model(sender, model, on_request=write_then_forward, flush_timeout_s=10.0)
                written = model[0].weight.detach().clone()
            finally:
                requests.put(None)
                loader.join(10.0)
            assert outcome == [None]
            assert torch.equal(got["0.weight"], written)  # read where it lies, as written
            assert torch.equal(got["2.weight"], model[2].weight.detach())


def test_ucx_landing_reads_a_chunk_straight_into_the_destinations_bit_exact():
    """Receiver.land: a chunk of more than 4 MiB lands in the engine's tensors as it is pulled;
    a landed tensor's view is the engine's own tensor, apply verifies and copies nothing, and a
    tied weight (two destinations) still gets both copies. land(None) stops it."""
    big = torch.zeros((6 << 20) // 4 + 16)
    small, tied_a, tied_b = torch.zeros(75), torch.zeros(1000), torch.zeros(1000)
    with wsync.Strategy("ucx", receivers=1, **OPTIONS) as trainer, wsync.Strategy("ucx", **OPTIONS) as engine:
        init = trainer.create_init_info()
        with trainer.sender(init) as sender, engine.receiver(init, 0) as receiver:
            table = receiver.dest_table([wsync.Dest("big", big), wsync.Dest("small", small),
                                         wsync.Dest("tied", tied_a), wsync.Dest("tied", tied_b)])
            receiver.land(table)
            for step in (1, 2):
                weights = {"big": torch.randn(big.numel()), "small": torch.randn(75),
                           "tied": torch.randn(1000)}
                request = sender.send_chunk(weights, last=True)
                with receiver.receive(request) as it:
                    name, view = next(iter(it))
                    assert name == "big" and view.data_ptr() == big.data_ptr()  # landed
                    it.apply(table, partial=True)
                sender.flush(10.0)
                assert receiver.completed_version == step
                for name, dst in (("big", big), ("small", small), ("tied", tied_a), ("tied", tied_b)):
                    assert torch.equal(dst, weights[name]), name
            receiver.land(None)
            weights = {"big": torch.randn(big.numel()), "small": torch.randn(75), "tied": torch.randn(1000)}
            with receiver.receive(sender.send_chunk(weights, last=True)) as it:
                name, view = next(iter(it))
                assert view.data_ptr() != big.data_ptr()  # in the receive buffer
                big.copy_(view)  # taken as a view: apply leaves it
                it.apply(table, partial=True)
            sender.flush(10.0)
            assert torch.equal(big, weights["big"])
            with pytest.raises(WsyncError) as info:
                with wsync.Strategy("shm", receivers=1) as other:
                    with other.receiver(other.create_init_info(), 0) as shm_receiver:
                        shm_receiver.land(shm_receiver.dest_table([wsync.Dest("small", small)]))
            assert info.value.status is Status.UNSUPPORTED
            assert info.value.message.startswith("Receiver.land (shm)")  # in Python's terms
