#!/usr/bin/env bash
# The ucx kind between "hosts": a trainer in one network namespace and two engines in another,
# joined by a veth pair (MODE netns), or the same processes over loopback (MODE loopback, and
# the fallback where namespaces cannot be made: then the netns tests skip with the reason).
# Each scenario asserts what the trainer and each engine see (named status, the peer named),
# the time it took, and that nothing is left behind (namespaces, veths, processes).
#   scenarios.sh MODE SCENARIO PEER_BINARY
set -u
mode=$1 scenario=$2 peer=$3
tag="wsu$$"
nst="${tag}t" nse="${tag}e" vt="${tag}a" ve="${tag}b"
dir=$(mktemp -d /tmp/wsync-ucx.XXXXXX)
pids=()
fail=0

cleanup() {
  for p in "${pids[@]}"; do kill -CONT "$p" 2>/dev/null; kill -KILL "$p" 2>/dev/null; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null; done
  if [ "$mode" = netns ]; then
    ip netns del "$nst" 2>/dev/null
    ip netns del "$nse" 2>/dev/null
  fi
  rm -rf "$dir"
}
trap cleanup EXIT

skip() { echo "SKIP: $*"; exit 77; }
bad() { echo "FAIL: $*"; fail=1; }

if [ "$mode" = netns ]; then
  [ "$(id -u)" -eq 0 ] || skip "network namespaces need root (the loopback variant runs the same scenario)"
  command -v ip >/dev/null || skip "iproute2's ip is not installed"
  ip netns add "$nst" 2>"$dir/err" || skip "cannot create a network namespace: $(cat "$dir/err")"
  ip netns add "$nse" || skip "cannot create a second network namespace"
  ip link add "$vt" netns "$nst" type veth peer name "$ve" netns "$nse" || skip "cannot create a veth pair"
  ip -n "$nst" addr add 10.231.7.1/24 dev "$vt"
  ip -n "$nse" addr add 10.231.7.2/24 dev "$ve"
  for ns in "$nst" "$nse"; do ip -n "$ns" link set lo up; done
  ip -n "$nst" link set "$vt" up
  ip -n "$nse" link set "$ve" up
  # UCX lists a tcp device only once it is running (carrier on both ends).
  for _ in $(seq 1 100); do
    ip -n "$nst" link show dev "$vt" | grep -q "state UP" && ip -n "$nse" link show dev "$ve" | grep -q "state UP" && break
    sleep 0.05
  done
  pre_t=(ip netns exec "$nst") pre_e=(ip netns exec "$nse")  # exec: $! is the peer itself
  dev_t=$vt dev_e=$ve
else
  [ "$scenario" = link_down ] && skip "bringing a link down needs the netns variant (a veth between namespaces)"
  pre_t=() pre_e=()
  dev_t=lo dev_e=lo
fi

opts() {  # device timeout_ms
  echo "{\"receivers\":2,\"transports\":\"tcp\",\"net_devices\":\"$1\",\"timeout_ms\":$2}"
}
start_trainer() {  # versions engines [step]
  "${pre_t[@]}" "$peer" trainer "$dir" "$(opts "$dev_t" "${T_TIMEOUT:-10000}")" "$@" >"$dir/trainer.log" 2>&1 &
  pids+=($!); trainer_pid=$!
}
start_engine() {  # index from to [slow_ms]
  "${pre_e[@]}" "$peer" engine "$dir" "$(opts "$dev_e" "${E_TIMEOUT:-10000}")" "$@" >"$dir/engine$1.log" 2>&1 &
  pids+=($!); eval "engine$1_pid=$!"
}
wait_for() {  # file pattern seconds
  for _ in $(seq 1 $(($3 * 20))); do grep -q -- "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done
  bad "waited $3 s for \"$2\" in $(basename "$1")"; return 1
}
expect() {  # file pattern
  grep -q -- "$2" "$1" || bad "$(basename "$1") lacks \"$2\""
}
finish() {  # seconds: wait for every process, then the bound
  local limit=$1 p
  for p in "${pids[@]}"; do
    for _ in $(seq 1 $((limit * 10))); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  done
  for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && bad "process $p still runs after $limit s"; done
}

start=$(date +%s)
export WSYNC_PEER_TENSOR_BYTES=${WSYNC_PEER_TENSOR_BYTES:-1048576}
case $scenario in
two_engines)
  start_trainer 4 2
  start_engine 0 1 4
  start_engine 1 1 4
  finish 60
  for v in 1 2 3 4; do expect "$dir/trainer.log" "flush v$v ok"; done
  for e in 0 1; do for v in 1 2 3 4; do expect "$dir/engine$e.log" "engine $e: version $v ok"; done; done
  ;;
engine_killed)  # engine 1 dies mid-pull of version 1: named in the flush, the rest go on
  export WSYNC_PEER_TENSOR_BYTES=4194304
  start_trainer 3 2
  start_engine 0 1 3
  start_engine 1 1 3 400
  wait_for "$dir/trainer.log" "trainer: ready" 20
  sleep 0.6
  kill -KILL "$engine1_pid"
  finish 40
  expect "$dir/trainer.log" "flush v1 WSYNC_ERR_PEER"
  expect "$dir/trainer.log" "receiver 1 ("
  expect "$dir/trainer.log" "failure what=2 receiver=1"
  expect "$dir/trainer.log" "flush v2 ok"
  expect "$dir/trainer.log" "flush v3 ok"
  for v in 1 2 3; do expect "$dir/engine0.log" "engine 0: version $v ok"; done
  ;;
late_joiner)  # engine 1 attaches after version 3 committed and pulls 3, then 4 and 5
  start_trainer 5 1 1
  start_engine 0 1 5
  for v in 1 2 3; do touch "$dir/go-$v"; wait_for "$dir/trainer.log" "flush v$v ok" 20; done
  start_engine 1 0 5
  wait_for "$dir/engine1.log" "attached, from version 3" 20
  touch "$dir/go-4" "$dir/go-5"
  finish 60
  for v in 3 4 5; do expect "$dir/engine1.log" "engine 1: version $v ok"; done
  for v in 1 2 3 4 5; do expect "$dir/engine0.log" "engine 0: version $v ok"; expect "$dir/trainer.log" "flush v$v ok"; done
  ;;
frozen_engine)  # engine 1 stops (SIGSTOP) before pulling: the flush times out naming it; the
                # trainer drops it and the next version's flush no longer waits for it
  export WSYNC_PEER_FLUSH_MS=3000 WSYNC_PEER_DROP_ON_TIMEOUT=1
  start_trainer 2 2 1
  start_engine 0 1 2
  start_engine 1 1 2
  wait_for "$dir/trainer.log" "trainer: ready" 20
  kill -STOP "$engine1_pid"
  touch "$dir/go-1" "$dir/go-2"
  wait_for "$dir/trainer.log" "trainer: done" 30
  kill -KILL "$engine1_pid"
  finish 30
  expect "$dir/trainer.log" "flush v1 WSYNC_ERR_TIMEOUT"
  expect "$dir/trainer.log" "from receiver 1 ("
  expect "$dir/trainer.log" "failure what=4 receiver=1"
  expect "$dir/trainer.log" "dropped receiver 1: WSYNC_OK"
  expect "$dir/trainer.log" "flush v2 ok"
  for v in 1 2; do expect "$dir/engine0.log" "engine 0: version $v ok"; done
  ;;
trainer_killed)  # the trainer dies while engines pull: each engine names it
  export WSYNC_PEER_TENSOR_BYTES=4194304
  E_TIMEOUT=5000
  start_trainer 3 2
  start_engine 0 1 3 300
  start_engine 1 1 3 300
  wait_for "$dir/trainer.log" "trainer: ready" 20
  for _ in $(seq 1 200); do [ -e "$dir/req-1-1.bin" ] && break; sleep 0.05; done  # both requests out
  sleep 0.5
  kill -KILL "$trainer_pid"
  finish 30
  for e in 0 1; do
    grep -Eq "engine $e: v1 WSYNC_ERR_(PEER|TIMEOUT): .*the trainer \(" "$dir/engine$e.log" ||
      bad "engine $e did not name the trainer: $(tail -1 "$dir/engine$e.log")"
  done
  ;;
link_down)  # the engines' link goes down mid-pull: both sides end in named errors in time
  export WSYNC_PEER_TENSOR_BYTES=4194304 WSYNC_PEER_FLUSH_MS=8000
  E_TIMEOUT=4000
  start_trainer 2 2
  start_engine 0 1 2 300
  start_engine 1 1 2 300
  wait_for "$dir/trainer.log" "trainer: ready" 20
  sleep 0.5
  ip -n "$nse" link set "$ve" down
  finish 40
  for e in 0 1; do
    grep -Eq "engine $e: v[12] WSYNC_ERR_(TIMEOUT|PEER): .*the trainer \(" "$dir/engine$e.log" ||
      bad "engine $e did not name the trainer: $(tail -1 "$dir/engine$e.log")"
  done
  grep -Eq "flush v1 WSYNC_ERR_(TIMEOUT|PEER).*receiver [01] \(" "$dir/trainer.log" ||
    bad "the trainer's flush did not name a receiver: $(grep flush "$dir/trainer.log")"
  ;;
*) echo "unknown scenario $scenario"; exit 2 ;;
esac
took=$(( $(date +%s) - start ))
echo "--- $mode/$scenario took ${took} s"
for f in "$dir"/*.log; do echo "--- $(basename "$f")"; cat "$f"; done
cleanup
trap - EXIT
if [ "$mode" = netns ]; then
  ip netns list | grep -q "$tag" && bad "namespaces left behind"
fi
for p in "${pids[@]}"; do kill -0 "$p" 2>/dev/null && bad "process $p left behind"; done
exit $fail
