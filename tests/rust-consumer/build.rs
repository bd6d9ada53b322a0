//! Cargo applies a build script's link arguments only to its own package, so the run path that
//! wsync-sys found (`WSYNC_RPATH=1` or the `rpath` feature) reaches this binary through the
//! `links` metadata: DEP_WSYNC_RPATH, `:`-separated, empty when rpath is off.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_WSYNC_RPATH");
    for dir in std::env::var("DEP_WSYNC_RPATH").unwrap_or_default().split(':') {
        if !dir.is_empty() {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
        }
    }
}
