//! Finds libwsync and tells rustc how to link it.
//!
//! 1. `WSYNC_LIB_DIR` (a directory holding `libwsync.so`, e.g. a CMake build directory):
//!    `-L native=$WSYNC_LIB_DIR -l wsync`.
//! 2. Otherwise `pkg-config --libs-only-L --libs-only-l wsync` (the `PKG_CONFIG` variable names
//!    another pkg-config), as installed by `libwsync-dev` or `cmake --install`.
//! 3. Otherwise the build fails with a message saying what to install or set.
//!
//! For dependents (the `links = "wsync"` metadata): `DEP_WSYNC_LINK_SEARCH` (the directories
//! searched, `:`-separated) and `DEP_WSYNC_INCLUDE` (include directories pkg-config reports,
//! `:`-separated, possibly empty).

use std::env;
use std::path::{Path, PathBuf};
use std::process::{exit, Command};

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    for var in [
        "WSYNC_LIB_DIR",
        "PKG_CONFIG",
        "PKG_CONFIG_PATH",
        "PKG_CONFIG_LIBDIR",
        "PKG_CONFIG_SYSROOT_DIR",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }

    match env::var_os("WSYNC_LIB_DIR").filter(|v| !v.is_empty()) {
        Some(dir) => from_lib_dir(PathBuf::from(dir)),
        None => match from_pkg_config() {
            Ok(()) => {}
            Err(why) => not_found(&why),
        },
    }
}

fn from_lib_dir(dir: PathBuf) {
    let found = ["libwsync.so", "libwsync.dylib"]
        .iter()
        .any(|name| dir.join(name).exists());
    if !found {
        eprintln!(
            "error: WSYNC_LIB_DIR is set to '{}', but it holds no libwsync.so (or libwsync.dylib).\n\
             Point it at the directory with the built library, e.g. after\n  \
             cmake -S <libwsync> -B build && cmake --build build\n\
             set WSYNC_LIB_DIR=<libwsync>/build.",
            dir.display()
        );
        exit(1);
    }
    let dir = dir.canonicalize().unwrap_or(dir);
    println!("cargo:rustc-link-search=native={}", dir.display());
    println!("cargo:rustc-link-lib=wsync");
    println!("cargo:link_search={}", dir.display());
    println!("cargo:include=");
}

fn from_pkg_config() -> Result<(), String> {
    let tool = env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".to_string());
    let libs = run(&tool, &["--libs-only-L", "--libs-only-l", "wsync"])?;
    let mut search = Vec::new();
    let mut linked = false;
    for token in libs.split_whitespace() {
        if let Some(dir) = token.strip_prefix("-L") {
            if !dir.is_empty() {
                println!("cargo:rustc-link-search=native={dir}");
                search.push(dir.to_string());
            }
        } else if let Some(lib) = token.strip_prefix("-l") {
            if !lib.is_empty() {
                println!("cargo:rustc-link-lib={lib}");
                linked |= lib == "wsync";
            }
        }
        // Anything else (-pthread, -Wl,...) is not a library or a search path; rustc's own
        // linker line already covers what libwsync.so needs (it links its dependencies itself).
    }
    if !linked {
        return Err(format!(
            "`{tool} --libs wsync` succeeded but did not name -lwsync (it printed '{}')",
            libs.trim()
        ));
    }
    // Include directories are metadata only (the Rust side needs no header); tests and
    // dependents' build scripts may use them to compile C against the same installation.
    let include = run(&tool, &["--cflags-only-I", "wsync"]).unwrap_or_default();
    let include: Vec<&str> = include
        .split_whitespace()
        .filter_map(|t| t.strip_prefix("-I"))
        .collect();
    println!("cargo:link_search={}", search.join(":"));
    println!("cargo:include={}", include.join(":"));
    Ok(())
}

fn run(tool: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(tool)
        .args(args)
        .output()
        .map_err(|e| format!("could not run `{tool}`: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "`{tool} {}` failed ({}): {}",
            args.join(" "),
            out.status,
            String::from_utf8_lossy(&out.stderr).trim()
        ));
    }
    String::from_utf8(out.stdout).map_err(|_| format!("`{tool}` printed non-UTF-8 output"))
}

fn not_found(why: &str) -> ! {
    let here = Path::new(env!("CARGO_MANIFEST_DIR")).display().to_string();
    eprintln!(
        "error: cannot find libwsync for the Rust binding ({here}).\n\
         pkg-config: {why}\n\
         Do one of:\n  \
         - install the development package: `apt install ./libwsync-dev_*.deb` (made by \
         `cpack -G DEB` in a libwsync build), or `cmake --install <build>`, so that \
         `pkg-config --libs wsync` works (set PKG_CONFIG_PATH for a non-standard prefix);\n  \
         - or set WSYNC_LIB_DIR to the directory holding libwsync.so (e.g. a CMake build \
         directory), and LD_LIBRARY_PATH to the same directory when running."
    );
    exit(1);
}
