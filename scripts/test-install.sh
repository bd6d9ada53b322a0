#!/usr/bin/env bash
# The Python binding as a user installs it: a wheel with libwsync bundled, built from
# bindings/python with pinned build tools, pip-installed into a fresh venv; then
# `import wsync`, wsync.version() and a tiny shm sync, with no WSYNC_LIBRARY set. Also checks
# that building wrote nothing into bindings/python.
#   WSYNC_LIBRARY  libwsync.so to bundle (default build/libwsync.so)
# Needs python3 with venv (Debian: python3-venv), strip (binutils) and PyPI; ~30 s.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
lib=${WSYNC_LIBRARY:-$root/build/libwsync.so}
[ -f "$lib" ] || { echo "no libwsync at $lib: build it first (cmake --build build --target wsync)"; exit 1; }
work=$(mktemp -d /tmp/wsync-install.XXXXXX)
trap 'rm -rf "$work"' EXIT
export PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1

# The build tools, every version pinned (hatchling and what it imports).
/usr/bin/python3 -m venv "$work/build"
"$work/build/bin/pip" install -q hatchling==1.29.0 packaging==26.3 pathspec==1.1.1 \
  pluggy==1.7.0 trove-classifiers==2026.9.21.13

# The wheel: the library stripped of debug sections (as the .deb ships it), bundled by
# bindings/python/hatch_build.py.
strip --strip-debug -o "$work/libwsync.so.0" "$(readlink -f "$lib")"
litter_before=$(git status --porcelain --ignored bindings/python)
WSYNC_BUNDLE_LIBRARY="$work/libwsync.so.0" "$work/build/bin/pip" wheel -q --no-deps \
  --no-build-isolation -w "$work/dist" bindings/python
litter_after=$(git status --porcelain --ignored bindings/python)
if [ "$litter_before" != "$litter_after" ]; then
  echo "building the wheel wrote into bindings/python:"
  diff <(echo "$litter_before") <(echo "$litter_after") || true
  exit 1
fi
wheel=$(ls "$work"/dist/wsync-*.whl)
case "$wheel" in
  *-py3-none-linux_*.whl) ;;
  *) echo "unexpected wheel tag: $wheel"; exit 1 ;;
esac

# A user's fresh venv: the wheel and its one dependency, pinned.
/usr/bin/python3 -m venv "$work/user"
"$work/user/bin/pip" install -q "$wheel" numpy==2.3.5
cd "$work"  # away from the source tree: the installed package is what gets imported
env -u WSYNC_LIBRARY "$work/user/bin/python" - <<'EOF'
import numpy as np
import wsync

print("wsync", wsync.version(), "library", wsync.load_library().path)
assert "site-packages/wsync/libwsync.so.0" in wsync.load_library().path

strategy = wsync.Strategy("shm", receivers=1, bucket_bytes=1 << 20)
init = strategy.create_init_info()
sender = strategy.sender(init)
engine = wsync.Strategy.for_init_info(init)
receiver = engine.receiver(init, 0)
weights = {"w": np.arange(1000, dtype=np.float32), "b": np.ones(7, dtype=np.int64)}
request = sender.send_chunk(weights, last=True)
got = {}
with receiver.receive(request, framework="numpy") as it:
    for name, view in it:
        got[name] = np.array(view)
sender.flush(10)
assert receiver.completed_version == 1
for name, want in weights.items():
    assert got[name].dtype == want.dtype and np.array_equal(got[name], want), name
for handle in (receiver, sender, engine, strategy):
    handle.close()
print("shm sync of", len(weights), "tensors: bit-exact")
EOF
echo "test-install: $(basename "$wheel") installs into a fresh venv and syncs"
