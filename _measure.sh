#!/usr/bin/env bash
# One-off measuring run (not committed): pack kernel vs hybrid, baseline with timelines, variants.
set -u
root=$PWD; O=${OUT:-/tmp/out}; mkdir -p $O
dep=$root/.gpu-deps/root
export CMAKE_PREFIX_PATH=$dep/usr CPATH=$dep/usr/include PKG_CONFIG_PATH=$dep/usr/lib/x86_64-linux-gnu/pkgconfig
export LD_LIBRARY_PATH=$dep/usr/lib/x86_64-linux-gnu LIBRARY_PATH=$dep/usr/lib/x86_64-linux-gnu
if ! command -v pkg-config >/dev/null; then export PATH=$dep/usr/bin:$PATH PKG_CONFIG_SYSROOT_DIR=$dep PKG_CONFIG_LIBDIR=$dep/usr/lib/x86_64-linux-gnu/pkgconfig:$dep/usr/share/pkgconfig; fi
timeout 120 cmake -S . -B build-gpu -DCMAKE_BUILD_TYPE=RelWithDebInfo -DWSYNC_BUILD_TESTS=ON -DWSYNC_BUILD_TOOLS=ON >/dev/null && timeout 150 cmake --build build-gpu -j16 >/dev/null || { echo BUILD FAILED; exit 1; }
echo built $(date +%T)
timeout 60 build-gpu/tests/gpu/pack_bench --layers 2 > $O/pack.json 2>&1; cat $O/pack.json
timeout 60 build-gpu/tests/gpu/pack_bench --layers 1 >> $O/pack.json 2>&1
for v in "--packed false" "--packed true"; do timeout 90 build-gpu/tools/wsync bench --strategy cuda_ipc $v --size-gb 8 --json >> $O/bench.jsonl 2>>$O/bench.err; done
python3 -c "
import json
for l in open('$O/bench.jsonl'):
    r=json.loads(l); r=r.get('result',r); print('bench packed', r.get('packed'), r.get('ratio_to_d2d'))
"
export WSYNC_LIBRARY=$root/build-gpu/libwsync.so PYTHONPATH=$root/bindings/python
run() { name=$1; shift; timeout 150 python3 scripts/gpu_baseline.py --steps 6 "$@" > $O/$name.json 2> $O/$name.err; echo "$name rc=$?"; python3 - $O/$name.json <<'PY'
import json,sys
d=json.load(open(sys.argv[1]))
print(d.get('wsync'), d['ratios'])
for k,v in d['methods'].items():
    if 'steps_s' in v: print(k, v['steady_s'], v['steps_s'], v.get('trainer'), {a:b for a,b in v.get('engine',{}).items() if a.endswith('per_step')})
    else: print(k, v)
PY
}
run base --methods d2d,torch_ipc_cached,torch_packed,wsync_packed,wsync_unpacked
run b4 --methods d2d,wsync_packed --wsync-buckets 4
run c4g --methods d2d,wsync_unpacked --wsync-chunk-mb 4096
PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True run exp --methods d2d,torch_packed,wsync_packed
