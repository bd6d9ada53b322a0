# Sourced by scripts/test-vllm.sh, test-sglang.sh, test-trl.sh and test-verl.sh: the vLLM venv
# they all stand on, and the way sglang and trl layer a small venv of pins over it.

# The lock (every package of the venv at one version) beside this file; its digest, stamped into
# the venv, says whether a venv was made from it.
VLLM_LOCK="$(dirname "${BASH_SOURCE[0]}")/vllm-lock.txt"
vllm_lock_digest() { sha256sum "$VLLM_LOCK" | cut -d' ' -f1; }

# ensure_vllm_venv DIR [MESSAGE]: makes the vLLM venv at DIR (vllm 0.33.0, pytest, the binding's
# build backend: exactly the packages of vllm-lock.txt, --no-deps, through uv) unless DIR was
# made from this lock (its .wsync-lock stamp); MESSAGE, if given, is printed before it is made.
# Cold ~2 min, ~9 GB; the uv cache is cleaned after.
ensure_vllm_venv() {
  local dir=$1 digest
  digest=$(vllm_lock_digest)
  if [ "$(cat "$dir/.wsync-lock" 2>/dev/null)" = "$digest" ] && [ -x "$dir/bin/python" ]; then
    return 0
  fi
  [ -z "${2:-}" ] || echo "$2"
  rm -rf "$dir"
  /usr/bin/python3 -m venv "$dir"
  "$dir/bin/pip" install -q uv==0.13.9
  UV_CACHE_DIR="$dir/.uv-cache" "$dir/bin/uv" pip install -q --python "$dir/bin/python" \
    --no-deps -r "$VLLM_LOCK"
  UV_CACHE_DIR="$dir/.uv-cache" "$dir/bin/uv" cache clean -q
  echo "$digest" > "$dir/.wsync-lock"
}

# lock_vllm_venv UV: prints a new lock (what vllm-lock.txt holds below its comment) resolved by
# UV from the index now; for updating the pins by hand, never run by the tests.
lock_vllm_venv() {
  local uv=$1 tmp
  tmp=$(mktemp -d)
  printf 'vllm==0.33.0\npytest==9.2.0\nhatchling==1.29.0\neditables==0.6\n' > "$tmp/in.txt"
  echo 'certifi>=2026.10.18' > "$tmp/override.txt"
  echo 'cuda-python==13.4.4' > "$tmp/constraint.txt"
  UV_CACHE_DIR="$tmp/cache" "$uv" pip compile -q "$tmp/in.txt" --override "$tmp/override.txt" \
    -c "$tmp/constraint.txt" --python-version 3.11 --python-platform x86_64-manylinux_2_28 \
    --no-header --no-annotate
  rm -rf "$tmp"
}

# site_packages PYTHON: its purelib directory.
site_packages() { "$1" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'; }

# layer_venv VENV BASE NAME PINS: a venv at VENV that reads BASE's site-packages through a .pth
# line and holds PINS (whitespace-separated, installed with --no-deps by BASE's uv) and this
# checkout's binding, editable. Remade only when PINS or BASE's site-packages changed (the stamp
# file VENV/.wsync-NAME-pins); the binding is installed again every time.
layer_venv() {
  local venv=$1 base=$2 name=$3 pins=$4
  local uv="$base/bin/uv"  # run from the vLLM venv, installing only into this one
  export UV_CACHE_DIR="$venv/.uv-cache"
  local base_site stamp site
  base_site=$(site_packages "$base/bin/python")
  stamp="$(echo "$pins" | tr '\n' ' ') base=$base_site"
  if [ "$(cat "$venv/.wsync-$name-pins" 2>/dev/null)" != "$stamp" ]; then
    rm -rf "$venv"
    /usr/bin/python3 -m venv --without-pip "$venv"
    site=$(site_packages "$venv/bin/python")
    [ "$(basename "$(dirname "$site")")" = "$(basename "$(dirname "$base_site")")" ] ||
      { echo "$venv and $base differ in Python version"; exit 1; }
    echo "$base_site" > "$site/_wsync_vllm_base.pth"
    # shellcheck disable=SC2086
    "$uv" pip install -q --python "$venv/bin/python" --no-deps $pins
    "$uv" cache clean -q
    echo "$stamp" > "$venv/.wsync-$name-pins"
  fi
  # The binding, editable (the source tree is what is tested), as in test-vllm.sh.
  "$uv" pip install -q --python "$venv/bin/python" --no-deps --no-build-isolation -e bindings/python
  "$uv" cache clean -q
}
