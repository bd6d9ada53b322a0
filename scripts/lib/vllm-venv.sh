# Sourced by scripts/test-vllm.sh, test-sglang.sh, test-trl.sh and test-verl.sh: the vLLM venv
# they all stand on, and the way sglang and trl layer a small venv of pins over it.

# ensure_vllm_venv DIR [MESSAGE]: makes the vLLM venv at DIR (vllm 0.33.0, pytest, through uv)
# unless it already has vllm==0.33.0; MESSAGE, if given, is printed before it is made.
# vllm 0.33.0 requires certifi>=2026.10.19, newer than PyPI offers here; uv's --override loosens
# that one requirement (pip cannot). Cold ~2 min, ~9 GB; the uv cache is cleaned after.
ensure_vllm_venv() {
  local dir=$1
  if "$dir/bin/python" -c 'import importlib.metadata as m, sys; sys.exit(m.version("vllm") != "0.33.0")' 2>/dev/null; then
    return 0
  fi
  [ -z "${2:-}" ] || echo "$2"
  rm -rf "$dir"
  /usr/bin/python3 -m venv "$dir"
  "$dir/bin/pip" install -q uv==0.13.9
  echo 'certifi>=2026.10.18' > "$dir/overrides.txt"
  UV_CACHE_DIR="$dir/.uv-cache" "$dir/bin/uv" pip install -q --python "$dir/bin/python" \
    vllm==0.33.0 pytest==9.2.0 --override "$dir/overrides.txt"
  UV_CACHE_DIR="$dir/.uv-cache" "$dir/bin/uv" cache clean -q
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
