//! The `ucx` kind through the Rust binding: selected by its kind string like the others. The
//! trainer and the engine live in this one process (the sender's progress thread answers the
//! receiver's attach and serves its GETs); tests/ucx/scenarios.sh covers separate hosts and
//! failures between processes. Where the library was built without UCX or `libucp.so.0` is
//! missing, each test says so on stderr and passes (as `wsync kinds` reports the kind
//! unavailable, which `kind_is_listed_with_its_runtime_or_the_reason` checks either way).

use std::time::Duration;

use wsync::{Options, Receiver, Sender, Status, Strategy, TensorRef};

fn ucx_available() -> bool {
    let kinds = wsync::kinds().expect("kinds");
    let ucx = kinds.iter().find(|k| k.name == "ucx");
    match ucx {
        Some(k) if k.available => true,
        Some(k) => {
            eprintln!("ucx kind unavailable here ({}): test skipped", k.reason);
            false
        }
        None => {
            eprintln!("ucx kind not built into this library: test skipped");
            false
        }
    }
}

fn options() -> Options {
    Options::new()
        .string("transports", "tcp")
        .string("net_devices", "lo")
        .uint("timeout_ms", 10_000)
}

fn pair() -> (Strategy, Sender, Strategy, Receiver) {
    let mut trainer =
        Strategy::with_options("ucx", &options().uint("receivers", 1)).expect("trainer strategy");
    let init = trainer.create_init_info().expect("init info");
    let sender = Sender::new(&mut trainer, &init).expect("sender");
    let mut engine = Strategy::with_options("ucx", &options()).expect("engine strategy");
    let receiver = Receiver::new(&mut engine, &init, 0).expect("receiver");
    (trainer, sender, engine, receiver)
}

#[test]
fn kind_is_listed_with_its_runtime_or_the_reason() {
    let kinds = wsync::kinds().expect("kinds");
    if let Some(k) = kinds.iter().find(|k| k.name == "ucx") {
        if k.available {
            assert!(
                k.runtime.contains("UCX"),
                "runtime of an available ucx kind: {:?}",
                k.runtime
            );
        } else {
            assert!(!k.reason.is_empty(), "an unavailable kind says why");
        }
    }
}

#[test]
fn versions_arrive_bit_exact_and_the_flush_sees_each_ack() {
    if !ucx_available() {
        return;
    }
    let (_trainer, mut sender, _engine, mut receiver) = pair();
    for step in 1u8..=3 {
        let w: Vec<f32> = (0..1000u16)
            .map(|i| f32::from(i) * f32::from(step))
            .collect();
        let b = vec![step; 7];
        let chunk = [
            TensorRef::new("w", &w, &[1000]).unwrap(),
            TensorRef::new("b", &b, &[7]).unwrap(),
        ];
        let req = sender.send_chunk(&chunk, true).unwrap();
        let mut recv = receiver.receive(&req).unwrap();
        let mut got_w = vec![0f32; 1000];
        for view in recv.views() {
            let view = view.unwrap();
            match view.name() {
                "w" => view.copy_to(&mut got_w).unwrap(),
                "b" => assert_eq!(view.to_bytes().unwrap(), b),
                other => panic!("unexpected tensor {other}"),
            }
        }
        recv.end().unwrap();
        sender.flush(Duration::from_secs(10)).unwrap();
        assert_eq!(got_w, w, "version {step}");
        assert_eq!(receiver.completed_version().unwrap(), u64::from(step));
    }
}

#[test]
fn an_engine_failure_reaches_the_flush_as_data_naming_the_receiver() {
    if !ucx_available() {
        return;
    }
    let (_trainer, mut sender, _engine, mut receiver) = pair();
    let w = [1f32; 8];
    let req = sender
        .send_chunk(&[TensorRef::new("w", &w, &[8]).unwrap()], true)
        .unwrap();
    let recv = receiver.receive(&req).unwrap();
    recv.fail(Status::Mismatch, "tensor 'w' has the wrong shape here")
        .unwrap();
    let e = sender.flush(Duration::from_secs(10)).unwrap_err();
    assert_eq!(e.status(), Status::Peer, "{e}");
    assert!(
        e.message().contains("receiver 0 (") && e.message().contains("wrong shape"),
        "{e}"
    );
    let failures = sender.failures();
    assert_eq!(failures.len(), 1, "{failures:?}");
    assert_eq!(
        (
            failures[0].receiver,
            failures[0].version,
            failures[0].status
        ),
        (0, 1, Status::Mismatch)
    );
    assert_eq!(receiver.completed_version().unwrap(), 0);
}

#[test]
fn a_receiver_index_out_of_range_is_named() {
    if !ucx_available() {
        return;
    }
    let mut trainer = Strategy::with_options("ucx", &options().uint("receivers", 1)).unwrap();
    let init = trainer.create_init_info().unwrap();
    let _sender = Sender::new(&mut trainer, &init).unwrap();
    let mut engine = Strategy::with_options("ucx", &options()).unwrap();
    let e = Receiver::new(&mut engine, &init, 5).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    assert!(e.message().contains("receiver index 5"), "{e}");
    // A range reads the same in every language (issue 39: "1 receivers (0..0)").
    assert!(e.message().contains("1 receiver, index 0"), "{e}");
    assert!(!e.message().contains(".."), "{e}");
}
