#!/usr/bin/env bash
# In a venv of its own with the real verl 0.9.1 (CPU only): the wsync checkpoint engine's tests
# (bindings/python/tests_verl). Arguments go to pytest.
#   WSYNC_VERL_VENV  the venv (default /tmp/wsync-verl-venv; reused when it has the pins below)
#   WSYNC_VLLM_VENV  the venv scripts/test-vllm.sh makes (default /tmp/wsync-vllm-venv), whose
#                    torch, numpy, pytest... this one uses through a .pth line rather than
#                    installing them twice. It is only read: made here with test-vllm.sh's own
#                    commands and lock only when not made from that lock (as test-vllm.sh
#                    would), never installed into otherwise.
#   WSYNC_LIBRARY    libwsync.so to test (default build/libwsync.so)
# verl 0.9.1 and the packages its checkpoint-engine modules import that the vLLM venv lacks
# are installed with --no-deps at pinned versions (verl's own requirements would pull a second
# torch stack); the binding is tested from the source tree (PYTHONPATH). About 75 s of CPU time
# (4 processes import torch and verl): ~1 min on an idle 2-core machine; the cold part adds ~10 s.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
# shellcheck source=scripts/lib/vllm-venv.sh
. scripts/lib/vllm-venv.sh
venv=${WSYNC_VERL_VENV:-/tmp/wsync-verl-venv}
base=${WSYNC_VLLM_VENV:-/tmp/wsync-vllm-venv}
lib=${WSYNC_LIBRARY:-$root/build/libwsync.so}
[ -f "$lib" ] || { echo "no libwsync at $lib: build it first (cmake --build build --target wsync)"; exit 1; }
pins=(verl==0.9.1 ray==2.60.0 msgpack==1.2.4 tensordict==0.15.3 pyvers==0.2.3 omegaconf==2.4.0
      codetiming==1.4.0)

# The base: scripts/test-vllm.sh's venv, made with its commands when it is missing.
ensure_vllm_venv "$base" "no venv from scripts/lib/vllm-lock.txt at $base: making it as scripts/test-vllm.sh does (~2 min, ~9 GB)"
base_site=$(site_packages "$base/bin/python")

# This venv: same python, the base's site-packages after its own, the pins.
have_pins() {
  "$venv/bin/python" - "$base_site" "${pins[@]}" <<'EOF' 2>/dev/null
import importlib.metadata as m, pathlib, sys, sysconfig
site = pathlib.Path(sysconfig.get_paths()["purelib"])
ok = (site / "_wsync_base.pth").read_text().strip() == sys.argv[1]
ok = ok and all(m.version(p.split("==")[0]) == p.split("==")[1] for p in sys.argv[2:])
sys.exit(0 if ok else 1)
EOF
}
if ! have_pins; then
  rm -rf "$venv"
  "$base/bin/python" -m venv "$venv"
  site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
  # A plain path line: the base's own .pth files (its editable wsync among them) stay unread.
  echo "$base_site" > "$site/_wsync_base.pth"
  "$venv/bin/python" -m pip install -q --disable-pip-version-check --no-deps "${pins[@]}"
  have_pins || { echo "the venv at $venv does not have the pins after installing"; exit 1; }
fi

export WSYNC_LIBRARY="$lib" PYTHONPATH="$root/bindings/python"
"$venv/bin/python" -m pytest -q -p no:cacheprovider -rs bindings/python/tests_verl "$@"
