//! `src/lib.rs` must declare every function, type and constant of `include/wsync.h`, with the
//! header's values. The header is read from the source tree (or `$WSYNC_HEADER`), so a change
//! to the C contract that the Rust declarations miss fails here.

use std::path::PathBuf;

use wsync_sys::*;

const SOURCE: &str = include_str!("../src/lib.rs");

fn header() -> String {
    let path = std::env::var_os("WSYNC_HEADER").map_or_else(
        || PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../include/wsync.h"),
        PathBuf::from,
    );
    std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read the C header {}: {e}", path.display()))
}

/// Names of the functions the header exports (`WSYNC_API <type> name(`).
fn header_functions(h: &str) -> Vec<String> {
    let mut names = Vec::new();
    for decl in h.split("WSYNC_API").skip(1) {
        let Some(paren) = decl.find('(') else {
            continue;
        };
        let before = &decl[..paren];
        let name = before
            .rsplit(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .next()
            .unwrap_or("");
        if name.starts_with("wsync_") {
            names.push(name.to_string());
        }
    }
    names
}

/// `#define WSYNC_NAME <integer>` lines, and the status enumerators `WSYNC_NAME = <integer>`.
fn header_constants(h: &str) -> Vec<(String, i64)> {
    fn int(text: &str) -> Option<i64> {
        let t = text.trim().trim_end_matches(['u', 'U']);
        if t == "UINT32_MAX" {
            return Some(i64::from(u32::MAX));
        }
        match t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
            Some(hex) => i64::from_str_radix(hex, 16).ok(),
            None => t.parse().ok(),
        }
    }
    let mut out = Vec::new();
    for line in h.lines() {
        let code = line.split("/*").next().unwrap_or("").trim();
        if let Some(rest) = code.strip_prefix("#define ") {
            let mut parts = rest.splitn(2, char::is_whitespace);
            let (name, value) = (parts.next().unwrap_or(""), parts.next().unwrap_or(""));
            if name.starts_with("WSYNC_") {
                if let Some(v) = int(value) {
                    out.push((name.to_string(), v));
                }
            }
        } else if let Some((name, value)) = code.trim_end_matches(',').split_once(" = ") {
            if name.starts_with("WSYNC_") {
                out.push((
                    name.trim().to_string(),
                    int(value).expect("enumerator value"),
                ));
            }
        }
    }
    out
}

/// Every constant this crate declares, with its value widened to i64.
// One macro widens constants of every integer type; `usize` and `u64` have no `From` into i64,
// so `as` it is (the u64 sentinels compare as their wrapped value on both sides).
#[allow(clippy::cast_lossless, clippy::cast_possible_wrap)]
fn rust_constants() -> Vec<(&'static str, i64)> {
    macro_rules! table {
        ($($c:ident),* $(,)?) => { vec![$((stringify!($c), $c as i64)),*] };
    }
    table![
        WSYNC_VERSION_MAJOR,
        WSYNC_VERSION_MINOR,
        WSYNC_VERSION_PATCH,
        WSYNC_OK,
        WSYNC_ERR_INVALID_ARGUMENT,
        WSYNC_ERR_UNSUPPORTED,
        WSYNC_ERR_UNAVAILABLE,
        WSYNC_ERR_MALFORMED,
        WSYNC_ERR_MISMATCH,
        WSYNC_ERR_TIMEOUT,
        WSYNC_ERR_PEER,
        WSYNC_ERR_NO_MEMORY,
        WSYNC_ERR_WRONG_STATE,
        WSYNC_ERR_SYSTEM,
        WSYNC_ERR_INTERNAL,
        WSYNC_ERR_INTEGRITY,
        WSYNC_ERR_ABANDONED,
        WSYNC_ERR_SKIPPED,
        WSYNC_STATUS_FORCE_32BIT_,
        WSYNC_DTYPE_INT,
        WSYNC_DTYPE_UINT,
        WSYNC_DTYPE_FLOAT,
        WSYNC_DTYPE_BFLOAT,
        WSYNC_DTYPE_COMPLEX,
        WSYNC_DTYPE_BOOL,
        WSYNC_DTYPE_FLOAT8_E3M4,
        WSYNC_DTYPE_FLOAT8_E4M3,
        WSYNC_DTYPE_FLOAT8_E4M3B11FNUZ,
        WSYNC_DTYPE_FLOAT8_E4M3FN,
        WSYNC_DTYPE_FLOAT8_E4M3FNUZ,
        WSYNC_DTYPE_FLOAT8_E5M2,
        WSYNC_DTYPE_FLOAT8_E5M2FNUZ,
        WSYNC_DTYPE_FLOAT8_E8M0FNU,
        WSYNC_DTYPE_FLOAT6_E2M3FN,
        WSYNC_DTYPE_FLOAT6_E3M2FN,
        WSYNC_DTYPE_FLOAT4_E2M1FN,
        WSYNC_DEVICE_CPU,
        WSYNC_DEVICE_CUDA,
        WSYNC_DEVICE_CUDA_HOST,
        WSYNC_DEVICE_ROCM,
        WSYNC_DEVICE_ROCM_HOST,
        WSYNC_DEVICE_CUDA_MANAGED,
        WSYNC_MAX_NDIM,
        WSYNC_MAX_CHUNK_TENSORS,
        WSYNC_MAX_NAME_BYTES,
        WSYNC_MAX_BLOB_BYTES,
        WSYNC_TENSOR_READ_ONLY,
        WSYNC_TENSOR_PATCH,
        WSYNC_CHUNK_LAST,
        WSYNC_FAILURE_FAILED,
        WSYNC_FAILURE_DIED,
        WSYNC_FAILURE_DETACHED,
        WSYNC_FAILURE_TIMEOUT,
        WSYNC_FAILURE_DROPPED,
        WSYNC_NO_CHUNK,
        WSYNC_RECEIVER_DROPPED,
        WSYNC_RECEIVER_SENDER_GONE,
        WSYNC_RECEIVER_ORDERS_LOADER_WORK,
        WSYNC_APPLY_PARTIAL,
        WSYNC_APPLY_COMPLETE,
        WSYNC_APPLY_RESULT_SIZE_0_6_0,
    ]
}

#[test]
fn every_header_function_is_declared_and_nothing_else() {
    let h = header();
    let funcs = header_functions(&h);
    assert!(
        funcs.len() >= 30,
        "parsed only {} functions from the header",
        funcs.len()
    );
    for f in &funcs {
        assert!(
            SOURCE.contains(&format!("pub fn {f}(")),
            "{f} is in wsync.h but not declared"
        );
    }
    let declared = SOURCE.matches("pub fn wsync_").count();
    assert_eq!(
        declared,
        funcs.len(),
        "lib.rs declares functions the header does not have"
    );
}

#[test]
fn every_header_constant_has_the_header_value() {
    let h = header();
    let consts = header_constants(&h);
    assert!(
        consts.len() >= 40,
        "parsed only {} constants from the header",
        consts.len()
    );
    let rust = rust_constants();
    for (name, value) in &consts {
        let got = rust.iter().find(|(n, _)| n == name).map(|(_, v)| *v);
        assert_eq!(got, Some(*value), "{name}: header says {value}");
        assert!(
            SOURCE.contains(&format!("pub const {name}:")),
            "{name} is not declared"
        );
    }
    for (name, _) in &rust {
        assert!(
            consts.iter().any(|(n, _)| n == name),
            "{name} is not in the header"
        );
    }
}

#[test]
fn version_number_follows_the_header_formula() {
    assert_eq!(
        WSYNC_VERSION_NUMBER,
        WSYNC_VERSION_MAJOR * 10000 + WSYNC_VERSION_MINOR * 100 + WSYNC_VERSION_PATCH
    );
    assert!(header().contains(
        "(WSYNC_VERSION_MAJOR * 10000 + WSYNC_VERSION_MINOR * 100 + WSYNC_VERSION_PATCH)"
    ));
    // SAFETY: takes no arguments and never fails.
    let loaded = unsafe { wsync_version_number() };
    assert_eq!(
        loaded / 10000,
        WSYNC_VERSION_MAJOR,
        "loaded library has another major version"
    );
}

#[test]
fn every_header_type_is_declared() {
    let h = header();
    let mut types = Vec::new();
    for line in h.lines() {
        for kw in ["typedef struct ", "typedef enum "] {
            if let Some(rest) = line.trim().strip_prefix(kw) {
                let name: String = rest
                    .chars()
                    .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                    .collect();
                if !types.contains(&name) {
                    types.push(name);
                }
            }
        }
    }
    assert_eq!(types.len(), 19, "types parsed from the header: {types:?}");
    for t in &types {
        let declared = SOURCE.contains(&format!("pub struct {t} "))
            || SOURCE.contains(&format!("pub type {t} ="))
            || SOURCE.contains(&format!("    {t};"));
        assert!(declared, "{t} is in wsync.h but not declared");
    }
}

#[test]
fn failure_message_has_the_header_length() {
    let h = header();
    let decl = h
        .split("typedef struct wsync_failure_t")
        .nth(1)
        .expect("wsync_failure_t in the header");
    assert!(
        decl.contains("char message[256];"),
        "message length changed in the header"
    );
    assert_eq!(wsync_failure_t::default().message.len(), 256);
}

#[test]
fn sized_constructors_set_struct_size_to_the_declared_size() {
    use std::mem::size_of;
    assert_eq!(
        wsync_tensor_t::sized().struct_size as usize,
        size_of::<wsync_tensor_t>()
    );
    assert_eq!(
        wsync_recv_info_t::sized().struct_size as usize,
        size_of::<wsync_recv_info_t>()
    );
    assert_eq!(
        wsync_failure_t::sized().struct_size as usize,
        size_of::<wsync_failure_t>()
    );
    assert_eq!(
        wsync_receiver_state_t::sized().struct_size as usize,
        size_of::<wsync_receiver_state_t>()
    );
    assert_eq!(
        wsync_patch_t::sized().struct_size as usize,
        size_of::<wsync_patch_t>()
    );
    assert_eq!(
        wsync_dest_t::sized().struct_size as usize,
        size_of::<wsync_dest_t>()
    );
    assert_eq!(
        wsync_apply_result_t::sized().struct_size as usize,
        size_of::<wsync_apply_result_t>()
    );
}

#[test]
fn loaded_library_is_at_least_the_header_version() {
    // SAFETY: takes no arguments and never fails.
    let loaded = unsafe { wsync_version_number() };
    assert!(
        loaded >= WSYNC_VERSION_NUMBER,
        "loaded libwsync {loaded} is older than the declarations ({WSYNC_VERSION_NUMBER})"
    );
}
