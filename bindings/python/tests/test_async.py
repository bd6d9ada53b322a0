"""Awaitable send, commit and flush for asyncio trainers: the library works on a worker thread
with the GIL released, so the event loop keeps running during a large send and a long
flush."""

import asyncio
import threading
import time

import pytest
import torch

import wsync
from wsync.engine import ModuleLoader
from wsync.trainer import send_model_async

BIG = 96 << 20  # bytes in the large chunk
HOLD_S = 0.25  # how long an engine holds the only bucket before each timed send gets it
TICK_S = 0.001


async def ticks_during(work):
    """Runs ``work`` (a coroutine) beside a task that wakes every millisecond; returns
    (work's result, ticks counted while it ran, work's duration in seconds)."""
    ticks = 0
    done = False

    async def ticker():
        nonlocal ticks
        while not done:
            await asyncio.sleep(TICK_S)
            ticks += 1

    task = asyncio.create_task(ticker())
    await asyncio.sleep(0)  # let the ticker start
    start_ticks, start = ticks, time.perf_counter()
    result = await work
    elapsed = time.perf_counter() - start
    counted = ticks - start_ticks
    done = True
    await task
    return result, counted, elapsed


def test_the_event_loop_keeps_running_during_a_large_send(make_sync):
    # One bucket, which an engine thread holds (its iteration open) for HOLD_S before it lets
    # go: each send below waits that long for the bucket, then packs BIG bytes. So a send lasts
    # at least HOLD_S on any host, however fast it copies (a modern torch on a fast host packs
    # 96 MiB in under 10 ms, too short to count ticks in).
    s = make_sync(buckets=1, bucket_bytes=BIG)
    big = {"w": torch.ones(BIG // 4)}
    engines = []

    def engine_holds(request):
        it = s.receiver.receive(request)

        def run():
            time.sleep(HOLD_S)
            with it:
                for _ in it:
                    pass

        engines.append(threading.Thread(target=run))
        engines[-1].start()

    async def blocking_send():
        return s.sender.send_chunk(big, last=True)  # no await inside: the loop is blocked

    async def scenario():
        engine_holds(s.sender.send_chunk(big, last=True))
        request, free_ticks, elapsed = await ticks_during(s.sender.send_chunk_async(big, last=True))
        engine_holds(request)
        # The control: the plain call starves the loop for the whole send, which shows the
        # tick count tells a blocked loop from a free one.
        blocked = await ticks_during(blocking_send())
        engine_holds(blocked[0])
        return free_ticks, elapsed, blocked

    free_ticks, elapsed, (request, blocked_ticks, blocked_elapsed) = asyncio.run(scenario())
    for e in engines:
        e.join(10)
    assert s.receiver.completed_version == 3
    # The loop woke during the awaited send at least once per 50 ms of it (1 ms ticks; lenient
    # for a loaded 2-core host, where the loop's thread waits for a core)...
    assert elapsed >= 0.9 * HOLD_S, f"the send took {elapsed:.4f} s: it did not wait for the bucket"
    assert free_ticks >= max(3, int(elapsed / 0.05)), (free_ticks, elapsed)
    # ...and not at all during the same send called plainly.
    assert blocked_elapsed >= 0.9 * HOLD_S, blocked_elapsed
    assert blocked_ticks == 0, (blocked_ticks, blocked_elapsed)
    assert isinstance(request, bytes)


def test_the_event_loop_keeps_running_while_a_flush_waits_for_a_receiver(sync):
    request = sync.sender.send_chunk({"w": torch.arange(8.0)}, last=True)

    def late_engine():
        time.sleep(0.3)
        with sync.receiver.receive(request) as it:
            for _ in it:
                pass

    engine = threading.Thread(target=late_engine)
    engine.start()
    _, ticks, elapsed = asyncio.run(ticks_during(sync.sender.flush_async(10)))
    engine.join()
    assert elapsed >= 0.25
    assert ticks >= 25, (ticks, elapsed)
    assert sync.receiver.completed_version == 1


def test_an_awaited_send_fails_with_the_librarys_error_naming_the_receivers(make_sync):
    s = make_sync(buckets=1, timeout_ms=200)

    async def main():
        await s.sender.send_chunk_async({"a": torch.ones(4)}, last=True)
        # The only bucket is still held by the receiver, which never reads it.
        await s.sender.send_chunk_async({"a": torch.ones(4)}, last=True)

    with pytest.raises(wsync.WsyncError) as info:
        asyncio.run(main())
    assert info.value.status is wsync.Status.TIMEOUT
    assert "receivers [0] did not acknowledge" in str(info.value)


def test_send_model_async_syncs_a_module_and_awaits_a_coroutine_forwarder(make_sync):
    s = make_sync(buckets=2)
    trainer = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    engine = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    loader = ModuleLoader(engine)
    forwarded = []

    async def forward(request):  # e.g. an HTTP call to the engines
        forwarded.append(request)
        await asyncio.to_thread(loader.load, s.receiver, request)

    async def main():
        return await send_model_async(s.sender, trainer, chunk_bytes=64 * 64 * 4,
                                      on_request=forward, flush_timeout_s=10)

    requests = asyncio.run(main())
    assert requests == forwarded and len(requests) > 1
    for name, tensor in trainer.state_dict().items():
        assert torch.equal(engine.state_dict()[name], tensor), name
    assert s.receiver.completed_version == 1


def test_send_model_async_abandons_the_version_when_the_forwarder_fails(make_sync):
    s = make_sync(buckets=4)
    trainer = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8))
    loader = ModuleLoader(torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Linear(64, 8)))
    calls = 0

    async def forward(request):
        nonlocal calls
        calls += 1
        loader.load(s.receiver, request)
        if calls == 1:
            raise ConnectionError("the engine went away")

    with pytest.raises(ConnectionError):
        asyncio.run(send_model_async(s.sender, trainer, chunk_bytes=64 * 64 * 4, on_request=forward))
    state = s.receiver.poll()
    assert (state.completed_version, state.failed_version) == (0, 1)
    assert state.failed_status is wsync.Status.ABANDONED


def test_send_model_async_keeps_no_earlier_chunk_alive_while_it_gathers_the_next(make_sync):
    # Noticed in the last stop: the boxes that hand chunks to and from the worker threads (a
    # finished work item, or its future's result, may outlive the call for a moment) had no
    # test of their own. Each gathered tensor is watched by a weak reference; when a chunk is
    # gathered, every tensor gathered for an earlier chunk must be gone, so a lazy source holds
    # about one chunk of gathered tensors at a time, as with send_model.
    import gc
    import weakref

    from wsync.trainer import LazySource

    s = make_sync(buckets=2)
    names = [f"layers.{i}.weight" for i in range(6)]
    metas = [(n, torch.float32, (256, 256)) for n in names]  # 256 KiB each
    alive = {}
    still_alive_at_gather = []

    def gather(asked):
        gc.collect()  # only references, not cycles waiting for the collector, may keep them
        still_alive_at_gather.append(sorted(n for n, ref in alive.items() if ref() is not None))
        out = {n: torch.full((256, 256), float(names.index(n))) for n in asked}
        for n, t in out.items():
            alive[n] = weakref.ref(t)
        return out

    loader_model = {n: torch.zeros(256, 256) for n in names}
    loader = ModuleLoader(loader_model)

    async def main():
        return await send_model_async(s.sender, LazySource(metas, gather),
                                      chunk_bytes=256 * 256 * 4,
                                      on_request=lambda r: loader.load(s.receiver, r),
                                      flush_timeout_s=10)

    requests = asyncio.run(main())
    assert len(requests) == len(names)  # one tensor per chunk
    assert still_alive_at_gather == [[]] * len(names), still_alive_at_gather
    for i, n in enumerate(names):
        assert torch.equal(loader_model[n], torch.full((256, 256), float(i))), n
    assert s.receiver.completed_version == 1
