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

#[allow(dead_code)]
mod common;

use std::process::ExitCode;

fn main() -> ExitCode {
    let run = || -> Result<(common::EngineConfig, common::EngineReport), String> {
        let pairs = common::parse_args(std::env::args().skip(1), common::EngineConfig::KEYS)?;
        let config = common::EngineConfig::from_args(&pairs)?;
        let input = pairs
            .iter()
            .rev()
            .find(|(k, _)| k == "input")
            .map_or("-", |(_, v)| v);
        let mut input = common::open_input(input)?;
        let report = common::run_engine(&mut input, &config)?;
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
