//! Delta patches through the Rust binding: a trainer with `"delta": "on"` sends patches after
//! the first version; the engine takes each with `Recv::patch` (flat indices + values) and
//! applies it itself, bit for bit; a dense entry is refused by name and the iteration goes on.

#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_precision_loss,
    clippy::cast_sign_loss
)]

use std::time::Duration;

use wsync::{Options, PatchIndices, Receiver, Sender, Status, Strategy, TensorRef};

/// A delta "on" trainer and one engine whose strategy has `engine_opts`.
fn sync_with(engine_opts: &Options) -> (Strategy, Sender, Strategy, Receiver) {
    let opts = Options::new()
        .uint("receivers", 1)
        .uint("bucket_bytes", 1 << 20)
        .string("delta", "on")
        .uint("timeout_ms", 5000);
    let mut trainer = Strategy::with_options("shm", &opts).expect("strategy");
    let init = trainer.create_init_info().expect("init info");
    let sender = Sender::new(&mut trainer, &init).expect("sender");
    let mut engine = Strategy::with_options("shm", engine_opts).expect("engine strategy");
    let receiver = Receiver::new(&mut engine, &init, 0).expect("receiver");
    (trainer, sender, engine, receiver)
}

fn sync() -> (Strategy, Sender, Strategy, Receiver) {
    sync_with(&Options::new())
}

#[test]
fn patches_carry_exactly_the_changed_elements_and_dense_entries_are_refused_by_name() {
    let (_t, mut sender, _e, mut receiver) = sync();
    let mut w: Vec<u32> = (0..1000).map(|i| (i as f32).to_bits()).collect();
    let mut engine = vec![0u32; 1000];
    for version in 1u64..=3 {
        let mut changed = Vec::new();
        if version > 1 {
            for &k in &[7usize, 300, 999] {
                let k = k - version as usize;
                w[k] = if k % 2 == 0 {
                    0x8000_0000
                } else {
                    0x7fc0_0000 | version as u32
                };
                changed.push(k);
            }
        }
        let t = [TensorRef::with_dtype("w", &w, &[1000], wsync::DType::F32).unwrap()];
        let request = sender.send_chunk(&t, true).unwrap();
        let mut recv = receiver.receive(&request).unwrap();
        if version == 1 {
            assert!(!recv.is_patch(0).unwrap());
            let err = recv.patch(0).unwrap_err();
            assert_eq!(err.status(), Status::InvalidArgument);
            assert!(err.message().contains("tensor 0 ('w')"), "{err}");
            let mut dst = vec![0u8; 4000];
            recv.copy_into(0, 0, &mut dst).unwrap(); // the iteration went on
            for (k, c) in dst.chunks_exact(4).enumerate() {
                engine[k] = u32::from_le_bytes(c.try_into().unwrap());
            }
        } else {
            assert!(recv.is_patch(0).unwrap());
            let p = recv.patch(0).unwrap();
            assert_eq!(
                (p.name(), p.base_version(), p.elements()),
                ("w", version - 1, 1000)
            );
            let PatchIndices::I32(ix) = p.indices() else {
                panic!("int32 indices expected")
            };
            changed.sort_unstable();
            assert_eq!(ix.iter().map(|&i| i as usize).collect::<Vec<_>>(), changed);
            for (k, &i) in ix.iter().enumerate() {
                let v = &p.values()[4 * k..4 * k + 4];
                engine[i as usize] = u32::from_le_bytes(v.try_into().unwrap());
            }
        }
        recv.end().unwrap();
        sender.flush(Duration::from_secs(5)).unwrap();
        assert_eq!(engine, w, "version {version}");
    }
}

/// With the receiver option `"delta_mirror"` the engine reads every version from views, patched
/// tensors included: the receiver applies each patch onto its own copy and verifies it.
#[test]
fn an_engine_with_a_mirror_reads_patched_tensors_from_views() {
    let (_t, mut sender, _e, mut receiver) =
        sync_with(&Options::new().boolean("delta_mirror", true));
    let mut w: Vec<u32> = (0..4096).map(|i| (i as f32).to_bits()).collect();
    for version in 1u64..=4 {
        if version > 1 {
            for k in (version as usize..4096).step_by(97) {
                w[k] ^= 0x8000_0000; // signs flip, -0.0 included
            }
        }
        let t = [TensorRef::with_dtype("w", &w, &[4096], wsync::DType::F32).unwrap()];
        let request = sender.send_chunk(&t, true).unwrap();
        let mut recv = receiver.receive(&request).unwrap();
        assert_eq!(recv.is_patch(0).unwrap(), version > 1);
        let seen: Vec<u32> = {
            let view = recv
                .next_view()
                .expect("one view")
                .expect("view of the mirror");
            assert!(view.is_read_only());
            view.to_bytes()
                .unwrap()
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes(c.try_into().unwrap()))
                .collect()
        };
        recv.end().unwrap();
        sender.flush(Duration::from_secs(5)).unwrap();
        assert_eq!(seen, w, "version {version}");
    }
}
