#!/usr/bin/env python3
"""Per-tensor overhead of the Python binding on the CPU (shm), against the C path.

The work: one chunk of N tiny tensors (4 x 4 float32, named like a MoE checkpoint's) is sent,
received and iterated to the end, sender and receiver in this one process, checksums off, so
what is measured is per-tensor bookkeeping and not bytes. Each figure is the median of several
repetitions, per tensor, all measured in this one run:

  binding       Sender.send_chunk(list of (name, torch.Tensor)) + Receiver.receive + iterating
                the Iteration to the end (zero-copy torch views; also numpy views) + end.
  C path        the same work written in C (bench/c_path.c: same tensors, names, strides and
                strategy options, same library), compiled here with `cc` and run right after.
  ctypes floor  the same library calls through bare ctypes (descriptors packed once before
                timing, one foreign call per view): what any ctypes binding pays at least.

Binding overhead = binding - C path (per tensor); ratio = binding / C path. The planner
(wsync.plan vs wsync_plan_create) is reported the same way. Target: at most 10 us per tensor.
Without a C compiler the C path is skipped and the ctypes floor stands in (and says so).

    WSYNC_LIBRARY=build/libwsync.so /usr/bin/python3 bindings/python/bench/bench_overhead.py
"""

import argparse
import ctypes
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from ctypes import byref, c_bool, c_void_p
from pathlib import Path

HERE = Path(__file__).resolve()
sys.path.insert(0, str(HERE.parents[1]))

import torch  # noqa: E402

import wsync  # noqa: E402
from wsync import _core, _lib  # noqa: E402

TARGET_US = 10.0


def make_tensors(n):
    data = torch.ones(n, 4, 4)
    return [(f"model.layers.{i // 16}.mlp.experts.{i % 16}.weight", data[i]) for i in range(n)]


def make_pair(n):
    bucket = (n * 256 + 4095) // 4096 * 4096
    strategy = wsync.Strategy("shm", receivers=1, buckets=2, bucket_bytes=bucket, checksum=False,
                              timeout_ms=10000)
    init = strategy.create_init_info()
    sender = strategy.sender(init)
    engine = wsync.Strategy("shm", verify=False)
    receiver = engine.receiver(init, 0)
    return strategy, engine, sender, receiver


def median_us(samples, n):
    return statistics.median(samples) / n * 1e6


def bench_binding(sender, receiver, tensors, reps, framework):
    send, recv = [], []
    n = len(tensors)
    for _ in range(reps):
        t0 = time.perf_counter()
        request = sender.send_chunk(tensors, last=True)
        t1 = time.perf_counter()
        with receiver.receive(request, framework=framework) as it:
            count = 0
            for _name, _view in it:
                count += 1
        t2 = time.perf_counter()
        assert count == n
        send.append(t1 - t0)
        recv.append(t2 - t1)
    sender.flush(10)
    return median_us(send, n), median_us(recv, n)


def bench_ctypes_floor(sender, receiver, tensors, reps):
    lib = _lib.lib()
    n = len(tensors)
    descs = _core.describe_tensors(tensors)  # packed once, outside the timing
    chunk = _lib.Chunk(descs.array, descs.count, wsync.CHUNK_LAST, ctypes.sizeof(_lib.Chunk))
    send_fn, free_fn = lib.wsync_sender_send_chunk, lib.wsync_blob_free
    recv_fn, next_fn, end_fn = lib.wsync_receiver_receive, lib.wsync_recv_next, lib.wsync_recv_end
    tx, rx = sender._h, receiver._h
    view, has = _lib.Tensor(), c_bool()
    view_ref, has_ref = byref(view), byref(has)
    send, recv = [], []
    for _ in range(reps):
        blob = _lib.Blob()
        t0 = time.perf_counter()
        assert send_fn(tx, byref(chunk), byref(blob)) == 0
        request = ctypes.string_at(blob.data, blob.size)
        free_fn(byref(blob))
        t1 = time.perf_counter()
        it = c_void_p()
        assert recv_fn(rx, request, len(request), byref(it)) == 0
        h = it.value
        count = -1
        while True:
            count += 1
            next_fn(h, view_ref, has_ref)
            if not has.value:
                break
        assert end_fn(h) == 0
        t2 = time.perf_counter()
        assert count == n
        send.append(t1 - t0)
        recv.append(t2 - t1)
    sender.flush(10)
    return median_us(send, n), median_us(recv, n)


def bench_plan(tensors, reps):
    samples = []
    for _ in range(reps):
        t0 = time.perf_counter()
        wsync.plan(tensors, chunk_bytes=1 << 40)
        samples.append(time.perf_counter() - t0)
    return median_us(samples, len(tensors))


def run_c_path(n, reps, include_dir, cc):
    """Compiles bench/c_path.c against the library the binding loaded and runs it: returns
    (figures, "") or (None, why not)."""
    lib_path = os.path.realpath(_lib.lib().path)
    lib_dir = os.path.dirname(lib_path)
    source = HERE.parent / "c_path.c"
    with tempfile.TemporaryDirectory(prefix="wsync-bench-") as tmp:
        exe = os.path.join(tmp, "c_path")
        cmd = [cc, "-O2", "-std=c99", "-D_POSIX_C_SOURCE=200809L", f"-I{include_dir}",
               str(source), lib_path, f"-Wl,-rpath,{lib_dir}", "-o", exe]
        try:
            built = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
        except (OSError, subprocess.TimeoutExpired) as exc:
            return None, f"cannot compile {source.name} with {cc}: {exc}"
        if built.returncode != 0:
            return None, f"{cc} failed on {source.name}: {built.stderr.strip()[:300]}"
        env = dict(os.environ, LD_LIBRARY_PATH=lib_dir)
        try:
            done = subprocess.run([exe, str(n), str(reps)], capture_output=True, text=True,
                                  timeout=300, env=env)
        except subprocess.TimeoutExpired as exc:
            return None, f"{source.name} ran too long: {exc}"
        if done.returncode != 0:
            return None, f"{source.name} exited {done.returncode}: {done.stderr.strip()[:300]}"
    figures = json.loads(done.stdout)
    if figures["library"] != wsync.version():
        return None, f"the C path loaded libwsync {figures['library']}, the binding {wsync.version()}"
    return figures, ""


def main():
    repo = HERE.parents[3]
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tensors", type=int, default=10000)
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--include", default=str(repo / "include"),
                        help="folder holding wsync.h, for compiling the C path")
    parser.add_argument("--cc", default=os.environ.get("CC", "cc"), help="C compiler")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args()

    torch.set_num_threads(1)
    n = args.tensors
    tensors = make_tensors(n)
    strategy, engine, sender, receiver = make_pair(n)
    try:
        bench_binding(sender, receiver, tensors, 2, "torch")  # warm up: first touch, caches
        floor_send, floor_recv = bench_ctypes_floor(sender, receiver, tensors, args.reps)
        bind_send, bind_recv = bench_binding(sender, receiver, tensors, args.reps, "torch")
        np_send, np_recv = bench_binding(sender, receiver, tensors, args.reps, "numpy")
    finally:
        receiver.close()
        sender.close()
        engine.close()
        strategy.close()
    bind_plan = bench_plan(tensors, args.reps)
    c_path, why = run_c_path(n, args.reps, args.include, args.cc)

    binding = bind_send + bind_recv
    floor = floor_send + floor_recv
    result = {
        "tensors": n, "reps": args.reps, "library": wsync.version(),
        "binding_torch_us": {"send": bind_send, "receive_iterate": bind_recv, "total": binding},
        "binding_numpy_us": {"send": np_send, "receive_iterate": np_recv,
                             "total": np_send + np_recv},
        "ctypes_floor_us": {"send": floor_send, "receive_iterate": floor_recv, "total": floor},
        "binding_plan_us": bind_plan,
    }
    if c_path:
        c_total = c_path["send_us"] + c_path["receive_iterate_us"]
        result["c_path_us"] = {"send": c_path["send_us"],
                               "receive_iterate": c_path["receive_iterate_us"], "total": c_total,
                               "plan": c_path["plan_us"]}
        baseline, baseline_name = c_total, "C path"
        result["plan_overhead_us"] = bind_plan - c_path["plan_us"]
    else:
        result["c_path_unavailable"] = why
        baseline, baseline_name = floor, "ctypes floor (no C compiler: C path not measured)"
    overhead = binding - baseline
    result.update({"baseline": baseline_name, "binding_overhead_us": overhead,
                   "ratio": binding / baseline, "target_us": TARGET_US,
                   "within_target": overhead <= TARGET_US})

    if args.json:
        print(json.dumps(result, indent=2))
        return 0 if result["within_target"] else 1
    print(f"wsync binding overhead, {n} tensors of 4x4 float32 in one chunk, shm, checksums off, "
          f"median of {args.reps} (us per tensor)")
    print(f"  {'':34s} {'send':>8s} {'recv+iter':>10s} {'total':>8s} {'plan':>8s}")
    rows = [("binding, torch views", bind_send, bind_recv, bind_plan),
            ("binding, numpy views", np_send, np_recv, None)]
    if c_path:
        rows.append(("C path (c_path.c, same run)", c_path["send_us"],
                     c_path["receive_iterate_us"], c_path["plan_us"]))
    rows.append(("ctypes floor (C + 1 call/view)", floor_send, floor_recv, None))
    for label, s, r, pl in rows:
        plan_text = f"{pl:8.2f}" if pl is not None else f"{'':8s}"
        print(f"  {label:34s} {s:8.2f} {r:10.2f} {s + r:8.2f} {plan_text}")
    if not c_path:
        print(f"  C path not measured: {why}")
    print(f"binding overhead vs {baseline_name}: {overhead:.2f} us/tensor "
          f"(binding {binding:.2f} / baseline {baseline:.2f} = {result['ratio']:.2f}x)")
    print(f"target <= {TARGET_US:.0f} us/tensor: {'met' if result['within_target'] else 'NOT met'}")
    return 0 if result["within_target"] else 1


if __name__ == "__main__":
    sys.exit(main())
