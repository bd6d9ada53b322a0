#!/usr/bin/env bash
# The ucx kind between "hosts": a trainer in one network namespace and two engines in another,
# joined by a veth pair (MODE netns), or the same processes over loopback (MODE loopback, and
# the fallback where namespaces cannot be made: then the netns tests skip with the reason).
# Each scenario asserts what the trainer and each engine see (named status, the peer named),
# how each process ended (its exit status; no sanitizer report in any log), the time bounds
# (the failing wait against its deadline, the whole scenario against its limit), and that
# nothing is left behind (processes before cleanup; namespaces, veths, UCX shared memory after).
#   scenarios.sh MODE SCENARIO PEER_BINARY [COUNTING_LIBUCP]
set -u
mode=$1 scenario=$2 peer=$3 counter=${4:-}
tag="wsu$$"
nst="${tag}t" nse="${tag}e" vt="${tag}a" ve="${tag}b"
dir=$(mktemp -d /tmp/wsync-ucx.XXXXXX)
pids=()
declare -A rc_of=()  # pid -> exit status, once finish has seen it end
fail=0
shm_before=$(ls /dev/shm 2>/dev/null | grep -i 'ucx' | sort)

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
  # exec (ip, then env): $! is the peer itself. The sanitizer options are passed on explicitly.
  # (LeakSanitizer's tracer crashing at exit in an ASan build, "Tracer caught signal 11", is the
  # runtime's __tls_get_addr heuristic, not these peers: scripts/test-all.sh sets
  # intercept_tls_get_addr=0 and says why.)
  pre_t=(ip netns exec "$nst" env ASAN_OPTIONS="${ASAN_OPTIONS:-}")
  pre_e=(ip netns exec "$nse" env ASAN_OPTIONS="${ASAN_OPTIONS:-}")
  dev_t=$vt dev_e=$ve
else
  [ "$scenario" = link_down ] && skip "bringing a link down needs the netns variant (a veth between namespaces)"
  pre_t=() pre_e=()
  dev_t=lo dev_e=lo
fi

opts() {  # device timeout_ms [more options, each with its leading comma]
  echo "{\"receivers\":2,\"transports\":\"tcp\",\"net_devices\":\"$1\",\"timeout_ms\":$2${3:-}}"
}
start_trainer() {  # versions engines [step]; $T_EXTRA: more trainer options
  "${pre_t[@]}" "$peer" trainer "$dir" "$(opts "$dev_t" "${T_TIMEOUT:-10000}" "${T_EXTRA:-}")" "$@" >"$dir/trainer.log" 2>&1 &
  pids+=($!); trainer_pid=$!
}
start_engine() {  # index from to [slow_ms]; $E_TAG: a suffix for its log and pid names
  "${pre_e[@]}" "$peer" engine "$dir" "$(opts "$dev_e" "${E_TIMEOUT:-10000}")" "$@" >"$dir/engine$1${E_TAG:-}.log" 2>&1 &
  pids+=($!); eval "engine$1${E_TAG:-}_pid=$!"
}
wait_for() {  # file pattern seconds
  for _ in $(seq 1 $(($3 * 20))); do grep -q -- "$2" "$1" 2>/dev/null && return 0; sleep 0.05; done
  bad "waited $3 s for \"$2\" in $(basename "$1")"; return 1
}
expect() {  # file pattern
  grep -q -- "$2" "$1" || bad "$(basename "$1") lacks \"$2\""
}
finish() {  # seconds: wait for every process up to the bound, then collect exit statuses
  local limit=$1 p
  for p in "${pids[@]}"; do
    for _ in $(seq 1 $((limit * 10))); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
  done
  for p in "${pids[@]}"; do
    if kill -0 "$p" 2>/dev/null; then
      bad "process $p still runs after $limit s (left behind)"
    else
      wait "$p"; rc_of[$p]=$?
    fi
  done
  finished=$(date +%s%N)
}
exits() {  # name pid status...: the process ended with one of these statuses (137: SIGKILL)
  local name=$1 pid=$2; shift 2
  local got=${rc_of[$pid]:-running} want
  for want in "$@"; do [ "$got" = "$want" ] && return 0; done
  bad "$name exited with $got, want $*"
}
ms_since() {  # nanosecond timestamp: milliseconds from it to when finish saw all end
  echo $(( (finished - $1) / 1000000 ))
}
flush_ms() {  # version: the milliseconds the trainer's flush of it took, from its log line
  sed -n "s/^trainer: flush v$1 [A-Z_a-z]* (\([0-9]*\) ms).*/\1/p" "$dir/trainer.log" | head -1
}
within() {  # what got_ms lo_ms hi_ms
  [ -n "$2" ] || { bad "$1: no figure"; return; }
  [ "$2" -ge "$3" ] && [ "$2" -le "$4" ] || bad "$1 took $2 ms, want $3..$4 ms"
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
  exits trainer "$trainer_pid" 0; exits "engine 0" "$engine0_pid" 0; exits "engine 1" "$engine1_pid" 0
  limit=60
  ;;
engine_killed)  # engine 1 dies mid-pull of version 1: named in the flush; a dead receiver is
                # named DIED in every flush until it is dropped (as on shm), so the trainer
                # drops it and the rest go on
  export WSYNC_PEER_TENSOR_BYTES=4194304
  export WSYNC_PEER_DROP_ON_DIED=1
  start_trainer 3 2
  start_engine 0 1 3
  start_engine 1 1 3 400
  # Killed holding v1's first chunk, its iteration open, before it acknowledged anything.
  wait_for "$dir/engine1.log" "engine 1: in v1 chunk 0" 30
  kill -KILL "$engine1_pid"
  finish 40
  expect "$dir/trainer.log" "flush v1 WSYNC_ERR_PEER"
  expect "$dir/trainer.log" "receiver 1 ("
  expect "$dir/trainer.log" "failure what=2 receiver=1"
  expect "$dir/trainer.log" "dropped receiver 1: WSYNC_OK"
  expect "$dir/trainer.log" "flush v2 ok"
  expect "$dir/trainer.log" "flush v3 ok"
  for v in 1 2 3; do expect "$dir/engine0.log" "engine 0: version $v ok"; done
  # The death is seen through the endpoint, not by waiting out the 10 s deadline.
  within "the trainer's failed flush of v1" "$(flush_ms 1)" 0 9000
  exits trainer "$trainer_pid" 1; exits "engine 0" "$engine0_pid" 0; exits "engine 1" "$engine1_pid" 137
  limit=40
  ;;
two_failures)  # both engines fail version 1, each with its own reason, one 2 s after the
               # other: the trainer's flush names both in one report (it used to return at the
               # first); version 2 completes on both
  start_trainer 2 2
  WSYNC_PEER_FAIL=1/0/12 start_engine 0 1 2
  WSYNC_PEER_FAIL=1/1/5 start_engine 1 1 2 500
  finish 60
  expect "$dir/trainer.log" "flush v1 WSYNC_ERR_PEER"
  expect "$dir/trainer.log" "receiver 0 (pid [0-9]*) failed chunk 0 of version 1: WSYNC_ERR_INTEGRITY: ucx_peer: told to fail"
  expect "$dir/trainer.log" "receiver 1 (pid [0-9]*) failed chunk 1 of version 1: WSYNC_ERR_MISMATCH: ucx_peer: told to fail"
  expect "$dir/trainer.log" "failure what=1 receiver=0 status=WSYNC_ERR_INTEGRITY"
  expect "$dir/trainer.log" "failure what=1 receiver=1 status=WSYNC_ERR_MISMATCH"
  expect "$dir/trainer.log" "flush v2 ok"
  for e in 0 1; do expect "$dir/engine$e.log" "engine $e: v1 failed as told"; expect "$dir/engine$e.log" "engine $e: version 2 ok"; done
  exits trainer "$trainer_pid" 1; exits "engine 0" "$engine0_pid" 0; exits "engine 1" "$engine1_pid" 0
  limit=60
  ;;
reattached)  # engine 1 dies mid-pull of version 1; a new engine 1 re-attaches (retrying while
             # the trainer still holds the index) and loads version 1 while engine 0, slow,
             # keeps the flush waiting: the flush is OK, never naming engine 1 DIED (a 5 s link
             # outage did); both engines load version 2
  export WSYNC_PEER_TENSOR_BYTES=4194304
  start_trainer 2 2
  start_engine 0 1 2 600
  start_engine 1 1 2 300
  wait_for "$dir/engine1.log" "engine 1: in v1 chunk 0" 30
  kill -KILL "$engine1_pid"
  WSYNC_PEER_ATTACH_RETRY_MS=5000 E_TAG=b start_engine 1 1 2
  finish 60
  expect "$dir/trainer.log" "flush v1 ok"
  expect "$dir/trainer.log" "flush v2 ok"
  grep -q "failure what=2" "$dir/trainer.log" && bad "the trainer reported a receiver DIED"
  for v in 1 2; do expect "$dir/engine0.log" "engine 0: version $v ok"; expect "$dir/engine1b.log" "engine 1: version $v ok"; done
  exits trainer "$trainer_pid" 0; exits "engine 0" "$engine0_pid" 0; exits "engine 1" "$engine1_pid" 137
  exits "engine 1 (re-attached)" "$engine1b_pid" 0
  limit=60
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
  exits trainer "$trainer_pid" 0; exits "engine 0" "$engine0_pid" 0; exits "engine 1" "$engine1_pid" 0
  limit=60
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
  # The flush waited out its 3 s deadline for the frozen engine and not much longer; v2, with
  # it dropped, did not wait for it at all.
  within "the trainer's timed-out flush of v1" "$(flush_ms 1)" 2900 5000
  within "the trainer's flush of v2" "$(flush_ms 2)" 0 2500
  exits trainer "$trainer_pid" 1; exits "engine 0" "$engine0_pid" 0; exits "engine 1" "$engine1_pid" 137
  limit=40
  ;;
trainer_killed)  # the trainer dies while engines pull: each engine names it
  export WSYNC_PEER_TENSOR_BYTES=4194304
  E_TIMEOUT=5000
  start_trainer 3 2
  start_engine 0 1 3 300
  start_engine 1 1 3 300
  # Killed while both engines hold v1's first chunk and v1's second chunk is announced (its
  # request written, so the engines wait on the library, not on the test's controller) but
  # still to be pulled.
  wait_for "$dir/engine0.log" "engine 0: in v1 chunk 0" 30
  wait_for "$dir/engine1.log" "engine 1: in v1 chunk 0" 30
  for _ in $(seq 1 400); do [ -e "$dir/req-1-1.bin" ] && break; sleep 0.05; done
  [ -e "$dir/req-1-1.bin" ] || bad "the trainer never announced v1's second chunk"
  killed=$(date +%s%N)
  kill -KILL "$trainer_pid"
  finish 30
  for e in 0 1; do
    grep -Eq "engine $e: v1 WSYNC_ERR_(PEER|TIMEOUT): .*the trainer \(" "$dir/engine$e.log" ||
      bad "engine $e did not name the trainer: $(tail -1 "$dir/engine$e.log")"
  done
  # Both engines gave up within their 5 s deadline (plus the 4 x 0.3 s they sleep in chunk 0
  # and scheduling), not at the 60 s a request file is waited for.
  within "the engines' ends after the trainer died" "$(ms_since "$killed")" 0 9000
  exits trainer "$trainer_pid" 137; exits "engine 0" "$engine0_pid" 1; exits "engine 1" "$engine1_pid" 1
  limit=30
  ;;
link_down)  # the engines' link goes down mid-pull: both sides end in named errors in time
  export WSYNC_PEER_TENSOR_BYTES=4194304 WSYNC_PEER_FLUSH_MS=8000
  E_TIMEOUT=4000
  start_trainer 2 2
  start_engine 0 1 2 300
  start_engine 1 1 2 300
  # Down while both engines hold v1's first chunk: the second cannot be pulled.
  wait_for "$dir/engine0.log" "engine 0: in v1 chunk 0" 30
  wait_for "$dir/engine1.log" "engine 1: in v1 chunk 0" 30
  ip -n "$nse" link set "$ve" down
  finish 40
  for e in 0 1; do
    grep -Eq "engine $e: v[12] WSYNC_ERR_(TIMEOUT|PEER): .*the trainer \(" "$dir/engine$e.log" ||
      bad "engine $e did not name the trainer: $(tail -1 "$dir/engine$e.log")"
  done
  grep -Eq "flush v1 WSYNC_ERR_(TIMEOUT|PEER).*receiver [01] \(" "$dir/trainer.log" ||
    bad "the trainer's flush did not name a receiver: $(grep flush "$dir/trainer.log")"
  within "the trainer's failed flush of v1" "$(flush_ms 1)" 0 10000
  exits trainer "$trainer_pid" 1; exits "engine 0" "$engine0_pid" 1; exits "engine 1" "$engine1_pid" 1
  limit=40
  ;;
firewalled)  # a firewall on the engine's host drops its packets to the trainer: attaching ends
            # at the engine's timeout_ms, named (UCX's blocking connect() held it for the
            # kernel's SYN retries, 134 s against 5 s: ucx user trial)
  [ "$mode" = netns ] || skip "a firewall between hosts needs the netns variant"
  command -v nft >/dev/null || skip "nft (nftables) is not installed"
  ip netns exec "$nse" nft add table ip wsf &&
    ip netns exec "$nse" nft add chain ip wsf out '{ type filter hook output priority 0; }' &&
    ip netns exec "$nse" nft add rule ip wsf out ip daddr 10.231.7.1 meta l4proto tcp drop ||
    skip "cannot add an nftables rule in a network namespace"
  E_TIMEOUT=3000
  start_trainer 1 1
  for _ in $(seq 1 400); do [ -e "$dir/init.bin" ] && break; sleep 0.05; done
  [ -e "$dir/init.bin" ] || bad "the trainer wrote no init info"
  began=$(date +%s%N)
  start_engine 0 1 1
  for _ in $(seq 1 300); do kill -0 "$engine0_pid" 2>/dev/null || break; sleep 0.1; done
  ended=$(date +%s%N)
  kill -KILL "$trainer_pid"
  finish 10
  expect "$dir/engine0.log" "engine 0: attach "
  expect "$dir/engine0.log" "the trainer (.*) did not answer the attach within 3000 ms"
  within "the engine's attach behind the firewall" "$(( (ended - began) / 1000000 ))" 2900 6000
  exits "engine 0" "$engine0_pid" 2; exits trainer "$trainer_pid" 137
  limit=30
  ;;
tp_shards)  # partial pulls across the link: engine 0 takes rank 0 of 2 along dimension 0 of
            # every tensor, engine 1 rank 1; each gets its half bit for bit, UCX is asked for
            # exactly those bytes (the engines load UCX through the counting stand-in), every
            # 64 KiB block of each half is verified against the trainer's block checksums, and
            # the trainer's flushes see both acknowledge every chunk
  [ -n "$counter" ] || skip "no counting libucp stand-in (tests/ucx/ucp_count.c) was given"
  T_EXTRA=',"block_checksum_bytes":65536' start_trainer 3 2
  WSYNC_PEER_SHARD=0/2 WSYNC_UCX_LIBRARY=$counter start_engine 0 1 3
  WSYNC_PEER_SHARD=1/2 WSYNC_UCX_LIBRARY=$counter start_engine 1 1 3
  finish 60
  half=$((WSYNC_PEER_TENSOR_BYTES * 8 / 2))  # 8 tensors, half of each
  for v in 1 2 3; do
    expect "$dir/trainer.log" "flush v$v ok"
    for e in 0 1; do expect "$dir/engine$e.log" "engine $e: version $v ok .*; took $half bytes; fetched $half bytes"; done
  done
  exits trainer "$trainer_pid" 0; exits "engine 0" "$engine0_pid" 0; exits "engine 1" "$engine1_pid" 0
  limit=60
  ;;
*) echo "unknown scenario $scenario"; exit 2 ;;
esac
took=$(( $(date +%s) - start ))
echo "--- $mode/$scenario took ${took} s"
[ "$took" -le "$limit" ] || bad "the scenario took $took s, over its $limit s"
# A sanitizer's report (the ASan build runs these too) fails the scenario whatever the
# process's exit status.
for f in "$dir"/*.log; do
  grep -Eq 'ERROR: (Address|Leak|Thread)Sanitizer|runtime error:' "$f" &&
    bad "$(basename "$f") holds a sanitizer report"
done
for f in "$dir"/*.log; do echo "--- $(basename "$f")"; cat "$f"; done
cleanup
trap - EXIT
if [ "$mode" = netns ]; then
  ip netns list | grep -q "$tag" && bad "namespaces left behind"
  ip link show 2>/dev/null | grep -q "$tag" && bad "a veth left behind in the root namespace"
fi
shm_after=$(ls /dev/shm 2>/dev/null | grep -i 'ucx' | sort)
[ "$shm_after" = "$shm_before" ] ||
  bad "shared memory left behind: $(comm -13 <(echo "$shm_before") <(echo "$shm_after") | tr '\n' ' ')"
exit $fail
