"""End to end across processes: a trainer trains a small transformer and syncs it over shm
after every optimizer step to two engine processes; this test is the controller, holding only
bytes (the init blob, the request blobs, weight snapshots) and forwarding them through queues.
The engines compare every tensor of their model bit for bit with the trainer's snapshot."""

import multiprocessing
import os
import queue
import time

from wsync import Status
import _mp_workers
from conftest import shm_segment

CTX = multiprocessing.get_context("spawn")
DEADLINE_S = 90  # the whole scenario, however it goes
POLL_S = 0.25  # how often a waiting controller checks that its processes are still alive


class Controller:
    """Starts the trainer and the engines, forwards blobs, and always cleans up: every process
    is joined with a timeout (killed if it overstays) and the shm segment's name is removed
    if a crashed trainer left it behind."""

    def __init__(self, cfg):
        self.cfg = cfg
        self.deadline = time.monotonic() + DEADLINE_S
        self.segment = None
        self.requests = []  # every request forwarded, in order
        self.stopping = False
        self.from_trainer, self.to_trainer = CTX.Queue(), CTX.Queue()
        self.from_engines = CTX.Queue()
        self.to_engines = [CTX.Queue() for _ in range(cfg["receivers"])]
        self.procs = [CTX.Process(target=_mp_workers.trainer_main, name="trainer",
                                  args=(self.from_trainer, self.to_trainer, cfg), daemon=True)]
        self.procs += [CTX.Process(target=_mp_workers.engine_main, name=f"engine {i}",
                                   args=(i, q, self.from_engines, cfg), daemon=True)
                       for i, q in enumerate(self.to_engines)]

    def get(self, q):
        """The next message on q; fails at once if a process exited, or at the deadline."""
        while True:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise AssertionError("the scenario ran past its deadline")
            try:
                msg = q.get(timeout=min(left, POLL_S))
                break
            except queue.Empty:
                dead = [f"{p.name} (exit code {p.exitcode})" for p in self.procs
                        if not p.is_alive()]
                if dead and q.empty():
                    raise AssertionError(f"processes exited early: {dead}") from None
        if msg[0] == "error":
            raise AssertionError(f"{msg[1]} failed:\n{msg[2]}")
        return msg

    def __enter__(self):
        for p in self.procs:
            p.start()
        return self

    def __exit__(self, *exc):
        for q in [self.to_trainer, *self.to_engines]:
            q.put(("stop",))
        for p in self.procs:
            p.join(timeout=max(1.0, min(15.0, self.deadline - time.monotonic())))
        for p in self.procs:
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
        for q in [self.from_trainer, self.to_trainer, self.from_engines, *self.to_engines]:
            q.close()
            q.cancel_join_thread()
        if self.segment and os.path.exists(self.segment):
            os.unlink(self.segment)

    def run(self):
        """Runs every step. Returns (initial engine snapshots, per step: (trainer's synced
        message, {engine index: report}))."""
        _, init = self.get(self.from_trainer)
        self.segment = shm_segment(init)
        for q in self.to_engines:
            q.put(("init", init))
        initial = {}
        for _ in self.to_engines:
            _, index, snap = self.get(self.from_engines)
            initial[index] = snap
        assert set(initial) == set(range(len(self.to_engines)))
        self.to_trainer.put(("go",))
        results = []
        for step in range(1, self.cfg["steps"] + 1):
            while True:
                msg = self.get(self.from_trainer)
                if msg[0] == "request":
                    assert msg[1] == step
                    self.requests.append(msg[2])
                    for q in self.to_engines:
                        q.put(msg)
                    continue
                assert msg[0] == "synced" and msg[1] == step, msg[:2]
                break
            trainer_snapshot = msg[4]
            for q in self.to_engines:
                q.put(("check", step, trainer_snapshot))
            reports = {}
            for _ in self.to_engines:
                report = self.get(self.from_engines)
                assert report[0] == "report" and report[2] == step
                reports[report[1]] = report
            results.append((msg, reports))
        return initial, results


BASE = {"receivers": 2, "buckets": 2, "bucket_bytes": 32 << 10, "chunk_bytes": 16 << 10,
        "flush_timeout_s": 20.0, "modes": {0: "loader", 1: "load_weights"}}
PARAMETERS = 1 + 2 * 10 + 1 + 1  # embed; 2 layers of 2 norms, 4 attn + q bias, 3 mlp; norm; head
BUFFERS = 2  # rope_inv_freq, trained_steps


def test_trainer_syncs_every_step_to_two_engines_bit_for_bit():
    steps = 3
    cfg = dict(BASE, steps=steps)
    with Controller(cfg) as controller:
        initial, results = controller.run()
    assert len(results) == steps
    assert not os.path.exists(controller.segment)  # no name left in /dev/shm
    previous = None
    for step, (synced, reports) in enumerate(results, 1):
        _, _, next_version, chunks, trainer_snapshot, flush_error = synced
        assert flush_error is None
        assert next_version == step + 1
        assert chunks > cfg["buckets"]  # more chunks than buckets: packing waited on loading
        assert len(trainer_snapshot) == PARAMETERS + BUFFERS
        # Training changed every parameter, so a stale engine cannot pass for a synced one.
        if previous is not None:
            changed = [n for n in trainer_snapshot if trainer_snapshot[n] != previous[n]]
            assert len(changed) == PARAMETERS + 1, f"step {step}: only {changed} changed"
        previous = trainer_snapshot
        assert set(reports) == {0, 1}
        for index, (_, _, _, completed, loaded, problems, errors) in reports.items():
            assert errors == [], f"engine {index}: {errors}"
            assert loaded == chunks, f"engine {index} loaded {loaded} of {chunks} chunks"
            assert completed == step, f"engine {index}"
            assert problems == [], f"engine {index} differs from the trainer at step {step}"
    # The engines started from other weights: equality above is the sync's doing.
    first = results[0][0][4]
    for index, snap in initial.items():
        same = [n for n in first if n != "rope_inv_freq" and snap[n] == first[n]]
        assert same == [], f"engine {index} started with the trainer's {same}"


def test_engine_with_a_different_plan_fails_the_trainers_flush():
    cfg = dict(BASE, steps=1, hidden={1: 48}, modes={0: "loader", 1: "loader"})
    with Controller(cfg) as controller:
        _, results = controller.run()
    (_, _, _, _, _, flush_error), reports = results[0]
    assert flush_error is not None
    status, message, failures = flush_error
    assert status == Status.PEER and "receiver 1" in message and "failed chunk" in message
    # The engine's own status and message reach the trainer as data.
    [(receiver, engine_status, engine_message)] = failures
    assert (receiver, engine_status) == (1, Status.MISMATCH)
    assert "layers.0.mlp.gate_proj.weight': shape differs" in engine_message
    (_, _, _, completed0, _, problems0, errors0) = reports[0]
    if completed0 == 1:  # the failure surfaced at the flush: engine 0 has the version
        assert errors0 == [] and problems0 == []
    else:  # it surfaced at a send waiting for a bucket: the trainer abandoned version 1,
        # so engine 0 never got its last chunk, or got chunks refused as ABANDONED
        assert completed0 == 0
        assert all(status == Status.ABANDONED for _, status, _ in errors0), errors0
    (_, _, _, completed1, _, problems1, errors1) = reports[1]
    assert completed1 == 0
    assert errors1, "engine 1 should have refused a chunk"
    step, status1, message1 = errors1[0]
    assert status1 == Status.MISMATCH
    assert ("layers.0.mlp.gate_proj.weight': shape differs: request has (64, 32), "
            "model has (48, 32)") in message1
    assert any(p.startswith("layers.0.mlp.gate_proj.weight: torch.float32(48, 32)")
               for p in problems1)


def test_parameters_in_the_arena_cross_in_place_every_step_bit_for_bit():
    """The trainer's parameters and buffers live in the sender's arena (place_in_arena, tied
    embedding and head moved once), the optimizer writes them between syncs; each sync sends
    every tensor in place (the requests list them all under "arena", no bucket bytes), and both
    engines match the trainer bit for bit after every step, with checksums on (the default)."""
    import wsync
    steps = 3
    cfg = dict(BASE, steps=steps, arena_bytes=1 << 20, tie=True,
               modes={0: "loader", 1: "loader"})
    with Controller(cfg) as controller:
        initial, results = controller.run()
    assert len(results) == steps
    assert not os.path.exists(controller.segment)
    in_place = total = 0
    for request in controller.requests:
        body = wsync.describe(request)["body"]
        total += len(body["tensors"]["names"])
        in_place += len(body["transport"].get("arena", []))
    # Every wire tensor crossed in place: the tied pair is one of them.
    assert total == steps * (PARAMETERS - 1 + BUFFERS), total
    assert in_place == total
    for step, (synced, reports) in enumerate(results, 1):
        _, _, next_version, chunks, trainer_snapshot, flush_error = synced
        assert flush_error is None
        assert next_version == step + 1
        assert trainer_snapshot["lm_head.weight"] == trainer_snapshot["embed_tokens.weight"]
        for index, (_, _, _, completed, loaded, problems, errors) in reports.items():
            assert errors == [], f"engine {index}: {errors}"
            assert completed == step, f"engine {index}"
            assert problems == [], f"engine {index} differs from the trainer at step {step}"
