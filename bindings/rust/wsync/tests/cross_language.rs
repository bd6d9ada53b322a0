//! Rust and C, in separate processes, syncing the same toy model both ways over shm.
//!
//! The C side is `bindings/rust/tests/c_peer/c_peer.c`, compiled here with `cc` (or `$CC`)
//! against the public header and the same libwsync the Rust code links. Both sides build the
//! weights from the formula in `examples/common/mod.rs` (shared with the example binaries), so
//! each checks the other bit for bit without trusting the library.
//!
//! Every child is killed and reaped on every path (a guard's Drop), every wait has a deadline,
//! and the Rust role of a test runs on a helper thread the test abandons (after killing the
//! children, which unblocks it) if it overruns.

// The example binaries' loops, run here in this process too. Each file brings its own copy of
// `examples/common/mod.rs` (as it does in its binary); the engine's serves the model and frames.
#[allow(dead_code)]
#[path = "../examples/engine.rs"]
mod engine;
#[allow(dead_code)]
mod support;
#[allow(dead_code, clippy::duplicate_mod)]
#[path = "../examples/trainer.rs"]
mod trainer;

use std::io::Read;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdin, ChildStdout, Command, ExitStatus, Stdio};
use std::sync::mpsc;
use std::sync::OnceLock;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use engine::common::{self, MODEL};
use engine::{EngineConfig, EngineReport};
use trainer::{TrainerConfig, TrainerReport};

/// Generous for a loaded 2-core machine; a healthy run takes well under a second.
const DEADLINE: Duration = Duration::from_secs(60);
const VERSIONS: u64 = 4;

// --- building the C peer --------------------------------------------------------------------------

fn manifest_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Directories holding libwsync: `$WSYNC_LIB_DIR` if set, else where wsync-sys found it.
fn lib_dirs() -> Vec<String> {
    match std::env::var("WSYNC_LIB_DIR") {
        Ok(dir) if !dir.is_empty() => vec![dir],
        _ => env!("WSYNC_LINK_SEARCH")
            .split(':')
            .filter(|d| !d.is_empty())
            .map(String::from)
            .collect(),
    }
}

/// The include directory with wsync.h: the source tree's, else pkg-config's.
fn include_dirs() -> Vec<PathBuf> {
    let tree = manifest_dir().join("../../../include");
    if tree.join("wsync.h").exists() {
        return vec![tree];
    }
    env!("WSYNC_INCLUDE_DIRS")
        .split(':')
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
        .collect()
}

fn build_c_peer() -> Result<PathBuf, String> {
    let source = manifest_dir().join("../tests/c_peer/c_peer.c");
    let out = Path::new(env!("CARGO_TARGET_TMPDIR")).join("c_peer");
    let cc = std::env::var("CC").unwrap_or_else(|_| "cc".to_string());
    let mut cmd = Command::new(&cc);
    cmd.args([
        "-std=c99",
        "-O1",
        "-Wall",
        "-Wextra",
        "-Wpedantic",
        "-Werror",
    ]);
    for dir in include_dirs() {
        cmd.arg("-I").arg(dir);
    }
    cmd.arg(&source).arg("-o").arg(&out);
    for dir in lib_dirs() {
        // rpath, so the child finds the same library even without LD_LIBRARY_PATH.
        cmd.arg(format!("-L{dir}")).arg(format!("-Wl,-rpath,{dir}"));
    }
    cmd.arg("-lwsync");
    let result = cmd
        .output()
        .map_err(|e| format!("cannot run `{cc}`: {e}"))?;
    if !result.status.success() {
        return Err(format!(
            "compiling the C peer failed ({}): {cmd:?}\n{}",
            result.status,
            String::from_utf8_lossy(&result.stderr)
        ));
    }
    Ok(out)
}

fn c_peer() -> &'static Path {
    static PEER: OnceLock<Result<PathBuf, String>> = OnceLock::new();
    match PEER.get_or_init(build_c_peer) {
        Ok(path) => path,
        Err(e) => panic!("{e}"),
    }
}

/// An example binary Cargo built next to this test (`cargo test` builds examples).
fn example(name: &str) -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    let profile_dir = exe
        .parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps/..");
    let path = profile_dir.join("examples").join(name);
    assert!(
        path.exists(),
        "{} is missing: run the whole suite with `cargo test` (which builds the examples) or \
         `cargo build --examples` first",
        path.display()
    );
    path
}

// --- child processes ---------------------------------------------------------------------------

/// A child process that is killed and reaped however the test ends.
struct Proc {
    name: String,
    child: Child,
    stdout: Option<JoinHandle<String>>,
    stderr: Option<JoinHandle<String>>,
    reaped: bool,
}

struct Finished {
    status: ExitStatus,
    stdout: String,
    stderr: String,
}

fn drain(mut r: impl Read + Send + 'static) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut buf = Vec::new();
        let _ = r.read_to_end(&mut buf);
        String::from_utf8_lossy(&buf).into_owned()
    })
}

impl Proc {
    /// Spawns `cmd` with stderr captured, stdin as configured by the caller (default: null)
    /// and stdout captured unless the caller configured it.
    fn spawn(
        name: &str,
        cmd: &mut Command,
        stdin: Stdio,
        stdout: Stdio,
        capture_stdout: bool,
    ) -> Proc {
        let mut child = cmd
            .stdin(stdin)
            .stdout(stdout)
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {name} ({cmd:?}): {e}"));
        let stderr = child.stderr.take().map(drain);
        let stdout = if capture_stdout {
            child.stdout.take().map(drain)
        } else {
            None
        };
        Proc {
            name: name.to_string(),
            child,
            stdout,
            stderr,
            reaped: false,
        }
    }

    fn take_stdin(&mut self) -> ChildStdin {
        self.child.stdin.take().expect("stdin was piped")
    }

    fn take_stdout(&mut self) -> ChildStdout {
        self.child
            .stdout
            .take()
            .expect("stdout was piped and not captured")
    }

    fn kill(&mut self) {
        if !self.reaped {
            let _ = self.child.kill();
        }
    }

    /// Waits for the exit until `deadline` (then kills it), and collects its output.
    fn finish(mut self, deadline: Instant) -> Finished {
        let status = loop {
            match self.child.try_wait() {
                Ok(Some(status)) => break status,
                Ok(None) if Instant::now() < deadline => {
                    std::thread::sleep(Duration::from_millis(5));
                }
                Ok(None) => {
                    self.kill();
                    let status = self.child.wait().expect("wait after kill");
                    self.reaped = true;
                    let err = self
                        .stderr
                        .take()
                        .map(|h| h.join().unwrap_or_default())
                        .unwrap_or_default();
                    panic!(
                        "{} did not exit before its deadline ({status}); stderr:\n{err}",
                        self.name
                    );
                }
                Err(e) => panic!("waiting for {}: {e}", self.name),
            }
        };
        self.reaped = true;
        let join = |h: Option<JoinHandle<String>>| {
            h.map(|h| h.join().unwrap_or_default()).unwrap_or_default()
        };
        Finished {
            status,
            stdout: join(self.stdout.take()),
            stderr: join(self.stderr.take()),
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if !self.reaped {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// Runs `role` on a helper thread and waits for it until the deadline; past it, kills every
/// child (which ends the role's blocked reads and writes) and fails the test.
fn run_role<T: Send + 'static>(
    children: &mut [&mut Proc],
    role: impl FnOnce() -> T + Send + 'static,
) -> T {
    let (tx, rx) = mpsc::channel();
    let handle = std::thread::spawn(move || {
        let _ = tx.send(role());
    });
    match rx.recv_timeout(DEADLINE) {
        Ok(value) => {
            handle.join().expect("role thread");
            value
        }
        Err(mpsc::RecvTimeoutError::Disconnected) => {
            for c in &mut *children {
                c.kill();
            }
            std::panic::resume_unwind(handle.join().expect_err("the role thread panicked"))
        }
        Err(mpsc::RecvTimeoutError::Timeout) => {
            for c in &mut *children {
                c.kill();
            }
            panic!("the Rust role did not finish within {DEADLINE:?}")
        }
    }
}

fn trainer_config() -> TrainerConfig {
    TrainerConfig {
        versions: VERSIONS,
        timeout_ms: 10_000,
        ..TrainerConfig::default()
    }
}

fn chunks_per_version() -> u64 {
    let specs = common::model_specs().unwrap();
    let c = TrainerConfig::default();
    wsync::Plan::with_options(
        &specs,
        &wsync::Options::new().uint("chunk_bytes", c.chunk_bytes),
    )
    .unwrap()
    .len() as u64
}

fn c_send(extra: &[&str]) -> Proc {
    let mut cmd = Command::new(c_peer());
    cmd.args([
        "send",
        "--versions",
        &VERSIONS.to_string(),
        "--timeout-ms",
        "10000",
    ])
    .args(extra);
    Proc::spawn(
        "c_peer send",
        &mut cmd,
        Stdio::null(),
        Stdio::piped(),
        false,
    )
}

fn c_recv(extra: &[&str], stdin: Stdio) -> Proc {
    let mut cmd = Command::new(c_peer());
    cmd.arg("recv").args(extra);
    Proc::spawn("c_peer recv", &mut cmd, stdin, Stdio::piped(), true)
}

/// Runs the Rust engine in this process on the frames of `c_peer send`: its report (a panic
/// with its error and the sender's stderr if it failed) and how the sender ended.
fn rust_engine_fed_by_c_sender(config: EngineConfig) -> (EngineReport, Finished) {
    let mut sender = c_send(&[]);
    let mut frames = sender.take_stdout();
    let report = run_role(&mut [&mut sender], move || {
        engine::run_engine(&mut frames, &config)
    });
    let done = sender.finish(Instant::now() + DEADLINE);
    let report =
        report.unwrap_or_else(|e| panic!("Rust engine: {e}\nC sender stderr:\n{}", done.stderr));
    (report, done)
}

/// Runs the Rust trainer in this process into `c_peer recv ARGS`: its outcome and how the
/// receiver ended.
fn rust_trainer_feeding_c_receiver(args: &[&str]) -> (wsync::Result<TrainerReport>, Finished) {
    let mut receiver = c_recv(args, Stdio::piped());
    let mut frames = receiver.take_stdin();
    let outcome = run_role(&mut [&mut receiver], move || {
        trainer::run_trainer(&mut frames, &trainer_config())
    });
    (outcome, receiver.finish(Instant::now() + DEADLINE))
}

// --- tests ------------------------------------------------------------------------------------------

#[test]
fn c_sender_feeds_the_rust_engine_bit_for_bit_over_several_versions() {
    let (report, done) = rust_engine_fed_by_c_sender(EngineConfig::default());
    assert!(done.status.success(), "C sender failed: {}", done.stderr);
    assert_eq!(
        report,
        EngineReport {
            announced: VERSIONS,
            completed: VERSIONS,
            chunks: VERSIONS * chunks_per_version(),
            tensors: VERSIONS * MODEL.len() as u64,
        }
    );
    assert!(
        chunks_per_version() > 2,
        "more chunks than buckets, so the sender waits on acks"
    );
}

#[test]
fn rust_trainer_feeds_the_c_receiver_bit_for_bit_over_several_versions() {
    let (report, done) = rust_trainer_feeding_c_receiver(&[]);
    let report =
        report.unwrap_or_else(|e| panic!("Rust trainer: {e}\nC receiver stderr:\n{}", done.stderr));
    assert_eq!(report.versions, VERSIONS);
    assert!(done.status.success(), "C receiver failed: {}", done.stderr);
    let expect = format!(
        "{} chunks, {} tensors verified; completed version {VERSIONS} (announced {VERSIONS})",
        VERSIONS * chunks_per_version(),
        VERSIONS * MODEL.len() as u64
    );
    assert!(
        done.stdout.contains(&expect),
        "C receiver said: {}",
        done.stdout
    );
}

#[test]
fn rust_engine_ending_early_fails_the_c_senders_flush_with_peer() {
    let (report, done) = rust_engine_fed_by_c_sender(EngineConfig {
        end_early_at: 2,
        ..EngineConfig::default()
    });
    assert_eq!(
        (report.announced, report.completed),
        (0, 1),
        "version 2 must not complete"
    );
    assert!(!done.status.success(), "the C sender should fail");
    assert!(
        // The sender learns it at its next send (waiting for a bucket) or at its flush.
        (done.stderr.contains("flush: WSYNC_ERR_PEER")
            || done.stderr.contains("send_chunk: WSYNC_ERR_PEER"))
            && done.stderr.contains("failed chunk 0 of version 2")
            && done
                .stderr
                .contains("failure: receiver 0 what 1 status WSYNC_ERR_WRONG_STATE"),
        "C sender said: {}",
        done.stderr
    );
}

#[test]
fn c_receiver_ending_early_fails_the_rust_trainers_flush_with_peer() {
    let (outcome, done) = rust_trainer_feeding_c_receiver(&["--end-early-at", "2"]);
    let e = outcome.expect_err("the trainer's flush should fail");
    assert_eq!(e.status(), wsync::Status::Peer, "{e}");
    let m = e.message();
    assert!(
        (m.starts_with("version 2: flush: shm: receiver 0")
            || m.starts_with("version 2: send: shm: receiver 0"))
            && m.contains("failed chunk 0 of version 2"),
        "{e}"
    );
    assert!(done.status.success(), "C receiver: {}", done.stderr);
    assert!(
        done.stdout.contains("completed version 1"),
        "C receiver said: {}",
        done.stdout
    );
}

#[test]
fn rust_engine_failing_after_its_last_view_fails_the_c_senders_flush_with_its_reason() {
    let (report, done) = rust_engine_fed_by_c_sender(EngineConfig {
        fail_at: 2,
        ..EngineConfig::default()
    });
    assert_eq!(
        (report.announced, report.completed),
        (0, 1),
        "version 2 must not complete"
    );
    assert!(!done.status.success(), "the C sender should fail");
    // The C sender prints each wsync_failure_t it reads after the failed flush.
    let last_chunk = chunks_per_version() - 1;
    let fields = format!(
        "failure: receiver 0 what 1 status WSYNC_ERR_MISMATCH version 2 chunk {last_chunk}"
    );
    assert!(
        done.stderr.contains(&fields)
            && done
                .stderr
                .contains("engine 0: refusing version 2 after its last view"),
        "C sender said: {}",
        done.stderr
    );
}

#[test]
fn c_receiver_failing_after_its_last_view_reaches_the_rust_flush_as_fields() {
    let (outcome, done) = rust_trainer_feeding_c_receiver(&["--fail-at", "2"]);
    let e = outcome.expect_err("the trainer's flush should fail");
    assert_eq!(e.status(), wsync::Status::Peer, "{e}");
    assert!(e.message().starts_with("version 2: flush: "), "{e}");
    let [f] = e.failures() else {
        panic!("one failure expected: {:?}", e.failures())
    };
    assert_eq!(f.what, wsync::FailureKind::Failed);
    assert_eq!(f.status, wsync::Status::Integrity);
    assert_eq!(f.receiver, 0);
    assert_eq!(f.version, 2);
    assert_eq!(
        f.chunk_index,
        Some(u32::try_from(chunks_per_version()).unwrap() - 1)
    );
    assert_eq!(f.message, "c_peer: refusing version 2 after its last view");
    assert!(
        u32::try_from(f.pid).is_ok_and(|pid| pid > 0 && pid != std::process::id()),
        "the C process's pid"
    );
    assert!(done.status.success(), "C receiver: {}", done.stderr);
    assert!(
        done.stdout.contains("completed version 1"),
        "C receiver said: {}",
        done.stdout
    );
}

#[test]
fn rust_trainer_syncs_a_c_engine_and_a_rust_engine_process_at_once() {
    let mut c_engine = c_recv(&["--index", "0"], Stdio::piped());
    let mut cmd = Command::new(example("engine"));
    cmd.args(["--index", "1"]);
    let mut rust_engine = Proc::spawn(
        "example engine",
        &mut cmd,
        Stdio::piped(),
        Stdio::piped(),
        true,
    );
    let mut fan_out = Tee(vec![c_engine.take_stdin(), rust_engine.take_stdin()]);
    let config = TrainerConfig {
        receivers: 2,
        ..trainer_config()
    };
    let report = run_role(&mut [&mut c_engine, &mut rust_engine], move || {
        trainer::run_trainer(&mut fan_out, &config)
    });
    let deadline = Instant::now() + DEADLINE;
    let (c_done, rust_done) = (c_engine.finish(deadline), rust_engine.finish(deadline));
    let report = report.unwrap_or_else(|e| {
        panic!(
            "Rust trainer: {e}\nC engine:\n{}\nRust engine:\n{}",
            c_done.stderr, rust_done.stderr
        )
    });
    assert_eq!(report.versions, VERSIONS);
    assert!(c_done.status.success(), "C engine: {}", c_done.stderr);
    assert!(
        rust_done.status.success(),
        "Rust engine: {}",
        rust_done.stderr
    );
    assert!(
        c_done
            .stdout
            .contains(&format!("completed version {VERSIONS}")),
        "{}",
        c_done.stdout
    );
    assert!(
        rust_done.stdout.contains(&format!(
            "engine 1: {} chunks, {} tensors verified bit for bit; completed version {VERSIONS}",
            VERSIONS * chunks_per_version(),
            VERSIONS * MODEL.len() as u64
        )),
        "{}",
        rust_done.stdout
    );
}

#[test]
fn example_binaries_pipe_into_each_other_and_into_the_c_peer() {
    let versions = VERSIONS.to_string();
    // Each pair: (producer, consumer); the producer's stdout is the consumer's stdin.
    let pairs: [(&str, Command, &str, Command); 3] = [
        (
            "example trainer",
            example_cmd("trainer", &["--versions", &versions]),
            "c_peer recv",
            c_cmd(&["recv"]),
        ),
        (
            "c_peer send",
            c_cmd(&["send", "--versions", &versions]),
            "example engine",
            example_cmd("engine", &[]),
        ),
        (
            "example trainer",
            example_cmd("trainer", &["--versions", &versions]),
            "example engine",
            example_cmd("engine", &[]),
        ),
    ];
    for (pname, mut producer, cname, mut consumer) in pairs {
        let mut p = Proc::spawn(pname, &mut producer, Stdio::null(), Stdio::piped(), false);
        let pipe = Stdio::from(p.take_stdout());
        let c = Proc::spawn(cname, &mut consumer, pipe, Stdio::piped(), true);
        let deadline = Instant::now() + DEADLINE;
        let c_done = c.finish(deadline);
        let p_done = p.finish(deadline);
        assert!(
            p_done.status.success(),
            "{pname} | {cname}: {pname} failed: {}",
            p_done.stderr
        );
        assert!(
            c_done.status.success(),
            "{pname} | {cname}: {cname} failed: {}",
            c_done.stderr
        );
        assert!(
            c_done
                .stdout
                .contains(&format!("completed version {VERSIONS}")),
            "{pname} | {cname}: {}",
            c_done.stdout
        );
    }
}

fn example_cmd(name: &str, args: &[&str]) -> Command {
    let mut cmd = Command::new(example(name));
    cmd.args(args);
    cmd
}

fn c_cmd(args: &[&str]) -> Command {
    let mut cmd = Command::new(c_peer());
    cmd.args(args);
    cmd
}

#[test]
fn a_stream_cut_short_is_an_error_not_a_hang() {
    // A trainer that dies mid-stream leaves its engines a truncated frame or no 'Q'. (The
    // trainer stays alive here, in this process, so its segment is removed when it is dropped.)
    let mut t = support::trainer(&support::options(1));
    let data = common::data(1, 0);
    let request = t
        .sender
        .send_chunk([&common::tensor(0, &data).unwrap()], false)
        .unwrap();
    let mut stream = Vec::new();
    common::write_frame(&mut stream, common::TAG_INIT, &t.init).unwrap();
    common::write_frame(&mut stream, common::TAG_REQUEST, &request).unwrap();
    let config = EngineConfig::default();

    let e = engine::run_engine(&mut &stream[..], &config).expect_err("no 'Q'");
    assert!(e.contains("without 'Q'"), "{e}");
    let cut = &stream[..stream.len() - 3];
    let e = engine::run_engine(&mut &cut[..], &config).expect_err("a truncated frame");
    assert!(e.contains("reading frames"), "{e}");
    let mut bad_tag = stream.clone();
    bad_tag[0] = b'X';
    let e = engine::run_engine(&mut &bad_tag[..], &config).expect_err("not a frame stream");
    assert!(
        e.contains("frame tag 0x58") && e.contains("not a wsync frame stream"),
        "{e}"
    );
    let e = engine::run_engine(&mut &b""[..], &config).expect_err("an empty stream");
    assert!(e.contains("before the init frame"), "{e}");
}

/// Writes every byte to several children (a controller fanning requests out).
struct Tee(Vec<ChildStdin>);

impl std::io::Write for Tee {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        for w in &mut self.0 {
            w.write_all(buf)?;
        }
        Ok(buf.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        self.0.iter_mut().try_for_each(std::io::Write::flush)
    }
}
