//! What the example trainer and engine share with each other, with the C peer
//! (`bindings/rust/tests/c_peer/c_peer.c`) and with the cross-language tests: the frame format
//! that carries blobs between processes, the toy model, the formula for its weights, and the
//! trainer's and engine's loops ([`run_trainer`], [`run_engine`]), which the tests also run in
//! their own process. Each example reads its own command line.
//!
//! # Frames
//!
//! A byte stream (a pipe, stdin/stdout, a FIFO made with `mkfifo`) of frames:
//!
//! ```text
//! offset 0   tag      1 byte, ASCII: 'I', 'R' or 'Q'
//! offset 1   length   u64, little-endian, at most 64 MiB
//! offset 9   payload  `length` bytes
//! ```
//!
//! * `I`: the init-info blob; the first frame of a stream, exactly once.
//! * `R`: one request blob per chunk, in the order the trainer sent them.
//! * `Q`: the end; the payload is 8 bytes, u64 little-endian: the number of sync versions the
//!   trainer sent and flushed (every receiver acknowledged them). Nothing follows it.
//!
//! The trainer flushes its output after every frame, so an engine can acknowledge chunk k
//! (freeing its bucket) while the trainer waits to pack chunk k + 2. A stream that ends without
//! `Q` means the trainer failed; an engine reports that as an error.
//!
//! # Model and weights
//!
//! [`MODEL`] lists the tensors (name, dtype, shape). Element `i` of tensor `t` at sync version
//! `v` (versions count from 1) is derived from
//!
//! ```text
//! splitmix64(x) = z ^ (z >> 31), where, in wrapping 64-bit arithmetic,
//!                 x' = x + 0x9E3779B97F4A7C15,
//!                 z  = (x' ^ (x' >> 30)) * 0xBF58476D1CE4E5B9,
//!                 z  = (z  ^ (z  >> 27)) * 0x94D049BB133111EB
//! w(v, t, i)    = splitmix64(splitmix64(splitmix64(v) ^ t) ^ i)
//! ```
//!
//! as: float32 `((w >> 40) as f32) * 2^-23 - 1.0` (exact in binary32, in [-1, 1));
//! bfloat16 the raw bits `(w >> 48) as u16`; uint8 `(w >> 56) as u8`; int64 `w as i64`.
//! Bytes are little-endian. Every version changes every byte pattern, and a receiver can check
//! what arrived bit for bit without trusting the library.

use std::io::{self, Read, Write};
use std::time::{Duration, Instant};

use wsync::{DType, Options, Plan, Receiver, Sender, Strategy, TensorRef, TensorSpec, View};

// --- frames ---------------------------------------------------------------------------------

/// Tag of the init-info frame.
pub const TAG_INIT: u8 = b'I';
/// Tag of a request frame.
pub const TAG_REQUEST: u8 = b'R';
/// Tag of the final frame (payload: u64 LE number of versions sent).
pub const TAG_DONE: u8 = b'Q';
/// Largest payload a reader accepts.
pub const MAX_FRAME: usize = 64 << 20;

/// Writes one frame and flushes the writer.
pub fn write_frame(w: &mut impl Write, tag: u8, payload: &[u8]) -> io::Result<()> {
    let mut header = [0u8; 9];
    header[0] = tag;
    header[1..].copy_from_slice(&(payload.len() as u64).to_le_bytes());
    w.write_all(&header)?;
    w.write_all(payload)?;
    w.flush()
}

fn invalid(message: String) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, message)
}

/// Reads one frame: `Ok(None)` at a clean end of stream (no byte of a new frame), an error for
/// a truncated frame, an unknown tag or an oversized length.
pub fn read_frame(r: &mut impl Read) -> io::Result<Option<(u8, Vec<u8>)>> {
    let mut header = [0u8; 9];
    let mut got = 0;
    while got < header.len() {
        match r.read(&mut header[got..]) {
            Ok(0) if got == 0 => return Ok(None),
            Ok(0) => {
                return Err(io::Error::new(
                    io::ErrorKind::UnexpectedEof,
                    "truncated frame header",
                ))
            }
            Ok(n) => got += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    let tag = header[0];
    if ![TAG_INIT, TAG_REQUEST, TAG_DONE].contains(&tag) {
        return Err(invalid(format!(
            "unknown frame tag 0x{tag:02x} (not a wsync frame stream?)"
        )));
    }
    let len = u64::from_le_bytes(header[1..].try_into().expect("8 bytes"));
    let len = usize::try_from(len)
        .ok()
        .filter(|&n| n <= MAX_FRAME)
        .ok_or_else(|| {
            invalid(format!(
                "frame of {len} bytes exceeds the {MAX_FRAME}-byte limit"
            ))
        })?;
    let mut payload = vec![0u8; len];
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

/// The typed contents of one tensor at one version.
#[derive(Debug, Clone, PartialEq)]
pub enum Data {
    /// float32 values
    F32(Vec<f32>),
    /// bfloat16 bits
    BF16(Vec<u16>),
    /// uint8 values
    U8(Vec<u8>),
    /// int64 values
    I64(Vec<i64>),
}

/// The contents of tensor `t` of [`MODEL`] at version `v`.
pub fn data(v: u64, t: usize) -> Data {
    let p = &MODEL[t];
    let n = p.shape.iter().product::<i64>().unsigned_abs();
    let ws = (0..n).map(|i| word(v, t as u64, i));
    match p.dtype {
        DType::F32 => Data::F32(ws.map(f32_of).collect()),
        DType::BF16 => Data::BF16(ws.map(|w| (w >> 48) as u16).collect()),
        DType::U8 => Data::U8(ws.map(|w| (w >> 56) as u8).collect()),
        DType::I64 => Data::I64(ws.map(|w| i64::from_ne_bytes(w.to_ne_bytes())).collect()),
        other => unreachable!("the toy model has no {other} tensor"),
    }
}

impl Data {
    /// A `TensorRef` over these contents, named and shaped as `MODEL[t]`.
    pub fn tensor(&self, t: usize) -> wsync::Result<TensorRef<'_>> {
        let p = &MODEL[t];
        match self {
            Data::F32(d) => TensorRef::new(p.name, d, p.shape),
            Data::BF16(d) => TensorRef::with_dtype(p.name, d, p.shape, DType::BF16),
            Data::U8(d) => TensorRef::new(p.name, d, p.shape),
            Data::I64(d) => TensorRef::new(p.name, d, p.shape),
        }
    }

    /// Whether `view` holds exactly these contents, read through the typed accessors.
    pub fn matches(&self, view: &View<'_>) -> wsync::Result<bool> {
        Ok(match self {
            // Compare bits, not values: -0.0 == 0.0 would hide a flipped sign bit.
            Data::F32(d) => {
                let got: &[f32] = view.as_slice()?;
                got.len() == d.len() && got.iter().zip(d).all(|(a, b)| a.to_bits() == b.to_bits())
            }
            Data::BF16(d) => view.as_raw_elements::<u16>()? == d.as_slice(),
            Data::U8(d) => view.bytes()? == d.as_slice(),
            Data::I64(d) => view.as_slice::<i64>()? == d.as_slice(),
        })
    }
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

// --- trainer ------------------------------------------------------------------------------------

/// How the trainer runs (examples/trainer.rs reads it from the command line).
#[derive(Debug, Clone)]
pub struct TrainerConfig {
    /// Sync versions to send.
    pub versions: u64,
    /// Receivers that must acknowledge.
    pub receivers: u64,
    /// Planner threshold.
    pub chunk_bytes: u64,
    /// shm bucket size.
    pub bucket_bytes: u64,
    /// shm buckets.
    pub buckets: u64,
    /// Deadline of `send_chunk` (strategy option) and of every flush.
    pub timeout_ms: u64,
    /// Whether requests carry checksums.
    pub checksum: bool,
}

impl Default for TrainerConfig {
    fn default() -> Self {
        TrainerConfig {
            versions: 3,
            receivers: 1,
            chunk_bytes: 16 << 10,
            bucket_bytes: 32 << 10,
            buckets: 2,
            timeout_ms: 20_000,
            checksum: true,
        }
    }
}

/// What a trainer run did.
#[derive(Debug, Clone, Default)]
pub struct TrainerReport {
    /// Versions sent and flushed.
    pub versions: u64,
    /// Chunks per version.
    pub chunks_per_version: usize,
    /// Bytes per version.
    pub bytes_per_version: u64,
}

fn err(context: &str) -> impl Fn(wsync::Error) -> String + '_ {
    move |e| format!("{context}: {e}")
}

/// Why a trainer run stopped: the text, and the receivers' failures when a flush failed because
/// of them (`wsync::Error::failures`). `Display` prints the text, then one line per failure.
#[derive(Debug, Clone, Default)]
pub struct TrainerError {
    /// What failed, with the library's status and message.
    pub message: String,
    /// Each receiver's failure as data.
    pub failures: Vec<wsync::Failure>,
}

impl From<String> for TrainerError {
    fn from(message: String) -> TrainerError {
        TrainerError {
            message,
            failures: Vec::new(),
        }
    }
}

impl std::fmt::Display for TrainerError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)?;
        self.failures.iter().try_for_each(|x| write!(f, "\n  {x}"))
    }
}

/// Runs the trainer: init frame, then every version's requests (planned, flushed), then `Q`.
pub fn run_trainer(out: &mut impl Write, c: &TrainerConfig) -> Result<TrainerReport, TrainerError> {
    let options = Options::new()
        .uint("receivers", c.receivers)
        .uint("buckets", c.buckets)
        .uint("bucket_bytes", c.bucket_bytes)
        .uint("timeout_ms", c.timeout_ms)
        .boolean("checksum", c.checksum);
    let mut strategy = Strategy::with_options("shm", &options).map_err(err("strategy"))?;
    let init = strategy.create_init_info().map_err(err("init info"))?;
    let mut sender = Sender::new(&mut strategy, &init).map_err(err("sender"))?;
    write_frame(out, TAG_INIT, &init).map_err(|e| format!("writing the init frame: {e}"))?;

    let specs = model_specs().map_err(err("model"))?;
    let plan = Plan::new(
        &specs,
        &Options::new().uint("chunk_bytes", c.chunk_bytes).to_json(),
    )
    .map_err(err("plan"))?;
    let mut report = TrainerReport {
        chunks_per_version: plan.len(),
        bytes_per_version: plan
            .chunks()
            .map_err(err("plan"))?
            .iter()
            .map(wsync::PlanChunk::bytes)
            .sum(),
        ..TrainerReport::default()
    };
    for v in 1..=c.versions {
        let expected = sender.version().map_err(err("version"))?;
        if expected != v {
            return Err(format!("sender is at version {expected}, expected {v}").into());
        }
        let started = Instant::now();
        let contents: Vec<Data> = (0..MODEL.len()).map(|t| data(v, t)).collect();
        let tensors = contents
            .iter()
            .enumerate()
            .map(|(t, d)| d.tensor(t))
            .collect::<wsync::Result<Vec<_>>>()
            .map_err(err("tensors"))?;
        sender
            .send_plan(
                &tensors,
                &plan,
                |request| -> Result<(), Box<dyn std::error::Error>> {
                    Ok(write_frame(out, TAG_REQUEST, request)?)
                },
            )
            .map_err(|e| format!("version {v}: send: {e}"))?;
        sender
            .flush(Duration::from_millis(c.timeout_ms))
            .map_err(|e| TrainerError {
                message: format!("version {v}: flush: {e}"),
                failures: e.failures().to_vec(),
            })?;
        report.versions = v;
        eprintln!(
            "trainer: version {v} synced to {} receiver(s): {} chunks, {} bytes, {:.1} ms",
            c.receivers,
            plan.len(),
            report.bytes_per_version,
            started.elapsed().as_secs_f64() * 1e3
        );
    }
    write_frame(out, TAG_DONE, &c.versions.to_le_bytes())
        .map_err(|e| format!("writing the final frame: {e}"))?;
    Ok(report)
}

// --- engine -------------------------------------------------------------------------------------

/// How the engine runs (examples/engine.rs reads it from the command line).
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Receiver index.
    pub index: u32,
    /// Whether to verify checksums (the strategy's "verify" option).
    pub verify: bool,
    /// End the first chunk of this version early, to show a failed sync (0: never).
    pub end_early_at: u64,
    /// Take every view of this version's last chunk, then fail it with `Recv::fail`, as a
    /// loader that fails after its last view does (0: never).
    pub fail_at: u64,
}

impl Default for EngineConfig {
    fn default() -> Self {
        EngineConfig {
            index: 0,
            verify: true,
            end_early_at: 0,
            fail_at: 0,
        }
    }
}

/// What an engine run received.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EngineReport {
    /// Versions the trainer said it sent (from `Q`; 0 if the stream ended without it).
    pub announced: u64,
    /// `completed_version()` at the end.
    pub completed: u64,
    /// Chunks received.
    pub chunks: u64,
    /// Tensors verified bit for bit.
    pub tensors: u64,
}

/// Runs the engine over a frame stream: receives every chunk, checks every tensor against the
/// formula, and checks that every announced version completed. With `end_early_at`, ends that
/// version's first chunk early and checks that the version does not complete; the stream then
/// ends without `Q` (the trainer's flush fails), which is the expected outcome and returns Ok
/// with `announced == 0`.
// One loop over the frame stream, read top to bottom as the protocol's reference engine.
#[allow(clippy::too_many_lines)]
pub fn run_engine(input: &mut impl Read, c: &EngineConfig) -> Result<EngineReport, String> {
    let io = |e: io::Error| format!("reading frames: {e}");
    let init = match read_frame(input).map_err(io)? {
        Some((TAG_INIT, init)) => init,
        Some((tag, _)) => return Err(format!("first frame is '{}', not 'I'", tag as char)),
        None => return Err("the stream ended before the init frame".into()),
    };
    let options = Options::new().boolean("verify", c.verify);
    let mut strategy = Strategy::with_options("shm", &options).map_err(err("strategy"))?;
    let mut receiver = Receiver::new(&mut strategy, &init, c.index).map_err(err("receiver"))?;
    let mut report = EngineReport::default();
    let mut version = 1u64; // the version the next chunk 0 must belong to
    let mut seen = [false; MODEL.len()];
    let mut failed_version = 0u64;
    loop {
        let (tag, payload) = match read_frame(input).map_err(io)? {
            Some(frame) => frame,
            None if failed_version != 0 => break, // expected: the trainer's flush failed
            None => return Err("the stream ended without 'Q': the trainer failed".into()),
        };
        match tag {
            TAG_REQUEST => {}
            TAG_DONE => {
                let bytes: [u8; 8] = payload
                    .as_slice()
                    .try_into()
                    .map_err(|_| "bad 'Q' payload".to_string())?;
                report.announced = u64::from_le_bytes(bytes);
                break;
            }
            _ => return Err(format!("unexpected frame '{}'", tag as char)),
        }
        let mut recv = match receiver.receive(&payload) {
            Ok(recv) => recv,
            // The rest of a version this engine failed: the library refuses it with that
            // version's status (the sender abandons the version once it learns of the failure).
            Err(e) if failed_version == version && version != 0 => {
                eprintln!(
                    "engine {}: skipping the rest of failed version {version}: {e}",
                    c.index
                );
                continue;
            }
            Err(e) => return Err(format!("receive: {e}")),
        };
        let info = recv.info();
        report.chunks += 1;
        if info.version != version {
            return Err(format!(
                "chunk of version {}, expected version {version}",
                info.version
            ));
        }
        if info.chunk_index == 0 {
            seen = [false; MODEL.len()];
        }
        if info.chunk_index == 0 && info.version == c.end_early_at {
            // Dry run only, then end without taking any view: acknowledged as failed.
            let names: Vec<String> = recv
                .metas()
                .map_err(err("peek"))?
                .iter()
                .map(|m| m.name().to_string())
                .collect();
            let first = names.first().map_or("?", String::as_str);
            match recv.end() {
                Err(e) if e.status() == wsync::Status::WrongState => {
                    eprintln!("engine {}: ended version {version} chunk 0 ({first}, ...) early as asked: {e}", c.index);
                }
                other => return Err(format!("ending early returned {other:?}, not WRONG_STATE")),
            }
            failed_version = version;
            for name in &names {
                if let Some(t) = MODEL.iter().position(|p| p.name == name) {
                    seen[t] = true;
                }
            }
        } else {
            for view in recv.views() {
                let view = view.map_err(err("next view"))?;
                let t = MODEL
                    .iter()
                    .position(|p| p.name == view.name())
                    .ok_or_else(|| format!("unknown tensor '{}'", view.name()))?;
                let p = &MODEL[t];
                if view.dtype() != p.dtype || view.shape() != p.shape {
                    return Err(format!(
                        "tensor '{}' is {} {:?}, expected {} {:?}",
                        p.name,
                        view.dtype(),
                        view.shape(),
                        p.dtype,
                        p.shape
                    ));
                }
                if seen[t] {
                    return Err(format!(
                        "tensor '{}' arrived twice in version {version}",
                        p.name
                    ));
                }
                seen[t] = true;
                if !data(version, t).matches(&view).map_err(err("typed view"))? {
                    return Err(format!("tensor '{}' of version {version} differs", p.name));
                }
                report.tensors += 1;
            }
            if info.last && info.version == c.fail_at {
                // Every view was taken: only Recv::fail can still fail the chunk.
                let why = format!(
                    "engine {}: refusing version {version} after its last view",
                    c.index
                );
                recv.fail(wsync::Status::Mismatch, &why)
                    .map_err(err("fail"))?;
                eprintln!("{why} as asked");
                failed_version = version;
            } else {
                recv.end().map_err(err(&format!(
                    "end of version {version} chunk {}",
                    info.chunk_index
                )))?;
            }
        }
        if info.last {
            if let Some(t) = seen.iter().position(|s| !s) {
                return Err(format!(
                    "version {version} ended without tensor '{}'",
                    MODEL[t].name
                ));
            }
            let done = receiver
                .completed_version()
                .map_err(err("completed version"))?;
            let want = if failed_version == version {
                version - 1
            } else {
                version
            };
            if done != want {
                return Err(format!(
                    "after version {version}, completed_version() is {done}, expected {want}"
                ));
            }
            eprintln!(
                "engine {}: version {version} {}",
                c.index,
                if failed_version == version {
                    "not completed (failed chunk), old weights kept"
                } else {
                    "verified bit for bit"
                }
            );
            version += 1;
        }
    }
    report.completed = receiver
        .completed_version()
        .map_err(err("completed version"))?;
    if failed_version == 0 && report.completed != report.announced {
        return Err(format!(
            "the trainer sent {} versions, this receiver completed {}",
            report.announced, report.completed
        ));
    }
    Ok(report)
}
