//! Versions are transactions (ABI 0.2): failing a chunk after its last view, failures as data
//! on the trainer's errors, dropping a receiver, committing without data, abandoning, and
//! polling a receiver to decide whether to roll back. One behaviour per test, in one process.

#[allow(dead_code)]
mod support;

use std::time::Duration;

use support::{options, receive_all, receiver, send, Trainer, SEC};
use wsync::{FailureKind, Status, TensorRef};

/// Four buckets: some tests publish a whole version before any receiver reads it.
fn trainer(receivers: u64) -> Trainer {
    support::trainer(&options(receivers).uint("buckets", 4))
}

// --- failing a chunk ------------------------------------------------------------------------------

#[test]
// r, t, q, k, v: receiver, trainer and attention tensors, as the other tests name them.
#[allow(clippy::many_single_char_names)]
fn recv_fail_after_the_last_view_reaches_the_flush_as_fields() {
    let mut t = trainer(1);
    let mut r = receiver(&t.init, 0);
    let w = [1.5f32; 8];
    let req = send(&mut t.sender, "w", &w, true);
    let mut recv = r.receive(&req).unwrap();
    assert_eq!(recv.views().count(), 1); // every view taken
    recv.fail(Status::Mismatch, "tensor 'w' has no home in this engine")
        .unwrap();
    assert_eq!(r.completed_version().unwrap(), 0);

    let e = t
        .sender
        .flush(SEC)
        .expect_err("the engine failed the chunk");
    assert_eq!(e.status(), Status::Peer);
    assert!(e.message().contains("tensor 'w' has no home"), "{e}");
    let [f] = e.failures() else {
        panic!("one failure expected: {:?}", e.failures())
    };
    assert_eq!(f.what, FailureKind::Failed);
    assert_eq!(f.status, Status::Mismatch);
    assert_eq!((f.receiver, f.version, f.chunk_index), (0, 1, Some(0)));
    assert_eq!(f.pid, i32::try_from(std::process::id()).unwrap());
    assert_eq!(f.message, "tensor 'w' has no home in this engine");
    assert_eq!(t.sender.failures(), e.failures());
}

#[test]
fn a_panicking_loader_fails_the_chunk_even_after_its_last_view() {
    let mut t = trainer(1);
    let mut r = receiver(&t.init, 0);
    let w = [2.0f32; 4];
    let req = send(&mut t.sender, "w", &w, true);
    let panicked = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
        let mut recv = r.receive(&req).unwrap();
        assert_eq!(recv.views().count(), 1);
        panic!("loader bug");
    }));
    assert!(panicked.is_err());
    let e = t.sender.flush(SEC).expect_err("the chunk was failed");
    assert_eq!(e.failures()[0].status, Status::WrongState);
    assert_eq!(e.failures()[0].message, "the loader panicked");
    assert_eq!(r.completed_version().unwrap(), 0);
}

#[test]
fn a_failed_version_is_not_completed_and_the_next_one_is() {
    let mut t = trainer(1);
    let mut r = receiver(&t.init, 0);
    let w = [1.0f32; 4];
    let req = send(&mut t.sender, "w", &w, true);
    r.receive(&req)
        .unwrap()
        .fail(Status::Integrity, "bad bytes")
        .unwrap();
    t.sender.flush(SEC).expect_err("failed");
    let req = send(&mut t.sender, "w", &w, true);
    receive_all(&mut r, &req).unwrap();
    t.sender.flush(SEC).unwrap();
    assert_eq!(r.completed_version().unwrap(), 2);
    let state = r.poll().unwrap();
    assert_eq!(state.completed_version, 2);
    assert_eq!(
        (state.failed_version, state.failed_status),
        (1, Some(Status::Integrity))
    );
}

// --- membership -----------------------------------------------------------------------------------

#[test]
fn drop_receiver_lets_flush_succeed_for_the_rest() {
    let mut t = trainer(2);
    let mut r0 = receiver(&t.init, 0);
    let mut r1 = receiver(&t.init, 1); // attached, never answers: a frozen engine
    let w = [1.0f32; 4];
    let req = send(&mut t.sender, "w", &w, true);
    receive_all(&mut r0, &req).unwrap();
    let e = t
        .sender
        .flush(Duration::from_millis(200))
        .expect_err("receiver 1 never answers");
    assert_eq!(e.status(), Status::Timeout);
    let kinds: Vec<_> = e.failures().iter().map(|f| (f.receiver, f.what)).collect();
    assert_eq!(kinds, [(1, FailureKind::Timeout)]);

    t.sender.drop_receiver(1).unwrap();
    t.sender
        .flush(SEC)
        .expect("receiver 0 acknowledged everything");
    assert!(t.sender.failures().is_empty());
    let req = send(&mut t.sender, "w", &w, true);
    receive_all(&mut r0, &req).unwrap();
    t.sender.flush(SEC).unwrap();
    assert_eq!(r0.completed_version().unwrap(), 2);

    let e = r1.receive(&req).expect_err("a dropped receiver is told");
    assert_eq!(e.status(), Status::Peer);
    assert!(r1.poll().unwrap().dropped);
}

#[test]
fn drop_receiver_out_of_range_is_invalid_argument() {
    let mut t = trainer(2);
    let e = t.sender.drop_receiver(2).expect_err("out of range");
    assert_eq!(e.status(), Status::InvalidArgument);
}

// --- commit, abandon, poll ------------------------------------------------------------------------

#[test]
fn commit_returns_a_request_with_the_manifest_and_begins_the_next_version() {
    let mut t = trainer(1);
    let w = [1.0f32; 3];
    send(&mut t.sender, "a", &w, false);
    let commit = t.sender.commit().unwrap();
    assert_eq!(t.sender.version().unwrap(), 2);
    let text: String = wsync::describe(&commit)
        .unwrap()
        .split_whitespace()
        .collect();
    for needle in [
        "\"last\":true",
        "\"chunk\":1",
        "\"names\":[]",
        "\"bytes\":12",
        "\"tensors\":1",
    ] {
        assert!(text.contains(needle), "{needle} not in {text}");
    }
}

// libwsync 0.2.0 makes commit requests (an empty tensor table) that its own receivers refuse:
// the shared tensor-table decoder (src/tensor.cpp, decode_tensor_table) rejects an empty 'names'
// with MALFORMED. The two tests below pin the receive side of a commit; run them with
// `cargo test -- --ignored` once that is fixed.
#[test]
fn commit_without_data_completes_the_version() {
    let mut t = trainer(1);
    let mut r = receiver(&t.init, 0);
    let w = [1.0f32; 3];
    let first = send(&mut t.sender, "a", &w, false);
    let commit = t.sender.commit().unwrap();
    assert_eq!(t.sender.version().unwrap(), 2);
    let info = receive_all(&mut r, &first).unwrap().info;
    assert_eq!((info.version, info.chunk_index, info.last), (1, 0, false));
    assert_eq!(r.completed_version().unwrap(), 0);
    let recv = r.receive(&commit).unwrap();
    let info = recv.info();
    assert!(recv.is_empty());
    recv.end().unwrap();
    assert_eq!((info.version, info.chunk_index, info.last), (1, 1, true));
    assert_eq!((info.version_tensors, info.version_bytes), (1, 12));
    assert!(info.version_chunks >= 1);
    t.sender.flush(SEC).unwrap();
    assert_eq!(r.completed_version().unwrap(), 1);
}

#[test]
fn commit_with_nothing_sent_is_wrong_state() {
    let mut t = trainer(1);
    let e = t.sender.commit().expect_err("nothing to commit");
    assert_eq!(e.status(), Status::WrongState);
}

#[test]
fn an_empty_last_chunk_is_a_commit() {
    let mut t = trainer(1);
    let mut r = receiver(&t.init, 0);
    let w = [1.0f32; 3];
    let first = send(&mut t.sender, "a", &w, false);
    let none: [TensorRef<'_>; 0] = [];
    let commit = t.sender.send_chunk(&none, true).unwrap();
    receive_all(&mut r, &first).unwrap();
    let info = receive_all(&mut r, &commit).unwrap().info;
    assert!(info.last && info.count == 0);
    assert_eq!(r.completed_version().unwrap(), 1);
}

#[test]
// r, t, q, k, v: receiver, trainer and attention tensors, as the other tests name them.
#[allow(clippy::many_single_char_names)]
fn the_last_chunk_carries_the_manifest() {
    let mut t = trainer(1);
    let mut r = receiver(&t.init, 0);
    let (a, b, c) = ([1.0f32; 3], [2.0f64; 2], [3.0f32; 1]);
    let first = send(&mut t.sender, "a", &a, false);
    let last = t
        .sender
        .send_chunk(
            &[
                TensorRef::new("b", &b, &[2]).unwrap(),
                TensorRef::new("c", &c, &[1]).unwrap(),
            ],
            true,
        )
        .unwrap();
    let info = receive_all(&mut r, &first).unwrap().info;
    assert_eq!(
        (
            info.version_chunks,
            info.version_tensors,
            info.version_bytes
        ),
        (0, 0, 0)
    );
    let info = receive_all(&mut r, &last).unwrap().info;
    assert_eq!((info.count, info.bytes), (2, 20));
    assert_eq!(
        (
            info.version_chunks,
            info.version_tensors,
            info.version_bytes
        ),
        (2, 3, 32)
    );
}

#[test]
fn poll_after_an_abandon_reports_the_failed_version() {
    let mut t = trainer(1);
    let mut r = receiver(&t.init, 0);
    let w = [1.0f32; 3];
    let first = send(&mut t.sender, "a", &w, false);
    receive_all(&mut r, &first).unwrap();
    assert_eq!(r.poll().unwrap().open_version, 1);
    t.sender.abandon().unwrap();
    let state = r.poll().unwrap();
    assert_eq!(
        (state.failed_version, state.failed_status),
        (1, Some(Status::Abandoned))
    );
    assert_eq!((state.open_version, state.completed_version), (0, 0));
    assert!(!state.dropped && !state.sender_gone);

    assert_eq!(t.sender.version().unwrap(), 2);
    let req = send(&mut t.sender, "a", &w, true);
    assert_eq!(receive_all(&mut r, &req).unwrap().info.version, 2);
    t.sender.flush(SEC).unwrap();
    assert_eq!(r.poll().unwrap().completed_version, 2);
}

#[test]
fn a_chunk_of_an_abandoned_version_is_refused_as_abandoned() {
    let mut t = trainer(1);
    let mut r = receiver(&t.init, 0);
    let w = [1.0f32; 3];
    let first = send(&mut t.sender, "a", &w, false);
    let second = send(&mut t.sender, "b", &w, false);
    receive_all(&mut r, &first).unwrap();
    t.sender.abandon().unwrap();
    let e = r.receive(&second).expect_err("abandoned");
    assert_eq!(e.status(), Status::Abandoned);
}

#[test]
fn abandon_without_a_published_chunk_does_nothing() {
    let mut t = trainer(1);
    let mut r = receiver(&t.init, 0);
    t.sender.abandon().unwrap();
    assert_eq!(t.sender.version().unwrap(), 1);
    let w = [1.0f32; 1];
    let req = send(&mut t.sender, "a", &w, true);
    receive_all(&mut r, &req).unwrap();
    assert_eq!(r.completed_version().unwrap(), 1);
}

#[test]
fn send_plan_abandons_the_version_when_forwarding_fails() {
    let mut t = trainer(1);
    let mut r = receiver(&t.init, 0);
    let specs: Vec<wsync::TensorSpec> = (0..4)
        .map(|i| {
            wsync::TensorSpec::new(&format!("layers.{i}.w"), &[1024], wsync::DType::F32).unwrap()
        })
        .collect();
    let plan = wsync::Plan::new(&specs, r#"{"chunk_bytes": 8192, "group_depth": 0}"#).unwrap();
    assert!(plan.len() > 1);
    let data: Vec<Vec<f32>> = (0..4u8).map(|i| vec![f32::from(i); 1024]).collect();
    let tensors: Vec<TensorRef<'_>> = data
        .iter()
        .enumerate()
        .map(|(i, d)| TensorRef::new(&format!("layers.{i}.w"), d, &[1024]).unwrap())
        .collect();
    let mut sent = 0;
    let outcome = t.sender.send_plan(
        &tensors,
        &plan,
        |request| -> Result<(), Box<dyn std::error::Error>> {
            receive_all(&mut r, request)?;
            sent += 1;
            Err("the controller lost its connection".into())
        },
    );
    assert!(outcome.is_err());
    assert_eq!(sent, 1);
    let state = r.poll().unwrap();
    assert_eq!(
        (state.failed_version, state.failed_status),
        (1, Some(Status::Abandoned))
    );
}
