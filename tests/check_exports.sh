#!/bin/sh
# Checks that libwsync exports nothing but wsync_* and needs no GPU library at load time.
set -eu
lib="$1"
bad=$(nm -D --defined-only "$lib" | awk '{print $3}' | grep -v '^wsync_' | grep -v '^$' || true)
if [ -n "$bad" ]; then
  echo "FAIL: symbols exported outside wsync_*:"; echo "$bad"; exit 1
fi
count=$(nm -D --defined-only "$lib" | grep -c ' wsync_' || true)
[ "$count" -ge 47 ] || { echo "FAIL: only $count wsync_ symbols exported (0.5 has 47)"; exit 1; }
# The calls each minor version added (0.5: split tensors) are exported.
for sym in wsync_sender_send_parts wsync_plan_chunk_parts wsync_recv_part wsync_recv_next_part; do
  nm -D --defined-only "$lib" | awk '{print $3}' | grep -qx "$sym" || { echo "FAIL: $sym is not exported"; exit 1; }
done
needed=$(readelf -d "$lib" | grep NEEDED || true)
if echo "$needed" | grep -Eiq 'cuda|nccl|nvidia'; then
  echo "FAIL: NEEDED names a GPU library:"; echo "$needed"; exit 1
fi
soname=$(readelf -d "$lib" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[ "$soname" = "libwsync.so.0" ] || { echo "FAIL: soname is '$soname', want libwsync.so.0"; exit 1; }
echo "OK: $count wsync_* symbols, soname $soname, NEEDED: $(echo "$needed" | sed 's/.*\[\(.*\)\]/\1/' | tr '\n' ' ')"
