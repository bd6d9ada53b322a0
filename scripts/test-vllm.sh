#!/usr/bin/env bash
# In a venv of its own with the real vLLM 0.33.0 and the torch it pins (CPU only): the wsync
# vLLM backend's tests (bindings/python/tests_vllm), then the binding's main suite
# (bindings/python/tests) on that modern torch. Arguments go to the first pytest run only.
#   WSYNC_VLLM_VENV  the venv (default /tmp/wsync-vllm-venv; reused when it has vllm==0.33.0)
#   WSYNC_LIBRARY    libwsync.so to test (default build/libwsync.so)
# vllm 0.33.0 requires certifi>=2026.10.19, newer than PyPI offers here; uv's --override
# loosens that one requirement (pip cannot). Cold install ~2 min, ~9 GB; the uv cache is
# cleaned after installing.
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
# and torch come with vllm. hatchling (the build backend, pinned with what it imports, and
# editables for an editable install; packaging and pluggy are vllm's own versions) builds
# outside the tree, so nothing is written into it.
"$venv/bin/uv" pip install -q --python "$venv/bin/python" hatchling==1.29.0 packaging==26.3 \
  pathspec==1.1.1 pluggy==1.7.0 trove-classifiers==2026.9.21.13 editables==0.6
"$venv/bin/uv" pip install -q --python "$venv/bin/python" --no-deps --no-build-isolation -e bindings/python
"$venv/bin/uv" cache clean -q

export WSYNC_LIBRARY="$lib" VLLM_TARGET_DEVICE=cpu
"$venv/bin/python" -m pytest -q -p no:cacheprovider -rs bindings/python/tests_vllm "$@"
"$venv/bin/python" -m pytest -q -p no:cacheprovider -rs bindings/python/tests
