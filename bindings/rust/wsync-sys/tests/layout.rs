//! The Rust structs must have exactly the size, alignment and field offsets of the C structs
//! the loaded library was compiled with, as it reports them through `wsync_abi_layout()`.

use std::collections::BTreeMap;
use std::ffi::{c_char, CStr};
use std::mem::{align_of, offset_of, size_of};

use wsync_sys::*;

/// The part of JSON the layout document uses: objects, arrays, numbers, strings, literals.
#[derive(Debug, Clone, PartialEq)]
enum Json {
    Null,
    Bool(bool),
    Num(f64),
    Str(String),
    Arr(Vec<Json>),
    Obj(BTreeMap<String, Json>),
}

impl Json {
    fn get(&self, key: &str) -> Option<&Json> {
        match self {
            Json::Obj(m) => m.get(key),
            _ => None,
        }
    }
    // The guard keeps only non-negative whole numbers; offsets and sizes are far below 2^52.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    fn as_usize(&self) -> Option<usize> {
        match self {
            Json::Num(n) if *n >= 0.0 && n.fract() == 0.0 => Some(*n as usize),
            _ => None,
        }
    }
}

/// A small recursive-descent reader; it rejects anything it does not understand.
struct Reader<'a> {
    s: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn parse(text: &'a str) -> Result<Json, String> {
        let mut r = Reader {
            s: text.as_bytes(),
            at: 0,
        };
        let v = r.value(0)?;
        r.ws();
        if r.at != r.s.len() {
            return Err(format!("trailing bytes at {}", r.at));
        }
        Ok(v)
    }
    fn ws(&mut self) {
        while self.at < self.s.len() && matches!(self.s[self.at], b' ' | b'\n' | b'\r' | b'\t') {
            self.at += 1;
        }
    }
    fn eat(&mut self, c: u8) -> Result<(), String> {
        self.ws();
        if self.s.get(self.at) == Some(&c) {
            self.at += 1;
            Ok(())
        } else {
            Err(format!("expected '{}' at {}", c as char, self.at))
        }
    }
    fn value(&mut self, depth: usize) -> Result<Json, String> {
        if depth > 32 {
            return Err("nested too deep".into());
        }
        self.ws();
        match self.s.get(self.at).copied() {
            Some(b'{') => {
                self.at += 1;
                let mut m = BTreeMap::new();
                self.ws();
                if self.s.get(self.at) == Some(&b'}') {
                    self.at += 1;
                    return Ok(Json::Obj(m));
                }
                loop {
                    self.ws();
                    let k = self.string()?;
                    self.eat(b':')?;
                    let v = self.value(depth + 1)?;
                    m.insert(k, v);
                    self.ws();
                    match self.s.get(self.at) {
                        Some(b',') => self.at += 1,
                        Some(b'}') => {
                            self.at += 1;
                            return Ok(Json::Obj(m));
                        }
                        _ => return Err(format!("bad object at {}", self.at)),
                    }
                }
            }
            Some(b'[') => {
                self.at += 1;
                let mut a = Vec::new();
                self.ws();
                if self.s.get(self.at) == Some(&b']') {
                    self.at += 1;
                    return Ok(Json::Arr(a));
                }
                loop {
                    a.push(self.value(depth + 1)?);
                    self.ws();
                    match self.s.get(self.at) {
                        Some(b',') => self.at += 1,
                        Some(b']') => {
                            self.at += 1;
                            return Ok(Json::Arr(a));
                        }
                        _ => return Err(format!("bad array at {}", self.at)),
                    }
                }
            }
            Some(b'"') => Ok(Json::Str(self.string()?)),
            Some(b't') => self.literal("true", Json::Bool(true)),
            Some(b'f') => self.literal("false", Json::Bool(false)),
            Some(b'n') => self.literal("null", Json::Null),
            Some(c) if c == b'-' || c.is_ascii_digit() => {
                let start = self.at;
                while self.at < self.s.len()
                    && matches!(
                        self.s[self.at],
                        b'-' | b'+' | b'.' | b'e' | b'E' | b'0'..=b'9'
                    )
                {
                    self.at += 1;
                }
                let text = std::str::from_utf8(&self.s[start..self.at]).unwrap();
                text.parse()
                    .map(Json::Num)
                    .map_err(|_| format!("bad number '{text}'"))
            }
            _ => Err(format!("unexpected byte at {}", self.at)),
        }
    }
    fn literal(&mut self, word: &str, v: Json) -> Result<Json, String> {
        if self.s[self.at..].starts_with(word.as_bytes()) {
            self.at += word.len();
            Ok(v)
        } else {
            Err(format!("bad literal at {}", self.at))
        }
    }
    fn string(&mut self) -> Result<String, String> {
        if self.s.get(self.at) != Some(&b'"') {
            return Err(format!("expected a string at {}", self.at));
        }
        self.at += 1;
        let mut out = Vec::new();
        loop {
            match self.s.get(self.at).copied() {
                None => return Err("unterminated string".into()),
                Some(b'"') => {
                    self.at += 1;
                    return String::from_utf8(out).map_err(|_| "string is not UTF-8".into());
                }
                Some(b'\\') => {
                    // Struct and field names never need escapes; keep the escaped byte as is.
                    let c = *self.s.get(self.at + 1).ok_or("unterminated escape")?;
                    if c == b'u' {
                        return Err("\\u escapes are not expected in the layout".into());
                    }
                    out.push(c);
                    self.at += 2;
                }
                Some(c) => {
                    out.push(c);
                    self.at += 1;
                }
            }
        }
    }
}

fn library_layout() -> Json {
    let mut text: *mut c_char = std::ptr::null_mut();
    // SAFETY: wsync_abi_layout writes a library-owned NUL-terminated string to a valid
    // out-pointer; it is read once and freed with wsync_string_free below.
    let status = unsafe { wsync_abi_layout(&mut text) };
    assert_eq!(status, WSYNC_OK, "wsync_abi_layout failed");
    assert!(!text.is_null());
    // SAFETY: on success `text` is a valid C string until it is freed.
    let owned = unsafe { CStr::from_ptr(text) }
        .to_str()
        .expect("layout is UTF-8")
        .to_owned();
    // SAFETY: `text` came from the library and is freed exactly once.
    unsafe { wsync_string_free(text) };
    Reader::parse(&owned).unwrap_or_else(|e| panic!("layout JSON: {e}\n{owned}"))
}

/// One Rust struct's layout: (size, align, [(C field name, Rust offset)]).
struct Decl {
    name: &'static str,
    size: usize,
    align: usize,
    fields: Vec<(&'static str, usize)>,
}

macro_rules! decl {
    ($t:ident { $($c:literal => $f:ident),* $(,)? }) => {
        Decl {
            name: stringify!($t),
            size: size_of::<$t>(),
            align: align_of::<$t>(),
            fields: vec![$(($c, offset_of!($t, $f))),*],
        }
    };
}

fn declarations() -> Vec<Decl> {
    vec![
        decl!(wsync_dtype_t { "code" => code, "bits" => bits, "lanes" => lanes }),
        decl!(wsync_device_t { "type" => type_, "index" => index }),
        decl!(wsync_tensor_t {
            "name" => name, "data" => data, "shape" => shape, "strides" => strides,
            "ndim" => ndim, "dtype" => dtype, "device" => device, "flags" => flags,
            "struct_size" => struct_size,
        }),
        decl!(wsync_chunk_t {
            "tensors" => tensors, "count" => count, "flags" => flags,
            "struct_size" => struct_size,
        }),
        decl!(wsync_part_t { "offset" => offset, "bytes" => bytes }),
        decl!(wsync_blob_t { "data" => data, "size" => size }),
        decl!(wsync_recv_info_t {
            "struct_size" => struct_size, "flags" => flags, "version" => version,
            "bytes" => bytes, "count" => count, "chunk_index" => chunk_index,
            "version_chunks" => version_chunks, "version_tensors" => version_tensors,
            "version_bytes" => version_bytes,
        }),
        decl!(wsync_failure_t {
            "struct_size" => struct_size, "what" => what, "status" => status,
            "receiver" => receiver, "version" => version, "chunk_index" => chunk_index,
            "pid" => pid, "message" => message,
        }),
        decl!(wsync_receiver_state_t {
            "struct_size" => struct_size, "flags" => flags,
            "completed_version" => completed_version, "open_version" => open_version,
            "failed_version" => failed_version, "failed_status" => failed_status,
            "reserved_" => reserved_,
        }),
        decl!(wsync_patch_t {
            "struct_size" => struct_size, "index_bits" => index_bits,
            "base_version" => base_version, "count" => count, "elements" => elements,
            "indices" => indices, "values" => values, "base_xxh3" => base_xxh3,
            "result_xxh3" => result_xxh3,
        }),
        decl!(wsync_dest_t {
            "name" => name, "data" => data, "shape" => shape, "ndim" => ndim,
            "dtype" => dtype, "src_offset" => src_offset, "bytes" => bytes,
            "flags" => flags, "struct_size" => struct_size,
        }),
        decl!(wsync_apply_result_t {
            "struct_size" => struct_size, "launches" => launches, "tensors" => tensors,
            "writes" => writes, "unmatched" => unmatched, "bytes" => bytes,
            "device_copies" => device_copies,
        }),
    ]
}

#[test]
fn every_struct_matches_the_library_layout_field_by_field() {
    let layout = library_layout();
    for d in declarations() {
        let c = layout
            .get(d.name)
            .unwrap_or_else(|| panic!("library reports no {}", d.name));
        let num = |k: &str| c.get(k).and_then(Json::as_usize);
        assert_eq!(num("size"), Some(d.size), "{}: size", d.name);
        assert_eq!(num("align"), Some(d.align), "{}: align", d.name);
        let Some(Json::Obj(fields)) = c.get("fields") else {
            panic!("{}: no fields object", d.name)
        };
        assert_eq!(
            fields.len(),
            d.fields.len(),
            "{}: the library reports fields {:?}",
            d.name,
            fields.keys().collect::<Vec<_>>()
        );
        for (field, offset) in &d.fields {
            let got = fields.get(*field).and_then(Json::as_usize);
            assert_eq!(got, Some(*offset), "{}.{}: offset", d.name, field);
        }
    }
}

#[test]
fn every_declared_struct_is_reported_by_the_library() {
    let layout = library_layout();
    for d in declarations() {
        assert!(
            layout.get(d.name).is_some(),
            "{} is declared but the library does not report it",
            d.name
        );
    }
    assert_eq!(declarations().len(), 12);
}

#[test]
fn every_struct_the_library_reports_is_declared() {
    let Json::Obj(all) = library_layout() else {
        panic!("layout is not an object")
    };
    let declared: Vec<&str> = declarations().iter().map(|d| d.name).collect();
    for name in all.keys() {
        if name == "wsync_status_t" {
            continue; // an enum, checked below
        }
        assert!(
            declared.contains(&name.as_str()),
            "{name} is in the library but not declared"
        );
    }
}

#[test]
fn status_enum_is_32_bits_like_the_alias() {
    let layout = library_layout();
    let s = layout
        .get("wsync_status_t")
        .expect("library reports wsync_status_t");
    assert_eq!(
        s.get("size").and_then(Json::as_usize),
        Some(size_of::<wsync_status_t>())
    );
    assert_eq!(
        s.get("align").and_then(Json::as_usize),
        Some(align_of::<wsync_status_t>())
    );
}

#[test]
fn reader_rejects_what_it_does_not_understand() {
    assert!(Reader::parse("{\"a\": 1,}").is_err());
    assert!(Reader::parse("{\"a\": 1} x").is_err());
    assert!(Reader::parse("[1, 2").is_err());
    assert_eq!(
        Reader::parse(" [true, null, -2.5] ").unwrap(),
        Json::Arr(vec![Json::Bool(true), Json::Null, Json::Num(-2.5)])
    );
}
