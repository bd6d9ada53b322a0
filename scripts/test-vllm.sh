#!/usr/bin/env bash
# In a venv of its own with the real vLLM 0.33.0 and the torch it pins (CPU only): the wsync
# vLLM backend's tests (bindings/python/tests_vllm), then the binding's main suite
# (bindings/python/tests) on that modern torch. Arguments go to the first pytest run only.
#   WSYNC_VLLM_VENV  the venv (default /tmp/wsync-vllm-venv; reused when it was made from
#                    scripts/lib/vllm-lock.txt as it is now)
#   WSYNC_LIBRARY    libwsync.so to test (default build/libwsync.so)
# Every package of that venv is pinned in scripts/lib/vllm-lock.txt (why, and how it was made,
# there). Cold install ~2 min, ~9 GB; the uv cache is cleaned after installing.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
# shellcheck source=scripts/lib/vllm-venv.sh
. scripts/lib/vllm-venv.sh
venv=${WSYNC_VLLM_VENV:-/tmp/wsync-vllm-venv}
lib=${WSYNC_LIBRARY:-$root/build/libwsync.so}
[ -f "$lib" ] || { echo "no libwsync at $lib: build it first (cmake --build build --target wsync)"; exit 1; }
export UV_CACHE_DIR="$venv/.uv-cache"

ensure_vllm_venv "$venv"
# The binding, editable (the source tree is what is tested), no dependency resolution: numpy
# and torch come with vllm, its build backend (hatchling, editables) with the lock. It builds
# outside the tree, so nothing is written into it.
"$venv/bin/uv" pip install -q --python "$venv/bin/python" --no-deps --no-build-isolation -e bindings/python
"$venv/bin/uv" cache clean -q

export WSYNC_LIBRARY="$lib" VLLM_TARGET_DEVICE=cpu
"$venv/bin/python" -m pytest -q -p no:cacheprovider -rs bindings/python/tests_vllm "$@"
"$venv/bin/python" -m pytest -q -p no:cacheprovider -rs bindings/python/tests
