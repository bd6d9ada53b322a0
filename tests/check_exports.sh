#!/bin/sh
# Checks what libwsync exports: every function include/wsync.h declares, each under a version
# node WSYNC_0.N of src/libwsync.map (symbol versioning, docs/abi-policy.md), and nothing else;
# and that the library needs no GPU library at load time.
# Usage: check_exports.sh LIBRARY HEADER
set -eu
lib="$1"
header="$2"
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# "wsync_blob_free@@WSYNC_0.1" per defined dynamic symbol (binutils >= 2.35 prints versions).
nm -D --defined-only --with-symbol-versions "$lib" | awk '{print $3}' | grep -v '^$' \
  | grep -v '^WSYNC_0\.[0-9]*$' | sort > "$tmp/exported"
bad=$(grep -v '^wsync_' "$tmp/exported" || true)
if [ -n "$bad" ]; then
  echo "FAIL: symbols exported outside wsync_*:"; echo "$bad"; exit 1
fi
unversioned=$(grep -v '@@WSYNC_0\.[0-9][0-9]*$' "$tmp/exported" || true)
if [ -n "$unversioned" ]; then
  echo "FAIL: symbols exported without a WSYNC_0.N version node:"; echo "$unversioned"; exit 1
fi
sed 's/@@.*//' "$tmp/exported" | sort -u > "$tmp/names"
# The functions the header declares: "WSYNC_API <type> name(".
tr '\n' ' ' < "$header" | grep -o 'WSYNC_API[^(;]*(' | grep -o 'wsync_[a-z0-9_]*($' \
  | tr -d '(' | sort -u > "$tmp/declared"
missing=$(comm -23 "$tmp/declared" "$tmp/names")
[ -z "$missing" ] || { echo "FAIL: declared in wsync.h but not exported (add to src/libwsync.map):"; echo "$missing"; exit 1; }
extra=$(comm -13 "$tmp/declared" "$tmp/names")
[ -z "$extra" ] || { echo "FAIL: exported but not declared in wsync.h:"; echo "$extra"; exit 1; }
count=$(wc -l < "$tmp/names")
[ "$count" -ge 48 ] || { echo "FAIL: only $count functions declared and exported (0.5 has 48)"; exit 1; }
# Each version's calls sit in that version's node (a node never changes once released).
for pair in wsync_strategy_create@@WSYNC_0.1 wsync_sender_commit@@WSYNC_0.2 \
            wsync_recv_copy@@WSYNC_0.3 wsync_sender_send_parts@@WSYNC_0.5 \
            wsync_recv_patch@@WSYNC_0.5; do
  grep -qx "$pair" "$tmp/exported" || { echo "FAIL: $pair is not exported"; exit 1; }
done
needed=$(readelf -d "$lib" | grep NEEDED || true)
if echo "$needed" | grep -Eiq 'cuda|nccl|nvidia|ucp|ucs|uct'; then
  echo "FAIL: NEEDED names a GPU or UCX library:"; echo "$needed"; exit 1
fi
soname=$(readelf -d "$lib" | sed -n 's/.*SONAME.*\[\(.*\)\]/\1/p')
[ "$soname" = "libwsync.so.0" ] || { echo "FAIL: soname is '$soname', want libwsync.so.0"; exit 1; }
nodes=$(sed 's/.*@@//' "$tmp/exported" | sort -u | tr '\n' ' ')
echo "OK: $count wsync_* functions, each versioned (nodes: $nodes), soname $soname, NEEDED: $(echo "$needed" | sed 's/.*\[\(.*\)\]/\1/' | tr '\n' ' ')"
