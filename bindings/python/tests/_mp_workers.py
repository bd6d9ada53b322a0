"""Process bodies for the multi-process tests: a trainer and engines that talk only bytes
through queues, as a controller (the test) forwards them. Every wait has a timeout; a failure
is reported to the controller as text instead of hanging."""

import traceback

import torch

import wsync
from wsync.engine import ModuleLoader
from wsync.trainer import place_in_arena, send_model
from _models import TinyLM, train_steps

WAIT_S = 60  # the longest any process waits for one message


def _get(inbox, expected_kind):
    msg = inbox.get(timeout=WAIT_S)
    if msg[0] != expected_kind:
        raise RuntimeError(f"expected a {expected_kind!r} message, got {msg[0]!r}")
    return msg


def snapshot(model) -> dict:
    """{name: (dtype, shape, raw bytes)} of a model's state dict: what "bit for bit" compares."""
    out = {}
    for name, t in model.state_dict().items():
        t = t.detach().cpu().contiguous()
        raw = t.view(torch.int16) if t.dtype == torch.bfloat16 else t
        out[name] = (str(t.dtype), tuple(t.shape), raw.numpy().tobytes())
    return out


def differences(model, expected: dict) -> list:
    """Every way the model's state dict differs from a snapshot: missing or extra names, and
    each tensor whose dtype, shape or any byte differs."""
    mine = snapshot(model)
    problems = [f"missing {n}" for n in expected if n not in mine]
    problems += [f"extra {n}" for n in mine if n not in expected]
    for name, (dtype, shape, raw) in expected.items():
        if name not in mine:
            continue
        got_dtype, got_shape, got_raw = mine[name]
        if (got_dtype, got_shape) != (dtype, shape):
            problems.append(f"{name}: {got_dtype}{got_shape} vs {dtype}{shape}")
        elif got_raw != raw:
            bad = sum(a != b for a, b in zip(got_raw, raw))
            problems.append(f"{name}: {bad} of {len(raw)} bytes differ")
    return problems


def trainer_main(outbox, inbox, cfg):
    """Trains a TinyLM and syncs it after every optimizer step: each request goes to the
    controller as soon as its chunk is sent; then flush, then a snapshot of the weights. A
    failed send or flush is reported as (status, message, [(receiver, status, message)])."""
    torch.set_num_threads(1)
    strategy = sender = None
    try:
        model = TinyLM(seed=0)
        if cfg.get("tie"):
            model.lm_head.weight = model.embed_tokens.weight
        extra = {"arena_bytes": cfg["arena_bytes"]} if cfg.get("arena_bytes") else {}
        strategy = wsync.Strategy("shm", receivers=cfg["receivers"], buckets=cfg["buckets"],
                                  bucket_bytes=cfg["bucket_bytes"], timeout_ms=20000, **extra)
        init = strategy.create_init_info()
        sender = strategy.sender(init)
        if extra:
            # The parameters live in the segment from here on; the optimizer keeps writing
            # them between syncs (after each flush), as a trainer's would.
            place_in_arena(sender, model)
        outbox.put(("init", init))
        _get(inbox, "go")
        for step in train_steps(model, cfg["steps"]):
            sent = []

            def forward(request, step=step):
                sent.append(request)
                outbox.put(("request", step, request))

            # A receiver's failure surfaces at the flush, or already at a send that waits for
            # a bucket that receiver holds (the version is then abandoned).
            try:
                send_model(sender, model, chunk_bytes=cfg["chunk_bytes"], on_request=forward)
                sender.flush(cfg["flush_timeout_s"])
                error = None
            except wsync.WsyncError as exc:
                error = (int(exc.status), exc.message,
                         [(f.receiver, int(f.status), f.message) for f in exc.failures])
            outbox.put(("synced", step, sender.version, len(sent), snapshot(model), error))
        _get(inbox, "stop")
    except BaseException:
        outbox.put(("error", "trainer", traceback.format_exc()))
    finally:
        if sender is not None:
            sender.close()
        if strategy is not None:
            strategy.close()


def engine_main(index, inbox, outbox, cfg):
    """An inference engine: loads every forwarded request into its own TinyLM (different
    initial weights), either with wsync's ModuleLoader or through its own load_weights; when asked,
    compares its weights bit for bit with the trainer's snapshot and reports the differences."""
    torch.set_num_threads(1)
    strategy = receiver = None
    try:
        model = TinyLM(seed=100 + index, hidden=cfg.get("hidden", {}).get(index, 64))
        initial = snapshot(model)
        _, init = _get(inbox, "init")
        strategy = wsync.Strategy.for_init_info(init)
        receiver = strategy.receiver(init, index)
        if cfg["modes"][index] == "load_weights":
            def load(request):
                # The model's own loader over the chunk's zero-copy views, as an inference
                # engine's checkpoint loader would take them.
                with receiver.receive(request, framework="torch") as it:
                    model.load_weights(list(it))
        else:
            loader = ModuleLoader(model)

            def load(request):
                loader.load(receiver, request)

        outbox.put(("ready", index, initial))
        errors, loaded = [], 0
        while True:
            msg = inbox.get(timeout=WAIT_S)
            if msg[0] == "request":
                try:
                    load(msg[2])
                    loaded += 1
                except wsync.WsyncError as exc:
                    errors.append((msg[1], int(exc.status), exc.message))
            elif msg[0] == "check":
                _, step, expected = msg
                outbox.put(("report", index, step, receiver.completed_version, loaded,
                            differences(model, expected), errors))
                errors, loaded = [], 0
            elif msg[0] == "stop":
                break
            else:
                raise RuntimeError(f"unexpected message {msg[0]!r}")
    except BaseException:
        outbox.put(("error", f"engine {index}", traceback.format_exc()))
    finally:
        if receiver is not None:
            receiver.close()
        if strategy is not None:
            strategy.close()
