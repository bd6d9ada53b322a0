#!/usr/bin/env bash
# A new Rust user's first steps (issue 39): a fresh cargo crate in a temporary directory with
# one dependency, `wsync` by path with its `static` feature, is built and run with no
# environment variable at all (no WSYNC_LIB_DIR: wsync-sys uses this checkout's build/; no
# LD_LIBRARY_PATH: nothing is looked up at run time), by `cargo run` and as the binary itself.
# Needs build/ (libwsync_static.a): run after the CTest stage. Offline, as CI is. An installed
# libwsync-dev is found first (pkg-config); WSYNC_TEST_PKG_CONFIG=/bin/false hides it.
set -euo pipefail
cd "$(dirname "$0")/.."
root=$PWD
[ -f build/libwsync_static.a ] || { echo "test-rust-consumer: build/libwsync_static.a is missing (build first)" >&2; exit 1; }
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT
mkdir -p "$dir/first-engine/src"
cat > "$dir/first-engine/Cargo.toml" <<TOML
[package]
name = "first-engine"
version = "0.1.0"
edition = "2021"

[dependencies]
wsync = { path = "$root/bindings/rust/wsync", features = ["static"] }
TOML
cat > "$dir/first-engine/src/main.rs" <<'RS'
use std::time::Duration;

fn main() -> Result<(), wsync::Error> {
    let mut trainer = wsync::Strategy::new("shm", r#"{"receivers": 1}"#)?;
    let init = trainer.create_init_info()?;
    let mut sender = wsync::Sender::new(&mut trainer, &init)?;
    let weights: Vec<f32> = (0..4096u16).map(f32::from).collect();
    let request = sender.send_chunk(&[wsync::TensorRef::new("w", &weights, &[64, 64])?], true)?;
    let mut engine = wsync::Strategy::new("shm", "")?;
    let mut receiver = wsync::Receiver::new(&mut engine, &init, 0)?;
    let mut recv = receiver.receive(&request)?;
    let mut got = vec![0f32; 4096];
    let loaded = (|| -> wsync::Result<()> {
        for view in recv.views() {
            let view = view?;
            let at = view.part().offset as usize / 4;
            view.copy_to(&mut got[at..at + view.byte_len() / 4])?;
        }
        Ok(())
    })();
    recv.finish(loaded)?;
    sender.flush(Duration::from_secs(30))?;
    assert_eq!(got, weights);
    println!("first-engine: version {} loaded, libwsync {}", receiver.completed_version()?, wsync::version());
    Ok(())
}
RS
# Only what a shell needs to find cargo: PATH and HOME (rustup's toolchain and cargo's home).
clean=(env -i "PATH=$PATH" "HOME=$HOME" ${WSYNC_TEST_PKG_CONFIG:+"PKG_CONFIG=$WSYNC_TEST_PKG_CONFIG"})
(cd "$dir/first-engine" && "${clean[@]}" cargo run --offline --quiet)
out=$("${clean[@]}" "$dir/first-engine/target/debug/first-engine")
echo "$out"
# The library linked must be this tree's: a libwsync-dev left installed is found first by
# pkg-config, and the test would then pass against that older copy.
tree=$(sed -n 's/^#define WSYNC_VERSION_\(MAJOR\|MINOR\|PATCH\) \([0-9]*\).*/\2/p' include/wsync.h | paste -sd.)
grep -q "libwsync $tree\$" <<<"$out" || {
  echo "test-rust-consumer: the crate linked another libwsync than this tree's $tree ($out);" \
       "a system copy (pkg-config --modversion wsync: $(pkg-config --modversion wsync 2>/dev/null || echo none))" \
       "is found before the checkout's build: remove it (apt-get purge libwsync-dev libwsync0)" >&2
  exit 1
}
echo "test-rust-consumer: a fresh crate depending on wsync alone built and ran with no environment variables"
