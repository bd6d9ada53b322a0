#!/usr/bin/env bash
# Real-GPU validation of libwsync in one command, and its fake-driver twin for CI.
#
#   scripts/gpu-validate.sh            on a machine with an NVIDIA GPU: builds, runs the `gpu`
#                                      CTest label, the Python GPU tests, `wsync bench --strategy
#                                      cuda_ipc` (per-allocation, packed, packed with a bf16 cast)
#                                      and scripts/gpu_baseline.py (one device copy and today's
#                                      per-tensor torch IPC practice beside libwsync, same run),
#                                      the pack and delta kernels against one device copy,
#                                      then appends a dated section to docs/gpu-validation.md.
#   scripts/gpu-validate.sh --fake     the same steps against tests/fake_gpu (CUDA driver and NCCL
#                                      as a library; small sizes); hardware-only steps skip with
#                                      their reason. CI runs this. The record goes to
#                                      BUILD/gpu-validation-fake.md unless --record says otherwise.
#
# Options: --build-dir DIR (default build-gpu; reuse an existing build), --record FILE,
#          --size-gb N (bench size, default 16), --layers N (baseline model, default 32 = 8B),
#          --out DIR (also copy the record and every raw output there as the steps finish: on a
#          device machine, $OUT, whose files come back), --step-timeout S (each step's own
#          limit, default 300 s; a step past it fails, and the next one runs).
# The baseline runs twice: with PyTorch's default allocator and with
# PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (trainer and engine), as many RL stacks set.
# WSYNC_RECORD_COMMIT names the commit in the record where `git rev-parse HEAD` would not (a
# copied tree on a device machine).
# Exits non-zero if any step fails; a skipped step is recorded with its reason. PYTHON names the
# interpreter that has torch and pytest (default: python3).
#
# The GPU machine may have no package registry. Dependencies the build needs there (cmocka,
# nlohmann-json, xxhash) can travel as unpacked Debian packages: run `scripts/gpu-validate.sh
# --pack-deps` on a Debian machine with apt, carry the .gpu-deps folder, and this script finds it.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD

mode=hardware build_dir=build-gpu record="" size_gb=16 layers=32 out="" step_timeout=300
python=${PYTHON:-python3}  # the Python with torch (and pytest) in it
while [ $# -gt 0 ]; do
  case "$1" in
    --fake) mode=fake ;;
    --build-dir) build_dir=$2; shift ;;
    --record) record=$2; shift ;;
    --size-gb) size_gb=$2; shift ;;
    --layers) layers=$2; shift ;;
    --out) out=$2; shift ;;
    --step-timeout) step_timeout=$2; shift ;;
    --pack-deps)
      rm -rf .gpu-deps && mkdir -p .gpu-deps/debs .gpu-deps/root
      # pkgconf too: CMake needs a pkg-config to find cmocka, and GPU images often lack one.
      # UCX (and what libucp needs) so the ucx kind is built and its GPU-trainer tests run, and
      # libssl3 (libcrypto.so.3: the ucx kind's HMAC-SHA256, opened at run time).
      (cd .gpu-deps/debs && apt-get download libcmocka0 libcmocka-dev nlohmann-json3-dev libxxhash-dev \
         pkgconf pkgconf-bin libpkgconf3 libucx0 libucx-dev libnuma1 libibverbs1 librdmacm1 libssl3)
      for d in .gpu-deps/debs/*.deb; do dpkg -x "$d" .gpu-deps/root; done
      grep -qx '/.gpu-deps/' .git/info/exclude 2>/dev/null || echo '/.gpu-deps/' >> .git/info/exclude
      echo "packed: $(ls .gpu-deps/debs | tr '\n' ' ')"; exit 0 ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "gpu-validate: unknown option $1 (see --help)" >&2; exit 2 ;;
  esac
  shift
done
[ -n "$record" ] || { [ $mode = fake ] && record=$build_dir/gpu-validation-fake.md || record=docs/gpu-validation.md; }

if [ -d .gpu-deps/root ]; then
  dep=$root/.gpu-deps/root
  export CMAKE_PREFIX_PATH=$dep/usr${CMAKE_PREFIX_PATH:+:$CMAKE_PREFIX_PATH}
  export CPATH=$dep/usr/include${CPATH:+:$CPATH}
  export PKG_CONFIG_PATH=$dep/usr/lib/x86_64-linux-gnu/pkgconfig${PKG_CONFIG_PATH:+:$PKG_CONFIG_PATH}
  export LD_LIBRARY_PATH=$dep/usr/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
  export LIBRARY_PATH=$dep/usr/lib/x86_64-linux-gnu${LIBRARY_PATH:+:$LIBRARY_PATH}
  # The carried pkgconf only where the machine has no pkg-config of its own; its .pc files say
  # prefix=/usr, so the sysroot variable points their -I/-L at the carried tree.
  if ! command -v pkg-config >/dev/null && [ -x "$dep/usr/bin/pkgconf" ]; then
    export PATH=$dep/usr/bin:$PATH PKG_CONFIG_SYSROOT_DIR=$dep
    export PKG_CONFIG_LIBDIR=$dep/usr/lib/x86_64-linux-gnu/pkgconfig:$dep/usr/share/pkgconfig
  fi
fi
# NCCL: where the system has no libnccl.so.2, the one PyTorch's wheel ships (nvidia-nccl-cu1x).
if [ -z "${WSYNC_NCCL_LIBRARY:-}" ] && ! ldconfig -p 2>/dev/null | grep -q 'libnccl\.so\.2'; then
  nccl=$("$python" -c 'import glob, os, nvidia; print(next(iter(sorted(p for d in nvidia.__path__ for p in glob.glob(os.path.join(d, "nccl*", "lib", "libnccl.so.2")))), ""))' 2>/dev/null || true)
  [ -n "$nccl" ] && export WSYNC_NCCL_LIBRARY=$nccl
fi

log=$(mktemp -d)
trap 'rm -rf "$log"' EXIT
failures=()
[ -z "$out" ] || mkdir -p "$out"
# Copies the raw outputs so far to --out (a device machine's $OUT returns at most 8 files: the
# outputs travel as one tarball, the record and the console log beside it).
save() { [ -z "$out" ] || tar -C "$log" -czf "$out/raw-outputs.tgz" . 2>/dev/null || true; }
step() { save; printf '\n==== gpu-validate: %s ====\n' "$*"; }
# Each step under its own limit: a hung GPU call fails that step, not the whole validation.
bounded() { timeout --kill-after=10 "$step_timeout" "$@"; }

step "build ($build_dir)"
# Tests and the tool on the command line: a reused build directory's cache may have them off
# (as scripts/demo.sh's build had, issue 36), and every step needs them (the CTest label,
# tests/fake_gpu, pack_bench and delta_bench are tests; the bench is the tool).
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWSYNC_BUILD_TESTS=ON \
  -DWSYNC_BUILD_TOOLS=ON >/dev/null
cmake --build "$build_dir" -j"$(nproc)" >/dev/null
wsync_cli=$build_dir/tools/wsync
if [ $mode = fake ]; then
  fake=$root/$build_dir/tests/fake_gpu/libwsync_fakegpu.so
  export WSYNC_CUDA_LIBRARY=$fake WSYNC_NCCL_LIBRARY=$fake
  label=gpu-fake bench_size=(--size-mb 64 --bucket-mb 16) steps=3
else
  label=gpu bench_size=(--size-gb "$size_gb") steps=5
fi

step "environment"
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1 || true)
[ -n "$gpu" ] || gpu="none ($mode: $( [ $mode = fake ] && echo "fake driver $WSYNC_CUDA_LIBRARY" || echo "nvidia-smi found no GPU"))"
kinds=$("$wsync_cli" kinds)
runtime() { python3 -c 'import json,sys; k=[x for x in json.load(sys.stdin) if x["kind"]==sys.argv[1]][0]; print(k["runtime"] if k["available"] else "unavailable: "+k["reason"])' "$1" <<<"$kinds"; }
cuda_rt=$(runtime cuda_ipc) nccl_rt=$(runtime nccl_broadcast)
torch_v=$("$python" -c 'import torch; print(torch.__version__, "cuda", torch.version.cuda, "available" if torch.cuda.is_available() else "not available")' 2>/dev/null || echo "not installed")
echo "GPU: $gpu"; echo "cuda_ipc: $cuda_rt"; echo "nccl_broadcast: $nccl_rt"; echo "torch: $torch_v"
if [ $mode = hardware ] && [[ "$cuda_rt" == unavailable* ]]; then
  echo "gpu-validate: the CUDA driver is unavailable here ($cuda_rt); use --fake without a GPU" >&2
  exit 1
fi

step "CTest label $label"
set +e
# --no-tests=error: a label that selects no test is a failure, not a pass.
(cd "$build_dir" && bounded ctest -L "$label" --no-tests=error --output-on-failure) > "$log/ctest.txt" 2>&1
ctest_rc=$?
set -e
cat "$log/ctest.txt"
[ $ctest_rc -eq 0 ] || failures+=("ctest -L $label")

step "Python GPU tests"
set +e
WSYNC_LIBRARY=$root/$build_dir/libwsync.so bounded "$python" -m pytest -q -rs -p no:cacheprovider \
  bindings/python/tests/test_gpu.py > "$log/pytest.txt" 2>&1
py_rc=$?
set -e
cat "$log/pytest.txt"
[ $py_rc -eq 0 ] || failures+=("pytest test_gpu.py")

step "wsync bench --strategy cuda_ipc"
: > "$log/bench.jsonl"
for variant in "--packed false" "--packed true" "--packed true --dtype bfloat16"; do
  # shellcheck disable=SC2086
  if got=$(bounded "$wsync_cli" bench --strategy cuda_ipc $variant "${bench_size[@]}" --steps $steps --json 2>&1); then
    echo "{\"variant\": \"$variant\", \"result\": $(tail -1 <<<"$got")}" >> "$log/bench.jsonl"
    tail -1 <<<"$got"
  else
    echo "$got"; failures+=("bench cuda_ipc $variant")
    echo "{\"variant\": \"$variant\", \"error\": \"failed\"}" >> "$log/bench.jsonl"
  fi
done

step "pack kernel against one device copy of the same bytes (tests/gpu/pack_bench.cpp)"
pack_args=(--layers 2 --reps 20); [ $mode = fake ] && pack_args=(--layers 1 --reps 2)
if bounded "$build_dir/tests/pack_bench" "${pack_args[@]}" > "$log/pack.json" 2> "$log/pack.err"; then
  cat "$log/pack.json"
else
  cat "$log/pack.json" "$log/pack.err"; failures+=("pack_bench")
fi

step "wsync bench --delta-fraction --strategy cuda_ipc (delta against dense end to end, same run)"
dsize=(--size-mb 2048 --steps 4); [ $mode = fake ] && dsize=(--size-mb 64 --steps 3)
if bounded "$wsync_cli" bench --delta-fraction 0.001,0.01,0.05,1.0 --strategy cuda_ipc "${dsize[@]}" --json \
     > "$log/delta_e2e.json" 2> "$log/delta_e2e.err"; then
  cat "$log/delta_e2e.json"
else
  cat "$log/delta_e2e.json" "$log/delta_e2e.err"; failures+=("bench delta cuda_ipc")
fi

step "delta kernels (compare + compact, verified apply, fold, tree hash) against one device copy (tests/gpu/delta_bench.cpp)"
delta_args=(--layers 2 --reps 10); [ $mode = fake ] && delta_args=(--layers 1 --reps 2 --hidden 512)
if bounded "$build_dir/tests/delta_bench" "${delta_args[@]}" > "$log/delta.jsonl" 2> "$log/delta.err"; then
  cat "$log/delta.jsonl"
else
  cat "$log/delta.jsonl" "$log/delta.err"; failures+=("delta_bench")
fi

step "wsync bench --strategy ucx --gpu (GPU trainer to GPU engine through pinned staging, over loopback tcp)"
usize=(--size-mb 2048 --steps 5); [ $mode = fake ] && usize=(--size-mb 32 --steps 3 --chunk-mb 8)
if "$wsync_cli" kinds | grep -q '"kind":"ucx"[^}]*"available":true\|"available":true,"kind":"ucx"'; then
  if bounded "$wsync_cli" bench --strategy ucx --gpu "${usize[@]}" --json > "$log/ucx_gpu.json" 2> "$log/ucx_gpu.err"; then
    tail -1 "$log/ucx_gpu.json"
  else
    cat "$log/ucx_gpu.json" "$log/ucx_gpu.err"; failures+=("bench ucx --gpu")
  fi
else
  echo "skipped: this build or machine has no usable ucx kind (carry UCX with --pack-deps)" | tee "$log/ucx_gpu.err"
fi

for alloc in default expandable; do
  suffix=$([ $alloc = default ] && echo "" || echo "_expandable")
  step "baseline ($alloc allocator): one device copy, torch IPC (per tensor, cached handles, bucketed) and libwsync, same run"
  conf=$([ $alloc = default ] && echo "${PYTORCH_CUDA_ALLOC_CONF:-}" || echo "expandable_segments:True")
  set +e
  PYTORCH_CUDA_ALLOC_CONF=$conf WSYNC_LIBRARY=$root/$build_dir/libwsync.so \
    PYTHONPATH=$root/bindings/python${PYTHONPATH:+:$PYTHONPATH} \
    bounded "$python" scripts/gpu_baseline.py --layers "$layers" --steps $steps \
    > "$log/baseline$suffix.json" 2> "$log/baseline$suffix.err"
  base_rc=$?
  set -e
  cat "$log/baseline$suffix.json"; tail -20 "$log/baseline$suffix.err"
  [ $base_rc -eq 0 ] || failures+=("gpu_baseline.py ($alloc allocator)")
done

step "record ($record)"
python3 - "$record" "$mode" "$gpu" "$cuda_rt" "$nccl_rt" "$torch_v" "$log" "${failures[@]+"${failures[@]}"}" <<'EOF'
import datetime, json, os, re, subprocess, sys
record, mode, gpu, cuda_rt, nccl_rt, torch_v, log, *failed = sys.argv[1:]
L = []
# A device machine's copy of the tree may carry another checkout's .git (its HEAD is not what
# runs there): WSYNC_RECORD_COMMIT, set by whoever starts the run, names the tree instead.
commit = os.environ.get("WSYNC_RECORD_COMMIT") or subprocess.run(
    ["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True).stdout.strip()
title = "hardware" if mode == "hardware" else "fake driver (tests/fake_gpu): logic only, no hardware figures"
L.append(f"\n### {datetime.date.today().isoformat()}: {title}\n")
L.append(f"- commit `{commit or 'unknown'}`, by `scripts/gpu-validate.sh{' --fake' if mode == 'fake' else ''}`")
L.append(f"- GPU and driver: {gpu}\n- CUDA (cuda_ipc): {cuda_rt}\n- NCCL (nccl_broadcast): {nccl_rt}\n- torch: {torch_v}")
L.append("\n| test | result |\n|---|---|")
for line in open(os.path.join(log, "ctest.txt")):
    m = re.search(r"Test\s+#\d+: (\S+) \.+\s*(\*+)?\s*(Passed|Failed|Skipped|Not Run|Timeout|Exception)", line)
    if m:
        L.append(f"| {m.group(1)} | {m.group(3)} |")
py = open(os.path.join(log, "pytest.txt")).read().strip().splitlines()
L.append(f"| Python `test_gpu.py` | {py[-1] if py else 'no output'} |")
L.append("\n| figure | value |\n|---|---|")
for line in open(os.path.join(log, "bench.jsonl")):
    try:
        b = json.loads(line)
    except ValueError:
        continue
    if "error" in b:
        L.append(f"| bench cuda_ipc {b.get('variant')} | failed |"); continue
    variant, b = b["variant"], b["result"]
    name = f"bench cuda_ipc {variant} ({b['bytes'] / 1e9:.2f} GB, {b['tensors']} tensors)"
    L.append(f"| {name} | steady {b['steady_sync_s']:.4f} s = {b['ratio_to_d2d']:.3f}x one device copy ({b['baseline_d2d_s']:.4f} s); first sync {b['first_sync_s']:.3f} s |")
try:
    p = json.load(open(os.path.join(log, "pack.json")))
    L.append(f"| pack kernel, {p['tensors']} tensors in one launch ({p['bytes'] / 1e9:.2f} GB, {p['tiles']} tiles) | {p['pack_s']:.5f} s ({p['pack_gbps']} GB/s) = {p['pack_to_copy']:.3f}x one cuMemcpyDtoDAsync of the same bytes ({p['copy_s']:.5f} s, {p['copy_gbps']} GB/s); as the library packs (copies of {p.get('driver_copy_min', 0) >> 20} MiB or more by the driver) {p.get('hybrid_s', 0):.5f} s = {p.get('hybrid_to_copy', 0):.3f}x{'' if p['exact'] else ', NOT bit-exact'} |")
except (OSError, ValueError, KeyError):
    L.append("| pack kernel | no result (see pack_bench's output) |")
try:
    e = json.load(open(os.path.join(log, "delta_e2e.json")))
    d = e["dense"]
    L.append(f"| bench cuda_ipc delta, dense ({e['model_bytes'] / 1e9:.2f} GB, {e['tensors']} tensors) | sync {d['sync_ms']:.1f} ms (send {d['send_ms']:.1f}, engine {d['apply_ms']:.1f}) |")
    for r in e["delta_runs"]:
        L.append(f"| bench cuda_ipc delta, {r['fraction'] * 100:g}% changed | {r['bytes_ratio']:.4f}x the bytes; sync {r['sync_ms']:.1f} ms = {r['sync_ratio']:.3f}x dense (send {r['send_ms']:.1f}, engine {r['apply_ms']:.1f}) |")
except (OSError, ValueError, KeyError):
    L.append("| bench cuda_ipc delta | no result (see its output) |")
try:
    for line in open(os.path.join(log, "delta.jsonl")):
        d = json.loads(line)
        L.append(f"| delta kernels, {d['fraction'] * 100:g}% changed ({d['bytes'] / 1e9:.2f} GB, {d['tensors']} tensors, patches {d['patch_bytes'] / 1e6:.1f} MB) | diff {d['diff_s']:.5f} s = {d['diff_to_copy']:.3f}x one device copy ({d['copy_s']:.5f} s); verified apply {d['apply_s']:.5f} s = {d['apply_to_copy']:.3f}x; fold {d['fold_s']:.5f} s; tree hash {d['hash_gbps']} GB/s; bases in pinned host memory: diff {d.get('diff_pinned_s', float('nan')):.5f} s = {d.get('diff_pinned_to_h2d', float('nan')):.3f}x one pinned-to-device copy ({d.get('h2d_s', float('nan')):.5f} s){'' if d['exact'] else ', NOT bit-exact'} |")
except (OSError, ValueError, KeyError):
    L.append("| delta kernels | no result (see delta_bench's output) |")
try:
    u = json.loads(open(os.path.join(log, "ucx_gpu.json")).read().strip().splitlines()[-1])
    L.append(f"| bench ucx --gpu ({u['bytes'] / 1e9:.2f} GB, {u['tensors']} tensors, {u['transports']} over {u['net_devices']}) | steady {u['steady_sync_s']:.4f} s ({u['steady_gbps']} GB/s) = {u['ratio_to_raw_get']:.3f}x UCX's raw GET of host memory ({u['raw_get_gbps']} GB/s); first sync {u['first_sync_s']:.3f} s |")
except (OSError, ValueError, KeyError, IndexError):
    why = open(os.path.join(log, "ucx_gpu.err")).read().strip().splitlines() if os.path.exists(os.path.join(log, "ucx_gpu.err")) else []
    L.append(f"| bench ucx --gpu | no result ({why[-1] if why else 'see its output'}) |")
for suffix, label in (("", "default allocator"), ("_expandable", "expandable_segments:True")):
  try:
    base = json.load(open(os.path.join(log, f"baseline{suffix}.json")))
  except (OSError, ValueError):
    base = {"skipped": "no JSON from gpu_baseline.py (see its error output)"}
  if "skipped" in base:
    L.append(f"| baseline, {label} (d2d, torch IPC, wsync) | skipped: {base['skipped']} |")
  else:
    L.append(f"| baseline model, {label} | {base['tensors']} tensors, {base['bytes'] / 1e9:.2f} GB bf16 |")
    for k, v in base["methods"].items():
        k = f"{k} ({label})"
        if "error" in v:
            L.append(f"| {k} | error: {v['error']} |")
        else:
            exact = "" if "bit_exact" not in v else (", bit-exact" if v["bit_exact"] else ", NOT bit-exact")
            L.append(f"| {k} | steady {v['steady_s']:.4f} s ({v['steady_gbps']} GB/s), first {v['first_s']:.3f} s{exact} |")
            if "engine" in v:
                e = v["engine"]
                split = "" if "end_s_per_step" not in e else f" (receive {e['receive_s_per_step']:.4f} s, end {e['end_s_per_step']:.4f} s)"
                L.append(f"| {k}: engine | load() {e['load_s_per_step']:.4f} s a step over {e['loads_per_step']:g} chunks{split}; one CUDA view {e['view_us_per_tensor']} us, one copy_ launch {e['copy_launch_us']} us |")
    for k, v in base.get("ratios", {}).items():
        L.append(f"| {k} ({label}) | {v} |")
L.append(f"\nVerdict: {'PASS' if not failed else 'FAIL: ' + '; '.join(failed)}.")
with open(record, "a") as f:
    f.write("\n".join(L) + "\n")
print("\n".join(L))
EOF

save
[ -z "$out" ] || [ "$record" -ef "$out/record.md" ] || cp "$record" "$out/record.md"
if [ ${#failures[@]} -gt 0 ]; then
  echo "gpu-validate: FAILED: ${failures[*]}" >&2
  exit 1
fi
echo "gpu-validate: all steps passed ($mode)"
