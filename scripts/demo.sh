#!/usr/bin/env bash
# The main job on a fresh Debian 12 machine: install build dependencies, build libwsync and the
# wsync tool, and run `wsync demo` (a trainer syncing a ~1 GB Llama-shaped model to engine
# processes over shared memory). Extra arguments go to `wsync demo` (see `wsync help demo`).
#
# Its own build directory, build-demo/, never build/: the demo installs only the build
# dependencies (no cmocka), so it must configure without tests, and a build/ configured that way
# kept WSYNC_BUILD_TESTS=OFF in its CMake cache for scripts/test-all.sh, which then ran no test
# at all (issue 36). Separate directories let the two commands run in either order.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/install-deps.sh --build
cmake -S . -B build-demo -DCMAKE_BUILD_TYPE=Release -DWSYNC_BUILD_TESTS=OFF -DWSYNC_BUILD_TOOLS=ON \
  -DWSYNC_BUILD_FUZZERS=OFF -DWSYNC_SANITIZE= >/dev/null
cmake --build build-demo -j"$(nproc)" >/dev/null
exec build-demo/tools/wsync demo "$@"
