#!/usr/bin/env bash
# Delta sync's crossover, measured (issue 35, docs/delta.md "The crossover"): dense against
# delta ("size": every version compared, each tensor a patch within its budget) against "auto"
# (by cost), over the ucx kind between two network namespaces joined by a veth pair whose both
# ends `tc` shapes (tbf) to each rate, at each changed fraction. Prints per cell the sync time
# as a ratio to the dense sync measured at the same rate in the same run, and which way each
# "auto" version went (P patches, D dense; versions 2..N).
#   scripts/delta-crossover.sh [WSYNC_BINARY]          the full table (several minutes)
#   scripts/delta-crossover.sh --smoke [WSYNC_BINARY]  one small cell (CI: tests/CMakeLists.txt)
# Environment: RATES (Gbit/s, default "1 10 25"), FRACTIONS (default 0.001,0.01,0.05,0.25),
# SIZE_MB (default 512), STEPS (default 6). Needs root, iproute2 and tc; exits 77 (skip) without.
set -euo pipefail
smoke=0
if [ "${1:-}" = --smoke ]; then smoke=1; shift; fi
here=$(cd "$(dirname "$0")/.." && pwd)
bin=${1:-$here/build/tools/wsync}
if [ "$smoke" = 1 ]; then
  RATES=${RATES:-1} FRACTIONS=${FRACTIONS:-0.01} SIZE_MB=${SIZE_MB:-32} STEPS=${STEPS:-3}
else
  RATES=${RATES:-"1 10 25"} FRACTIONS=${FRACTIONS:-0.001,0.01,0.05,0.25} SIZE_MB=${SIZE_MB:-512} STEPS=${STEPS:-6}
fi
skip() { echo "SKIP: $*"; exit 77; }
[ "$(id -u)" -eq 0 ] || skip "network namespaces and tc need root"
command -v ip >/dev/null || skip "iproute2's ip is not installed"
command -v tc >/dev/null || skip "tc (iproute2) is not installed"
[ -x "$bin" ] || { echo "no wsync tool at $bin" >&2; exit 2; }
tag="wsx$$" nst="wsx$$t" nse="wsx$$e"
out=$(mktemp -d /tmp/wsync-crossover.XXXXXX)
cleanup() {
  ip netns del "$nst" 2>/dev/null || true
  ip netns del "$nse" 2>/dev/null || true
  rm -rf "$out"
}
trap cleanup EXIT
ip netns add "$nst" 2>"$out/err" || skip "cannot create a network namespace: $(cat "$out/err")"
ip netns add "$nse"
# The same device name at both ends (each in its own namespace), so one --net-devices serves both.
ip link add "$tag" netns "$nst" type veth peer name "$tag" netns "$nse" || skip "cannot create a veth pair"
ip -n "$nst" addr add 10.237.9.1/24 dev "$tag"
ip -n "$nse" addr add 10.237.9.2/24 dev "$tag"
for ns in "$nst" "$nse"; do ip -n "$ns" link set lo up; ip -n "$ns" link set "$tag" up; done
for _ in $(seq 1 100); do
  ip -n "$nst" link show dev "$tag" | grep -q "state UP" && ip -n "$nse" link show dev "$tag" | grep -q "state UP" && break
  sleep 0.05
done
for rate in $RATES; do
  # tbf: the bucket holds 4 ms of the rate (at least 1 MB), so the shaper, not the timer
  # granularity, sets the rate at 25 Gbit/s.
  burst=$(( rate * 1000000000 / 8 / 250 )); [ "$burst" -ge 1048576 ] || burst=1048576
  for ns in "$nst" "$nse"; do
    ip netns exec "$ns" tc qdisc replace dev "$tag" root tbf rate "${rate}gbit" burst "$burst" latency 200ms
  done
  echo "rate ${rate} Gbit/s: wsync bench --delta-fraction $FRACTIONS --delta size,auto --size-mb $SIZE_MB --steps $STEPS" >&2
  ip netns exec "$nst" "$bin" bench --delta-fraction "$FRACTIONS" --delta size,auto --strategy ucx \
    --transports tcp --net-devices "$tag" --engine-netns "$nse" --size-mb "$SIZE_MB" --steps "$STEPS" \
    --json > "$out/rate$rate.json"
done
python3 - "$out" $RATES <<'PY'
import json, sys
out, rates = sys.argv[1], sys.argv[2:]
print("ucx over a veth pair shaped with tc tbf; sync time as a ratio to dense at the same rate")
print("dense2 x: dense run again after the delta runs, to the first (the baseline's own spread)")
print(f"{'Gbit/s':>6} {'dense ms':>9} {'dense2 x':>8} {'changed':>8} {'delta x':>8} {'auto x':>7}  auto chose (versions 2..)  ms each: dense | auto")
for r in rates:
    j = json.load(open(f"{out}/rate{r}.json"))
    dense = j["dense"]["sync_ms"]
    again = j["dense_again"]["sync_ratio"]
    cells = {}
    for run in j["delta_runs"]:
        cells.setdefault(run["fraction"], {})[run["mode"]] = run
    for f, c in cells.items():
        print(f"{r:>6} {dense:>9.1f} {again:>8.3f} {f:>8g} {c['size']['sync_ratio']:>8.3f} "
              f"{c['auto']['sync_ratio']:>7.3f}  {c['auto']['chose']:<25} "
              f"{' '.join('%.0f' % x for x in j['dense'].get('sync_ms_each', []))} | "
              f"{' '.join('%.0f' % x for x in c['auto'].get('sync_ms_each', []))}")
PY
