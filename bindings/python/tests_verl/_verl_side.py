"""One side of a verl weight update in its own process, driven over stdin/stdout with JSON lines
(no pickle): ``python _verl_side.py trainer|rollout <rank> <bucket_mb> <engine_kwargs json>``.

- trainer: the actor worker's part of verl 0.9.1's ``ActorRolloutRefWorker`` as
  ``verl/workers/engine_workers.py`` does it: the checkpoint engine made from verl's
  ``CheckpointEngineConfig`` through ``import_external_libs(custom_backend_module)`` and
  ``CheckpointEngineRegistry.new(backend, is_master=rank == 0, bucket_size=MB << 20,
  **engine_kwargs)``; ``update`` awaits ``checkpoint_engine.send_weights(<generator>,
  global_steps=...)`` with the generator of :func:`_verl_model.weights`.
- rollout: verl's own ``CheckpointEngineWorker`` (built from a ``RolloutConfig`` whose
  ``checkpoint_engine`` selects wsync), with a CPU server adapter (a ``BaseRollout``, the
  inference engine's part) that copies what verl hands it into a dict; ``prepare``, ``init``
  and ``finalize`` go through the worker's ``execute_checkpoint_engine``, ``update`` is the
  worker's ``update_weights(global_steps=...)``, then checks every tensor bit for bit.

Commands (one JSON object a line): ``{"op": "prepare"}``, ``{"op": "init", "kwargs": {...}}``,
``{"op": "update", "seed": n, "global_steps": n}`` (a trainer given ``fail_after`` has its
generator raise after that many tensors; a rollout given ``raise_after`` has its server adapter
raise after that many, and one given ``stall_after`` replies ``{"stalled": true}`` after that
many and then waits, to be killed), ``{"op": "finalize"}``,
``{"op": "rebuild", "engine_kwargs": {...}}`` (the old engine shut down, a new one built as at
start), ``{"op": "exit"}``. Replies: ``{"ok": true, ...}`` or ``{"ok": false, "type", "status",
"message", "elapsed"}``.
"""

import asyncio
import json
import os
import sys
import time

# Replies go to the original stdout; anything else printed goes to stderr.
_reply = os.fdopen(os.dup(1), "w", buffering=1)
os.dup2(2, 1)

import _verl_model  # noqa: E402
from verl.utils.import_utils import import_external_libs  # noqa: E402
from verl.workers.config import CheckpointEngineConfig, RolloutConfig  # noqa: E402

MODULE = "wsync.integrations.verl"


def reply(**fields):
    _reply.write(json.dumps(fields) + "\n")


def failure(exc, started):
    status = getattr(exc, "status", None)
    return {"ok": False, "type": type(exc).__name__, "mro": [c.__name__ for c in type(exc).__mro__],
            "status": None if status is None else status.name, "message": str(exc),
            "failures": [str(f) for f in getattr(exc, "failures", ())],
            "elapsed": time.monotonic() - started}


def ce_config(bucket_mb, engine_kwargs):
    return CheckpointEngineConfig(backend="wsync", update_weights_bucket_megabytes=bucket_mb,
                                  engine_kwargs={"wsync": engine_kwargs},
                                  custom_backend_module=MODULE)


def make_trainer(rank, bucket_mb, engine_kwargs):
    """As ActorRolloutRefWorker.init_model builds its checkpoint engine (verl 0.9.1)."""
    from verl.checkpoint_engine import CheckpointEngineRegistry

    config = ce_config(bucket_mb, engine_kwargs)
    backend = config.backend
    bucket_size = config.update_weights_bucket_megabytes << 20
    kwargs = config.engine_kwargs.get(backend, {})
    import_external_libs(config.custom_backend_module or None)
    return CheckpointEngineRegistry.new(backend, is_master=(rank == 0), bucket_size=bucket_size,
                                        **kwargs)


def make_rollout(rank, bucket_mb, engine_kwargs):
    from verl.checkpoint_engine.base import CheckpointEngineWorker
    from verl.workers.rollout import BaseRollout

    class CpuServerAdapter(BaseRollout):
        """The inference engine's side of ``BaseRollout`` on CPU: copies each tensor."""

        def __init__(self):  # no device mesh, no model config: nothing is served
            self.store = {}
            self.stall_after = None
            self.raise_after = None
            self.wire_formats = []

        async def resume(self, tags):
            pass

        async def release(self):
            pass

        async def update_weights(self, weights, wire_format="named_tensors", **kwargs):
            self.wire_formats.append(wire_format)
            count = 0
            async for name, tensor in weights:
                self.store[name] = tensor.clone()
                count += 1
                if self.stall_after is not None and count >= self.stall_after:
                    reply(stalled=True)
                    await asyncio.sleep(3600)
                if self.raise_after is not None and count >= self.raise_after:
                    raise RuntimeError(f"the engine refused '{name}'")

    os.environ.update(WORLD_SIZE="1", RANK="0", MASTER_ADDR="127.0.0.1",
                      MASTER_PORT=str(_verl_model.free_port()))
    config = RolloutConfig(name="vllm", checkpoint_engine=ce_config(bucket_mb, engine_kwargs))
    adapter = CpuServerAdapter()
    return CheckpointEngineWorker(config, None, server_adapter=adapter), adapter


def main():
    role, rank, bucket_mb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    def build(engine_kwargs):
        if role == "trainer":
            return make_trainer(rank, bucket_mb, engine_kwargs), None, None
        worker, adapter = make_rollout(rank, bucket_mb, engine_kwargs)
        return worker.checkpoint_engine, worker, adapter

    engine, worker, adapter = build(json.loads(sys.argv[4]))

    def ce(method, **kwargs):
        if worker is not None:
            return worker.execute_checkpoint_engine(method, **kwargs)
        return getattr(engine, method)(**kwargs)

    reply(ok=True, ready=True, pid=os.getpid(), engine=type(engine).__module__ + "." +
          type(engine).__name__, bucket_size=engine.bucket_size)
    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["op"]
        started = time.monotonic()
        try:
            if op == "prepare":
                reply(ok=True, metadata=ce("prepare"))
            elif op == "init":
                ce("init_process_group", **cmd["kwargs"])
                reply(ok=True)
            elif op == "update":
                steps = cmd.get("global_steps")
                if worker is None:
                    gen = _verl_model.weights(cmd["seed"], fail_after=cmd.get("fail_after"),
                                               touch=cmd.get("touch", 0))
                    metrics = asyncio.run(engine.send_weights(gen, global_steps=steps))
                    reply(ok=True, metrics=metrics, elapsed=time.monotonic() - started)
                else:
                    adapter.store = {}
                    adapter.stall_after = cmd.get("stall_after")
                    adapter.raise_after = cmd.get("raise_after")
                    asyncio.run(worker.update_weights(global_steps=steps))
                    expected = dict(_verl_model.weights(cmd["seed"], touch=cmd.get("touch", 0)))
                    bad = _verl_model.mismatches(expected, adapter.store)
                    reply(ok=not bad, mismatches=bad, tensors=len(adapter.store),
                          completed_version=engine.completed_version,
                          wire_formats=adapter.wire_formats[-1:],
                          elapsed=time.monotonic() - started)
            elif op == "finalize":
                ce("finalize")
                reply(ok=True)
            elif op == "rebuild":  # a new engine (and rollout worker) with other engine_kwargs
                engine.shutdown()
                engine, worker, adapter = build(cmd["engine_kwargs"])
                reply(ok=True)
            elif op == "exit":
                engine.shutdown()
                reply(ok=True)
                return
            else:
                reply(ok=False, type="ValueError", message=f"unknown op {op!r}")
        except Exception as exc:  # reported to the driver, which asserts on it
            reply(**failure(exc, started))


if __name__ == "__main__":
    main()
