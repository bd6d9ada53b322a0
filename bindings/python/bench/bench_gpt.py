#!/usr/bin/env python3
"""A Python trainer with a GPT (tied embeddings) syncing to two engine processes: wsync's
``send_model`` + ``ModuleLoader`` over ``shm`` against the hand-written baseline peers use on one
host (the trainer's parameters in shared memory through ``share_memory_()``, their handles sent
to the engines once over a ``torch.multiprocessing`` pipe, then per step a message down the pipe
and each engine ``copy_()``-ing every parameter into its own model), all in this one run.

Per step, outside the timing, the trainer changes every weight (``add_``, as an optimizer step
writes them); the figure is the time from the trainer starting the sync until both engines have
loaded the step (wsync: ``send_model`` forwarding each request as its chunk is sent, ``flush``,
and both engines' replies; baseline: the message down both pipes and both engines' replies).
Each mode's figure is the median over ``--steps`` steps after one warm-up step; every mode ends
by checking that both engines hold the trainer's weights bit for bit. The modes run in turn,
``--rounds`` times over (a fresh model each round), so a slow minute of a shared host falls on
every mode alike; the table gives, per mode, the median over rounds, its ratio to the baseline
of the same round (median, lowest, highest) and in how many rounds it beat that baseline. A
one-core ``copy_`` of the model's unique bytes is measured in the same run as the memory-speed
reference.

What differs, so the figures read right: the baseline copies once (shared memory -> engine) and
only works when the trainer's parameters live in host shared memory (not for a GPU trainer, not
across machines) and an engine may copy while the trainer writes (no versions, no checksums, a
torn step is served). wsync copies twice (trainer -> bucket -> engine, pipelined by chunk) and
gives versioned, all-or-nothing syncs, with or without checksums.

    WSYNC_LIBRARY=build/libwsync.so /usr/bin/python3 bindings/python/bench/bench_gpt.py
"""

import argparse
import hashlib
import json
import os
import statistics
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[1]))

import torch  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402
from torch import nn  # noqa: E402

import wsync  # noqa: E402
from wsync.engine import ModuleLoader  # noqa: E402
from wsync.trainer import ARENA_ALIGN, place_in_arena, send_model  # noqa: E402

WAIT_S = 300


class Block(nn.Module):
    def __init__(self, dim, hidden):
        super().__init__()
        self.ln_1 = nn.LayerNorm(dim)
        self.attn = nn.Linear(dim, 3 * dim)
        self.proj = nn.Linear(dim, dim)
        self.ln_2 = nn.LayerNorm(dim)
        self.fc = nn.Linear(dim, hidden)
        self.fc_proj = nn.Linear(hidden, dim)


class GPT(nn.Module):
    """GPT-2's shapes; lm_head.weight is wte.weight (tied)."""

    def __init__(self, vocab, dim, layers, ctx=1024, seed=0):
        super().__init__()
        torch.manual_seed(seed)
        self.wte = nn.Embedding(vocab, dim)
        self.wpe = nn.Embedding(ctx, dim)
        self.h = nn.ModuleList(Block(dim, 4 * dim) for _ in range(layers))
        self.ln_f = nn.LayerNorm(dim)
        self.lm_head = nn.Linear(dim, vocab, bias=False)
        self.lm_head.weight = self.wte.weight


def digest(model) -> str:
    h = hashlib.sha256()
    for name, t in model.state_dict().items():
        h.update(name.encode())
        h.update(t.detach().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def unique_params(model):
    """(name, parameter) once per tensor, as named_parameters() gives them (tied: first name)."""
    return list(model.named_parameters())


def engine_main(index, conn, cfg):
    torch.set_num_threads(1)
    model = GPT(cfg["vocab"], cfg["dim"], cfg["layers"], seed=100 + index)
    mode = cfg["mode"]
    if mode == "baseline":
        shared = conn.recv()  # {name: tensor in the trainer's shared memory}, once
        own = unique_params(model)
        conn.send("ready")
        while True:
            msg = conn.recv()
            if msg[0] == "sync":
                with torch.no_grad():
                    for name, p in own:
                        p.copy_(shared[name])
                conn.send(("done", msg[1]))
            elif msg[0] == "digest":
                conn.send(("digest", digest(model)))
            else:
                break
    else:
        init = conn.recv()
        opts = {"copy_threads": cfg["copy_threads"]} if cfg["copy_threads"] is not None else {}
        strategy = wsync.Strategy.for_init_info(init, **opts)
        receiver = strategy.receiver(init, index)
        loader = ModuleLoader(model)
        conn.send("ready")
        while True:
            msg = conn.recv()
            if msg[0] == "request":
                info = loader.load(receiver, msg[1])
                if info.last:
                    conn.send(("done", info.version))
            elif msg[0] == "digest":
                conn.send(("digest", digest(model)))
            else:
                break
        receiver.close()
        strategy.close()


def step_weights(model):
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1e-6)


def expect(conn, kind):
    if not conn.poll(WAIT_S):
        raise RuntimeError(f"no {kind!r} from an engine within {WAIT_S} s")
    msg = conn.recv()
    got = msg if isinstance(msg, str) else msg[0]
    if got != kind:
        raise RuntimeError(f"expected {kind!r} from an engine, got {msg!r}")
    return msg


def run_mode(model, cfg, mode, checksum=None, aliases="join", arena=False):
    ctx = mp.get_context("spawn")
    pipes = [ctx.Pipe() for _ in range(2)]
    procs = [ctx.Process(target=engine_main, args=(i, pipes[i][1], dict(cfg, mode=mode)))
             for i in range(2)]
    for p in procs:
        p.start()
    conns = [a for a, _ in pipes]
    strategy = sender = None
    times = []
    try:
        if mode == "baseline":
            shared = dict(unique_params(model))
            for c in conns:
                c.send(shared)
        else:
            extra = {}
            if arena:  # room for every unique tensor at the arena's 256-byte alignment
                tensors = list(model.parameters()) + list(model.buffers())
                extra["arena_bytes"] = sum(t.numel() * t.element_size() + ARENA_ALIGN
                                           for t in tensors)
            if cfg["copy_threads"] is not None:  # the trainer's packing/hashing threads too
                extra["copy_threads"] = cfg["copy_threads"]
            strategy = wsync.Strategy("shm", receivers=2, checksum=checksum,
                                      bucket_bytes=cfg["bucket_mb"] << 20, buckets=cfg["buckets"],
                                      timeout_ms=60000, **extra)
            init = strategy.create_init_info()
            sender = strategy.sender(init)
            if arena:
                place_in_arena(sender, model)  # from now on the trainer's weights live there
            for c in conns:
                c.send(init)
        for c in conns:
            expect(c, "ready")
        for step in range(cfg["steps"] + 1):
            step_weights(model)
            t0 = time.perf_counter()
            if mode == "baseline":
                for c in conns:
                    c.send(("sync", step))
            else:
                def forward(request):
                    for c in conns:
                        c.send(("request", request))
                send_model(sender, model, on_request=forward, aliases=aliases,
                           chunk_bytes=cfg["chunk_mb"] << 20 if cfg["chunk_mb"] else None)
                sender.flush(60)
            for c in conns:
                expect(c, "done")
            if step > 0:  # step 0 warms up (page faults, first mappings)
                times.append(time.perf_counter() - t0)
        want = digest(model)
        for i, c in enumerate(conns):
            c.send(("digest",))
            got = expect(c, "digest")[1]
            if got != want:
                raise RuntimeError(f"{mode}: engine {i} does not hold the trainer's weights")
        for c in conns:
            c.send(("stop",))
    finally:
        for p in procs:
            p.join(30)
            if p.is_alive():
                p.kill()
        if sender is not None:
            sender.close()
        if strategy is not None:
            strategy.close()
    return statistics.median(times), times


def one_core_copy_s(model, reps=5):
    params = [p.detach() for p in model.parameters()]
    dsts = [torch.empty_like(p) for p in params]
    for d, s in zip(dsts, params):
        d.copy_(s)
    best = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for d, s in zip(dsts, params):
            d.copy_(s)
        best.append(time.perf_counter() - t0)
    return statistics.median(best)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--layers", type=int, default=8, help="transformer blocks (default 8: ~96M params)")
    ap.add_argument("--dim", type=int, default=768)
    ap.add_argument("--vocab", type=int, default=50304)
    ap.add_argument("--steps", type=int, default=5, help="timed steps per mode (after one warm-up)")
    ap.add_argument("--bucket-mb", type=int, default=256,
                    help="shm bucket size (MiB); at least the largest tensor (wte)")
    ap.add_argument("--buckets", type=int, default=2, help="shm buckets")
    ap.add_argument("--chunk-mb", type=int, default=0,
                    help="planned chunk size (MiB; default: the bucket size)")
    ap.add_argument("--copy-threads", type=int, default=None,
                    help="copy_threads option of the trainer and the engines (default: the "
                         "library's, one per CPU)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="times every mode runs, in turn, each round with a fresh model")
    ap.add_argument("--json", action="store_true", help="one JSON object instead of the table")
    args = ap.parse_args()
    if args.rounds < 1 or args.steps < 1:
        ap.error("--rounds and --steps must be at least 1")
    torch.set_num_threads(1)
    cfg = {"vocab": args.vocab, "dim": args.dim, "layers": args.layers, "steps": args.steps,
           "bucket_mb": args.bucket_mb, "buckets": args.buckets, "chunk_mb": args.chunk_mb,
           "copy_threads": args.copy_threads}
    modes = (("baseline share_memory_ + pipe", "baseline", None, None, False),
             ("wsync shm, checksums on", "wsync", True, "join", False),
             ("wsync shm, checksums off", "wsync", False, "join", False),
             ("wsync, checksums on, tied sent twice", "wsync", True, "repeat", False),
             # The arena modes come last in a round: they move the model's parameters into a
             # sender's arena.
             ("wsync shm arena, checksums on", "wsync", True, "join", True),
             ("wsync shm arena, checksums off", "wsync", False, "join", True))
    base_name = modes[0][0]
    results = {name: {"round_median_s": [], "steps_s": []} for name, *_ in modes}
    copy_s = []
    for _ in range(args.rounds):
        model = GPT(args.vocab, args.dim, args.layers)  # same seed: the same weights each round
        unique = sum(p.numel() * p.element_size() for p in model.parameters())
        named = sum(t.numel() * t.element_size() for t in model.state_dict().values())
        params = sum(p.numel() for p in model.parameters())
        copy_s.append(one_core_copy_s(model))
        model.share_memory()  # share_memory_() on every tensor; the baseline needs it; wsync does not care where the bytes live
        for name, mode, checksum, aliases, arena in modes:
            med, all_s = run_mode(model, cfg, mode, checksum, aliases, arena)
            results[name]["round_median_s"].append(med)
            results[name]["steps_s"].append(all_s)
        del model
    base = results[base_name]["round_median_s"]
    for r in results.values():
        ratios = [m / b for m, b in zip(r["round_median_s"], base)]
        r["median_s"] = statistics.median(r["round_median_s"])
        r["x_baseline"] = {"median": statistics.median(ratios), "min": min(ratios),
                           "max": max(ratios)}
        r["rounds_faster_than_baseline"] = sum(x < 1 for x in ratios)
    copy_med = statistics.median(copy_s)
    out = {"params": params, "unique_bytes": unique, "state_dict_bytes": named,
           "one_core_copy_s": copy_med, "cpus": os.cpu_count(), "rounds": args.rounds,
           "torch": torch.__version__, "results": results}
    if args.json:
        print(json.dumps(out))
        return
    print(f"GPT {params / 1e6:.1f}M params (tied wte/lm_head), float32: "
          f"{unique / 2**20:.0f} MiB unique, {named / 2**20:.0f} MiB under all state_dict names; "
          f"torch {torch.__version__}, {os.cpu_count()} CPUs, 2 engine processes")
    print(f"one-core copy_ of the unique bytes: {copy_med * 1e3:.1f} ms (median of rounds)")
    print(f"sync to both engines: median over {args.rounds} rounds of each round's median of "
          f"{args.steps} steps; x baseline: within each round")
    print(f"{'mode':<38} {'ms':>7} {'x baseline (min-max)':>22} {'faster':>7} {'x copy':>7}")
    for name, r in results.items():
        x = r["x_baseline"]
        span = f"{x['median']:.2f} ({x['min']:.2f}-{x['max']:.2f})"
        faster = "" if name == base_name else f"{r['rounds_faster_than_baseline']}/{args.rounds}"
        print(f"{name:<38} {r['median_s'] * 1e3:7.1f} {span:>22} {faster:>7} "
              f"{r['median_s'] / copy_med:7.2f}")


if __name__ == "__main__":
    main()
