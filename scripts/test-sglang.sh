#!/usr/bin/env bash
# The wsync SGLang loader and trainer helper (bindings/python/wsync/integrations/sglang.py)
# against the real sglang 0.5.23, CPU only: bindings/python/tests_sglang. Arguments go to pytest.
#   WSYNC_SGLANG_VENV this script's venv (default /tmp/wsync-sglang-venv; reused when it has the pins)
#   WSYNC_VLLM_VENV   the vLLM venv it is layered on (default /tmp/wsync-vllm-venv), as
#                     scripts/test-vllm.sh makes it; made here with the same steps when missing,
#                     never changed otherwise
#   WSYNC_LIBRARY     libwsync.so to test (default build/libwsync.so)
# sglang 0.5.23 pins torch==2.14.1 (a CUDA build) and transformers==5.19.0 and requires CUDA
# kernel packages (sglang-kernel, flashinfer, deep-gemm, ...) that cannot run here. The SGLang
# venv therefore holds sglang itself, installed without dependency resolution, and only the
# modules its weight-update path imports that the vLLM venv lacks (pinned); torch 2.14.0,
# transformers 5.20.2 and the rest come from the vLLM venv through a .pth file naming its
# site-packages (the same torch minor; the paths the tests drive ran on it, see
# docs/integrations/sglang.md). Cold (vLLM venv present) ~15 s.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
# shellcheck source=scripts/lib/vllm-venv.sh
. scripts/lib/vllm-venv.sh
venv=${WSYNC_SGLANG_VENV:-/tmp/wsync-sglang-venv}
base=${WSYNC_VLLM_VENV:-/tmp/wsync-vllm-venv}
lib=${WSYNC_LIBRARY:-$root/build/libwsync.so}
[ -f "$lib" ] || { echo "no libwsync at $lib: build it first (cmake --build build --target wsync)"; exit 1; }

# sglang and what its srt modules import beyond the vLLM venv, and the binding's build backend
# for its editable install (test-vllm.sh's pins).
pins="sglang==0.5.23 ipython==9.18.1 traitlets==5.16.1 gguf==0.19.0 soundfile==0.14.0
blobfile==3.3.0 hatchling==1.29.0 packaging==26.3 pathspec==1.1.1 pluggy==1.7.0
trove-classifiers==2026.9.21.13 editables==0.6"

# The vLLM venv (scripts/test-vllm.sh's install steps, only when not made from its lock), and this
# one layered over it.
ensure_vllm_venv "$base"
layer_venv "$venv" "$base" sglang "$pins"

export WSYNC_LIBRARY="$lib"
"$venv/bin/python" -m pytest -q -p no:cacheprovider -rs bindings/python/tests_sglang "$@"
