#!/bin/sh
# The Rust binding as a crate outside its workspace uses it: a new crate (main.rs, build.rs
# here) depending on `wsync` by path is built and run
#   1. with WSYNC_LIB_DIR alone (a relative path, resolved against the consumer's workspace)
#      and WSYNC_RPATH=1: no LD_LIBRARY_PATH;
#   2. with pkg-config alone, against a `cmake --install` prefix in a temporary directory;
#   3. statically (feature `static`, libwsync.a and `pkg-config --static`): no libwsync.so needed;
#   4. as a docs-only build (DOCS_RS=1) with no library anywhere;
# and a WSYNC_LIB_DIR that does not exist must fail saying so.
# Usage: run.sh <source dir> <build dir>. Exit 77 (skipped) without cargo.
set -eu
src=$(cd "$1" && pwd)
bin=$(cd "$2" && pwd)
command -v cargo >/dev/null 2>&1 || { echo "cargo not found: skipped"; exit 77; }
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
unset LD_LIBRARY_PATH WSYNC_LIB_DIR WSYNC_RPATH WSYNC_STATIC WSYNC_INCLUDE_DIR DOCS_RS \
  PKG_CONFIG_PATH CARGO_TARGET_DIR 2>/dev/null || true
export PKG_CONFIG_PATH=/nonexistent  # nothing from the system unless a step says so
export CARGO_NET_OFFLINE=true CARGO_TERM_COLOR=never

app="$work/consumer"
mkdir -p "$app/src"
cp "$src/tests/rust-consumer/main.rs" "$app/src/main.rs"
cp "$src/tests/rust-consumer/build.rs" "$app/build.rs"
cat > "$app/Cargo.toml" <<TOML
[package]
name = "wsync-consumer"
version = "0.1.0"
edition = "2021"
publish = false

[dependencies]
wsync = { path = "$src/bindings/rust/wsync" }
# Only for its links metadata (DEP_WSYNC_RPATH) in build.rs.
wsync-sys = { path = "$src/bindings/rust/wsync-sys" }

[features]
static = ["wsync/static"]

[workspace]
TOML
exe="$app/target/debug/wsync-consumer"
cd "$app"

echo "--- WSYNC_LIB_DIR (relative) + WSYNC_RPATH=1, no LD_LIBRARY_PATH"
rel=$(realpath --relative-to="$app" "$bin")
WSYNC_LIB_DIR="$rel" WSYNC_RPATH=1 cargo build --quiet
readelf -d "$exe" | grep -E 'RUNPATH|RPATH'
"$exe" lib-dir

echo "--- WSYNC_LIB_DIR that does not exist"
if WSYNC_LIB_DIR=no/such/dir cargo build --quiet > "$work/err.txt" 2>&1; then
  echo "a missing WSYNC_LIB_DIR was accepted"; exit 1
fi
grep -q "no such directory exists" "$work/err.txt" || { cat "$work/err.txt"; exit 1; }
grep "$app/no/such/dir" "$work/err.txt"

echo "--- pkg-config (cmake --install prefix)"
prefix="$work/prefix"
cmake --install "$bin" --prefix "$prefix" >/dev/null
pcdir=$(dirname "$(find "$prefix" -name wsync.pc)")
PKG_CONFIG_PATH="$pcdir" WSYNC_RPATH=1 cargo build --quiet
readelf -d "$exe" | grep -E 'RUNPATH|RPATH'
"$exe" pkg-config

echo "--- static (feature static, pkg-config --static)"
PKG_CONFIG_PATH="$pcdir" cargo build --quiet --features static
if readelf -d "$exe" | grep -q 'libwsync'; then
  echo "the static build still needs libwsync.so:"; readelf -d "$exe"; exit 1
fi
rm -rf "$prefix"   # no library left anywhere: the binary must not need one
"$exe" static

echo "--- docs only (DOCS_RS=1, no library)"
DOCS_RS=1 cargo check --quiet
echo "rust_consumer: OK"
