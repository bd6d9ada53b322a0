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
    readme_blocks();
}

/// The `rust` fenced blocks of the checkout's README.md ("top") and bindings/rust/README.md ("rust"),
/// each written as `OUT_DIR/readme/<which>_<n>.rs` wrapped in braces, and their numbers as
/// `TOP_BLOCKS` / `RUST_BLOCKS` in `counts.rs`: tests/readme.rs compiles and runs them as they
/// are written (issue 39). Outside a checkout there are none.
fn readme_blocks() {
    use std::path::PathBuf;
    let out = PathBuf::from(std::env::var_os("OUT_DIR").expect("cargo sets OUT_DIR")).join("readme");
    std::fs::create_dir_all(&out).expect("OUT_DIR is writable");
    let here = PathBuf::from(std::env::var_os("CARGO_MANIFEST_DIR").expect("cargo sets it"));
    let mut counts = String::new();
    for (which, path) in [
        ("top", here.join("../../../README.md")),
        ("rust", here.join("../README.md")),
    ] {
        println!("cargo:rerun-if-changed={}", path.display());
        let text = std::fs::read_to_string(&path).unwrap_or_default();
        let mut n = 0;
        let mut block: Option<Vec<&str>> = None;
        for line in text.lines() {
            match (&mut block, line.trim()) {
                (None, "```rust") => block = Some(Vec::new()),
                (Some(lines), "```") => {
                    let file = out.join(format!("{which}_{n}.rs"));
                    let code = format!("{{\n{}\n}}\n", lines.join("\n"));
                    std::fs::write(file, code).expect("OUT_DIR is writable");
                    n += 1;
                    block = None;
                }
                (Some(lines), _) => lines.push(line),
                (None, _) => {}
            }
        }
        let name = which.to_uppercase();
        counts.extend(["pub const ", &name, "_BLOCKS: usize = ", &n.to_string(), ";\n"]);
    }
    std::fs::write(out.join("counts.rs"), counts).expect("OUT_DIR is writable");
}
