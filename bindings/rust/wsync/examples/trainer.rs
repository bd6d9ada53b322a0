//! A Rust trainer that syncs a toy model to engines over shared memory ("shm").
//!
//! ```text
//! trainer [--versions N] [--receivers N] [--output PATH|-] [--chunk-bytes N]
//!         [--bucket-bytes N] [--buckets N] [--timeout-ms N] [--checksum true|false]
//! ```
//!
//! It writes the init info and one request per chunk as frames (see `common/mod.rs`) to
//! `--output` (default `-`, stdout), flushes every version (every receiver acknowledged every
//! chunk, or it fails naming the receiver), and ends the stream with a `Q` frame. Weights change
//! every version by a formula the engines check bit for bit. Progress goes to stderr.
//!
//! ```sh
//! cargo run --example trainer -- --versions 5 | cargo run --example engine
//! mkfifo /tmp/w0 /tmp/w1      # two engines: a controller would fan the frames out; tee can
//! cargo run --example trainer -- --receivers 2 | tee /tmp/w1 > /tmp/w0 &
//! cargo run --example engine -- --input /tmp/w0 --index 0 &
//! cargo run --example engine -- --input /tmp/w1 --index 1
//! ```

// `common/mod.rs` next to this file also when a test includes this file with `#[path]`.
#[allow(dead_code)]
#[path = "common/mod.rs"]
pub(crate) mod common;

use std::io::{self, Write};
use std::process::ExitCode;
use std::time::{Duration, Instant};

use common::{boolean, data, model_specs, number, parse_args, tensor, write_frame, MODEL};
use wsync::{Options, Plan, Sender, Status, Strategy};

/// How the trainer runs (read from the command line).
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

/// An I/O error on the frame stream as a `wsync::Error` saying what was being written.
fn io_error(context: &str) -> impl Fn(io::Error) -> wsync::Error + '_ {
    move |e| wsync::Error::new(Status::System, format!("{context}: {e}"))
}

/// Runs the trainer: init frame, then every version's requests (planned, flushed), then `Q`.
/// A failed flush's error carries the receivers' failures (`wsync::Error::failures`).
///
/// # Errors
/// The first failing call, its message prefixed with what the trainer was doing.
pub fn run_trainer(out: &mut impl Write, c: &TrainerConfig) -> wsync::Result<TrainerReport> {
    let options = Options::new()
        .uint("receivers", c.receivers)
        .uint("buckets", c.buckets)
        .uint("bucket_bytes", c.bucket_bytes)
        .uint("timeout_ms", c.timeout_ms)
        .boolean("checksum", c.checksum);
    let mut strategy =
        Strategy::with_options("shm", &options).map_err(|e| e.context("strategy"))?;
    let init = strategy
        .create_init_info()
        .map_err(|e| e.context("init info"))?;
    let mut sender = Sender::new(&mut strategy, &init).map_err(|e| e.context("sender"))?;
    write_frame(out, common::TAG_INIT, &init).map_err(io_error("writing the init frame"))?;

    let specs = model_specs().map_err(|e| e.context("model"))?;
    let plan = Plan::with_options(&specs, &Options::new().uint("chunk_bytes", c.chunk_bytes))
        .map_err(|e| e.context("plan"))?;
    let mut report = TrainerReport {
        chunks_per_version: plan.len(),
        bytes_per_version: plan.chunks()?.iter().map(wsync::PlanChunk::bytes).sum(),
        ..TrainerReport::default()
    };
    for v in 1..=c.versions {
        let started = Instant::now();
        let contents: Vec<Vec<u8>> = (0..MODEL.len()).map(|t| data(v, t)).collect();
        let tensors = contents
            .iter()
            .enumerate()
            .map(|(t, bytes)| tensor(t, bytes))
            .collect::<wsync::Result<Vec<_>>>()?;
        sender
            .send_plan(&tensors, &plan, |request| {
                write_frame(out, common::TAG_REQUEST, request).map_err(io_error("writing"))
            })
            .map_err(|e| e.context(format_args!("version {v}: send")))?;
        sender
            .flush(Duration::from_millis(c.timeout_ms))
            .map_err(|e| e.context(format_args!("version {v}: flush")))?;
        report.versions = v;
        eprintln!(
            "trainer: version {v} synced to {} receiver(s): {} chunks, {} bytes, {:.1} ms",
            c.receivers,
            plan.len(),
            report.bytes_per_version,
            started.elapsed().as_secs_f64() * 1e3
        );
    }
    write_frame(out, common::TAG_DONE, &c.versions.to_le_bytes())
        .map_err(io_error("writing the final frame"))?;
    Ok(report)
}

/// The options over the defaults, and `--output`.
fn config(args: impl IntoIterator<Item = String>) -> Result<(TrainerConfig, String), String> {
    let mut c = TrainerConfig::default();
    let mut output = "-".to_string();
    let keys = [
        "versions",
        "receivers",
        "chunk-bytes",
        "bucket-bytes",
        "buckets",
        "timeout-ms",
        "checksum",
        "output",
    ];
    parse_args(args, &keys, |k, v| {
        match k {
            "versions" => c.versions = number(k, &v)?,
            "receivers" => c.receivers = number(k, &v)?,
            "chunk-bytes" => c.chunk_bytes = number(k, &v)?,
            "bucket-bytes" => c.bucket_bytes = number(k, &v)?,
            "buckets" => c.buckets = number(k, &v)?,
            "timeout-ms" => c.timeout_ms = number(k, &v)?,
            "checksum" => c.checksum = boolean(k, &v)?,
            _ => output = v,
        }
        Ok(())
    })?;
    Ok((c, output))
}

/// Opens `path` for writing (`-` is stdout; a FIFO is opened for writing as is).
fn open_output(path: &str) -> Result<Box<dyn Write>, String> {
    if path == "-" {
        Ok(Box::new(io::stdout().lock()))
    } else {
        std::fs::File::create(path)
            .map(|f| Box::new(io::BufWriter::new(f)) as Box<dyn Write>)
            .map_err(|e| format!("cannot open {path}: {e}"))
    }
}

fn main() -> ExitCode {
    let (config, output) = match config(std::env::args().skip(1)) {
        Ok(parsed) => parsed,
        Err(e) => {
            eprintln!("trainer: error: {e}");
            return ExitCode::FAILURE;
        }
    };
    let report = open_output(&output)
        .map_err(|e| wsync::Error::new(Status::InvalidArgument, e))
        .and_then(|mut out| run_trainer(&mut out, &config));
    match report {
        Ok(r) => {
            eprintln!(
                "trainer: done: {} versions of {} chunks ({} bytes each)",
                r.versions, r.chunks_per_version, r.bytes_per_version
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("trainer: error: {e}");
            for failure in e.failures() {
                eprintln!("  {failure}");
            }
            ExitCode::FAILURE
        }
    }
}
