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

use std::process::ExitCode;

fn main() -> ExitCode {
    let run = || -> Result<common::TrainerReport, String> {
        let pairs = common::parse_args(std::env::args().skip(1), common::TrainerConfig::KEYS)?;
        let config = common::TrainerConfig::from_args(&pairs)?;
        let output = pairs
            .iter()
            .rev()
            .find(|(k, _)| k == "output")
            .map_or("-", |(_, v)| v);
        let mut out = common::open_output(output)?;
        common::run_trainer(&mut out, &config)
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
