#!/usr/bin/env bash
# The wsync TRL weight transfer (bindings/python/wsync/integrations/trl.py) against the real
# trl 1.16.0 and vLLM 0.33.0, CPU only: bindings/python/tests_trl. Arguments go to pytest.
#   WSYNC_TRL_VENV   this script's venv (default /tmp/wsync-trl-venv; reused when it has the pins)
#   WSYNC_VLLM_VENV  the vLLM venv it is layered on (default /tmp/wsync-vllm-venv), as
#                    scripts/test-vllm.sh makes it; made here with the same steps when missing,
#                    never changed otherwise
#   WSYNC_LIBRARY    libwsync.so to test (default build/libwsync.so)
# The TRL venv holds only what trl needs beyond vllm (pinned, installed without dependency
# resolution); torch, transformers, vllm and the rest come from the vLLM venv through a .pth
# file naming its site-packages (whose own .pth files, e.g. its editable wsync, are not read:
# this checkout's binding is installed here, editable). Cold (vLLM venv present) ~20 s.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
# shellcheck source=scripts/lib/vllm-venv.sh
. scripts/lib/vllm-venv.sh
venv=${WSYNC_TRL_VENV:-/tmp/wsync-trl-venv}
base=${WSYNC_VLLM_VENV:-/tmp/wsync-vllm-venv}
lib=${WSYNC_LIBRARY:-$root/build/libwsync.so}
[ -f "$lib" ] || { echo "no libwsync at $lib: build it first (cmake --build build --target wsync)"; exit 1; }

# What trl==1.16.0 needs that vllm==0.33.0 does not bring (resolved against the vLLM venv's
# packages), and the binding's build backend for its editable install (test-vllm.sh's pins).
pins="trl==1.16.0 accelerate==1.16.0 datasets==5.2.0 multiprocess==0.70.19 pandas==3.1.1
pyarrow==26.0.1 python-dateutil==4.0.0 tzdata==2026.6 xxhash==4.1.0
hatchling==1.29.0 packaging==26.3 pathspec==1.1.1 pluggy==1.7.0 trove-classifiers==2026.9.21.13
editables==0.6"

# The vLLM venv (scripts/test-vllm.sh's install steps, only when not made from its lock), and this
# one layered over it.
ensure_vllm_venv "$base"
layer_venv "$venv" "$base" trl "$pins"

export WSYNC_LIBRARY="$lib" VLLM_TARGET_DEVICE=cpu TRL_EXPERIMENTAL_SILENCE=1
"$venv/bin/python" -m pytest -q -p no:cacheprovider -rs bindings/python/tests_trl "$@"
