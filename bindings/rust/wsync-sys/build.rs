//! Finds libwsync and tells rustc how to link it, the way mature `-sys` crates (zstd-sys,
//! libgit2-sys) do. No dependencies: pkg-config is run by hand.
//!
//! Where the library comes from, first match wins:
//!
//! 1. `DOCS_RS` set (docs.rs, or any docs-only build): nothing is linked, no library is needed.
//! 2. `WSYNC_LIB_DIR`: a directory holding `libwsync.so` (dynamic) or `libwsync.a` /
//!    `libwsync_static.a` (static), e.g. a `CMake` build directory or `<prefix>/lib/<multiarch>`.
//!    A relative path is resolved against the workspace cargo was invoked in (then the directory
//!    it was invoked from), never against this crate's directory; a path that does not exist is
//!    an error naming what was tried.
//! 3. pkg-config (`PKG_CONFIG` names another binary): `pkg-config wsync`, which must be at least
//!    the version these declarations were written from (`--atleast-version=MAJOR.MINOR`) and of
//!    the same major version.
//! 4. Otherwise the build fails with a message saying what to install or set.
//!
//! How:
//!
//! - feature `static` (or `WSYNC_STATIC=1`): link the static library, plus the C++ runtime and
//!   the system libraries it uses (`stdc++`, `pthread`, `rt`, `dl`; pkg-config's
//!   `--static` list when found that way). Nothing to find at run time.
//! - feature `rpath` (or `WSYNC_RPATH=1`), dynamic only: record the library's directory as the
//!   run path of this package's own tests and examples (`-Wl,-rpath`), and hand it to
//!   dependents as `DEP_WSYNC_RPATH`: Cargo applies a build script's link arguments only to its
//!   own package's targets, so a binary crate elsewhere adds a two-line build script (see the
//!   README). Without it the loader needs `LD_LIBRARY_PATH` for a non-system directory.
//!
//! The `wsync.h` next to the library (`<dir>/../include`, `<dir>/../../include`, the source
//! tree of a `CMake` build directory, pkg-config's `includedir`, or `WSYNC_INCLUDE_DIR`) gives the
//! version built against: it must match these declarations' major version and be at least their
//! minor version, and it becomes `WSYNC_BUILT_AGAINST_VERSION_NUMBER` (0 if no header was found),
//! which the `wsync` crate compares with the loaded library at run time.
//!
//! Metadata for dependents (`links = "wsync"`): `DEP_WSYNC_LINK_SEARCH` and `DEP_WSYNC_INCLUDE`
//! (`:`-separated, possibly empty), `DEP_WSYNC_RPATH` (empty unless rpath is on),
//! `DEP_WSYNC_STATIC` (`1` or `0`), `DEP_WSYNC_VERSION_NUMBER` (as above).

use std::env;
use std::path::{Path, PathBuf};
use std::process::{exit, Command};

/// The system libraries the static library needs (the shared one records them itself).
const STATIC_SYSTEM_LIBS: [&str; 4] = ["stdc++", "pthread", "rt", "dl"];

struct Found {
    search: Vec<PathBuf>,
    include: Vec<PathBuf>,
    header_version: Option<u32>,
}

fn main() {
    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/lib.rs");
    for var in [
        "DOCS_RS",
        "WSYNC_LIB_DIR",
        "WSYNC_INCLUDE_DIR",
        "WSYNC_STATIC",
        "WSYNC_RPATH",
        "PKG_CONFIG",
        "PKG_CONFIG_PATH",
        "PKG_CONFIG_LIBDIR",
        "PKG_CONFIG_SYSROOT_DIR",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }

    if env::var_os("DOCS_RS").is_some() {
        // Documentation only: declarations compile without the library, and nothing links.
        emit_metadata(&[], &[], None, false, None);
        return;
    }

    let want_static = env::var_os("CARGO_FEATURE_STATIC").is_some() || env_flag("WSYNC_STATIC");
    let want_rpath = env::var_os("CARGO_FEATURE_RPATH").is_some() || env_flag("WSYNC_RPATH");
    let declared = declared_version();

    let found = match env::var_os("WSYNC_LIB_DIR").filter(|v| !v.is_empty()) {
        Some(dir) => from_lib_dir(&resolve_lib_dir(&PathBuf::from(dir)), want_static),
        None => match from_pkg_config(want_static, declared) {
            Ok(found) => found,
            Err(why) => match checkout_build_dir(want_static) {
                Some(dir) => {
                    if !want_static && !want_rpath {
                        println!(
                            "cargo:warning=wsync-sys: linking the checkout's {}/libwsync.so; a \
                             binary made with it finds the library at run time only through \
                             LD_LIBRARY_PATH (or an installed libwsync0): enable wsync's \
                             `static` feature for one that needs nothing at run time",
                            dir.display()
                        );
                    }
                    from_lib_dir(&dir, want_static)
                }
                None => not_found(&why),
            },
        },
    };

    if let Some(v) = found.header_version {
        check_header_version(v, declared);
    } else {
        println!(
            "cargo:warning=wsync-sys: no wsync.h found beside the library (set WSYNC_INCLUDE_DIR); \
             the run-time check compares the loaded library with {}.{}.0 only",
            declared.0, declared.1
        );
    }

    let rpath = if want_rpath && !want_static {
        // This package's own tests; dependents read DEP_WSYNC_RPATH.
        for dir in &found.search {
            println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
        }
        Some(join(&found.search))
    } else {
        None
    };
    emit_metadata(
        &found.search,
        &found.include,
        found.header_version,
        want_static,
        rpath,
    );
}

/// The `CMake` build directory of the libwsync checkout this crate sits in
/// (`<checkout>/bindings/rust/wsync-sys` -> `<checkout>/build`), when it holds the library to
/// link: a crate with a path dependency on the checkout builds with no variable set.
fn checkout_build_dir(want_static: bool) -> Option<PathBuf> {
    let here = PathBuf::from(env::var_os("CARGO_MANIFEST_DIR")?);
    let dir = here.join("../../../build").canonicalize().ok()?;
    println!("cargo:rerun-if-changed={}", dir.join("libwsync.so").display());
    let names: &[&str] = if want_static {
        &["libwsync.a", "libwsync_static.a"]
    } else {
        &["libwsync.so"]
    };
    names
        .iter()
        .any(|n| dir.join(n).is_file())
        .then_some(dir)
}

fn env_flag(name: &str) -> bool {
    env::var(name).is_ok_and(|v| !matches!(v.as_str(), "" | "0" | "false" | "no" | "off"))
}

fn join(paths: &[PathBuf]) -> String {
    paths
        .iter()
        .map(|p| p.display().to_string())
        .collect::<Vec<_>>()
        .join(":")
}

fn emit_metadata(
    search: &[PathBuf],
    include: &[PathBuf],
    header_version: Option<u32>,
    is_static: bool,
    rpath: Option<String>,
) {
    let number = header_version.unwrap_or(0);
    println!("cargo:rustc-env=WSYNC_SYS_BUILT_AGAINST={number}");
    println!("cargo:link_search={}", join(search));
    println!("cargo:include={}", join(include));
    println!("cargo:rpath={}", rpath.unwrap_or_default());
    println!("cargo:static={}", u8::from(is_static));
    println!("cargo:version_number={number}");
}

/// `(major, minor, patch)` of `WSYNC_VERSION_*` in src/lib.rs, the one place they are written.
fn declared_version() -> (u32, u32, u32) {
    let source = include_str!("src/lib.rs");
    let get = |part: &str| -> u32 {
        let key = format!("pub const WSYNC_VERSION_{part}: u32 = ");
        source
            .lines()
            .find_map(|l| l.trim().strip_prefix(key.as_str()))
            .and_then(|rest| rest.trim_end_matches(';').trim().parse().ok())
            .unwrap_or_else(|| panic!("src/lib.rs declares no WSYNC_VERSION_{part}"))
    };
    (get("MAJOR"), get("MINOR"), get("PATCH"))
}

fn check_header_version(found: u32, declared: (u32, u32, u32)) {
    let least = declared.0 * 10000 + declared.1 * 100;
    if found / 10000 != declared.0 || found < least {
        eprintln!(
            "error: the libwsync being linked is {} (from its wsync.h), but wsync-sys declares \
             the {}.{} API: it needs libwsync {}.{}.0 or newer with major version {}. Point \
             WSYNC_LIB_DIR or PKG_CONFIG_PATH at a newer build.",
            text(found),
            declared.0,
            declared.1,
            declared.0,
            declared.1,
            declared.0
        );
        exit(1);
    }
}

fn text(number: u32) -> String {
    format!("{}.{}.{}", number / 10000, number / 100 % 100, number % 100)
}

/// A relative `WSYNC_LIB_DIR` means relative to the workspace the user invoked cargo in (a
/// build script runs in its own crate's directory, which would be surprising for a dependency).
fn resolve_lib_dir(dir: &Path) -> PathBuf {
    if dir.is_absolute() {
        if !dir.is_dir() {
            eprintln!(
                "error: WSYNC_LIB_DIR is '{}', which is not a directory.",
                dir.display()
            );
            exit(1);
        }
        return dir.to_path_buf();
    }
    let mut tried = Vec::new();
    for base in workspace_candidates() {
        let candidate = base.join(dir);
        if candidate.is_dir() {
            return candidate.canonicalize().unwrap_or(candidate);
        }
        if !tried.contains(&candidate) {
            tried.push(candidate);
        }
    }
    eprintln!(
        "error: WSYNC_LIB_DIR is the relative path '{}', which is resolved against the \
         workspace cargo was invoked in, but no such directory exists; tried:\n{}\n\
         Use an absolute path, or one relative to the workspace root.",
        dir.display(),
        tried
            .iter()
            .map(|p| format!("  {}", p.display()))
            .collect::<Vec<_>>()
            .join("\n")
    );
    exit(1);
}

/// The invoking workspace's root, then the directory cargo was started from: `CARGO_WORKSPACE_DIR`
/// if a config sets it, `cargo locate-project --workspace` run where cargo was started (`PWD`),
/// that directory itself, and the directory holding the `target` directory of `OUT_DIR`.
fn workspace_candidates() -> Vec<PathBuf> {
    let mut out = Vec::new();
    if let Some(dir) = env::var_os("CARGO_WORKSPACE_DIR") {
        out.push(PathBuf::from(dir));
    }
    let started = env::var_os("PWD").map(PathBuf::from);
    if let Some(pwd) = &started {
        let cargo = env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let located = Command::new(cargo)
            .args(["locate-project", "--workspace", "--message-format", "plain"])
            .current_dir(pwd)
            .output();
        if let Ok(o) = located {
            if o.status.success() {
                let manifest = PathBuf::from(String::from_utf8_lossy(&o.stdout).trim());
                if let Some(root) = manifest.parent() {
                    out.push(root.to_path_buf());
                }
            }
        }
        out.push(pwd.clone());
    }
    if let Some(out_dir) = env::var_os("OUT_DIR") {
        let out_dir = PathBuf::from(out_dir);
        if let Some(root) = out_dir
            .ancestors()
            .find(|a| a.file_name().is_some_and(|n| n == "target"))
            .and_then(Path::parent)
        {
            out.push(root.to_path_buf());
        }
    }
    out
}

fn from_lib_dir(dir: &Path, want_static: bool) -> Found {
    let dir = dir.canonicalize().unwrap_or_else(|_| dir.to_path_buf());
    if want_static {
        let Some(name) = ["wsync", "wsync_static"]
            .into_iter()
            .find(|n| dir.join(format!("lib{n}.a")).is_file())
        else {
            eprintln!(
                "error: the `static` feature (or WSYNC_STATIC) is on and WSYNC_LIB_DIR is '{}', \
                 but it holds no libwsync.a (installed by libwsync-dev or `cmake --install`) or \
                 libwsync_static.a (a CMake build directory).",
                dir.display()
            );
            exit(1);
        };
        println!("cargo:rustc-link-search=native={}", dir.display());
        println!("cargo:rustc-link-lib=static={name}");
        for lib in STATIC_SYSTEM_LIBS {
            println!("cargo:rustc-link-lib=dylib={lib}");
        }
    } else {
        let found = ["libwsync.so", "libwsync.dylib"]
            .iter()
            .any(|name| dir.join(name).exists());
        if !found {
            eprintln!(
                "error: WSYNC_LIB_DIR is set to '{}', but it holds no libwsync.so (or \
                 libwsync.dylib).\nPoint it at the directory with the built library, e.g. after\n  \
                 cmake -S <libwsync> -B build && cmake --build build\n\
                 set WSYNC_LIB_DIR=<libwsync>/build.",
                dir.display()
            );
            exit(1);
        }
        println!("cargo:rustc-link-search=native={}", dir.display());
        println!("cargo:rustc-link-lib=dylib=wsync");
    }
    let include = header_dirs_near(&dir);
    let header_version = include.iter().find_map(|d| header_version(d));
    Found {
        search: vec![dir],
        include,
        header_version,
    }
}

/// Include directories that may hold the `wsync.h` matching a library directory.
fn header_dirs_near(lib_dir: &Path) -> Vec<PathBuf> {
    let mut candidates = Vec::new();
    if let Some(dir) = env::var_os("WSYNC_INCLUDE_DIR") {
        candidates.push(PathBuf::from(dir));
    }
    // An install prefix: <prefix>/lib or <prefix>/lib/<multiarch>.
    for up in lib_dir.ancestors().skip(1).take(2) {
        candidates.push(up.join("include"));
    }
    // A CMake build directory: its source tree.
    if let Ok(cache) = std::fs::read_to_string(lib_dir.join("CMakeCache.txt")) {
        if let Some(src) = cache
            .lines()
            .find_map(|l| l.strip_prefix("wsync_SOURCE_DIR:STATIC="))
        {
            candidates.push(Path::new(src).join("include"));
        }
    }
    candidates
        .into_iter()
        .filter(|d| d.join("wsync.h").is_file())
        .collect()
}

/// `WSYNC_VERSION_NUMBER` as `dir/wsync.h` defines it.
fn header_version(dir: &Path) -> Option<u32> {
    let path = dir.join("wsync.h");
    let text = std::fs::read_to_string(&path).ok()?;
    println!("cargo:rerun-if-changed={}", path.display());
    let get = |part: &str| -> Option<u32> {
        let key = format!("#define WSYNC_VERSION_{part} ");
        text.lines()
            .find_map(|l| l.strip_prefix(key.as_str()))
            .and_then(|v| v.trim().parse().ok())
    };
    Some(get("MAJOR")? * 10000 + get("MINOR")? * 100 + get("PATCH")?)
}

fn from_pkg_config(want_static: bool, declared: (u32, u32, u32)) -> Result<Found, String> {
    let tool = env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".to_string());
    let modversion = run(&tool, &["--modversion", "wsync"])?;
    let least = format!("{}.{}", declared.0, declared.1);
    let major: Option<u32> = modversion
        .trim()
        .split('.')
        .next()
        .and_then(|m| m.parse().ok());
    if run(&tool, &["--atleast-version", &least, "wsync"]).is_err() || major != Some(declared.0) {
        return Err(format!(
            "`{tool}` finds libwsync {}, but this binding needs {least} or newer with major \
             version {} (`{tool} --atleast-version={least} wsync` fails); install a newer \
             libwsync-dev or point PKG_CONFIG_PATH at a newer installation",
            modversion.trim(),
            declared.0
        ));
    }
    let mut args = vec!["--libs-only-L", "--libs-only-l"];
    if want_static {
        args.push("--static");
    }
    args.push("wsync");
    let libs = run(&tool, &args)?;
    let mut search = Vec::new();
    if want_static && !libs.contains("-L") {
        // A system libdir goes unsaid by pkg-config, but rustc looks for static libraries only
        // in the directories it is given.
        if let Ok(dir) = run(&tool, &["--variable=libdir", "wsync"]) {
            let dir = dir.trim();
            if !dir.is_empty() {
                println!("cargo:rustc-link-search=native={dir}");
                search.push(PathBuf::from(dir));
            }
        }
    }
    let mut linked = false;
    for token in libs.split_whitespace() {
        if let Some(dir) = token.strip_prefix("-L") {
            if !dir.is_empty() {
                println!("cargo:rustc-link-search=native={dir}");
                search.push(PathBuf::from(dir));
            }
        } else if let Some(lib) = token.strip_prefix("-l") {
            if lib == "wsync" {
                let kind = if want_static { "static" } else { "dylib" };
                println!("cargo:rustc-link-lib={kind}={lib}");
                linked = true;
            } else if !lib.is_empty() {
                println!("cargo:rustc-link-lib=dylib={lib}");
            }
        }
        // Anything else (-pthread, -Wl,...) is not a library or a search path; the shared
        // library records its own dependencies, and --static lists the static one's as -l.
    }
    if !linked {
        return Err(format!(
            "`{tool} --libs wsync` succeeded but did not name -lwsync (it printed '{}')",
            libs.trim()
        ));
    }
    if want_static {
        // An older wsync.pc without Libs.private: make sure the C++ runtime is there.
        if !libs.contains("-lstdc++") {
            for lib in STATIC_SYSTEM_LIBS {
                println!("cargo:rustc-link-lib=dylib={lib}");
            }
        }
    }
    let mut include: Vec<PathBuf> = run(&tool, &["--cflags-only-I", "wsync"])
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|t| t.strip_prefix("-I"))
        .map(PathBuf::from)
        .collect();
    if let Ok(dir) = run(&tool, &["--variable=includedir", "wsync"]) {
        let dir = PathBuf::from(dir.trim());
        if !dir.as_os_str().is_empty() && !include.contains(&dir) {
            include.push(dir);
        }
    }
    if let Some(dir) = env::var_os("WSYNC_INCLUDE_DIR") {
        include.insert(0, PathBuf::from(dir));
    }
    let header_version = include.iter().find_map(|d| header_version(d));
    Ok(Found {
        search,
        include,
        header_version,
    })
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
         - or set WSYNC_LIB_DIR to the directory holding libwsync.so (e.g. a `CMake` build \
         directory; a checkout's own `build/` is used without it), and when running set \
         LD_LIBRARY_PATH to the same directory, or enable wsync's `static` feature (WSYNC_STATIC=1) \
         for a binary that needs no library at run time (the `rpath` feature, WSYNC_RPATH=1, \
         records the directory in this workspace's own tests and examples only: Cargo gives a \
         library crate's link arguments to no other crate);\n  \
         - or, for a docs-only build, set DOCS_RS=1."
    );
    exit(1);
}
