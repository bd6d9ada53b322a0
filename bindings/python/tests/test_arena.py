"""The sender's arena (shm "arena_bytes"): place_in_arena moves a module's tensors into it, the
library sends them in place, and the arena's memory outlives the sender while tensors use it."""

import ctypes

import pytest
import torch
from torch import nn

import wsync
from wsync import Status
from wsync.engine import ModuleLoader
from wsync.trainer import ARENA_ALIGN, place_in_arena, send_model

from _models import TinyLM


def _pair(arena_bytes, **options):
    strategy = wsync.Strategy("shm", arena_bytes=arena_bytes, **options)
    init = strategy.create_init_info()
    return strategy, init, strategy.sender(init)


def _arena_range(sender):
    arena = sender.arena
    base = ctypes.addressof(arena)
    return base, base + ctypes.sizeof(arena)


def test_a_sender_without_arena_has_none_and_place_in_arena_says_what_to_set():
    strategy = wsync.Strategy("shm")
    sender = strategy.sender(strategy.create_init_info())
    assert sender.arena is None
    with pytest.raises(wsync.WsyncError) as exc:
        place_in_arena(sender, nn.Linear(4, 4))
    assert exc.value.status == Status.INVALID_ARGUMENT and "arena_bytes" in exc.value.message
    sender.close()
    strategy.close()


def test_parameters_and_buffers_move_in_with_their_values_identity_and_ties():
    model = TinyLM(seed=3)
    model.lm_head.weight = model.embed_tokens.weight  # tied: one Parameter under two names
    before = {n: t.clone() for n, t in model.state_dict().items()}
    params = {n: p for n, p in model.named_parameters()}
    strategy, _, sender = _pair(1 << 20)
    used = place_in_arena(sender, model)
    lo, hi = _arena_range(sender)
    unique = list(model.parameters()) + list(model.buffers())
    assert used == sender.arena_used
    assert used >= sum(t.numel() * t.element_size() for t in unique)
    for t in unique:  # every tensor now lives in the arena, on the alignment rule
        assert lo <= t.data_ptr() and t.data_ptr() + t.numel() * t.element_size() <= hi
        assert (t.data_ptr() - lo) % ARENA_ALIGN == 0
    assert model.lm_head.weight is model.embed_tokens.weight
    for n, p in model.named_parameters():
        assert p is params[n]  # same Parameter objects: optimizers and hooks still hold them
    for n, t in model.state_dict().items():
        assert torch.equal(t, before[n]), n
    # A second call appends after the first.
    extra = torch.arange(10, dtype=torch.float32)
    assert place_in_arena(sender, [extra]) >= 40
    assert extra.data_ptr() >= lo + used
    sender.close()
    strategy.close()


def test_tensors_that_do_not_fit_are_refused_before_anything_moves():
    model = nn.Linear(64, 64)  # 16.6 KB of parameters
    pointers = [p.data_ptr() for p in model.parameters()]
    strategy, _, sender = _pair(4096)
    with pytest.raises(wsync.WsyncError) as exc:
        place_in_arena(sender, model)
    assert exc.value.status == Status.INVALID_ARGUMENT
    assert "arena_bytes >=" in exc.value.message and "4096 bytes" in exc.value.message
    assert [p.data_ptr() for p in model.parameters()] == pointers
    assert sender.arena_used == 0
    sender.close()
    strategy.close()


def test_a_sync_sends_arena_tensors_in_place_and_loads_bit_for_bit():
    trainer, engine = TinyLM(seed=0), TinyLM(seed=7)
    strategy, init, sender = _pair(1 << 20, bucket_bytes=64 << 10, buckets=2)
    place_in_arena(sender, trainer)
    stray = torch.ones(8)  # not in the arena: packed into a bucket as before
    receiver = wsync.Strategy.for_init_info(init).receiver(init, 0)
    loader = ModuleLoader(engine, ignore_unknown=True)
    requests = []
    send_model(sender, {**trainer.state_dict(), "stray": stray}, chunk_bytes=32 << 10,
               on_request=lambda r: (requests.append(r), loader.load(receiver, r)),
               flush_timeout_s=10)
    in_place = sum(len(wsync.describe(r)["body"]["transport"].get("arena", [])) for r in requests)
    assert in_place == len(trainer.state_dict())  # all but the stray tensor
    for n, t in trainer.state_dict().items():
        assert torch.equal(engine.state_dict()[n], t), n
    receiver.close()
    sender.close()
    strategy.close()


def test_arena_tensors_outlive_the_closed_sender_and_strategy():
    model = nn.Linear(32, 32)
    strategy, _, sender = _pair(1 << 16)
    place_in_arena(sender, model)
    expected = model.weight.detach().clone()
    sender.close()
    strategy.close()
    del sender, strategy
    # The memory stays mapped while the tensors use it: reading and writing are fine.
    assert torch.equal(model.weight.detach(), expected)
    with torch.no_grad():
        model.weight.add_(1)
    assert torch.equal(model.weight.detach(), expected + 1)


def test_send_model_over_arena_tensors_returns_only_once_every_engine_has_acknowledged():
    # Engines read placed tensors in the trainer's memory: were send_model to return before
    # they acknowledged, the trainer's next optimizer step would write under their copy
    # (wrong weights, silent with checksums off). It flushes without being asked.
    import queue
    import threading
    import time

    trainer, engine = TinyLM(seed=0), TinyLM(seed=7)
    strategy, init, sender = _pair(1 << 20, bucket_bytes=64 << 10, buckets=4, checksum=False)
    place_in_arena(sender, trainer)
    receiver = wsync.Strategy.for_init_info(init).receiver(init, 0)
    loader = ModuleLoader(engine)
    inbox = queue.Queue()
    loaded = []

    def slow_engine():
        while (request := inbox.get()) is not None:
            time.sleep(0.2)  # an engine busy serving: it takes a while to read each chunk
            loader.load(receiver, request)
            loaded.append(time.monotonic())

    thread = threading.Thread(target=slow_engine)
    thread.start()
    try:
        requests = send_model(sender, trainer, chunk_bytes=32 << 10, on_request=inbox.put)
        returned = time.monotonic()
        assert len(requests) >= 2
        # The engine notes the time just after its load() returned, which may be a moment after
        # the acknowledgement that let send_model return: allow that moment, not a chunk's
        # 0.2 s (a send_model that did not wait would return about 0.2 s early per chunk).
        for _ in range(200):
            if len(loaded) == len(requests):
                break
            time.sleep(0.005)
        assert len(loaded) == len(requests) and loaded[-1] <= returned + 0.1
        sender.flush(0)  # nothing owed: a poll succeeds
        for n, t in trainer.state_dict().items():
            assert torch.equal(engine.state_dict()[n], t), n
    finally:
        inbox.put(None)
        thread.join()
    receiver.close()
    sender.close()
    strategy.close()


def test_send_model_over_arena_tensors_raises_when_an_engine_does_not_acknowledge():
    trainer = TinyLM(seed=0)
    strategy, init, sender = _pair(1 << 20, bucket_bytes=64 << 10, buckets=8)
    place_in_arena(sender, trainer)
    receiver = wsync.Strategy.for_init_info(init).receiver(init, 0)  # attached, never reads
    with pytest.raises(wsync.WsyncError) as exc:
        send_model(sender, trainer, chunk_bytes=32 << 10, on_request=lambda r: None,
                   flush_timeout_s=0.3)  # forwarded, but the engine never reads
    assert exc.value.status == Status.TIMEOUT and "receiver 0" in exc.value.message
    receiver.close()
    sender.close()
    strategy.close()


def test_send_model_over_arena_tensors_without_on_request_is_refused_before_sending():
    # Its requests would come back only after a flush no engine could answer (review: every
    # call timed out and committed a version nobody was told of).
    trainer = TinyLM(seed=0)
    strategy, init, sender = _pair(1 << 20, bucket_bytes=64 << 10, buckets=8)
    place_in_arena(sender, trainer)
    with pytest.raises(wsync.WsyncError) as exc:
        send_model(sender, trainer, chunk_bytes=32 << 10)
    assert exc.value.status == Status.INVALID_ARGUMENT and "pass on_request" in exc.value.message
    assert sender.version == 1  # nothing was sent
    sender.close()
    strategy.close()
