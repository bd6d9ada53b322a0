//! Passes where `wsync-sys` found libwsync on to this crate's tests, which compile a C peer
//! against the same library: `DEP_WSYNC_LINK_SEARCH` and `DEP_WSYNC_INCLUDE` come from
//! wsync-sys's `links = "wsync"` metadata and become `WSYNC_LINK_SEARCH` and
//! `WSYNC_INCLUDE_DIRS` at compile time (`:`-separated, possibly empty).

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
}
