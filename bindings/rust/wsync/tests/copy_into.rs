//! `Recv::copy_into` (`wsync_recv_copy`) against the real library, in one process.

use std::time::Duration;

use wsync::{Options, Receiver, Sender, Status, Strategy, TensorRef};

fn sync(checksum: bool) -> (Strategy, Sender, Vec<u8>, Receiver) {
    let opts = Options::new()
        .uint("receivers", 1)
        .uint("bucket_bytes", 1 << 20)
        .uint("timeout_ms", 3000)
        .boolean("checksum", checksum);
    let mut strategy = Strategy::with_options("shm", &opts).expect("strategy");
    let init = strategy.create_init_info().expect("init info");
    let sender = Sender::new(&mut strategy, &init).expect("sender");
    let mut engine = Strategy::new("shm", "").expect("engine strategy");
    let receiver = Receiver::new(&mut engine, &init, 0).expect("receiver");
    (strategy, sender, init, receiver)
}

#[test]
fn copy_into_is_bit_exact_at_any_destination_offset_and_takes_the_tensor() {
    let (_s, mut sender, _init, mut r) = sync(true);
    let a: Vec<u8> = (0..70_001u32).map(|i| (i * 31 % 251) as u8).collect();
    let b = [7u8; 64];
    let chunk = [
        TensorRef::new("a", &a, &[70_001]).unwrap(),
        TensorRef::new("b", &b, &[64]).unwrap(),
    ];
    let req = sender.send_chunk(&chunk, true).unwrap();
    let mut recv = r.receive(&req).unwrap();
    let mut buf = vec![0u8; a.len() + 4096];
    for off in [0usize, 16, 64, 2048] {
        recv.copy_into(0, 0, &mut buf[off..off + a.len()]).unwrap();
        assert_eq!(&buf[off..off + a.len()], a.as_slice());
    }
    let mut part = [0u8; 100];
    recv.copy_into(0, 5000, &mut part).unwrap();
    assert_eq!(&part[..], &a[5000..5100]);
    let names: Vec<String> = recv
        .views()
        .map(|v| v.unwrap().name().to_string())
        .collect();
    assert_eq!(names, ["b"], "the copied tensor is not yielded again");
    recv.end().unwrap();
    sender.flush(Duration::from_secs(5)).unwrap();
    assert_eq!(r.completed_version().unwrap(), 1);
}

#[test]
fn copy_into_out_of_range_is_invalid_argument_and_loses_nothing() {
    let (_s, mut sender, _init, mut r) = sync(false);
    let a = [1u8; 32];
    let req = sender
        .send_chunk(&[TensorRef::new("a", &a, &[32]).unwrap()], true)
        .unwrap();
    let mut recv = r.receive(&req).unwrap();
    let mut dst = [0u8; 64];
    let e = recv.copy_into(1, 0, &mut dst[..1]).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    assert!(e.message().contains("index 1 is out of range"), "{e}");
    let e = recv.copy_into(0, 0, &mut dst[..33]).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    assert!(e.message().contains("'a'"), "{e}");
    recv.copy_into(0, 0, &mut dst[..32]).unwrap();
    assert_eq!(&dst[..32], &a);
    recv.end().unwrap();
}
