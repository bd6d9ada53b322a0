//! What a new Rust engine author meets first (issue 39): the README's view loop against split
//! tensors, the loader's own error reaching the trainer through `?` and `Recv::finish`, the rest
//! of a failed version skipped with its own status, and messages that name Rust calls.

// Sizes here are small constants and the byte pattern keeps 8 bits on purpose.
#![allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]

use std::time::Duration;

use wsync::{Error, FailureKind, Options, Plan, Receiver, Sender, Status, Strategy, TensorRef};

const CHUNK: u64 = 64 << 10;

fn sync() -> (Strategy, Sender, Strategy, Receiver) {
    let opts = Options::new()
        .uint("receivers", 1)
        .uint("bucket_bytes", CHUNK)
        .uint("buckets", 4)
        .uint("timeout_ms", 5000);
    let mut trainer = Strategy::with_options("shm", &opts).expect("strategy");
    let init = trainer.create_init_info().expect("init info");
    let sender = Sender::new(&mut trainer, &init).expect("sender");
    let mut engine = Strategy::new("shm", "").expect("engine strategy");
    let receiver = Receiver::new(&mut engine, &init, 0).expect("receiver");
    (trainer, sender, engine, receiver)
}

fn bytes(seed: u32, n: usize) -> Vec<u8> {
    (0..n)
        .map(|i| ((i as u32).wrapping_mul(2_654_435_761).wrapping_add(seed) >> 13) as u8)
        .collect()
}

/// The README's loop (`for view in recv.views()`) over a version whose large tensor is split,
/// as a Python trainer's `send_model` does by default: every part lands at its place.
#[test]
fn the_readme_view_loop_loads_split_tensors_bit_exact() {
    let (_t, mut sender, _e, mut receiver) = sync();
    let big = bytes(1, 3 * CHUNK as usize + 1000);
    let small = bytes(2, 4096);
    let tensors = [
        TensorRef::new("embed.weight", &big, &[big.len() as i64]).unwrap(),
        TensorRef::new("norm.weight", &small, &[4096]).unwrap(),
    ];
    let plan = Plan::with_options(
        &tensors,
        &Options::new()
            .uint("chunk_bytes", CHUNK)
            .boolean("split", true),
    )
    .unwrap();
    let mut model = std::collections::HashMap::from([
        ("embed.weight".to_string(), vec![0u8; big.len()]),
        ("norm.weight".to_string(), vec![0u8; small.len()]),
    ]);
    sender
        .send_plan(&tensors, &plan, |request| -> wsync::Result<()> {
            let mut recv = receiver.receive(request)?;
            for view in recv.views() {
                let view = view?;
                let at = view.part().offset as usize;
                let param = model.get_mut(view.name()).expect("a known name");
                view.copy_bytes_to(&mut param[at..at + view.byte_len()])?;
            }
            recv.end()
        })
        .unwrap();
    sender.flush(Duration::from_secs(5)).unwrap();
    assert_eq!(receiver.completed_version().unwrap(), 1);
    assert_eq!(model["embed.weight"], big);
    assert_eq!(model["norm.weight"], small);
}

/// A loader that leaves by `?` used to reach the trainer only as "dropped without `end()`"
/// (`WRONG_STATE`); `Recv::finish` sends its own status and text.
#[test]
fn finish_sends_the_loaders_own_error_to_the_trainer() {
    let (_t, mut sender, _e, mut receiver) = sync();
    let w = bytes(3, 4096);
    let request = sender
        .send_chunk(&[TensorRef::new("w", &w, &[4096]).unwrap()], true)
        .unwrap();
    let mut recv = receiver.receive(&request).unwrap();
    let loaded = (|| -> wsync::Result<()> {
        for view in recv.views() {
            let view = view?;
            Err(Error::new(
                Status::Mismatch,
                format!("the model has no parameter '{}'", view.name()),
            ))?;
        }
        Ok(())
    })();
    let e = recv.finish(loaded).unwrap_err();
    assert_eq!(e.status(), Status::Mismatch);
    let e = sender.flush(Duration::from_secs(5)).unwrap_err();
    assert_eq!(e.status(), Status::Peer, "{e}");
    let f = &e.failures()[0];
    assert_eq!(f.what, FailureKind::Failed);
    assert_eq!(f.status, Status::Mismatch, "{f}");
    assert!(f.message.contains("the model has no parameter 'w'"), "{f}");
    assert_eq!(receiver.completed_version().unwrap(), 0);
}

/// `finish(Ok(..))` ends the iteration and completes the chunk.
#[test]
fn finish_with_ok_ends_the_iteration() {
    let (_t, mut sender, _e, mut receiver) = sync();
    let w = bytes(4, 4096);
    let request = sender
        .send_chunk(&[TensorRef::new("w", &w, &[4096]).unwrap()], true)
        .unwrap();
    let mut recv = receiver.receive(&request).unwrap();
    let loaded: wsync::Result<Vec<u8>> = recv.views().next().unwrap().and_then(|v| v.to_bytes());
    assert_eq!(recv.finish(loaded).unwrap(), w);
    sender.flush(Duration::from_secs(5)).unwrap();
    assert_eq!(receiver.completed_version().unwrap(), 1);
}

/// After a loader failure the later chunks of that version were refused with the loader's own
/// status (`WRONG_STATE` in the trial), which reads as a new bug; they are `Skipped`.
#[test]
fn the_rest_of_a_failed_version_is_skipped_with_its_own_status() {
    let (_t, mut sender, _e, mut receiver) = sync();
    let w = bytes(5, 4096);
    let t = [TensorRef::new("w", &w, &[4096]).unwrap()];
    let first = sender.send_chunk(&t, false).unwrap();
    let second = sender.send_chunk(&t, true).unwrap();
    let recv = receiver.receive(&first).unwrap();
    recv.fail(Status::WrongState, "the loader stopped").unwrap();
    let e = receiver.receive(&second).unwrap_err();
    assert_eq!(e.status(), Status::Skipped, "{e}");
    assert!(e.message().contains("already failed here"), "{e}");
    let state = receiver.poll().unwrap();
    assert_eq!(state.failed_version, 1);
    assert_eq!(state.failed_status, Some(Status::WrongState));
    // The trainer hears the loader's failure once, not a second one for the skipped chunk.
    let e = sender.flush(Duration::from_secs(5)).unwrap_err();
    assert_eq!(e.failures().len(), 1, "{e:?}");
    assert_eq!(e.failures()[0].status, Status::WrongState);
}

/// An index held by a live process names its pid and what to do, in Rust's terms.
#[test]
fn an_index_held_by_a_live_process_names_the_pid_and_the_rust_remedy() {
    let opts = Options::new().uint("receivers", 1);
    let mut trainer = Strategy::with_options("shm", &opts).unwrap();
    let init = trainer.create_init_info().unwrap();
    let _sender = Sender::new(&mut trainer, &init).unwrap();
    let mut engine = Strategy::new("shm", "").unwrap();
    let _held = Receiver::new(&mut engine, &init, 0).unwrap();
    let mut other = Strategy::new("shm", "").unwrap();
    let e = Receiver::new(&mut other, &init, 0).unwrap_err();
    assert_eq!(e.status(), Status::WrongState, "{e}");
    let pid = format!("pid {}", std::process::id());
    assert!(e.message().contains(&pid), "{e}");
    assert!(e.message().contains("Sender::drop_receiver"), "{e}");
    assert!(e.message().contains("end that process"), "{e}");
    assert!(!e.message().contains("wsync_"), "{e}");
}
