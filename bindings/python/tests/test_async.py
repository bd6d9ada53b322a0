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

BIG = 256 << 20  # bytes in the large chunk: long enough to pack that the loop must tick meanwhile
# (96 MiB packed in 9 ms on an idle 2-core host with torch 2.14, under the 10 ms the test needs)
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
    s = make_sync(buckets=1, bucket_bytes=BIG)
    big = {"w": torch.ones(BIG // 4)}

    async def blocking_send():
        return s.sender.send_chunk(big, last=True)  # no await inside: the loop is blocked

    async def scenario():
        request, free_ticks, elapsed = await ticks_during(s.sender.send_chunk_async(big, last=True))
        with s.receiver.receive(request) as it:
            for _ in it:
                pass
        # The control: the plain call starves the loop for the whole send, which shows the
        # tick count tells a blocked loop from a free one.
        blocked = await ticks_during(blocking_send())
        return free_ticks, elapsed, blocked

    free_ticks, elapsed, (request, blocked_ticks, blocked_elapsed) = asyncio.run(scenario())
    # The loop woke during the awaited send at least once per 50 ms of it (1 ms ticks; lenient
    # for a loaded 2-core host, where the loop's thread waits for a core)...
    assert elapsed > 0.01, f"the send took {elapsed:.4f} s: too short to tell"
    assert free_ticks >= max(3, int(elapsed / 0.05)), (free_ticks, elapsed)
    # ...and not at all during the same send called plainly.
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
