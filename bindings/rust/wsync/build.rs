//! Passes where `wsync-sys` found libwsync on to this crate's tests, which compile a C peer
//! against the same library: `DEP_WSYNC_LINK_SEARCH` and `DEP_WSYNC_INCLUDE` come from
//! wsync-sys's `links = "wsync"` metadata and become `WSYNC_LINK_SEARCH` and
//! `WSYNC_INCLUDE_DIRS` at compile time (`:`-separated, possibly empty).
//!
//! With the `rpath` feature (or `WSYNC_RPATH=1`) wsync-sys reports the library's directory as
//! `DEP_WSYNC_RPATH`; it becomes the run path of this crate's tests and examples, so `cargo run
//! --example ...` and `cargo test` need no `LD_LIBRARY_PATH`. (Cargo applies link arguments only
//! to the package whose build script printed them, hence this second copy.)

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    for (from, to) in [
        ("DEP_WSYNC_LINK_SEARCH", "WSYNC_LINK_SEARCH"),
        ("DEP_WSYNC_INCLUDE", "WSYNC_INCLUDE_DIRS"),
    ] {
        println!("cargo:rerun-if-env-changed={from}");
        println!(
            "cargo:rustc-env={to}={}",
            std::env::var(from).unwrap_or_default()
        );
    }
    println!("cargo:rerun-if-env-changed=DEP_WSYNC_RPATH");
    let rpath = std::env::var("DEP_WSYNC_RPATH").unwrap_or_default();
    for dir in rpath.split(':').filter(|d| !d.is_empty()) {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
