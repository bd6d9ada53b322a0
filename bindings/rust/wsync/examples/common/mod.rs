//! What the example trainer and engine share with each other and with the C peer
//! (`bindings/rust/tests/c_peer/c_peer.c`): the frame format that carries blobs between
//! processes, the toy model and the formula for its weights, and command-line parsing. The
//! trainer's and engine's loops are in their own files (`run_trainer`, `run_engine`), which the
//! cross-language tests include to run them in their own process.
//!
//! Frames: a byte stream (pipe, stdin/stdout, FIFO) of `tag (1 byte: 'I' init info, 'R'
//! request, 'Q' end) | length (u64 LE, at most 64 MiB) | payload`; `I` once, first; one `R` per
//! chunk in send order; `Q` last, its payload the number of versions sent and flushed (u64 LE).
//! A stream without `Q` means the trainer failed. The writer flushes after every frame.
//!
//! Weights: element `i` of tensor `t` at version `v` (from 1) is derived from
//! `w = splitmix64(splitmix64(splitmix64(v) ^ t) ^ i)` as float32 `(w >> 40) * 2^-23 - 1`
//! (exact), bfloat16 bits `w >> 48`, uint8 `w >> 56`, int64 `w`, little-endian, so a receiver
//! checks what arrived bit for bit without trusting the library. Both are described in
//! `bindings/rust/README.md` ("Examples"); the C peer implements the same.

use std::io::{self, Read, Write};

use wsync::{DType, TensorRef, TensorSpec, View};

// --- frames ---------------------------------------------------------------------------------

/// Tag of the init-info frame.
pub const TAG_INIT: u8 = b'I';
/// Tag of a request frame.
pub const TAG_REQUEST: u8 = b'R';
/// Tag of the final frame (payload: u64 LE number of versions sent).
pub const TAG_DONE: u8 = b'Q';
/// Largest payload a reader accepts.
pub const MAX_FRAME: u64 = 64 << 20;

/// Writes one frame and flushes the writer.
pub fn write_frame(w: &mut impl Write, tag: u8, payload: &[u8]) -> io::Result<()> {
    let mut header = [0u8; 9];
    header[0] = tag;
    header[1..].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    w.write_all(&header)?;
    w.write_all(payload)?;
    w.flush()
}

/// Reads one frame: `Ok(None)` at a clean end of stream (no byte of a new frame), an error for
/// a truncated frame, an unknown tag or an oversized length.
pub fn read_frame(r: &mut impl Read) -> io::Result<Option<(u8, Vec<u8>)>> {
    let mut header = [0u8; 9];
    loop {
        match r.read(&mut header[..1]) {
            Ok(0) => return Ok(None),
            Ok(_) => break,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    r.read_exact(&mut header[1..])?;
    let [tag, len @ ..] = header;
    let len = u64::from_le_bytes(len);
    let invalid = |why: String| Err(io::Error::new(io::ErrorKind::InvalidData, why));
    if ![TAG_INIT, TAG_REQUEST, TAG_DONE].contains(&tag) {
        return invalid(format!(
            "unknown frame tag 0x{tag:02x} (not a wsync frame stream?)"
        ));
    }
    if len > MAX_FRAME {
        return invalid(format!(
            "frame of {len} bytes exceeds the {MAX_FRAME}-byte limit"
        ));
    }
    let mut payload = vec![0u8; usize::try_from(len).expect("at most MAX_FRAME")];
    r.read_exact(&mut payload)?;
    Ok(Some((tag, payload)))
}

// --- model and weights ------------------------------------------------------------------------

/// One tensor of the toy model: its name, dtype (float32, bfloat16, uint8 or int64) and shape
/// (empty for a scalar).
#[derive(Debug, Clone, Copy)]
pub struct Param {
    /// Its name.
    pub name: &'static str,
    /// Its element type.
    pub dtype: DType,
    /// Its shape.
    pub shape: &'static [i64],
}

const fn param(name: &'static str, dtype: DType, shape: &'static [i64]) -> Param {
    Param { name, dtype, shape }
}

/// The toy model, in the order the trainer lists it (the C peer has the same table).
pub const MODEL: [Param; 11] = [
    param("embed.weight", DType::F32, &[64, 32]),
    param("layers.0.attn.q.weight", DType::BF16, &[32, 32]),
    param("layers.0.attn.k.weight", DType::BF16, &[32, 32]),
    param("layers.0.attn.v.weight", DType::BF16, &[32, 32]),
    param("layers.0.attn.o.weight", DType::F32, &[32, 32]),
    param("layers.0.mlp.up.weight", DType::F32, &[128, 32]),
    param("layers.0.mlp.down.weight", DType::F32, &[32, 128]),
    param("layers.0.norm.weight", DType::F32, &[32]),
    param("layers.0.norm.quant", DType::U8, &[3, 5, 7]),
    param("lm_head.weight", DType::F32, &[64, 32]),
    param("step", DType::I64, &[]),
];

/// splitmix64's output function (see the module docs).
pub fn splitmix64(x: u64) -> u64 {
    let x = x.wrapping_add(0x9E37_79B9_7F4A_7C15);
    let z = (x ^ (x >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    let z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

/// The 64-bit word behind element `i` of tensor `t` at version `v`.
pub fn word(v: u64, t: u64, i: u64) -> u64 {
    splitmix64(splitmix64(splitmix64(v) ^ t) ^ i)
}

/// A float32 element: exact in binary32, in [-1, 1).
// `w >> 40` has 24 bits, which binary32 holds exactly.
#[allow(clippy::cast_precision_loss)]
pub fn f32_of(w: u64) -> f32 {
    ((w >> 40) as f32) * (1.0 / 8_388_608.0) - 1.0
}

/// The bytes of tensor `t` of [`MODEL`] at version `v` (little-endian).
pub fn data(v: u64, t: usize) -> Vec<u8> {
    let p = &MODEL[t];
    let mut out = Vec::new();
    for w in (0..p.shape.iter().product::<i64>().unsigned_abs()).map(|i| word(v, t as u64, i)) {
        match p.dtype {
            DType::F32 => out.extend_from_slice(&f32_of(w).to_le_bytes()),
            DType::BF16 => out.extend_from_slice(&w.to_le_bytes()[6..]),
            DType::U8 => out.push(w.to_le_bytes()[7]),
            DType::I64 => out.extend_from_slice(&w.to_le_bytes()),
            other => unreachable!("the toy model has no {other} tensor"),
        }
    }
    out
}

/// A `TensorRef` over `bytes` (from [`data`]), named, typed and shaped as `MODEL[t]`.
pub fn tensor(t: usize, bytes: &[u8]) -> wsync::Result<TensorRef<'_>> {
    let p = &MODEL[t];
    TensorRef::from_bytes(p.name, bytes, p.shape, p.dtype)
}

/// Whether `view` is tensor `t` of [`MODEL`] at version `v`: name, dtype, shape and bytes.
pub fn matches(view: &View<'_>, v: u64, t: usize) -> wsync::Result<bool> {
    let p = &MODEL[t];
    if view.name() != p.name || view.dtype() != p.dtype || view.shape() != p.shape {
        return Ok(false);
    }
    // Copied out (safe whatever the trainer does meanwhile; `end` says whether to trust it).
    let mut got = vec![0u8; view.byte_len()];
    view.copy_bytes_to(&mut got)?;
    Ok(got == data(v, t))
}

/// The specs of [`MODEL`], for planning.
pub fn model_specs() -> wsync::Result<Vec<TensorSpec>> {
    MODEL
        .iter()
        .map(|p| TensorSpec::new(p.name, p.shape, p.dtype))
        .collect()
}

// --- command lines ------------------------------------------------------------------------------

/// Reads `--key value` pairs, handing each to `set`; `known` lists the keys accepted.
pub fn parse_args(
    args: impl IntoIterator<Item = String>,
    known: &[&str],
    mut set: impl FnMut(&str, String) -> Result<(), String>,
) -> Result<(), String> {
    let mut it = args.into_iter();
    while let Some(key) = it.next() {
        let name = key
            .strip_prefix("--")
            .ok_or_else(|| format!("unexpected argument '{key}'"))?;
        if !known.contains(&name) {
            return Err(format!(
                "unknown option --{name} (known: --{})",
                known.join(", --")
            ));
        }
        let value = it.next().ok_or_else(|| format!("--{name} needs a value"))?;
        set(name, value)?;
    }
    Ok(())
}

/// `value` as a non-negative integer.
pub fn number(key: &str, value: &str) -> Result<u64, String> {
    value
        .parse()
        .map_err(|_| format!("--{key} takes a non-negative integer, not '{value}'"))
}

/// `value` as a boolean: true/1/yes or false/0/no.
pub fn boolean(key: &str, value: &str) -> Result<bool, String> {
    match value {
        "true" | "1" | "yes" => Ok(true),
        "false" | "0" | "no" => Ok(false),
        _ => Err(format!("--{key} takes true or false, not '{value}'")),
    }
}
