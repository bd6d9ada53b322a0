#!/usr/bin/env python3
"""libwsync's cuda_ipc against today's practice, measured in one run on one GPU.

A trainer process holds an 8B-parameter Llama-shaped bf16 model on cuda:0 (32 layers, 291
tensors, ~16 GB; --layers scales it down) and an engine process holds a model of the same shape
on the same GPU. Each step the trainer changes its weights and syncs them to the engine, and
the step is timed from the trainer's first send to the engine's last acknowledged copy:

  d2d          one device-to-device copy of the same bytes inside one process (the floor);
  torch_ipc    today's practice (vLLM's `ipc` weight-transfer engine, SkyRL before it): one
               torch.multiprocessing.reductions.reduce_tensor handle per tensor, sent to the
               engine process, which rebuilds each tensor (cudaIpcOpenMemHandle through torch's
               cache) and copies it into its own parameter;
  torch_ipc_cached
               the best a user writes in ~30 lines of torch: the same handles sent and opened
               once, then each step the engine copies every tensor (copy_ per tensor) out of
               the trainer's memory it keeps mapped, and synchronizes;
  torch_packed bucketed flatten (SkyRL/verl practice), at its best: persistent 1 GiB buckets
               whose handles the engine opens once; each step the trainer copies its tensors
               into the buckets (one torch.cat(out=) per bucket), the engine copies each
               tensor's slice out into its parameter;
  wsync_packed / wsync_unpacked
               libwsync's cuda_ipc strategy through the Python binding (wsync.trainer.send_model,
               wsync.engine.ModuleLoader): packed device buckets, or the trainer's own
               allocations with cached handles.

After the last step of each method the engine's weights are compared bit for bit with the
trainer's (a position-weighted sum of every tensor's raw 16-bit words, computed on the GPU on
both sides; any difference fails the run). Prints one JSON object with every figure and the
ratios (steady state = median of the steps after the first; the first is reported apart) and
exits non-zero if any method fails or is not bit-exact. The allocator configuration
(PYTORCH_CUDA_ALLOC_CONF, e.g. expandable_segments:True, which many RL stacks set) applies to
both processes and is recorded as "alloc_conf". Needs torch with CUDA and a GPU;
scripts/gpu-validate.sh runs it and records the result in docs/gpu-validation.md.
"""

import argparse
import json
import multiprocessing as mp
import os
import statistics
import sys
import time
import traceback

WAIT_S = 600  # the longest either process waits for the other's next message


def llama_shapes(layers: int, hidden=4096, inter=14336, kv=1024, vocab=128256):
    """(name, shape) of a Llama-3-8B-shaped model: 9 tensors a layer, embeddings, final norm,
    lm_head (291 tensors and 8.03e9 parameters at 32 layers)."""
    out = [("model.embed_tokens.weight", (vocab, hidden))]
    for i in range(layers):
        p = f"model.layers.{i}."
        out += [(p + "self_attn.q_proj.weight", (hidden, hidden)),
                (p + "self_attn.k_proj.weight", (kv, hidden)),
                (p + "self_attn.v_proj.weight", (kv, hidden)),
                (p + "self_attn.o_proj.weight", (hidden, hidden)),
                (p + "mlp.gate_proj.weight", (inter, hidden)),
                (p + "mlp.up_proj.weight", (inter, hidden)),
                (p + "mlp.down_proj.weight", (hidden, inter)),
                (p + "input_layernorm.weight", (hidden,)),
                (p + "post_attention_layernorm.weight", (hidden,))]
    out += [("model.norm.weight", (hidden,)), ("lm_head.weight", (vocab, hidden))]
    return out


def build_module(torch, shapes, seed):
    """An nn.Module whose state dict has exactly `shapes` (dotted names as nested modules)."""
    root = torch.nn.Module()
    g = torch.Generator(device="cuda:0").manual_seed(seed)
    for name, shape in shapes:
        *path, leaf = name.split(".")
        m = root
        for part in path:
            if not hasattr(m, part):
                m.add_module(part, torch.nn.Module())
            m = getattr(m, part)
        t = torch.empty(shape, dtype=torch.bfloat16, device="cuda:0")
        t.normal_(generator=g)
        m.register_parameter(leaf, torch.nn.Parameter(t, requires_grad=False))
    return root


def fingerprint(torch, module):
    """{name: position-weighted sum of the tensor's raw 16-bit words}: equal on both sides
    exactly when the bytes are (up to a vanishing chance), computed without leaving the GPU."""
    out = {}
    for name, t in module.state_dict().items():
        w = t.detach().reshape(-1).view(torch.int16).to(torch.int64)
        pos = torch.arange(w.numel(), device=w.device, dtype=torch.int64) % 65521 + 1
        out[name] = int((w * pos).sum().item())
    return out


def perturb(torch, module, step):
    """A training step's worth of change: every tensor's bytes change."""
    with torch.no_grad():
        for t in module.parameters():
            t.add_(0.001 * step)


# ---- engine process ------------------------------------------------------------------------------
def engine_main(shapes, inbox, outbox):
    try:
        import torch
        import wsync
        from wsync.engine import ModuleLoader

        torch.cuda.set_device(0)
        model = build_module(torch, shapes, seed=1)
        params = dict(model.state_dict())
        outbox.put(("ready",))
        receiver = loader = None
        cached = buckets = None
        load_s = []  # wall time of each ModuleLoader.load since the last "stats"
        # Where load() spends it: receive (parse, open handles), end (wait for the copies,
        # acknowledge), and the rest (the loader's own work and queuing copies).
        split = {"receive_s": 0.0, "end_s": 0.0}
        from wsync._core import Iteration, Receiver
        # Per load, the moments (time.perf_counter: CLOCK_MONOTONIC, one clock for both
        # processes) its request arrived and each timed call returned: the last version's make
        # the step's timeline beside the trainer's own.
        trace = []
        def timed(cls, attr, key):
            inner = getattr(cls, attr)
            def wrapper(*a, **k):
                t0 = time.perf_counter()
                try:
                    return inner(*a, **k)
                finally:
                    t1 = time.perf_counter()
                    split[key] += t1 - t0
                    if trace:
                        trace[-1][key.replace("_s", "")] = t1
            setattr(cls, attr, wrapper)
        timed(Receiver, "receive", "receive_s")
        timed(Iteration, "end", "end_s")
        # The one-call path (ModuleLoader's destination table): its Python and C time, how many
        # chunks took it, and the per-version re-read of the module's tensors.
        split.update({"apply_s": 0.0, "refresh_s": 0.0, "table_chunks": 0})
        timed(Iteration, "apply", "apply_s")
        timed(ModuleLoader, "_refresh_targets", "refresh_s")
        inner_apply_table = ModuleLoader._apply_table
        def counting_apply_table(self, *a, **k):
            took = inner_apply_table(self, *a, **k)
            split["table_chunks"] += int(bool(took))
            return took
        ModuleLoader._apply_table = counting_apply_table
        while True:
            msg = inbox.get(timeout=WAIT_S)
            kind = msg[0]
            if kind == "quit":
                break
            if kind == "wsync_init":
                if receiver is not None:
                    receiver.close()
                strategy = wsync.Strategy.for_init_info(msg[1], device=0)
                receiver = strategy.receiver(msg[1], 0)
                loader = ModuleLoader(model)
                outbox.put(("ok",))
            elif kind == "wsync_request":
                t0 = time.perf_counter()
                trace.append({"got": t0})
                loader.load(receiver, msg[1])  # acknowledged once its copies are done
                t1 = time.perf_counter()
                trace[-1]["loaded"] = t1
                load_s.append(t1 - t0)
            elif kind == "stats":
                # Where an engine's time goes: its load() calls, and the cost of one zero-copy
                # CUDA view (wsync._core.cuda_view, torch.as_tensor over __cuda_array_interface__)
                # and of one copy_ launch, each timed over 2000 calls on this engine's GPU.
                from wsync._core import cuda_view
                p = next(iter(params.values()))
                t0 = time.perf_counter()
                for _ in range(2000):
                    v = cuda_view(p.data_ptr(), p.shape, (wsync.DTYPE_BFLOAT, 16, 1), 0)
                view_us = (time.perf_counter() - t0) / 2000 * 1e6
                small = torch.empty(64, dtype=torch.bfloat16, device="cuda:0")
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                for _ in range(2000):
                    small.copy_(v.view(-1)[:64])
                torch.cuda.synchronize()
                copy_us = (time.perf_counter() - t0) / 2000 * 1e6
                outbox.put(("stats", {"loads": len(load_s), "load_s_total": round(sum(load_s), 6),
                                      "receive_s_total": round(split["receive_s"], 6),
                                      "end_s_total": round(split["end_s"], 6),
                                      "apply_s_total": round(split["apply_s"], 6),
                                      "refresh_s_total": round(split["refresh_s"], 6),
                                      "table_chunks": split["table_chunks"],
                                      "trace": trace[-(len(load_s) // max(1, msg[1])):] if len(msg) > 1 else [],
                                      "view_us": round(view_us, 2), "copy_launch_us": round(copy_us, 2)}))
                load_s = []
                trace = []
                split.update({"receive_s": 0.0, "end_s": 0.0, "apply_s": 0.0, "refresh_s": 0.0,
                              "table_chunks": 0})
            elif kind == "torch_handles":
                # What vLLM's ipc engine does with each handle: rebuild, copy, let go.
                with torch.no_grad():
                    for name, (rebuild, args) in msg[1]:
                        params[name].copy_(rebuild(*args))
                torch.cuda.current_stream().synchronize()
                outbox.put(("done",))
            elif kind == "torch_cache":
                # Handles opened once (torch caches the mapping); kept for every step.
                cached = [(params[name], rebuild(*args)) for name, (rebuild, args) in msg[1]]
                torch.cuda.current_stream().synchronize()
                outbox.put(("done",))
            elif kind == "torch_cached_step":
                with torch.no_grad():
                    for dst, src in cached:
                        dst.copy_(src)
                torch.cuda.current_stream().synchronize()
                outbox.put(("done",))
            elif kind == "torch_buckets":
                # One handle per bucket, opened once; each bucket's layout: (name, start, numel).
                buckets = [(rebuild(*args), layout) for (rebuild, args), layout in msg[1]]
                torch.cuda.current_stream().synchronize()
                outbox.put(("done",))
            elif kind == "torch_bucket_step":
                with torch.no_grad():
                    for flat, layout in buckets:
                        for name, start, numel in layout:
                            params[name].view(-1).copy_(flat[start:start + numel])
                torch.cuda.current_stream().synchronize()
                outbox.put(("done",))
            elif kind == "torch_release":
                cached = buckets = None
                torch.cuda.ipc_collect()
                outbox.put(("done",))
            elif kind == "fingerprint":
                outbox.put(("fingerprint", fingerprint(torch, model)))
    except Exception:
        outbox.put(("error", traceback.format_exc()))


# ---- trainer (this process) -------------------------------------------------------------------------
class Engine:
    def __init__(self, ctx, shapes):
        self.inbox, self.outbox = ctx.Queue(), ctx.Queue()
        self.proc = ctx.Process(target=engine_main, args=(shapes, self.inbox, self.outbox))
        self.proc.start()
        self.expect("ready")

    def expect(self, kind):
        msg = self.outbox.get(timeout=WAIT_S)
        if msg[0] == "error":
            raise RuntimeError("engine failed:\n" + msg[1])
        if msg[0] != kind:
            raise RuntimeError(f"engine sent {msg[0]!r}, expected {kind!r}")
        return msg

    def close(self):
        self.inbox.put(("quit",))
        self.proc.join(timeout=60)
        if self.proc.is_alive():
            self.proc.kill()


def time_steps(torch, model, steps, one_sync):
    times = []
    for step in range(1, steps + 1):
        perturb(torch, model, step)
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        one_sync()
        times.append(time.perf_counter() - t0)
    return times


def timeline(trainer, trace):
    """The last step, in ms from the trainer's call: when the trainer handed each request on,
    and when the engine got it, had received it, had applied it (the table path) and had
    loaded it; when send_model returned and when the flush did."""
    t0 = trainer["start"]
    ms = lambda t: None if t is None else round((t - t0) * 1e3, 3)
    return {"sent": [ms(t) for t in trainer["sent"]],
            "engine": [{k: ms(v) for k, v in rec.items()} for rec in trace],
            "send_model_returned": ms(trainer.get("sent_all")), "flushed": ms(trainer.get("flushed"))}


def summary(times, nbytes):
    steady = statistics.median(times[1:]) if len(times) > 1 else times[0]
    return {"first_s": round(times[0], 6), "steady_s": round(steady, 6),
            "steady_gbps": round(nbytes / steady / 1e9, 3), "steps_s": [round(t, 6) for t in times]}


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, default=32, help="decoder layers (32: 8B parameters)")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--bucket-mb", type=int, default=1024)
    ap.add_argument("--wsync-chunk-mb", type=int, default=None,
                    help="libwsync's chunk size (default --bucket-mb; packed: at most the bucket)")
    ap.add_argument("--wsync-buckets", type=int, default=2, help="libwsync packed buckets")
    ap.add_argument("--methods",
                    default="d2d,torch_ipc,torch_ipc_cached,torch_packed,wsync_packed,wsync_unpacked")
    args = ap.parse_args()

    import torch
    import wsync
    from wsync.trainer import send_model

    if not torch.cuda.is_available():
        print(json.dumps({"skipped": "torch.cuda.is_available() is False: no GPU or driver"}))
        return 0
    torch.cuda.set_device(0)
    shapes = llama_shapes(args.layers)
    model = build_module(torch, shapes, seed=0)
    named = list(model.state_dict().items())
    nbytes = sum(t.numel() * t.element_size() for _, t in named)
    result = {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__,
              "cuda_runtime": torch.version.cuda, "libwsync": wsync.version(),
              "alloc_conf": os.environ.get("PYTORCH_CUDA_ALLOC_CONF", ""),
              "tensors": len(named), "bytes": nbytes, "steps": args.steps,
              "wsync": {"chunk_mb": args.wsync_chunk_mb or args.bucket_mb, "buckets": args.wsync_buckets,
                        "bucket_mb": args.bucket_mb},
              "methods": {}}
    methods = args.methods.split(",")
    failed = []

    if "d2d" in methods:
        flat_src = torch.empty(nbytes, dtype=torch.uint8, device="cuda:0")
        flat_dst = torch.empty_like(flat_src)

        def d2d():
            flat_dst.copy_(flat_src)
            torch.cuda.synchronize()
        result["methods"]["d2d"] = summary(time_steps(torch, model, args.steps, d2d), nbytes)
        del flat_src, flat_dst
        torch.cuda.empty_cache()

    ctx = mp.get_context("spawn")
    engine = Engine(ctx, shapes)
    try:
        want = None
        if "torch_ipc" in methods:
            from torch.multiprocessing.reductions import reduce_tensor

            def torch_ipc():
                handles = [(name, reduce_tensor(t)) for name, t in model.state_dict().items()]
                engine.inbox.put(("torch_handles", handles))
                engine.expect("done")
            result["methods"]["torch_ipc"] = summary(time_steps(torch, model, args.steps, torch_ipc), nbytes)
            want = fingerprint(torch, model)
            engine.inbox.put(("fingerprint",))
            got = engine.expect("fingerprint")[1]
            result["methods"]["torch_ipc"]["bit_exact"] = got == want
            if got != want:
                failed.append("torch_ipc not bit-exact")

        def check_exact(name):
            want = fingerprint(torch, model)
            engine.inbox.put(("fingerprint",))
            got = engine.expect("fingerprint")[1]
            result["methods"][name]["bit_exact"] = got == want
            if got != want:
                failed.append(f"{name} not bit-exact")

        def ping(kind):
            def step():
                engine.inbox.put((kind,))
                engine.expect("done")
            return step

        if "torch_ipc_cached" in methods:
            from torch.multiprocessing.reductions import reduce_tensor
            try:
                engine.inbox.put(("torch_cache", [(n, reduce_tensor(t)) for n, t in named]))
                engine.expect("done")
                result["methods"]["torch_ipc_cached"] = summary(
                    time_steps(torch, model, args.steps, ping("torch_cached_step")), nbytes)
                check_exact("torch_ipc_cached")
            except Exception as exc:
                result["methods"]["torch_ipc_cached"] = {"error": f"{type(exc).__name__}: {exc}"}
                failed.append(f"torch_ipc_cached: {exc}")
            engine.inbox.put(("torch_release",))
            engine.expect("done")

        if "torch_packed" in methods:
            from torch.multiprocessing.reductions import reduce_tensor
            try:
                cap = args.bucket_mb << 20
                groups, cur, size = [], [], 0
                for n, t in named:
                    b = t.numel() * t.element_size()
                    if cur and size + b > cap:
                        groups.append(cur)
                        cur, size = [], 0
                    cur.append((n, t))
                    size += b
                if cur:
                    groups.append(cur)
                flats, layouts = [], []
                for g in groups:
                    total = sum(t.numel() for _, t in g)
                    flats.append(torch.empty(total, dtype=torch.bfloat16, device="cuda:0"))
                    start, layout = 0, []
                    for n, t in g:
                        layout.append((n, start, t.numel()))
                        start += t.numel()
                    layouts.append(layout)
                engine.inbox.put(("torch_buckets", [(reduce_tensor(f), l) for f, l in zip(flats, layouts)]))
                engine.expect("done")

                def torch_packed():
                    for flat, g in zip(flats, groups):
                        torch.cat([t.reshape(-1) for _, t in g], out=flat)
                    torch.cuda.synchronize()
                    engine.inbox.put(("torch_bucket_step",))
                    engine.expect("done")
                result["methods"]["torch_packed"] = summary(time_steps(torch, model, args.steps, torch_packed), nbytes)
                check_exact("torch_packed")
            except Exception as exc:
                result["methods"]["torch_packed"] = {"error": f"{type(exc).__name__}: {exc}"}
                failed.append(f"torch_packed: {exc}")
            engine.inbox.put(("torch_release",))
            engine.expect("done")
            flats = None
            torch.cuda.empty_cache()

        for packed in (True, False):
            name = "wsync_packed" if packed else "wsync_unpacked"
            if name not in methods:
                continue
            strategy = wsync.Strategy("cuda_ipc", receivers=1, packed=packed,
                                      bucket_bytes=args.bucket_mb << 20, buckets=args.wsync_buckets)
            chunk_mb = min(args.wsync_chunk_mb or args.bucket_mb,
                           args.bucket_mb if packed else 1 << 30)
            init = strategy.create_init_info()
            engine.inbox.put(("wsync_init", init))
            engine.expect("ok")
            sender = strategy.sender(init)

            trainer_split = {"send_s": 0.0, "flush_s": 0.0}
            last = {}  # the last step's moments, for the timeline

            def forward(req):
                last["sent"].append(time.perf_counter())
                engine.inbox.put(("wsync_request", req))

            def wsync_sync():
                t0 = time.perf_counter()
                last.clear()
                last.update(start=t0, sent=[])
                send_model(sender, model, chunk_bytes=chunk_mb << 20, on_request=forward)
                t1 = time.perf_counter()
                sender.flush(300)
                t2 = time.perf_counter()
                last.update(sent_all=t1, flushed=t2)
                trainer_split["send_s"] += t1 - t0
                trainer_split["flush_s"] += t2 - t1
            try:
                r = summary(time_steps(torch, model, args.steps, wsync_sync), nbytes)
                engine.inbox.put(("stats", args.steps))
                st = engine.expect("stats")[1]
                r["timeline_ms"] = timeline(last, st["trace"])
                r["trainer"] = {k.replace("_s", "_s_per_step"): round(v / args.steps, 6)
                                for k, v in trainer_split.items()}
                r["engine"] = {"load_s_per_step": round(st["load_s_total"] / args.steps, 6),
                               "receive_s_per_step": round(st["receive_s_total"] / args.steps, 6),
                               "end_s_per_step": round(st["end_s_total"] / args.steps, 6),
                               "apply_s_per_step": round(st["apply_s_total"] / args.steps, 6),
                               "refresh_s_per_step": round(st["refresh_s_total"] / args.steps, 6),
                               "chunks_by_table": st["table_chunks"],
                               "loads_per_step": st["loads"] / args.steps,
                               "view_us_per_tensor": st["view_us"],
                               "copy_launch_us": st["copy_launch_us"]}
                want = fingerprint(torch, model)
                engine.inbox.put(("fingerprint",))
                got = engine.expect("fingerprint")[1]
                r["bit_exact"] = got == want
                if got != want:
                    failed.append(f"{name} not bit-exact")
                result["methods"][name] = r
            except Exception as exc:  # recorded, and the run fails
                result["methods"][name] = {"error": f"{type(exc).__name__}: {exc}"}
                failed.append(f"{name}: {exc}")
            finally:
                sender.close()
                strategy.close()
    finally:
        engine.close()

    m = result["methods"]
    ratios = {}
    if "d2d" in m:
        for k in ("torch_ipc", "torch_ipc_cached", "torch_packed", "wsync_packed", "wsync_unpacked"):
            if "steady_s" in m.get(k, {}):
                ratios[f"{k}_to_d2d"] = round(m[k]["steady_s"] / m["d2d"]["steady_s"], 3)
    # Against each peer, the libwsync mode that does the same job: per-allocation against the
    # best per-tensor practice (cached handles), packed against bucketed flatten; > 1 is faster.
    for ours, peer in (("wsync_unpacked", "torch_ipc_cached"), ("wsync_packed", "torch_packed"),
                       ("wsync_unpacked", "torch_ipc"), ("wsync_packed", "torch_ipc")):
        if "steady_s" in m.get(ours, {}) and "steady_s" in m.get(peer, {}):
            ratios[f"{ours}_speedup_over_{peer}"] = round(m[peer]["steady_s"] / m[ours]["steady_s"], 3)
    result["ratios"] = ratios
    result["failed"] = failed
    print(json.dumps(result, indent=2))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
