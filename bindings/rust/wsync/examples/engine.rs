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

use std::io::{self, Read};
use std::process::ExitCode;

use common::{boolean, number, parse_args, EngineConfig};

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
    let run = || -> Result<(EngineConfig, common::EngineReport), String> {
        let (config, input) = config(std::env::args().skip(1))?;
        let report = common::run_engine(&mut open_input(&input)?, &config)?;
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
