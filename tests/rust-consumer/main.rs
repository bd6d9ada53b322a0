//! A program outside libwsync's Cargo workspace that depends on `wsync` by path, as a user's
//! would: one tensor synced to itself over shm, the requests forwarded by a closure that returns
//! `std::io::Result` (so `wsync::Error` must convert into `std::io::Error`).

use std::time::Duration;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let how = std::env::args().nth(1).unwrap_or_default();
    wsync::check_version()?;
    let opts = wsync::Options::new().uint("receivers", 1).uint("bucket_bytes", 1 << 20);
    let mut strategy = wsync::Strategy::with_options("shm", &opts)?;
    let init = strategy.create_init_info()?;
    let mut sender = wsync::Sender::new(&mut strategy, &init)?;
    let mut engine_strategy = wsync::Strategy::new("shm", "")?;
    let mut receiver = wsync::Receiver::new(&mut engine_strategy, &init, 0)?;

    let weights: Vec<f32> = (0..64u8).map(f32::from).collect();
    let tensors = [wsync::TensorRef::new("layers.0.w", &weights, &[8, 8])?];
    let plan = wsync::Plan::new(&tensors, "")?;
    let mut requests = Vec::new();
    let chunks = sender.send_plan(&tensors, &plan, |request| -> std::io::Result<()> {
        requests.push(request.to_vec());
        Ok(())
    })?;
    for request in &requests {
        let mut recv = receiver.receive(request)?;
        let mut got = vec![0f32; weights.len()];
        recv.copy_tensor_into(0, &mut got)?;
        assert_eq!(got, weights);
        recv.end()?;
    }
    sender.flush(Duration::from_secs(10))?;
    assert_eq!(receiver.completed_version()?, 1);
    println!(
        "rust consumer ({how}): {chunks} chunk(s) synced with libwsync {}",
        wsync::version()
    );
    Ok(())
}
