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

#[allow(dead_code)]
mod common;

use std::io::{self, Write};
use std::process::ExitCode;

use common::{boolean, number, parse_args, TrainerConfig};

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
    let run = || -> Result<common::TrainerReport, common::TrainerError> {
        let (config, output) = config(std::env::args().skip(1))?;
        common::run_trainer(&mut open_output(&output)?, &config)
    };
    match run() {
        Ok(r) => {
            eprintln!(
                "trainer: done: {} versions of {} chunks ({} bytes each)",
                r.versions, r.chunks_per_version, r.bytes_per_version
            );
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("trainer: error: {e}");
            ExitCode::FAILURE
        }
    }
}
