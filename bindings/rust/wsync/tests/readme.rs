//! The Rust blocks of README.md and bindings/rust/README.md, compiled and run as they are
//! written (issue 39: the first README example a user tried did not compile). wsync's build
//! script copies each block into `OUT_DIR/readme/`; every function here includes one as its
//! body, after giving it what the README leaves to the reader. An engine block runs against a
//! Python trainer and a trainer block against Python engines: the Python READMEs' own blocks
//! where they fit (bindings/python/tests/readme_blocks.py runs them), through files in a
//! temporary directory (`init`, `req-0000`, ..., `done`).
//!
//! Needs `/usr/bin/python3` (or `$PYTHON`) with torch; without it the cross-language tests say
//! so and pass, unless `WSYNC_README_NEED_PYTHON` is set (scripts/test-all.sh sets it).

// README code is written for readers: no lint of it here.
#![allow(clippy::all, clippy::pedantic, unused)]

use std::collections::HashMap;
use std::error::Error;
use std::path::{Path, PathBuf};
use std::process::{Child, Command};
use std::time::{Duration, Instant};

use wsync::FailureKind;

mod support;

mod counts {
    include!(concat!(env!("OUT_DIR"), "/readme/counts.rs"));
}

type AnyResult<T> = Result<T, Box<dyn Error>>;

#[test]
fn every_rust_block_of_the_readmes_has_a_test() {
    assert_eq!(counts::TOP_BLOCKS, 2, "README.md: a Rust block without a test here");
    assert_eq!(counts::RUST_BLOCKS, 4, "bindings/rust/README.md: a Rust block without a test");
}

// -- Python peers through files --------------------------------------------------------------

fn python_bin() -> String {
    std::env::var("PYTHON").unwrap_or_else(|_| "/usr/bin/python3".to_string())
}

fn script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../python/tests/readme_blocks.py")
}

fn library() -> PathBuf {
    let dir = env!("WSYNC_LINK_SEARCH")
        .split(':')
        .find(|d| Path::new(d).join("libwsync.so").exists())
        .expect("wsync-sys found a libwsync.so");
    Path::new(dir).join("libwsync.so")
}

/// Whether a Python with torch is here (else the cross-language tests say so and pass).
fn have_python() -> bool {
    let ok = Command::new(python_bin())
        .args(["-c", "import torch, numpy"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok || std::env::var_os("WSYNC_README_NEED_PYTHON").is_none(),
        "{} cannot import torch, and WSYNC_README_NEED_PYTHON is set",
        python_bin()
    );
    if !ok {
        eprintln!("skipped: {} cannot import torch", python_bin());
    }
    ok
}

fn python(args: &[&str]) -> Child {
    Command::new(python_bin())
        .arg(script())
        .args(args)
        .env("WSYNC_LIBRARY", library())
        .spawn()
        .expect("python starts")
}

fn finish(mut child: Child, what: &str) {
    let status = child.wait().expect("python ends");
    assert!(status.success(), "{what}: {status}");
}

struct Dir(PathBuf);

impl Dir {
    fn new(name: &str) -> Dir {
        let d = std::env::temp_dir().join(format!("wsync-readme-{name}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        Dir(d)
    }
    fn arg(&self) -> &str {
        self.0.to_str().unwrap()
    }
    fn put(&self, name: &str, data: &[u8]) {
        let tmp = self.0.join(format!("{name}.tmp"));
        std::fs::write(&tmp, data).unwrap();
        std::fs::rename(tmp, self.0.join(name)).unwrap();
    }
    fn wait(&self, name: &str) -> Vec<u8> {
        let path = self.0.join(name);
        let deadline = Instant::now() + Duration::from_secs(120);
        while !path.exists() {
            assert!(Instant::now() < deadline, "{} did not appear", path.display());
            std::thread::sleep(Duration::from_millis(5));
        }
        std::fs::read(path).unwrap()
    }
    /// The requests in order, as the trainer writes them, until it is done.
    fn requests(&self) -> impl Iterator<Item = Vec<u8>> + '_ {
        let mut n = 0;
        let mut deadline = Instant::now() + Duration::from_secs(120);
        std::iter::from_fn(move || loop {
            let path = self.0.join(format!("req-{n:04}"));
            assert!(Instant::now() < deadline, "no {} within 120 s", path.display());
            if path.exists() {
                deadline = Instant::now() + Duration::from_secs(120);
                n += 1;
                return Some(std::fs::read(path).unwrap());
            }
            if self.0.join("done").exists() && !path.exists() {
                return None;
            }
            std::thread::sleep(Duration::from_millis(2));
        })
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

// -- README.md ---------------------------------------------------------------------------------

fn top_trainer(
    weights: Vec<f32>,
    forward_to_engines: &mut dyn FnMut(&[u8], &[u8]),
) -> AnyResult<()> {
    include!(concat!(env!("OUT_DIR"), "/readme/top_0.rs"));
    Ok(())
}

fn top_engine(
    init: Vec<u8>,
    my_index: u32,
    forwarded_requests: impl Iterator<Item = Vec<u8>>,
    load: &mut dyn FnMut(&str, u64, &[u8]) -> wsync::Result<()>,
) -> AnyResult<()> {
    include!(concat!(env!("OUT_DIR"), "/readme/top_1.rs"));
    Ok(())
}

/// README.md's Rust trainer block, its engine README.md's Python engine block.
#[test]
fn readme_rust_trainer_block_syncs_the_readme_python_engine_block_bit_exact() {
    if !have_python() {
        return;
    }
    let dir = Dir::new("top-trainer");
    let weights: Vec<f32> = (0..4096u16).map(|i| f32::from(i) * 0.25).collect();
    let mut engine = None;
    let mut n = 0;
    let mut forward = |init: &[u8], request: &[u8]| {
        if engine.is_none() {
            dir.put("init", init);
            engine = Some(python(&["top-engine", dir.arg(), "0"]));
        }
        dir.put(&format!("req-{n:04}"), request);
        n += 1;
    };
    top_trainer(weights.clone(), &mut forward).unwrap();
    dir.put("done", b"");
    finish(engine.expect("the block forwarded a request"), "README.md's Python engine");
    assert_eq!(std::fs::read(dir.0.join("loaded-0-w")).unwrap(), f32_bytes(&weights));
}

/// README.md's Python trainer block (receivers=2), its engines README.md's Rust engine block
/// in two threads; the tensors arrive bit-exact.
#[test]
fn readme_rust_engine_block_loads_from_the_readme_python_trainer_block_bit_exact() {
    if !have_python() {
        return;
    }
    let dir = Dir::new("top-engine");
    let trainer = python(&["top-trainer", dir.arg()]);
    let init = dir.wait("init");
    let loaded: Vec<HashMap<String, Vec<u8>>> = std::thread::scope(|s| {
        let engines: Vec<_> = (0..2u32)
            .map(|i| {
                let (init, dir) = (init.clone(), &dir);
                s.spawn(move || {
                    let mut model: HashMap<String, Vec<u8>> = HashMap::new();
                    let mut load = |name: &str, offset: u64, bytes: &[u8]| -> wsync::Result<()> {
                        let t = model.entry(name.to_string()).or_default();
                        let end = offset as usize + bytes.len();
                        if t.len() < end {
                            t.resize(end, 0);
                        }
                        t[offset as usize..end].copy_from_slice(bytes);
                        Ok(())
                    };
                    top_engine(init, i, dir.requests(), &mut load).unwrap();
                    model
                })
            })
            .collect();
        engines.into_iter().map(|e| e.join().unwrap()).collect()
    });
    finish(trainer, "README.md's Python trainer");
    for model in loaded {
        assert_eq!(model.len(), 3, "{:?}", model.keys());
        for (name, bytes) in &model {
            assert_eq!(bytes, &dir.wait(&format!("expected-{name}")), "{name}");
        }
    }
}

// -- bindings/rust/README.md -------------------------------------------------------------------

fn rust_trainer(
    q: Vec<f32>,
    up_bits: Vec<u16>,
    forward_to_engines: &mut dyn FnMut(&[u8]) -> wsync::Result<()>,
) -> AnyResult<()> {
    include!(concat!(env!("OUT_DIR"), "/readme/rust_0.rs"));
    Ok(())
}

/// The engine's model of the Rust README's engine block: bfloat16 tensors by name.
struct Model(HashMap<String, (Vec<i64>, Vec<u8>)>);

impl Model {
    fn new(shapes: &[(&str, &[i64])]) -> Model {
        Model(
            shapes
                .iter()
                .map(|(name, shape)| {
                    let n: i64 = shape.iter().product();
                    (name.to_string(), (shape.to_vec(), vec![0u8; 2 * n as usize]))
                })
                .collect(),
        )
    }
    fn check(&self, name: &str, dtype: wsync::DType, shape: &[i64]) -> wsync::Result<()> {
        match self.0.get(name) {
            Some((s, _)) if s == shape && dtype == wsync::DType::BF16 => Ok(()),
            _ => Err(wsync::Error::new(
                wsync::Status::Mismatch,
                format!("tensor '{name}' does not fit the model"),
            )),
        }
    }
    fn bytes_mut(&mut self, name: &str) -> wsync::Result<&mut [u8]> {
        self.0.get_mut(name).map(|(_, b)| b.as_mut_slice()).ok_or_else(|| {
            wsync::Error::new(wsync::Status::Mismatch, format!("no tensor '{name}'"))
        })
    }
}

fn rust_engine(
    init: Vec<u8>,
    my_index: u32,
    forwarded_requests: impl Iterator<Item = Vec<u8>>,
    model: &mut Model,
) -> AnyResult<()> {
    include!(concat!(env!("OUT_DIR"), "/readme/rust_1.rs"));
    Ok(())
}

fn rust_dest_table(
    mut receiver: wsync::Receiver,
    request: Vec<u8>,
    qkv: &mut [f32],
    mut emb: Vec<f32>,
    mut lm_head: Vec<f32>,
    mut w_shard: Vec<f32>,
) -> AnyResult<(Vec<f32>, Vec<f32>, Vec<f32>)> {
    include!(concat!(env!("OUT_DIR"), "/readme/rust_2.rs"));
    Ok((emb, lm_head, w_shard))
}

fn rust_failures(mut sender: wsync::Sender) -> AnyResult<()> {
    include!(concat!(env!("OUT_DIR"), "/readme/rust_3.rs"));
    Ok(())
}

/// The Rust README's trainer block (q float32, up bfloat16 bits), its two engines the Python
/// README's engine block (a `ModuleLoader` each), bit-exact.
#[test]
fn rust_readme_trainer_block_syncs_two_python_readme_engine_blocks_bit_exact() {
    if !have_python() {
        return;
    }
    let dir = Dir::new("rust-trainer");
    let q: Vec<f32> = (0..4096 * 4096u32).map(|i| (i % 1000) as f32 * 0.5).collect();
    let up_bits: Vec<u16> = (0..11008 * 4096u32).map(|i| (i % 30000) as u16).collect();
    let mut engines = Vec::new();
    let mut n = 0;
    let mut forward = |bytes: &[u8]| -> wsync::Result<()> {
        if engines.is_empty() {
            dir.put("init", bytes);
            engines.push(python(&["engine", dir.arg(), "0"]));
            engines.push(python(&["engine", dir.arg(), "1"]));
        } else {
            dir.put(&format!("req-{n:04}"), bytes);
            n += 1;
        }
        Ok(())
    };
    rust_trainer(q.clone(), up_bits.clone(), &mut forward).unwrap();
    dir.put("done", b"");
    for (i, e) in engines.into_iter().enumerate() {
        finish(e, "bindings/python/README.md's engine");
        let got = std::fs::read(dir.0.join(format!("loaded-{i}-layers.0.attn.q.weight"))).unwrap();
        assert!(got == f32_bytes(&q), "engine {i}: q differs");
        let got = std::fs::read(dir.0.join(format!("loaded-{i}-layers.0.mlp.up.weight"))).unwrap();
        let want: Vec<u8> = up_bits.iter().flat_map(|x| x.to_ne_bytes()).collect();
        assert!(got == want, "engine {i}: up differs");
    }
}

/// The Rust README's engine block in two threads, its trainer the Python README's trainer
/// block (receivers=2, send_model casting to bfloat16).
#[test]
fn rust_readme_engine_block_loads_from_the_python_readme_trainer_block_bit_exact() {
    if !have_python() {
        return;
    }
    let dir = Dir::new("rust-engine");
    let trainer = python(&["trainer", dir.arg()]);
    let init = dir.wait("init");
    let shapes: [(&str, &[i64]); 3] = [
        ("embed.weight", &[64, 32]),
        ("proj.weight", &[32, 32]),
        ("proj.bias", &[32]),
    ];
    let models: Vec<Model> = std::thread::scope(|s| {
        let engines: Vec<_> = (0..2u32)
            .map(|i| {
                let (init, dir) = (init.clone(), &dir);
                s.spawn(move || {
                    let mut model = Model::new(&shapes);
                    rust_engine(init, i, dir.requests(), &mut model).unwrap();
                    model
                })
            })
            .collect();
        engines.into_iter().map(|e| e.join().unwrap()).collect()
    });
    finish(trainer, "bindings/python/README.md's trainer");
    for model in models {
        for (name, (_, bytes)) in &model.0 {
            assert_eq!(bytes, &dir.wait(&format!("expected-{name}")), "{name}");
        }
    }
}

/// The Rust README's destination-table block, fed by a Python trainer (`send_model`).
#[test]
fn rust_readme_dest_table_block_loads_a_python_trainers_chunk() {
    if !have_python() {
        return;
    }
    let dir = Dir::new("rust-dest");
    let spec = r#"[{"name": "q", "shape": [4, 8]}, {"name": "k", "shape": [2, 8]},
                   {"name": "v", "shape": [2, 8]}, {"name": "emb", "shape": [16, 8]},
                   {"name": "w", "shape": [4, 8]}]"#;
    let trainer = python(&["send", dir.arg(), spec]);
    let init = dir.wait("init");
    let mut strategy = wsync::Strategy::new("shm", "").unwrap();
    let receiver = wsync::Receiver::new(&mut strategy, &init, 0).unwrap();
    // One chunk: the trainer's flush waits for it, so take it as it comes.
    let request = dir.requests().next().expect("a request");
    let mut qkv = vec![0f32; 64];
    let (emb, lm_head, w_shard) = rust_dest_table(
        receiver,
        request,
        &mut qkv,
        vec![0.0; 128],
        vec![0.0; 128],
        vec![0.0; 16],
    )
    .unwrap();
    finish(trainer, "the Python trainer");
    assert!(!dir.0.join("req-0001").exists(), "one chunk");
    let n = |count: u16| -> Vec<f32> { (0..count).map(f32::from).collect() };
    let want_qkv: Vec<f32> = [n(32), n(16), n(16)].concat();
    assert_eq!(qkv, want_qkv);
    assert_eq!(emb, n(128));
    assert_eq!(lm_head, n(128));
    assert_eq!(w_shard, n(32)[16..].to_vec());
}

/// The Rust README's failure-handling block, after an engine failed its chunk: it reads the
/// failure and the next flush succeeds.
#[test]
fn rust_readme_failures_block_handles_an_engines_failure() {
    let mut trainer = wsync::Strategy::new("shm", r#"{"receivers": 1}"#).unwrap();
    let init = trainer.create_init_info().unwrap();
    let mut sender = wsync::Sender::new(&mut trainer, &init).unwrap();
    let mut engine = wsync::Strategy::new("shm", "").unwrap();
    let mut receiver = wsync::Receiver::new(&mut engine, &init, 0).unwrap();
    let w = [1.0f32; 16];
    let request = sender
        .send_chunk(&[wsync::TensorRef::new("w", &w, &[16]).unwrap()], true)
        .unwrap();
    let recv = receiver.receive(&request).unwrap();
    recv.fail(wsync::Status::Mismatch, "no parameter 'w'").unwrap();
    rust_failures(sender).unwrap();
}
