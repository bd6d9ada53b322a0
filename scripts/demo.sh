#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: install build dependencies, build libwsync and the
# wsync tool, and run `wsync demo` (a trainer syncing a ~1 GB Llama-shaped model to engine
# processes over shared memory). Extra arguments go to `wsync demo` (see `wsync help demo`).
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --build
cmake -S . -B build -DCMAKE_BUILD_TYPE=Release -DWSYNC_BUILD_TESTS=OFF >/dev/null
cmake --build build -j"$(nproc)" >/dev/null
exec build/tools/wsync demo "$@"
