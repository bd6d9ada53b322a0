//! What the in-process test files share (each includes it with `mod support;`): a shm trainer
//! (strategy, init info, sender) and its receivers in this process, which the library allows.
//! Buckets are small and deadlines short, so tests stay cheap and a mistake cannot hang.

use std::time::Duration;

use wsync::{Element, Options, Receiver, RecvInfo, Sender, Strategy, TensorRef};

/// The deadline of flushes and waits that are expected to succeed.
pub const SEC: Duration = Duration::from_secs(5);

/// Two 64 KiB buckets and a 3 s send timeout for `receivers` receivers.
pub fn options(receivers: u64) -> Options {
    Options::new()
        .uint("receivers", receivers)
        .uint("buckets", 2)
        .uint("bucket_bytes", 64 << 10)
        .uint("timeout_ms", 3000)
}

/// A trainer: its strategy (kept alive), sender and init info.
pub struct Trainer {
    _strategy: Strategy,
    /// The sender.
    pub sender: Sender,
    /// The init info every receiver needs.
    pub init: Vec<u8>,
}

/// A shm trainer with `opts`.
pub fn trainer(opts: &Options) -> Trainer {
    let mut strategy = Strategy::with_options("shm", opts).expect("strategy");
    let init = strategy.create_init_info().expect("init info");
    let sender = Sender::new(&mut strategy, &init).expect("sender");
    Trainer {
        _strategy: strategy,
        sender,
        init,
    }
}

/// Receiver `index` of the trainer whose init info is `init`, with default engine options.
pub fn receiver(init: &[u8], index: u32) -> Receiver {
    receiver_with(init, index, "")
}

/// Receiver `index`, its engine strategy made with the JSON `options`.
pub fn receiver_with(init: &[u8], index: u32, options: &str) -> Receiver {
    // The engine's strategy may be dropped right away: receivers hold what they need.
    let mut strategy = Strategy::new("shm", options).expect("engine strategy");
    Receiver::new(&mut strategy, init, index).expect("receiver")
}

/// Sends `values` as a chunk of one tensor, `name`, shaped `[values.len()]`; returns the request.
pub fn send<T: Element>(s: &mut Sender, name: &str, values: &[T], last: bool) -> Vec<u8> {
    s.send_chunk(
        &[TensorRef::new(name, values, &[i64::try_from(values.len()).unwrap()]).unwrap()],
        last,
    )
    .expect("send")
}

/// What [`receive_all`] saw: the chunk's info and how many views it took.
pub struct Received {
    /// `Recv::info()` of the chunk.
    pub info: RecvInfo,
    /// Views taken.
    pub views: usize,
}

/// Receives a request, takes every view, and ends the iteration.
pub fn receive_all(r: &mut Receiver, request: &[u8]) -> wsync::Result<Received> {
    let mut recv = r.receive(request)?;
    let info = recv.info();
    let views = recv.views().collect::<wsync::Result<Vec<_>>>()?.len();
    recv.end()?;
    Ok(Received { info, views })
}
