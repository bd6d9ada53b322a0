//! A Rust engine that receives the toy model over shared memory ("shm") and verifies it.
//!
//! ```text
//! engine [--input PATH|-] [--index N] [--verify true|false] [--end-early-at VERSION]
//!        [--fail-at VERSION]
//! ```
//!
//! It reads frames (see `common/mod.rs`) from `--input` (default `-`, stdin; a pipe or a FIFO),
//! creates receiver `--index` from the init frame, receives every request, checks every
//! tensor's name, dtype, shape and bytes against the formula the trainer used, and checks that
//! every version the trainer announced in its final frame completed. `--end-early-at V` ends
//! the first chunk of version V without reading it, to show a failed sync: the version is not
//! completed and the trainer's flush fails naming this receiver. `--fail-at V` takes every view
//! of version V's last chunk and then fails it with `Recv::fail`, as a loader that fails after
//! its last view does: the trainer's flush fails with this engine's status and message.
//!
//! Exit status 0 when everything was verified (or failed exactly as asked), 1 otherwise.
//!
//! ```sh
//! cargo run --example trainer -- --versions 5 | cargo run --example engine
//! ```

// `common/mod.rs` next to this file also when a test includes this file with `#[path]`.
#[allow(dead_code)]
#[path = "common/mod.rs"]
pub(crate) mod common;

use std::io::{self, Read};
use std::process::ExitCode;

use common::{
    boolean, matches, number, parse_args, read_frame, MODEL, TAG_DONE, TAG_INIT, TAG_REQUEST,
};
use wsync::{Options, Receiver, Strategy};

fn err(context: &str) -> impl Fn(wsync::Error) -> String + '_ {
    move |e| format!("{context}: {e}")
}

/// How the engine runs (read from the command line).
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
///
/// # Errors
/// A bad frame stream, a failing library call, or a tensor that differs from the formula,
/// described as text.
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
                if seen[t] {
                    return Err(format!(
                        "tensor '{}' arrived twice in version {version}",
                        view.name()
                    ));
                }
                seen[t] = true;
                if !matches(&view, version, t).map_err(err("view"))? {
                    let p = &MODEL[t];
                    return Err(format!(
                        "tensor '{}' of version {version} ({} {:?}) differs from the formula's {} {:?}",
                        p.name,
                        view.dtype(),
                        view.shape(),
                        p.dtype,
                        p.shape
                    ));
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

/// The options over the defaults, and `--input`.
fn config(args: impl IntoIterator<Item = String>) -> Result<(EngineConfig, String), String> {
    let mut c = EngineConfig::default();
    let mut input = "-".to_string();
    let keys = ["index", "verify", "end-early-at", "fail-at", "input"];
    parse_args(args, &keys, |k, v| {
        match k {
            "index" => {
                c.index = u32::try_from(number(k, &v)?).map_err(|_| "--index is too large")?;
            }
            "verify" => c.verify = boolean(k, &v)?,
            "end-early-at" => c.end_early_at = number(k, &v)?,
            "fail-at" => c.fail_at = number(k, &v)?,
            _ => input = v,
        }
        Ok(())
    })?;
    Ok((c, input))
}

/// Opens `path` for reading (`-` is stdin).
fn open_input(path: &str) -> Result<Box<dyn Read>, String> {
    if path == "-" {
        Ok(Box::new(io::stdin().lock()))
    } else {
        std::fs::File::open(path)
            .map(|f| Box::new(io::BufReader::new(f)) as Box<dyn Read>)
            .map_err(|e| format!("cannot open {path}: {e}"))
    }
}

fn main() -> ExitCode {
    let run = || -> Result<(EngineConfig, EngineReport), String> {
        let (config, input) = config(std::env::args().skip(1))?;
        let report = run_engine(&mut open_input(&input)?, &config)?;
        Ok((config, report))
    };
    match run() {
        Ok((c, r)) => {
            println!(
                "engine {}: {} chunks, {} tensors verified bit for bit; completed version {} \
                 (trainer announced {})",
                c.index, r.chunks, r.tensors, r.completed, r.announced
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("engine: error: {e}");
            ExitCode::FAILURE
        }
    }
}
