//! The safe API against the real library, in one process (the library allows a sender and its
//! receivers in one process). One behaviour per test, named for it; every wait is bounded by a
//! small `timeout_ms` or flush deadline.

#[allow(dead_code)]
mod support;

use std::time::{Duration, Instant};

use support::{options, receive_all, receiver, receiver_with, send, trainer, SEC};
use wsync::{
    describe, describe_options, kinds, merge_requests, plan, DType, Device, Error, Options, Plan,
    Receiver, Sender, Status, Strategy, TensorRef, TensorSpec,
};

fn f32s(seed: u32, n: usize) -> Vec<f32> {
    (0..n)
        .map(|i| f32_exact(seed * 1000 + u32::try_from(i).unwrap()) * 0.25 - 3.0)
        .collect()
}

/// `x` as f32; test values stay far below 2^24, where binary32 is exact.
#[allow(clippy::cast_precision_loss)]
fn f32_exact(x: u32) -> f32 {
    assert!(x < 1 << 24, "{x} is not exact in f32");
    x as f32
}

fn expect_err<T: std::fmt::Debug>(
    r: wsync::Result<T>,
    status: Status,
    needle: &str,
) -> wsync::Error {
    let e = r.expect_err("the call should have failed");
    assert_eq!(e.status(), status, "{e}");
    assert!(
        e.message().contains(needle),
        "message {:?} does not mention {needle:?}",
        e.message()
    );
    e
}

// --- the happy path ------------------------------------------------------------------------------

#[test]
// r, t, q, k, v: receiver, trainer and attention tensors, as the other tests name them.
#[allow(clippy::many_single_char_names)]
fn sync_moves_every_tensor_bit_for_bit_over_several_versions() {
    let mut t = trainer(&options(1));
    let mut r = receiver(&t.init, 0);
    assert_eq!(r.completed_version().unwrap(), 0);
    for v in 1..=3u32 {
        assert_eq!(t.sender.version().unwrap(), u64::from(v));
        let a = f32s(v, 600);
        let v16 = u16::try_from(v).unwrap();
        let b: Vec<u16> = (0..256u16).map(|i| i.wrapping_mul(v16 + 7)).collect();
        let c: Vec<u8> = (0..100u8).map(|i| i ^ u8::try_from(v).unwrap()).collect();
        let step = [i64::from(v) * -1_000_000_007];
        let chunk0 = [
            TensorRef::new("layers.0.attn.q.weight", &a, &[20, 30]).unwrap(),
            TensorRef::with_dtype("layers.0.attn.k.weight", &b, &[16, 16], DType::BF16).unwrap(),
        ];
        let chunk1 = [
            TensorRef::new("layers.0.norm.quant", &c, &[4, 25]).unwrap(),
            TensorRef::new("step", &step, &[]).unwrap(),
        ];
        let req0 = t.sender.send_chunk(&chunk0, false).unwrap();
        let req1 = t.sender.send_chunk(&chunk1, true).unwrap();

        let mut recv = r.receive(&req0).unwrap();
        let info = recv.info();
        assert_eq!(
            (info.version, info.chunk_index, info.last, info.count),
            (u64::from(v), 0, false, 2)
        );
        assert_eq!(info.bytes, 600 * 4 + 256 * 2);
        let views: Vec<_> = recv.views().collect::<wsync::Result<_>>().unwrap();
        assert_eq!(views.len(), 2);
        assert_eq!(views[0].name(), "layers.0.attn.q.weight");
        assert_eq!(views[0].dtype(), DType::F32);
        assert_eq!(views[0].shape(), &[20, 30]);
        assert_eq!(views[0].device(), Device::CPU);
        assert!(views[0].is_read_only());
        let got: Vec<f32> = views[0].to_vec().unwrap();
        assert!(got.iter().zip(&a).all(|(x, y)| x.to_bits() == y.to_bits()));
        assert_eq!(views[1].dtype(), DType::BF16);
        let mut bits = vec![0u16; b.len()];
        views[1].copy_raw_to(&mut bits).unwrap();
        assert_eq!(bits, b);
        assert_eq!(views[1].byte_len(), 512);
        drop(views);
        recv.end().unwrap();
        assert_eq!(
            r.completed_version().unwrap(),
            u64::from(v - 1),
            "a version is complete only after its last chunk"
        );

        let mut recv = r.receive(&req1).unwrap();
        assert!(recv.info().last);
        let mut n = 0;
        while let Some(view) = recv.next_view() {
            let view = view.unwrap();
            match view.name() {
                "layers.0.norm.quant" => assert_eq!(view.to_bytes().unwrap(), c),
                "step" => {
                    assert!(view.shape().is_empty());
                    assert_eq!(view.elements(), 1);
                    assert_eq!(view.to_vec::<i64>().unwrap(), &step);
                }
                other => panic!("unexpected tensor {other}"),
            }
            n += 1;
        }
        assert_eq!(n, 2);
        recv.end().unwrap();
        t.sender.flush(SEC).unwrap();
        assert_eq!(r.completed_version().unwrap(), u64::from(v));
    }
}

#[test]
// r, t, q, k, v: receiver, trainer and attention tensors, as the other tests name them.
#[allow(clippy::many_single_char_names)]
fn views_may_be_held_together_and_come_in_chunk_order() {
    let mut t = trainer(&options(1));
    let mut r = receiver(&t.init, 0);
    let (q, k, v) = (f32s(1, 64), f32s(2, 64), f32s(3, 64));
    let req = t
        .sender
        .send_chunk(
            &[
                TensorRef::new("attn.q", &q, &[8, 8]).unwrap(),
                TensorRef::new("attn.k", &k, &[8, 8]).unwrap(),
                TensorRef::new("attn.v", &v, &[8, 8]).unwrap(),
            ],
            true,
        )
        .unwrap();
    let mut recv = r.receive(&req).unwrap();
    let mut views = recv.views();
    let (vq, vk, vv) = (
        views.next().unwrap().unwrap(),
        views.next().unwrap().unwrap(),
        views.next().unwrap().unwrap(),
    );
    assert!(views.next().is_none());
    assert!(views.next().is_none(), "the iterator is fused");
    // All three are still valid: fuse them.
    let fused: Vec<f32> = [vq, vk, vv]
        .iter()
        .flat_map(|x| x.to_vec::<f32>().unwrap())
        .collect();
    assert_eq!(fused, [q, k, v].concat());
    recv.end().unwrap();
    t.sender.flush(SEC).unwrap();
}

#[test]
fn dry_run_describes_tensors_without_data() {
    let mut t = trainer(&options(1));
    let mut r = receiver(&t.init, 0);
    let a = f32s(1, 6);
    let b = [7u8; 5];
    let req = t
        .sender
        .send_chunk(
            &[
                TensorRef::new("a", &a, &[2, 3]).unwrap(),
                TensorRef::new("b", &b, &[5]).unwrap(),
            ],
            true,
        )
        .unwrap();
    let mut recv = r.receive(&req).unwrap();
    assert_eq!(recv.len(), 2);
    let metas = recv.metas().unwrap();
    assert_eq!(metas.len(), 2);
    assert_eq!(
        (metas[0].name(), metas[0].dtype(), metas[0].shape()),
        ("a", DType::F32, &[2i64, 3][..])
    );
    assert_eq!(metas[0].byte_len().unwrap(), 24);
    assert_eq!(
        (metas[1].name(), metas[1].dtype(), metas[1].shape()),
        ("b", DType::U8, &[5i64][..])
    );
    assert_eq!(metas[1].device(), Device::CPU);
    expect_err(recv.peek(2), Status::InvalidArgument, "out of range");
    drop(metas);
    // Peeking moves nothing: every view is still to come.
    assert_eq!(recv.views().count(), 2);
    recv.end().unwrap();
}

#[test]
fn typed_access_checks_dtype_and_element_size() {
    let mut t = trainer(&options(1));
    let mut r = receiver(&t.init, 0);
    let bits = [1u16, 2, 3, 4];
    let req = t
        .sender
        .send_chunk(
            &[TensorRef::with_dtype("w", &bits, &[4], DType::BF16).unwrap()],
            true,
        )
        .unwrap();
    let mut recv = r.receive(&req).unwrap();
    let view = recv.views().next().unwrap().unwrap();
    // SAFETY: this process is the trainer, which neither drops the receiver nor sends again
    // while the view lives, and no other process has the segment.
    let (wrong_dtype, wrong_size, bits16, raw) = unsafe {
        (
            view.as_slice::<u16>(),
            view.as_raw_elements::<u32>(),
            view.as_raw_elements::<u16>(),
            view.bytes(),
        )
    };
    expect_err(wrong_dtype, Status::Mismatch, "bfloat16, not uint16");
    expect_err(wrong_size, Status::Mismatch, "not 4 bytes");
    assert_eq!(bits16.unwrap(), &bits);
    assert_eq!(raw.unwrap().len(), 8);
    // The safe copies check the same, and the length.
    expect_err(
        view.to_vec::<u16>(),
        Status::Mismatch,
        "bfloat16, not uint16",
    );
    expect_err(
        view.copy_raw_to(&mut [0u32; 2]),
        Status::Mismatch,
        "not 4 bytes",
    );
    expect_err(
        view.copy_raw_to(&mut [0u16; 3]),
        Status::InvalidArgument,
        "tensor 'w' has 8 bytes here; the destination has 6",
    );
    let mut got = [0u16; 4];
    view.copy_raw_to(&mut got).unwrap();
    assert_eq!(got, bits);
    let mut raw = [0u8; 9];
    view.copy_bytes_to(&mut raw[1..]).unwrap(); // any alignment
    assert_eq!(raw[1..], [1, 0, 2, 0, 3, 0, 4, 0]);
    assert!(!view.data_ptr().is_null());
    assert_eq!(
        view.data_ptr() as usize % 256,
        0,
        "shm views are 256-byte aligned"
    );
    recv.end().unwrap();
}

#[test]
fn handles_move_to_other_threads() {
    let t = trainer(&options(1));
    let r = receiver(&t.init, 0);
    let (tx, rx) = std::sync::mpsc::channel::<Vec<u8>>();
    let mut sender = t.sender;
    let trainer = std::thread::spawn(move || {
        for v in 1..=3u32 {
            let w = f32s(v, 32);
            tx.send(
                sender
                    .send_chunk(&[TensorRef::new("w", &w, &[32]).unwrap()], true)
                    .unwrap(),
            )
            .unwrap();
            sender.flush(SEC).unwrap();
        }
    });
    let engine = std::thread::spawn(move || {
        let mut r = r;
        for v in 1..=3u32 {
            let req = rx.recv_timeout(SEC).expect("a request");
            let mut recv = r.receive(&req).unwrap();
            for view in &mut recv {
                let got: Vec<f32> = view.unwrap().to_vec::<f32>().unwrap();
                assert_eq!(got, f32s(v, 32));
            }
            recv.end().unwrap();
        }
        r.completed_version().unwrap()
    });
    trainer.join().unwrap();
    assert_eq!(engine.join().unwrap(), 3);
}

// --- strategies and options -------------------------------------------------------------------

#[test]
fn unknown_option_key_is_invalid_argument_naming_the_key() {
    let e = expect_err(
        Strategy::new("shm", r#"{"recievers": 2}"#),
        Status::InvalidArgument,
        "recievers",
    );
    assert!(
        e.message().contains("receivers"),
        "the message lists the known keys: {e}"
    );
}

#[test]
fn option_of_wrong_type_or_out_of_range_is_invalid_argument() {
    expect_err(
        Strategy::new("shm", r#"{"receivers": "two"}"#),
        Status::InvalidArgument,
        "receivers",
    );
    expect_err(
        Strategy::new("shm", r#"{"receivers": 0}"#),
        Status::InvalidArgument,
        "out of range",
    );
    expect_err(
        Strategy::new("shm", r#"{"checksum": 1}"#),
        Status::InvalidArgument,
        "checksum",
    );
    expect_err(
        Strategy::new("shm", "[1, 2]"),
        Status::InvalidArgument,
        "JSON object",
    );
    expect_err(
        Strategy::new("shm", "{not json"),
        Status::InvalidArgument,
        "not valid JSON",
    );
    expect_err(
        Strategy::new("shm", "{\"a\0\": 1}"),
        Status::InvalidArgument,
        "NUL byte",
    );
}

#[test]
fn unknown_kind_is_unsupported() {
    expect_err(
        Strategy::new("carrier_pigeon", ""),
        Status::Unsupported,
        "carrier_pigeon",
    );
    expect_err(
        describe_options("carrier_pigeon"),
        Status::Unsupported,
        "carrier_pigeon",
    );
}

#[test]
fn kinds_and_options_describe_the_shm_strategy() {
    let all = kinds().unwrap();
    let shm = all
        .iter()
        .find(|k| k.name == "shm")
        .expect("shm is built in");
    assert!(shm.available, "shm unavailable here: {}", shm.reason);
    let text = describe_options("shm").unwrap();
    for key in [
        "receivers",
        "buckets",
        "bucket_bytes",
        "checksum",
        "verify",
        "timeout_ms",
    ] {
        assert!(
            text.contains(&format!("\"{key}\"")),
            "{key} missing from {text}"
        );
    }
    let s = Strategy::new("shm", "").unwrap();
    assert_eq!(s.kind().unwrap(), "shm");
    assert!(format!("{s:?}").contains("shm"));
}

#[test]
fn init_info_is_made_once_per_strategy() {
    let mut s = Strategy::with_options("shm", &options(1)).unwrap();
    let init = s.create_init_info().unwrap();
    expect_err(s.create_init_info(), Status::WrongState, "already");
    let described = describe(&init).unwrap();
    assert!(
        described.contains("\"type\": \"init\"") && described.contains("\"kind\": \"shm\""),
        "{described}"
    );
}

// --- blobs ------------------------------------------------------------------------------------------

#[test]
fn malformed_blobs_are_refused_before_any_memory_is_touched() {
    let t = trainer(&options(1));
    let garbage = b"definitely not a wsync blob";
    expect_err(describe(garbage), Status::Malformed, "");
    let mut s = Strategy::new("shm", "").unwrap();
    expect_err(Receiver::new(&mut s, garbage, 0), Status::Malformed, "");
    expect_err(
        Receiver::new(&mut s, &t.init[..t.init.len() / 2], 0),
        Status::Malformed,
        "",
    );
    expect_err(
        Receiver::new(&mut s, &[], 0),
        Status::InvalidArgument,
        "empty",
    );
    let mut r = receiver(&t.init, 0);
    expect_err(r.receive(garbage), Status::Malformed, "");
    expect_err(r.receive(&[]), Status::InvalidArgument, "empty");
}

#[test]
// r, t, q, k, v: receiver, trainer and attention tensors, as the other tests name them.
#[allow(clippy::many_single_char_names)]
fn blobs_of_another_role_or_strategy_are_mismatch() {
    let mut t = trainer(&options(1));
    let w = [1.0f32; 4];
    let req = send(&mut t.sender, "w", &w, true);
    let mut s = Strategy::new("shm", "").unwrap();
    expect_err(
        Receiver::new(&mut s, &req, 0),
        Status::Mismatch,
        "expected an init blob",
    );
    let mut r = receiver(&t.init, 0);
    expect_err(
        r.receive(&t.init),
        Status::Mismatch,
        "expected a request blob",
    );
    // A request for another segment.
    let mut other = trainer(&options(1));
    let other_req = other
        .sender
        .send_chunk(&[TensorRef::new("w", &w, &[4]).unwrap()], true)
        .unwrap();
    expect_err(r.receive(&other_req), Status::Mismatch, "segment");
    // Init info of one strategy given to the sender of another.
    let mut a = Strategy::with_options("shm", &options(1)).unwrap();
    let _a_init = a.create_init_info().unwrap();
    expect_err(Sender::new(&mut a, &t.init), Status::Mismatch, "segment");
    expect_err(
        Sender::new(&mut s, &t.init),
        Status::WrongState,
        "has not created",
    );
}

#[test]
fn out_of_order_and_replayed_requests_are_mismatch() {
    let mut t = trainer(&options(1));
    let mut r = receiver(&t.init, 0);
    let w = [1u8; 8];
    let tensor = [TensorRef::new("w", &w, &[8]).unwrap()];
    let first = t.sender.send_chunk(&tensor, false).unwrap();
    let second = t.sender.send_chunk(&tensor, true).unwrap();
    expect_err(r.receive(&second), Status::Mismatch, "chunk 0");
    // Version 1 failed here at its first out-of-order chunk (the trainer is told so): neither
    // its late chunk 0 nor its last chunk again can complete it.
    expect_err(r.receive(&first), Status::Mismatch, "chunk 0 of version 1");
    expect_err(r.receive(&second), Status::Mismatch, "version 1");
    assert_eq!(r.completed_version().unwrap(), 0);
}

#[test]
fn merge_of_one_shm_part_is_a_copy_and_more_are_unsupported() {
    let mut t = trainer(&options(1));
    let w = [1u8; 8];
    let req = send(&mut t.sender, "w", &w, true);
    assert_eq!(merge_requests(&[&req]).unwrap(), req);
    expect_err(
        merge_requests(&[&req, &req]),
        Status::Unsupported,
        "single sender",
    );
    expect_err(merge_requests(&[]), Status::InvalidArgument, "no parts");
    expect_err(
        merge_requests(&[&req, &[]]),
        Status::InvalidArgument,
        "part 1",
    );
    expect_err(merge_requests(&[b"junk"]), Status::Malformed, "part 0");
}

// --- receivers ----------------------------------------------------------------------------------

#[test]
fn receiver_index_out_of_range_or_taken_is_refused() {
    let t = trainer(&options(2));
    let mut s = Strategy::new("shm", "").unwrap();
    expect_err(
        Receiver::new(&mut s, &t.init, 2),
        Status::InvalidArgument,
        "receiver index 2",
    );
    let r0 = Receiver::new(&mut s, &t.init, 0).unwrap();
    assert_eq!(r0.index(), 0);
    expect_err(
        Receiver::new(&mut s, &t.init, 0),
        Status::WrongState,
        "already attached",
    );
    assert!(Receiver::new(&mut s, &t.init, 1).is_ok());
}

#[test]
fn receive_while_an_iteration_is_open_is_wrong_state_at_run_time_only_when_leaked() {
    // With the borrow checker a second `receive` while a Recv lives does not compile (see the
    // compile_fail examples in the crate docs). Leaking the Recv releases the borrow without
    // ending the iteration, and then the library's own check answers.
    let mut t = trainer(&options(1));
    let mut r = receiver(&t.init, 0);
    let w = [1u8; 8];
    let tensor = [TensorRef::new("w", &w, &[8]).unwrap()];
    let first = t.sender.send_chunk(&tensor, false).unwrap();
    let second = t.sender.send_chunk(&tensor, true).unwrap();
    std::mem::forget(r.receive(&first).unwrap());
    expect_err(r.receive(&second), Status::WrongState, "still open");
    // Dropping the receiver ends the leaked iteration as failed; the sender hears of it.
    drop(r);
    expect_err(t.sender.flush(SEC), Status::Peer, "receiver 0");
}

#[test]
// r, t, q, k, v: receiver, trainer and attention tensors, as the other tests name them.
#[allow(clippy::many_single_char_names)]
fn ending_early_is_acknowledged_as_failed_and_flush_reports_peer_once() {
    let mut t = trainer(&options(1));
    let mut r = receiver(&t.init, 0);
    let (a, b) = (f32s(1, 4), f32s(2, 4));
    let good = |s: &mut Sender, last| {
        s.send_chunk(
            &[
                TensorRef::new("a", &a, &[4]).unwrap(),
                TensorRef::new("b", &b, &[4]).unwrap(),
            ],
            last,
        )
    };
    let req = good(&mut t.sender, true).unwrap();
    assert_eq!(receive_all(&mut r, &req).unwrap().views, 2);
    t.sender.flush(SEC).unwrap();
    assert_eq!(r.completed_version().unwrap(), 1);

    let req = good(&mut t.sender, true).unwrap();
    let mut recv = r.receive(&req).unwrap();
    assert!(recv.views().next().unwrap().is_ok());
    expect_err(recv.end(), Status::WrongState, "ended after 1 of 2 tensors");
    assert_eq!(
        r.completed_version().unwrap(),
        1,
        "the failed version is not complete"
    );
    let e = expect_err(
        t.sender.flush(SEC),
        Status::Peer,
        "failed chunk 0 of version 2",
    );
    assert_eq!(e.failures().len(), 1);
    assert_eq!(e.failures()[0].status, Status::WrongState);
    t.sender.flush(SEC).expect("each failure is reported once");

    // The next version starts afresh.
    let req = good(&mut t.sender, true).unwrap();
    r.receive(&req).unwrap().end().expect_err("no views taken");
    expect_err(
        t.sender.flush(SEC),
        Status::Peer,
        "failed chunk 0 of version 3",
    );
    let req = good(&mut t.sender, true).unwrap();
    assert_eq!(receive_all(&mut r, &req).unwrap().views, 2);
    assert_eq!(r.completed_version().unwrap(), 4);
}

#[test]
fn dropping_an_unfinished_iteration_acknowledges_failure() {
    let mut t = trainer(&options(1));
    let mut r = receiver(&t.init, 0);
    let w = [3i32; 16];
    let req = t
        .sender
        .send_chunk(
            &[
                TensorRef::new("x", &w, &[16]).unwrap(),
                TensorRef::new("y", &w, &[4, 4]).unwrap(),
            ],
            true,
        )
        .unwrap();
    {
        let mut recv = r.receive(&req).unwrap();
        let _first = recv.views().next();
        // Dropped here, as a `?` would: one of two tensors taken.
    }
    assert_eq!(r.completed_version().unwrap(), 0);
    expect_err(t.sender.flush(SEC), Status::Peer, "WSYNC_ERR_WRONG_STATE");
}

#[test]
fn copy_tensor_into_checks_dtype_and_length_and_takes_nothing_when_it_refuses() {
    let mut t = trainer(&options(1));
    let mut r = receiver(&t.init, 0);
    let w = f32s(7, 1024);
    let req = send(&mut t.sender, "w", &w, true);
    let mut recv = r.receive(&req).unwrap();
    // A bf16 buffer of the same byte size, and a buffer short by one element: refused by
    // name, nothing copied, nothing taken.
    let mut as_u32 = vec![0u32; 1024];
    expect_err(
        recv.copy_tensor_into(0, &mut as_u32),
        Status::Mismatch,
        "tensor 'w' is float32, not uint32",
    );
    let mut short = vec![0f32; 1023];
    expect_err(
        recv.copy_tensor_into(0, &mut short),
        Status::InvalidArgument,
        "tensor 'w' has 1024 elements; the destination holds 1023",
    );
    assert!(short.iter().all(|&x| x == 0.0));
    let mut got = vec![0f32; 1024];
    recv.copy_tensor_into(0, &mut got).unwrap();
    assert!(got.iter().zip(&w).all(|(x, y)| x.to_bits() == y.to_bits()));
    recv.end().unwrap();
    t.sender.flush(SEC).unwrap();
    assert_eq!(r.completed_version().unwrap(), 1);
}

#[test]
fn copy_tensor_raw_into_takes_bfloat16_bits_into_u16_without_the_half_feature() {
    // Rust user trial: a bf16 tensor could only reach a `&mut [u16]` through an unsafe cast
    // to bytes; `copy_tensor_raw_into` checks the element size instead of the dtype.
    let mut t = trainer(&options(1));
    let mut r = receiver(&t.init, 0);
    let bits: Vec<u16> = (0..512u16).map(|i| i.wrapping_mul(40503)).collect();
    let req = t
        .sender
        .send_chunk(
            &[TensorRef::with_dtype("w", &bits, &[512], DType::BF16).unwrap()],
            true,
        )
        .unwrap();
    let mut recv = r.receive(&req).unwrap();
    let mut wide = vec![0u32; 256];
    expect_err(
        recv.copy_tensor_raw_into(0, &mut wide),
        Status::Mismatch,
        "tensor 'w' is bfloat16, whose elements are not 4 bytes",
    );
    let mut short = vec![0u16; 511];
    expect_err(
        recv.copy_tensor_raw_into(0, &mut short),
        Status::InvalidArgument,
        "tensor 'w' has 512 elements; the destination holds 511",
    );
    let mut got = vec![0u16; 512];
    recv.copy_tensor_raw_into(0, &mut got).unwrap();
    assert_eq!(got, bits);
    recv.end().unwrap();
    t.sender.flush(SEC).unwrap();
    assert_eq!(r.completed_version().unwrap(), 1);
}

#[test]
fn returning_early_after_every_view_was_taken_fails_the_chunk() {
    // Only end() completes a chunk: a loader that took every view and then returned with `?`
    // (it may not have loaded the last one) leaves the version incomplete, and the trainer
    // hears why. (A drop used to end the iteration, which completed the version with whatever
    // the loader had managed to load: an engine serving a mix.)
    fn load(r: &mut Receiver, req: &[u8], sink: &mut Vec<u8>) -> wsync::Result<()> {
        let mut recv = r.receive(req)?;
        for view in recv.views() {
            let view = view?;
            sink.extend_from_slice(&[0; 4][..view.byte_len()]);
            Err(Error::new(Status::NoMemory, "the engine's buffer is full"))?;
        }
        recv.end()
    }
    let mut t = trainer(&options(1));
    let mut r = receiver(&t.init, 0);
    let w = [5u8; 4];
    let req = send(&mut t.sender, "w", &w, true);
    let mut sink = Vec::new();
    expect_err(
        load(&mut r, &req, &mut sink),
        Status::NoMemory,
        "buffer is full",
    );
    assert_eq!(r.completed_version().unwrap(), 0);
    let flushed = t.sender.flush(SEC).expect_err("the chunk was failed");
    let [failure] = flushed.failures() else {
        panic!("one failure expected: {:?}", flushed.failures())
    };
    assert_eq!(failure.status, Status::WrongState);
    assert!(
        failure.message.contains("dropped without end()"),
        "{}",
        failure.message
    );
    // The next version completes as usual.
    let req = send(&mut t.sender, "w", &w, true);
    let mut recv = r.receive(&req).unwrap();
    assert_eq!(recv.views().count(), 1);
    recv.end().unwrap();
    assert_eq!(r.completed_version().unwrap(), 2);
    t.sender.flush(SEC).unwrap();
}

#[test]
fn corrupted_bytes_fail_the_iteration_the_version_and_the_flush() {
    // Two receivers, one attached: the segment's name stays, so the test can reach its bytes.
    let mut t = trainer(&options(2));
    let mut r = receiver(&t.init, 0);
    let w: Vec<u64> = (0..64).map(|i| 0x5753_594e_4300_0000 + i).collect();
    let req = send(&mut t.sender, "w", &w, true);
    corrupt_segment(&t.init, &w);
    let mut recv = r.receive(&req).unwrap();
    let mut views = recv.views();
    let e = views
        .next()
        .expect("an item")
        .expect_err("the checksum is wrong");
    assert_eq!(e.status(), Status::Integrity);
    assert!(
        e.message().contains("tensor 'w'") && e.message().contains("checksum mismatch"),
        "{e}"
    );
    assert!(views.next().is_none(), "the iterator ends after an error");
    expect_err(recv.end(), Status::Integrity, "checksum");
    assert_eq!(r.completed_version().unwrap(), 0);
    let e = expect_err(
        t.sender.flush(Duration::from_millis(200)),
        Status::Peer,
        "WSYNC_ERR_INTEGRITY",
    );
    assert_eq!(e.failures()[0].status, Status::Integrity);
}

#[test]
fn a_request_changed_in_transit_is_refused_by_its_seal() {
    let mut t = trainer(&options(1));
    let mut r = receiver(&t.init, 0);
    let w: Vec<u64> = (0..64).collect();
    let mut req = t
        .sender
        .send_chunk(&[TensorRef::new("w", &w, &[64]).unwrap()], true)
        .unwrap();
    corrupt_first_checksum(&mut req);
    expect_err(r.receive(&req), Status::Integrity, "seal");
}

#[test]
fn verify_false_skips_checksums() {
    let mut t = trainer(&options(2));
    let mut r = receiver_with(&t.init, 0, r#"{"verify": false}"#);
    let w: Vec<u64> = (0..64).map(|i| 0x5753_594e_4300_0000 + i).collect();
    let req = send(&mut t.sender, "w", &w, true);
    corrupt_segment(&t.init, &w);
    let mut recv = r.receive(&req).unwrap();
    let got = recv.views().next().unwrap().unwrap();
    let got = got.to_vec::<u64>().unwrap();
    assert_eq!(
        got[0],
        w[0] ^ 0xff,
        "the corrupted byte is delivered unverified"
    );
    assert_eq!(&got[1..], &w[1..]);
    recv.end().unwrap();
    drop(r);
}

/// Flips the lowest byte of `w[0]` where the sender packed `w` into the shm segment (the
/// segment's name must still exist: some receiver not attached yet).
fn corrupt_segment(init: &[u8], w: &[u64]) {
    use std::os::unix::fs::FileExt;
    let text = describe(init).unwrap();
    let at = text.find("\"segment\"").expect("an shm init info");
    let rest = &text[at + 9..];
    let name = rest[rest.find('"').unwrap() + 1..]
        .split('"')
        .next()
        .unwrap();
    let file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(format!("/dev/shm{name}"))
        .expect("the segment");
    let mut bytes = Vec::new();
    std::io::Read::read_to_end(&mut &file, &mut bytes).unwrap();
    let needle: Vec<u8> = w.iter().take(4).flat_map(|v| v.to_le_bytes()).collect();
    let pos = bytes
        .windows(needle.len())
        .position(|x| x == needle.as_slice())
        .expect("the tensor's bytes in the segment");
    file.write_at(&[bytes[pos] ^ 0xff], pos as u64).unwrap();
}

/// Flips one bit of the first checksum a request carries (found through `describe`).
fn corrupt_first_checksum(req: &mut [u8]) {
    let text = describe(req).unwrap();
    // shm requests carry tree hashes ("tree"); a table of XXH3-64s says "xxh3".
    let at = text
        .find("\"tree\"")
        .or_else(|| text.find("\"xxh3\""))
        .expect("the request carries checksums");
    let list = &text[at + text[at..].find('[').expect("a list of checksums") + 1..];
    let digits: String = list
        .trim_start()
        .chars()
        .take_while(char::is_ascii_digit)
        .collect();
    let sum: u64 = digits.parse().expect("a checksum");
    // CBOR's shortest encoding of an unsigned integer: a head byte, then big-endian bytes.
    let needle: Vec<u8> = match sum {
        0..=0x17 => vec![u8::try_from(sum).unwrap()],
        0x18..=0xff => vec![0x18, u8::try_from(sum).unwrap()],
        0x100..=0xffff => [&[0x19][..], &u16::try_from(sum).unwrap().to_be_bytes()].concat(),
        0x1_0000..=0xffff_ffff => {
            [&[0x1a][..], &u32::try_from(sum).unwrap().to_be_bytes()].concat()
        }
        _ => [&[0x1b][..], &sum.to_be_bytes()].concat(),
    };
    assert!(
        needle.len() >= 5,
        "checksum {sum} too small to find unambiguously"
    );
    let pos = req
        .windows(needle.len())
        .position(|w| w == needle.as_slice())
        .expect("checksum bytes in the request");
    req[pos + needle.len() - 1] ^= 1;
}

// --- tensors the library refuses ---------------------------------------------------------------

#[test]
fn bad_tensors_are_refused_by_name_and_nothing_is_published() {
    let mut t = trainer(&options(1));
    let mut r = receiver(&t.init, 0);
    let w = [1.0f32; 8];
    let ok = TensorRef::new("ok", &w, &[8]).unwrap();
    // Zero elements: the slice matches the shape (0 == 0), so the library decides.
    let empty: [f32; 0] = [];
    let zero = TensorRef::new("zero", &empty, &[0, 4]).unwrap();
    expect_err(
        t.sender.send_chunk([&ok, &zero], true),
        Status::InvalidArgument,
        "tensor 1 ('zero')",
    );
    expect_err(
        t.sender.send_chunk([&ok, &ok], true),
        Status::InvalidArgument,
        "duplicate name",
    );
    let long = "x".repeat(1025);
    let long_t = TensorRef::new(&long, &w, &[8]).unwrap();
    expect_err(
        t.sender.send_chunk([&long_t], true),
        Status::InvalidArgument,
        "longer than 1024",
    );
    let unnamed = TensorRef::new("", &w, &[8]).unwrap();
    expect_err(
        t.sender.send_chunk([&unnamed], true),
        Status::InvalidArgument,
        "name is empty",
    );
    let many_dims = TensorRef::new("w", &w[..1], &[1; 17]).unwrap();
    expect_err(
        t.sender.send_chunk([&many_dims], true),
        Status::InvalidArgument,
        "ndim 17",
    );
    let opaque = TensorRef::from_bytes("h", &[0u8; 8], &[1], DType::new(3, 64, 1)).unwrap();
    expect_err(
        t.sender.send_chunk([&opaque], true),
        Status::InvalidArgument,
        "unsupported dtype",
    );
    expect_err(
        t.sender.send_chunk(std::iter::empty(), false),
        Status::InvalidArgument,
        "chunk has no tensors",
    );
    // Empty and last is a commit (0.2): with no chunk in the version there is nothing to commit.
    expect_err(
        t.sender.send_chunk(std::iter::empty(), true),
        Status::WrongState,
        "nothing to commit",
    );
    let big = vec![0u8; 65 << 10];
    let too_big = TensorRef::new("big", &big, &[65 << 10]).unwrap();
    expect_err(
        t.sender.send_chunk([&too_big], true),
        Status::InvalidArgument,
        "does not fit in one bucket",
    );
    // SAFETY: `w` is valid host memory for the call; the shm strategy refuses the device tag
    // before it reads a byte.
    let on_gpu = unsafe {
        TensorRef::from_raw_parts("g", w.as_ptr().cast(), &[8], DType::F32, Device::cuda(0))
    }
    .unwrap();
    expect_err(
        t.sender.send_chunk([&on_gpu], true),
        Status::Unsupported,
        "cuda:0",
    );

    // Nothing was published: the next chunk is still chunk 0 of version 1.
    assert_eq!(t.sender.version().unwrap(), 1);
    let req = t.sender.send_chunk([&ok], true).unwrap();
    let recv = r.receive(&req).unwrap();
    assert_eq!((recv.info().version, recv.info().chunk_index), (1, 0));
    drop(recv);
}

#[test]
fn shape_mismatch_is_refused_before_the_library_sees_the_slice() {
    let w = [0f32; 10];
    expect_err(
        TensorRef::new("w", &w, &[3, 4]),
        Status::InvalidArgument,
        "needs 48 bytes, the slice has 40",
    );
    expect_err(
        TensorRef::with_dtype("w", &w, &[10], DType::F64),
        Status::InvalidArgument,
        "needs 80 bytes",
    );
    expect_err(
        TensorRef::new("a\0b", &w, &[10]),
        Status::InvalidArgument,
        "NUL byte",
    );
}

// --- deadlines ------------------------------------------------------------------------------------

#[test]
fn flush_times_out_naming_receivers_that_never_answered() {
    let mut t = trainer(&options(2));
    let mut r0 = receiver(&t.init, 0);
    let w = [1u8; 8];
    let req = send(&mut t.sender, "w", &w, true);
    let mut recv = r0.receive(&req).unwrap();
    assert_eq!(recv.views().count(), 1);
    recv.end().unwrap();
    let started = Instant::now();
    let e = expect_err(
        t.sender.flush(Duration::from_millis(150)),
        Status::Timeout,
        "receivers [1]",
    );
    assert!(e.message().contains("never attached: [1]"), "{e}");
    assert!(started.elapsed() < Duration::from_secs(3));
    // A zero deadline polls.
    expect_err(
        t.sender.flush(Duration::ZERO),
        Status::Timeout,
        "receivers [1]",
    );
}

#[test]
fn send_blocks_for_a_free_bucket_then_times_out() {
    let opts = Options::new()
        .uint("buckets", 1)
        .uint("bucket_bytes", 4096)
        .uint("timeout_ms", 150);
    let mut t = trainer(&opts);
    let _r = receiver(&t.init, 0); // attached, but never receives
    let w = [1u8; 8];
    let tensor = [TensorRef::new("w", &w, &[8]).unwrap()];
    t.sender.send_chunk(&tensor, true).unwrap();
    let started = Instant::now();
    expect_err(
        t.sender.send_chunk(&tensor, true),
        Status::Timeout,
        "no free bucket",
    );
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(100) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
}

#[test]
fn wait_released_returns_at_once_for_shm_and_refuses_unfinished_versions() {
    let mut t = trainer(&options(1));
    let mut r = receiver(&t.init, 0);
    let w = [1u8; 8];
    let req = send(&mut t.sender, "w", &w, true);
    receive_all(&mut r, &req).unwrap();
    t.sender.flush(SEC).unwrap();
    // shm copied the tensors while sending: nothing of the trainer's is mapped elsewhere.
    t.sender.wait_released(1, Duration::ZERO).unwrap();
    t.sender
        .wait_released(Sender::ALL_VERSIONS, Duration::ZERO)
        .unwrap();
    expect_err(
        t.sender.wait_released(2, SEC),
        Status::InvalidArgument,
        "version 2",
    );
}

#[test]
fn flush_reports_a_receiver_that_detached() {
    let mut t = trainer(&options(1));
    let r = receiver(&t.init, 0);
    let w = [1u8; 8];
    t.sender
        .send_chunk(&[TensorRef::new("w", &w, &[8]).unwrap()], true)
        .unwrap();
    drop(r);
    expect_err(t.sender.flush(SEC), Status::Peer, "detached");
}

// --- planner --------------------------------------------------------------------------------------

fn specs() -> Vec<TensorSpec> {
    let mut v = Vec::new();
    for layer in 0..3 {
        for part in ["q", "k", "v"] {
            v.push(
                TensorSpec::new(
                    &format!("layers.{layer}.attn.{part}.weight"),
                    &[32, 32],
                    DType::F32,
                )
                .unwrap(),
            );
        }
        v.push(
            TensorSpec::new(
                &format!("layers.{layer}.mlp.weight"),
                &[64, 32],
                DType::BF16,
            )
            .unwrap(),
        );
    }
    v
}

#[test]
fn plan_groups_modules_and_covers_every_tensor_once_in_order() {
    let specs = specs();
    let p = Plan::new(&specs, r#"{"chunk_bytes": 12288}"#).unwrap();
    assert!(p.len() >= 3 && !p.is_empty(), "{p:?}");
    let chunks = p.chunks().unwrap();
    let all: Vec<usize> = chunks.iter().flat_map(|c| c.indices().to_vec()).collect();
    assert_eq!(all, (0..specs.len()).collect::<Vec<_>>());
    for c in &chunks {
        let bytes: u64 = c
            .indices()
            .iter()
            .map(|&i| specs[i].byte_size().unwrap())
            .sum();
        assert_eq!(c.bytes(), bytes);
        assert_eq!(c.is_last(), c.index() + 1 == p.len());
        // q, k and v of one layer (one module at depth 2) stay together.
        let names: Vec<&str> = c.indices().iter().map(|&i| specs[i].name()).collect();
        for layer in 0..3 {
            let q = format!("layers.{layer}.attn.q.weight");
            if names.contains(&q.as_str()) {
                assert!(
                    names.contains(&format!("layers.{layer}.attn.v.weight").as_str()),
                    "{names:?}"
                );
            }
        }
    }
    expect_err(p.chunk(p.len()), Status::InvalidArgument, "out of range");
    // Deterministic, and the free function is the same planner.
    let again = plan(&specs, r#"{"chunk_bytes": 12288}"#).unwrap();
    assert_eq!(
        again
            .chunks()
            .unwrap()
            .iter()
            .map(|c| c.indices().to_vec())
            .collect::<Vec<_>>(),
        chunks
            .iter()
            .map(|c| c.indices().to_vec())
            .collect::<Vec<_>>()
    );
}

#[test]
fn plan_refuses_bad_tensors_and_options() {
    let specs = specs();
    expect_err(
        Plan::new(&specs, r#"{"chunk_size": 1}"#),
        Status::InvalidArgument,
        "chunk_size",
    );
    expect_err(
        Plan::new::<TensorSpec>(&[], ""),
        Status::InvalidArgument,
        "no tensors",
    );
    let dup = [specs[0].clone(), specs[0].clone()];
    expect_err(
        Plan::new(&dup, ""),
        Status::InvalidArgument,
        "duplicate name",
    );
    let zero = [TensorSpec::new("z", &[0], DType::F32).unwrap()];
    expect_err(Plan::new(&zero, ""), Status::InvalidArgument, "zero-size");
}

#[test]
fn send_plan_sends_a_whole_version_and_forwards_each_request() {
    let mut t = trainer(&options(1));
    let mut r = receiver(&t.init, 0);
    let data: Vec<Vec<f32>> = (0..8).map(|i| f32s(i, 256)).collect();
    let tensors: Vec<TensorRef> = data
        .iter()
        .enumerate()
        .map(|(i, d)| {
            TensorRef::new(&format!("layers.{}.w{}", i / 2, i % 2), d, &[16, 16]).unwrap()
        })
        .collect();
    let p = Plan::new(&tensors, r#"{"chunk_bytes": 2048}"#).unwrap();
    assert!(
        p.len() > 2,
        "more chunks than buckets exercise back-pressure"
    );
    let mut received = 0;
    let sent = t
        .sender
        .send_plan(&tensors, &p, |req| -> wsync::Result<()> {
            // Receive each request at once, as a controller would forward it.
            let mut recv = r.receive(req)?;
            for view in recv.views() {
                let view = view?;
                let i = tensors
                    .iter()
                    .position(|t| t.name() == view.name())
                    .unwrap();
                assert_eq!(view.to_vec::<f32>()?, data[i]);
                received += 1;
            }
            recv.end()
        })
        .unwrap();
    assert_eq!(sent, p.len());
    assert_eq!(received, tensors.len());
    t.sender.flush(SEC).unwrap();
    assert_eq!(r.completed_version().unwrap(), 1);
    // A plan made for other tensors is refused before anything is sent.
    let e = t
        .sender
        .send_plan(&tensors[..1], &p, |_| Ok::<(), wsync::Error>(()))
        .unwrap_err();
    assert!(e.message().contains("only 1 tensors were given"), "{e}");
}

#[test]
fn shm_accepts_and_ignores_a_callers_cuda_stream() {
    let mut t = trainer(&options(1));
    let mut r = receiver(&t.init, 0);
    let stream = 0x1000usize as *mut std::ffi::c_void;
    // SAFETY: shm never uses the stream (host memory needs no ordering).
    unsafe {
        t.sender.set_stream(stream).unwrap();
        r.set_stream(stream).unwrap();
        r.set_stream(std::ptr::null_mut()).unwrap();
    }
    let w = [3u8; 8];
    let req = send(&mut t.sender, "w", &w, true);
    receive_all(&mut r, &req).unwrap();
    t.sender.flush(SEC).unwrap();
}

#[test]
fn a_plan_passes_through_its_raw_handle_and_back_unchanged() {
    let specs = [
        TensorSpec::new("layers.0.w", &[64], DType::F32).unwrap(),
        TensorSpec::new("layers.1.w", &[64], DType::F32).unwrap(),
    ];
    let p = Plan::new(&specs, r#"{"chunk_bytes": 256, "group_depth": 0}"#).unwrap();
    let before: Vec<Vec<usize>> = p
        .chunks()
        .unwrap()
        .iter()
        .map(|c| c.indices().to_vec())
        .collect();
    let raw = std::ptr::NonNull::new(p.into_raw()).unwrap();
    // SAFETY: `raw` came from into_raw just above and nothing else owns it.
    let back = unsafe { Plan::from_raw(raw) };
    assert_eq!(back.as_raw(), raw.as_ptr());
    assert_eq!(back.len(), before.len());
    let after: Vec<Vec<usize>> = back
        .chunks()
        .unwrap()
        .iter()
        .map(|c| c.indices().to_vec())
        .collect();
    assert_eq!(after, before);
}

// --- builders and iteration info -----------------------------------------------------------------

#[test]
fn plan_with_options_is_plan_new_with_the_builders_json() {
    let specs = specs();
    let opts = Options::new()
        .uint("chunk_bytes", 12288)
        .uint("group_depth", 0);
    let built = Plan::with_options(&specs, &opts).unwrap();
    let text = Plan::new(&specs, &opts.to_json()).unwrap();
    let indices = |p: &Plan| -> Vec<Vec<usize>> {
        p.chunks()
            .unwrap()
            .iter()
            .map(|c| c.indices().to_vec())
            .collect()
    };
    assert_eq!(indices(&built), indices(&text));
    // The options reach the planner: a smaller bound gives more chunks.
    let small = Plan::with_options(&specs, &Options::new().uint("chunk_bytes", 1024)).unwrap();
    assert!(small.len() > built.len(), "{small:?} vs {built:?}");
    expect_err(
        Plan::with_options(&specs, &Options::new().uint("chunk_size", 1)),
        Status::InvalidArgument,
        "chunk_size",
    );
}

#[test]
fn chunk_info_is_readable_while_views_are_held() {
    let mut t = trainer(&options(1));
    let mut r = receiver(&t.init, 0);
    let a = f32s(1, 16);
    let b = f32s(2, 8);
    let request = t
        .sender
        .send_chunk(
            &[
                TensorRef::new("a", &a, &[16]).unwrap(),
                TensorRef::new("b", &b, &[8]).unwrap(),
            ],
            true,
        )
        .unwrap();
    let mut recv = r.receive(&request).unwrap();
    let mut views = recv.views();
    assert_eq!(views.yielded(), 0);
    let first = views.next().unwrap().unwrap();
    // The first view is still held while the iterator answers for the chunk.
    let info = views.info();
    assert_eq!((info.version, info.chunk_index, info.count), (1, 0, 2));
    assert!(info.last);
    assert_eq!(info.bytes, 24 * 4);
    assert_eq!(views.yielded(), 1);
    let second = views.next().unwrap().unwrap();
    assert_eq!(views.yielded(), 2);
    assert!(views.next().is_none());
    assert_eq!(views.info(), info);
    assert_eq!((first.name(), second.name()), ("a", "b"));
    assert_eq!(recv.info(), info);
    recv.end().unwrap();
    t.sender.flush(SEC).unwrap();
}

#[cfg(feature = "half")]
#[test]
fn half_floats_travel_as_their_dtypes_and_read_back_typed() {
    use wsync::half::{Bf16, F16};
    let mut t = trainer(&options(1));
    let mut r = receiver(&t.init, 0);
    let values = [0.5f32, -1.25, 3.0, 65504.0, -0.0, 1e-7];
    let b: Vec<Bf16> = values.iter().copied().map(Bf16::from_f32).collect();
    let h: Vec<F16> = values.iter().copied().map(F16::from_f32).collect();
    let request = t
        .sender
        .send_chunk(
            &[
                TensorRef::new("b", &b, &[2, 3]).unwrap(),
                TensorRef::new("h", &h, &[6]).unwrap(),
            ],
            true,
        )
        .unwrap();
    let mut recv = r.receive(&request).unwrap();
    let views: Vec<_> = recv.views().collect::<wsync::Result<_>>().unwrap();
    assert_eq!(views[0].dtype(), DType::BF16);
    assert_eq!(views[1].dtype(), DType::F16);
    assert_eq!(views[0].to_vec::<Bf16>().unwrap(), b);
    // SAFETY: this process is the trainer, which neither drops the receiver nor sends again
    // while the views live, and no other process has the segment.
    assert_eq!(unsafe { views[1].as_slice::<F16>() }.unwrap(), h.as_slice());
    // The dtype is checked: bfloat16 is not float16.
    expect_err(views[0].to_vec::<F16>(), Status::Mismatch, "bfloat16");
    // The bits are the documented encodings.
    let mut bits = vec![0u16; h.len()];
    views[1].copy_raw_to(&mut bits).unwrap();
    assert_eq!(&bits[..4], &[0x3800, 0xbd00, 0x4200, 0x7bff]);
    drop(views);
    recv.end().unwrap();
    t.sender.flush(SEC).unwrap();
}

#[test]
fn kinds_carry_their_capabilities_as_data() {
    let all = kinds().unwrap();
    let get = |name: &str| all.iter().find(|k| k.name == name).expect(name).capabilities.clone();
    let shm = get("shm");
    assert_eq!(shm.tensor_memory, ["host"]);
    assert_eq!(shm.senders.as_deref(), Some("one"));
    assert_eq!((shm.drop_receiver, shm.reattach, shm.collective), (Some(true), Some(true), Some(false)));
    assert_eq!(shm.delta.as_deref(), Some("host"));
    let nccl = get("nccl_broadcast");
    assert_eq!(nccl.tensor_memory, ["cuda"]);
    assert_eq!((nccl.drop_receiver, nccl.collective, nccl.gpu_per_receiver), (Some(false), Some(true), Some(true)));
    assert_eq!(get("cuda_ipc").senders.as_deref(), Some("many"));
}

#[test]
fn kind_info_runtime_is_the_librarys_runtime_field() {
    let mut raw: *mut std::ffi::c_char = std::ptr::null_mut();
    // SAFETY: `raw` is a valid out-pointer; on success it holds the library's string, which is
    // copied here and freed once with wsync_string_free.
    let text = unsafe {
        assert_eq!(
            wsync::sys::wsync_strategy_kinds(&mut raw),
            wsync::sys::WSYNC_OK
        );
        let text = std::ffi::CStr::from_ptr(raw).to_string_lossy().into_owned();
        wsync::sys::wsync_string_free(raw);
        text
    };
    let all = kinds().unwrap();
    for k in &all {
        // Names and runtimes here hold no characters JSON escapes.
        let field = format!("\"runtime\":\"{}\"", k.runtime);
        assert!(text.contains(&field), "{k:?} not in {text}");
        assert!(k.available || k.runtime.is_empty(), "{k:?}");
    }
    let reported =
        text.matches("\"runtime\":\"").count() - text.matches("\"runtime\":\"\"").count();
    let read = all.iter().filter(|k| !k.runtime.is_empty()).count();
    assert_eq!(read, reported, "{text}");
}

#[test]
fn handles_survive_a_round_trip_through_their_raw_pointers() {
    use std::ptr::NonNull;
    let mut strategy = Strategy::with_options("shm", &options(1)).unwrap();
    let init = strategy.create_init_info().unwrap();
    let raw = NonNull::new(strategy.into_raw()).unwrap();
    // SAFETY: `raw` came from into_raw just above and nothing else owns it.
    let mut strategy = unsafe { Strategy::from_raw(raw) };
    assert_eq!(strategy.as_raw(), raw.as_ptr());
    assert_eq!(strategy.kind().unwrap(), "shm");

    let sender = Sender::new(&mut strategy, &init).unwrap();
    let raw = NonNull::new(sender.into_raw()).unwrap();
    // SAFETY: as above.
    let mut sender = unsafe { Sender::from_raw(raw) };
    assert_eq!(sender.as_raw(), raw.as_ptr());

    let receiver = receiver(&init, 0);
    let raw = NonNull::new(receiver.into_raw()).unwrap();
    // SAFETY: as above; it was made as receiver 0.
    let mut receiver = unsafe { Receiver::from_raw(raw, 0) };
    assert_eq!((receiver.as_raw(), receiver.index()), (raw.as_ptr(), 0));

    // Both still work as the handles they were.
    let request = send(&mut sender, "w", &[1.5f32, 2.5], true);
    let got = receive_all(&mut receiver, &request).unwrap();
    assert_eq!(got.views, 1);
    sender.flush(SEC).unwrap();
    assert_eq!(receiver.completed_version().unwrap(), 1);
}

// --- the sender's arena ---------------------------------------------------------------------------

#[test]
fn arena_tensors_are_sent_in_place_and_arrive_bit_for_bit() {
    let none = trainer(&options(1));
    assert!(none.sender.arena().unwrap().is_none());
    let mut t = trainer(&options(1).uint("arena_bytes", 5000));
    let (base, len) = t.sender.arena().unwrap().expect("an arena");
    assert_eq!(len, 8192, "rounded up to whole pages");
    let mut r = receiver(&t.init, 0);
    for v in 1..=2u8 {
        // SAFETY: the arena is `len` bytes of this process's memory, mapped while the sender
        // lives, and nothing else writes it (the last version was flushed).
        let arena = unsafe { std::slice::from_raw_parts_mut(base.as_ptr(), len) };
        for (i, b) in arena[..1024].iter_mut().enumerate() {
            *b = u8::try_from(i % 251).unwrap() ^ v;
        }
        // SAFETY: 1024 initialised bytes in the arena, not written until the flush below.
        let w = unsafe {
            TensorRef::from_raw_parts("w", base.as_ptr().cast(), &[256], DType::F32, Device::CPU)
        }
        .unwrap();
        let request = t.sender.send_chunk([&w], true).unwrap();
        let text = describe(&request).unwrap();
        assert!(
            text.replace([' ', '\n'], "").contains("\"arena\":[0]"),
            "{text}"
        );
        let mut recv = r.receive(&request).unwrap();
        let view = recv.next_view().expect("one tensor").unwrap();
        let mut got = vec![0u8; 1024];
        view.copy_bytes_to(&mut got).unwrap();
        assert_eq!(got, &arena[..1024]);
        recv.end().unwrap();
        t.sender.flush(SEC).unwrap();
    }
    drop(none);
}
