//! Split tensors through the Rust binding: a tensor larger than a chunk is planned as parts
//! (`"split": true`), `Sender::send_plan` sends them with `send_parts`, and an engine fills its
//! buffer part by part with `Recv::copy_into` of the whole tensor, or from views (`View::part`).

// Sizes here are small constants (under 1 MiB) and the byte pattern keeps 8 bits on purpose.
#![allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]

use std::time::Duration;

use wsync::{Options, Part, Plan, Receiver, Sender, Status, Strategy, TensorRef};

const CHUNK: u64 = 64 << 10;

fn sync() -> (Strategy, Sender, Strategy, Receiver) {
    let opts = Options::new()
        .uint("receivers", 1)
        .uint("bucket_bytes", CHUNK)
        .uint("buckets", 2)
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

#[test]
fn a_tensor_larger_than_a_chunk_crosses_in_parts_and_copy_into_fills_it() {
    let (_t, mut sender, _e, mut receiver) = sync();
    let big_len = 3 * CHUNK as usize + 1000; // 4 parts, the last one short
    for version in 1u32..=2 {
        let big = bytes(version, big_len);
        let small = bytes(100 + version, 4096);
        let tensors = [
            TensorRef::new("embed.weight", &big, &[big_len as i64]).unwrap(),
            TensorRef::new("norm.weight", &small, &[4096]).unwrap(),
        ];
        let plan = Plan::with_options(
            &tensors,
            &Options::new()
                .uint("chunk_bytes", CHUNK)
                .boolean("split", true),
        )
        .unwrap();
        let chunks = plan.chunks().unwrap();
        assert!(chunks.len() >= 4, "{plan:?}");
        assert!(chunks.iter().any(wsync::PlanChunk::has_parts));
        let mut got_big = vec![0u8; big_len];
        let mut got_small = vec![0u8; 4096];
        let mut seen_parts = Vec::new();
        let sent = sender
            .send_plan(&tensors, &plan, |req| -> wsync::Result<()> {
                let mut recv = receiver.receive(req)?;
                for i in 0..recv.info().count {
                    let meta = recv.peek(i)?;
                    let part = recv.part(i)?;
                    if meta.name() == "embed.weight" {
                        seen_parts.push(part);
                        // The whole tensor's range: only this part's share is written.
                        recv.copy_into(i, 0, &mut got_big)?;
                    } else {
                        assert_eq!(
                            part,
                            Part {
                                offset: 0,
                                bytes: 4096
                            }
                        );
                        recv.copy_into(i, 0, &mut got_small)?;
                    }
                }
                recv.end()
            })
            .unwrap();
        assert_eq!(sent, chunks.len());
        sender.flush(Duration::from_secs(5)).unwrap();
        assert_eq!(receiver.completed_version().unwrap(), u64::from(version));
        assert_eq!(got_big, big, "version {version}: the split tensor differs");
        assert_eq!(got_small, small);
        // Consecutive parts covering the tensor, each at most a chunk.
        assert_eq!(seen_parts.len(), 4, "{seen_parts:?}");
        let mut at = 0;
        for p in &seen_parts {
            assert_eq!(p.offset, at, "{seen_parts:?}");
            assert!(p.bytes > 0 && p.bytes <= CHUNK, "{seen_parts:?}");
            at += p.bytes;
        }
        assert_eq!(at, big_len as u64);
    }
}

#[test]
fn views_yield_a_part_with_its_range_and_send_parts_checks_its_ranges() {
    let (_t, mut sender, _e, mut receiver) = sync();
    let big = bytes(7, 2 * CHUNK as usize);
    let t = [TensorRef::new("w", &big, &[2 * CHUNK as i64]).unwrap()];
    // One range per tensor, or nothing is sent.
    let e = sender.send_parts(&t, &[], false).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    // A part that does not start at 0 is refused by name before anything is published.
    let e = sender
        .send_parts(
            &t,
            &[Part {
                offset: 4096,
                bytes: 4096,
            }],
            false,
        )
        .unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    assert!(e.message().contains("'w'"), "{e}");
    let first = sender
        .send_parts(
            &t,
            &[Part {
                offset: 0,
                bytes: CHUNK,
            }],
            false,
        )
        .unwrap();
    let mut recv = receiver.receive(&first).unwrap();
    assert_eq!(
        recv.part(0).unwrap(),
        Part {
            offset: 0,
            bytes: CHUNK
        }
    );
    // Rust user trial: `views()` refused a part (UNSUPPORTED, naming wsync_recv_copy and
    // wsync_recv_next_part); it yields it, with the range it holds.
    let view = recv.views().next().unwrap().unwrap();
    assert_eq!(view.name(), "w");
    assert_eq!(view.shape(), &[2 * CHUNK as i64]);
    assert!(view.is_part());
    assert_eq!(
        view.part(),
        Part {
            offset: 0,
            bytes: CHUNK
        }
    );
    assert_eq!(view.to_bytes().unwrap(), &big[..CHUNK as usize]);
    recv.end().unwrap();
}

/// Rust user trial: a Python trainer's `send_model` splits large tensors by default, and an
/// engine that loads from views (the README's way) failed every version with `Unsupported`.
/// `Recv::next_part_view` yields each part as a view of just its bytes, with its range; the
/// engine places them and gets the tensor bit-exact, the whole tensor coming with its full range.
#[test]
fn next_part_view_yields_each_part_as_a_view_of_its_bytes() {
    let (_t, mut sender, _e, mut receiver) = sync();
    let big_len = 2 * CHUNK as usize + 4 * 1000; // 3 parts of f32, the last one short
    let big = bytes(11, big_len);
    let small = bytes(12, 4096);
    let tensors = [
        TensorRef::with_dtype(
            "embed.weight",
            &big,
            &[(big_len / 4) as i64],
            wsync::DType::F32,
        )
        .unwrap(),
        TensorRef::new("norm.weight", &small, &[4096]).unwrap(),
    ];
    let plan = Plan::with_options(
        &tensors,
        &Options::new()
            .uint("chunk_bytes", CHUNK)
            .boolean("split", true),
    )
    .unwrap();
    let mut got_big = vec![0u8; big_len];
    let mut got_small = Vec::new();
    let mut parts = Vec::new();
    sender
        .send_plan(&tensors, &plan, |req| -> wsync::Result<()> {
            let mut recv = receiver.receive(req)?;
            while let Some(item) = recv.next_part_view() {
                let (view, part) = item?;
                assert_eq!(view.byte_len() as u64, part.bytes);
                if view.name() == "embed.weight" {
                    assert_eq!(view.shape(), &[(big_len / 4) as i64]); // the whole tensor's
                    let floats = view.to_vec::<f32>()?; // the part's elements
                    assert_eq!(floats.len() * 4, part.bytes as usize);
                    let at = part.offset as usize;
                    view.copy_bytes_to(&mut got_big[at..at + view.byte_len()])?;
                    parts.push(part);
                } else {
                    assert_eq!(
                        part,
                        Part {
                            offset: 0,
                            bytes: 4096
                        }
                    );
                    got_small.extend_from_slice(&view.to_bytes()?);
                }
            }
            recv.end()
        })
        .unwrap();
    sender.flush(Duration::from_secs(5)).unwrap();
    assert_eq!(receiver.completed_version().unwrap(), 1);
    assert_eq!(got_big, big, "the split tensor differs");
    assert_eq!(got_small, small);
    assert_eq!(parts.len(), 3, "{parts:?}");
    assert_eq!(parts.iter().map(|p| p.bytes).sum::<u64>(), big_len as u64);
}
