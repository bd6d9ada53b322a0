//! Destination tables and `Recv::apply` (`wsync_dest_table_create` / `wsync_recv_apply`, 0.6)
//! against the real library over shm, in one process, mirroring `tests/test_apply.c`: a chunk
//! loaded into declared host destinations by one call, bit for bit; every refusal named, made
//! before any byte moves and leaving the iteration usable.

#[allow(dead_code)]
mod support;

use support::{options, receiver, Trainer, SEC};
use wsync::{ApplyFlags, DType, Dest, DestTable, Receiver, Sender, Status, TensorRef};

/// The trainer's model: float32 "q" [4, 8], "k" [2, 8], "v" [2, 8], "emb" [16, 8].
const NAMES: [&str; 4] = ["q", "k", "v", "emb"];
const SHAPES: [[i64; 2]; 4] = [[4, 8], [2, 8], [2, 8], [16, 8]];
const Q: usize = 0;
const K: usize = 1;
const V: usize = 2;
const EMB: usize = 3;

/// Elements of tensor `t`.
fn elements(t: usize) -> usize {
    SHAPES[t]
        .iter()
        .map(|&e| usize::try_from(e).unwrap())
        .product()
}

/// Tensor `t`'s values at `version`: finite floats of varied bit patterns (compared as bits).
fn values(version: u64, t: usize) -> Vec<f32> {
    (0..elements(t) as u64)
        .map(|i| {
            let mut h = version
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .wrapping_add((t as u64) << 32 | i);
            h ^= h >> 29;
            h = h.wrapping_mul(0xBF58_476D_1CE4_E5B9);
            h ^= h >> 32;
            f32::from_bits(u32::try_from(h % 0x7F00_0000).unwrap())
        })
        .collect()
}

fn bits(v: &[f32]) -> Vec<u32> {
    v.iter().map(|x| x.to_bits()).collect()
}

/// The bits of a guard element around each destination.
const GUARD: u32 = 0xA5A5_A5A5;
/// Guard elements before, between and after destinations.
const G: usize = 8;

fn guarded(n: usize) -> Vec<f32> {
    vec![f32::from_bits(GUARD); n]
}

fn untouched(v: &[f32]) -> bool {
    v.iter().all(|x| x.to_bits() == GUARD)
}

/// Two receivers' worth of buckets; four of them so a version's chunks never wait.
fn trainer(receivers: u64) -> Trainer {
    support::trainer(&options(receivers).uint("buckets", 4))
}

/// Sends the tensors listed in `which` at `version` as one chunk; returns the request.
fn send(sender: &mut Sender, which: &[usize], version: u64, last: bool) -> Vec<u8> {
    let data: Vec<Vec<f32>> = which.iter().map(|&t| values(version, t)).collect();
    let refs: Vec<TensorRef<'_>> = which
        .iter()
        .zip(&data)
        .map(|(&t, d)| TensorRef::new(NAMES[t], d, &SHAPES[t]).unwrap())
        .collect();
    sender.send_chunk(&refs, last).expect("send")
}

const ALL: [usize; 4] = [Q, K, V, EMB];

/// The engine's memory, with guard elements around every destination:
/// - `qkv`: q, k and v fused into one [8, 8] parameter (q rows 0-3, k 4-5, v 6-7);
/// - `embs`: the embedding kept twice (a tied name with two destinations): whole, and rows
///   8-15 only, a byte range of the wire tensor (a shard, `src_offset`/`bytes`).
struct Engine {
    qkv: Vec<f32>,
    embs: Vec<f32>,
}

/// Where rows 8-15 of "emb" start in bytes, and how many bytes they are.
const EMB_SHARD: (u64, u64) = (8 * 8 * 4, 8 * 8 * 4);
const EMB_SHARD_ELEMENTS: usize = 8 * 8;

impl Engine {
    fn new() -> Engine {
        Engine {
            qkv: guarded(G + 64 + G),
            embs: guarded(G + 128 + G + EMB_SHARD_ELEMENTS + G),
        }
    }

    /// The five destinations over this memory, borrowing it for the table's life.
    fn dests(&mut self) -> Vec<Dest<'_>> {
        let (_, rest) = self.qkv.split_at_mut(G);
        let (q, rest) = rest.split_at_mut(32);
        let (k, rest) = rest.split_at_mut(16);
        let (v, _) = rest.split_at_mut(16);
        let (_, rest) = self.embs.split_at_mut(G);
        let (emb, rest) = rest.split_at_mut(128);
        let (_, rest) = rest.split_at_mut(G);
        let (shard, _) = rest.split_at_mut(EMB_SHARD_ELEMENTS);
        vec![
            Dest::new("q", q, &SHAPES[Q]).unwrap(),
            Dest::new("k", k, &SHAPES[K]).unwrap(),
            Dest::new("v", v, &SHAPES[V]).unwrap(),
            Dest::new("emb", emb, &SHAPES[EMB]).unwrap(),
            Dest::new("emb", shard, &SHAPES[EMB])
                .unwrap()
                .range(EMB_SHARD.0, EMB_SHARD.1),
        ]
    }

    fn table(&mut self, r: &mut Receiver) -> DestTable<'_> {
        DestTable::new(r, self.dests()).expect("table")
    }

    fn q(&self) -> &[f32] {
        &self.qkv[G..G + 32]
    }
    fn k(&self) -> &[f32] {
        &self.qkv[G + 32..G + 48]
    }
    fn v(&self) -> &[f32] {
        &self.qkv[G + 48..G + 64]
    }
    fn emb(&self) -> &[f32] {
        &self.embs[G..G + 128]
    }
    fn emb_shard(&self) -> &[f32] {
        &self.embs[G + 128 + G..G + 128 + G + EMB_SHARD_ELEMENTS]
    }
    fn guards_intact(&self) -> bool {
        untouched(&self.qkv[..G])
            && untouched(&self.qkv[G + 64..])
            && untouched(&self.embs[..G])
            && untouched(&self.embs[G + 128..G + 128 + G])
            && untouched(&self.embs[G + 128 + G + EMB_SHARD_ELEMENTS..])
    }
    fn all_untouched(&self) -> bool {
        untouched(&self.qkv) && untouched(&self.embs)
    }

    /// Whether every destination holds `version`'s bytes, bit for bit, and no guard moved.
    fn holds(&self, version: u64) -> bool {
        let emb = values(version, EMB);
        bits(self.q()) == bits(&values(version, Q))
            && bits(self.k()) == bits(&values(version, K))
            && bits(self.v()) == bits(&values(version, V))
            && bits(self.emb()) == bits(&emb)
            && bits(self.emb_shard()) == bits(&emb[64..])
            && self.guards_intact()
    }
}

#[test]
fn a_chunk_loads_into_fused_tied_and_ranged_host_destinations_bit_for_bit() {
    let mut t = trainer(1);
    let mut r = receiver(&t.init, 0);
    let mut engine = Engine::new();
    for version in 1..=3 {
        // Host memory is read between versions: a table per version, dropped to read it.
        let table = engine.table(&mut r);
        assert_eq!(table.dest_count(), 5);
        let req = send(&mut t.sender, &ALL, version, true);
        let mut recv = r.receive(&req).unwrap();
        let done = recv.apply(&table, ApplyFlags::COMPLETE).unwrap();
        assert_eq!(done.tensors, 4);
        assert_eq!(done.writes, 5, "emb is written twice");
        assert_eq!(done.unmatched, 0);
        assert_eq!(done.launches, 0, "host memory: the copy loop, no kernel");
        assert_eq!(done.bytes, (32 + 16 + 16 + 128 + 64) * 4);
        assert_eq!(
            recv.views().count(),
            0,
            "applied entries are taken: no view is left"
        );
        recv.end().unwrap();
        drop(table);
        assert!(
            engine.holds(version),
            "version {version}: the engine's memory differs"
        );
        t.sender.flush(SEC).unwrap();
        assert_eq!(r.completed_version().unwrap(), version);
    }
}

#[test]
// r, t, q, k, v: receiver, trainer and attention tensors, as the other tests name them.
#[allow(clippy::many_single_char_names)]
fn a_mismatched_shape_is_refused_by_name_nothing_moves_and_the_iteration_goes_on() {
    let mut t = trainer(1);
    let mut r = receiver(&t.init, 0);
    let mut engine = Engine::new();
    let req = send(&mut t.sender, &ALL, 1, true);
    {
        let (q, rest) = engine.qkv.split_at_mut(32);
        let (k, rest) = rest.split_at_mut(16);
        let (v, _) = rest.split_at_mut(16);
        let (emb, _) = engine.embs.split_at_mut(128);
        let table = DestTable::new(
            &mut r,
            [
                Dest::new("q", q, &SHAPES[Q]).unwrap(),
                // k declared [4, 8], taking rows 0-1 of it: the chunk's k is [2, 8].
                Dest::new("k", k, &[4, 8]).unwrap().range(0, 64),
                // v declared bfloat16 [2, 16]: the same bytes, another dtype.
                Dest::with_dtype("v", v, &[2, 16], DType::BF16).unwrap(),
                Dest::new("emb", emb, &SHAPES[EMB]).unwrap(),
            ],
        )
        .expect("the table itself is well-formed");
        let mut recv = r.receive(&req).unwrap();
        let err = recv.apply(&table, ApplyFlags::NONE).unwrap_err();
        assert_eq!(err.status(), Status::Mismatch, "{err}");
        assert!(err.message().contains("'k'"), "{err}");
        assert!(err.message().contains("[2, 8]"), "{err}");
        assert!(err.message().contains("[4, 8]"), "{err}");
        drop(table);
        // The iteration is as it was: the loader takes the chunk another way.
        let mut scratch = vec![0f32; 128];
        for tensor in ALL {
            let n = elements(tensor);
            recv.copy_tensor_into(tensor, &mut scratch[..n]).unwrap();
            assert_eq!(
                bits(&scratch[..n]),
                bits(&values(1, tensor)),
                "{}",
                NAMES[tensor]
            );
        }
        recv.end().unwrap();
    }
    assert!(engine.all_untouched(), "a refused apply moved bytes");
    t.sender.flush(SEC).unwrap();
    assert_eq!(r.completed_version().unwrap(), 1);
}

#[test]
fn partial_leaves_tensors_without_a_destination_for_views() {
    let mut t = trainer(1);
    let mut r = receiver(&t.init, 0);
    // Memory the test reads while the table lives: declared with the raw constructor.
    let mut qkv = guarded(64);
    let base = qkv.as_mut_ptr();
    let raw = |offset: usize, t: usize| {
        // SAFETY: `qkv` outlives the table and is not touched through a reference while the
        // table lives (only read through `base` between applies, none running); the three
        // ranges [0, 32), [32, 48), [48, 64) are inside it and disjoint.
        unsafe { Dest::from_raw_parts(NAMES[t], base.add(offset).cast(), &SHAPES[t], DType::F32) }
            .unwrap()
    };
    let table = DestTable::new(&mut r, [raw(0, Q), raw(32, K), raw(48, V)]).unwrap();
    // SAFETY: `base` points at the 64 floats of `qkv`; no apply runs while this reads them.
    let read = || unsafe { std::slice::from_raw_parts(base, 64) }.to_vec();
    let req = send(&mut t.sender, &ALL, 1, true);
    let mut recv = r.receive(&req).unwrap();

    let e = recv.apply(&table, ApplyFlags::NONE).unwrap_err();
    assert_eq!(e.status(), Status::Mismatch, "{e}");
    assert!(e.message().contains("'emb'"), "{e}");
    assert!(e.message().contains("has no destination"), "{e}");
    assert!(untouched(&read()), "the refusal moved bytes");

    let done = recv.apply(&table, ApplyFlags::PARTIAL).unwrap();
    assert_eq!((done.tensors, done.writes, done.unmatched), (3, 3, 1));
    assert_eq!(done.bytes, 64 * 4);
    let got = read();
    assert_eq!(bits(&got[..32]), bits(&values(1, Q)));
    assert_eq!(bits(&got[32..48]), bits(&values(1, K)));
    assert_eq!(bits(&got[48..]), bits(&values(1, V)));

    // The one left comes as the only view, bit for bit; then the chunk ends complete.
    let views: Vec<_> = recv.views().collect::<wsync::Result<_>>().unwrap();
    assert_eq!(views.len(), 1);
    assert_eq!(views[0].name(), "emb");
    assert_eq!(
        bits(&views[0].to_vec::<f32>().unwrap()),
        bits(&values(1, EMB))
    );
    drop(views);
    recv.end().unwrap();
    drop(table);
    t.sender.flush(SEC).unwrap();
    assert_eq!(r.completed_version().unwrap(), 1);
}

#[test]
fn complete_refuses_a_version_that_misses_a_destination_and_it_never_commits() {
    let mut t = trainer(1);
    let mut r = receiver(&t.init, 0);
    let mut engine = Engine::new();
    {
        let table = engine.table(&mut r);
        // Version 1: q, k in chunk 0; v, emb in chunk 1. Complete.
        for (which, last) in [(&[Q, K][..], false), (&[V, EMB][..], true)] {
            let req = send(&mut t.sender, which, 1, last);
            let mut recv = r.receive(&req).unwrap();
            recv.apply(&table, ApplyFlags::COMPLETE).unwrap();
            recv.end().unwrap();
        }
    }
    assert!(engine.holds(1));
    t.sender.flush(SEC).unwrap();
    assert_eq!(r.completed_version().unwrap(), 1);
    {
        let table = engine.table(&mut r);
        // Version 2 sends q, k, then only v: emb (both of its destinations) never comes.
        let req = send(&mut t.sender, &[Q, K], 2, false);
        let mut recv = r.receive(&req).unwrap();
        recv.apply(&table, ApplyFlags::COMPLETE).unwrap();
        recv.end().unwrap();
        let req = send(&mut t.sender, &[V], 2, true);
        let mut recv = r.receive(&req).unwrap();
        let e = recv.apply(&table, ApplyFlags::COMPLETE).unwrap_err();
        assert_eq!(e.status(), Status::Mismatch, "{e}");
        assert!(
            e.message()
                .contains("2 destination(s) of the table were not written by it: 'emb', 'emb'"),
            "{e}"
        );
        assert!(e.message().contains("version 2"), "{e}");
        recv.fail(Status::Mismatch, e.message()).unwrap();
    }
    // v was not written: still version 1's (q and k are version 2's, applied before).
    assert_eq!(bits(engine.v()), bits(&values(1, V)));
    assert_eq!(bits(engine.q()), bits(&values(2, Q)));
    assert!(engine.guards_intact());
    let e = t
        .sender
        .flush(SEC)
        .expect_err("the engine failed version 2");
    assert_eq!(e.status(), Status::Peer, "{e}");
    assert!(e.message().contains("were not written by it"), "{e}");
    assert_eq!(r.completed_version().unwrap(), 1);
}

/// Asserts `result` is `InvalidArgument` with `needle` in its message.
fn invalid(result: wsync::Result<DestTable<'_>>, needle: &str) {
    let e = result.expect_err(needle);
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    assert!(e.message().contains(needle), "{needle}: {e}");
}

#[test]
fn bad_destinations_are_refused_by_name_before_the_table_exists() {
    let t = trainer(1);
    let mut r = receiver(&t.init, 0);
    let mut buf = vec![0f32; 64];
    // The binding's checks: a host slice must be exactly the bytes its range takes, so the
    // library can never write past it.
    invalid(
        DestTable::new(&mut r, [Dest::new("q", &mut buf[..31], &[4, 8]).unwrap()]),
        "destination 0 ('q'): takes 128 bytes of the wire tensor (float32 [4, 8], 128 bytes, \
         from byte 0), the slice has 124",
    );
    {
        let (q, k) = buf.split_at_mut(32);
        invalid(
            DestTable::new(
                &mut r,
                [
                    Dest::new("q", q, &[4, 8]).unwrap(),
                    Dest::new("k", &mut k[..8], &[2, 8]).unwrap().range(64, 0),
                ],
            ),
            "destination 1 ('k'): takes 0 bytes",
        );
    }
    invalid(
        DestTable::new(
            &mut r,
            [Dest::new("q", &mut buf[..4], &[4, 8])
                .unwrap()
                .range(256, 0)],
        ),
        "src_offset 256 is past the tensor's 128 bytes",
    );
    invalid(
        DestTable::new(&mut r, [Dest::new("q", &mut buf[..0], &[4, 8]).unwrap()]),
        "the slice is empty",
    );
    invalid(
        DestTable::new(
            &mut r,
            [Dest::with_dtype("q", &mut buf[..32], &[4, 8], DType::new(2, 12, 1)).unwrap()],
        ),
        "destination 0 ('q'): dtype float12 has no whole-byte element size",
    );
    let e = Dest::new("q\0", &mut buf[..32], &[4, 8]).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    let e = Dest::new("q", &mut buf[..32], &[-4, 8]).unwrap_err();
    assert_eq!(e.status(), Status::InvalidArgument, "{e}");
    // The library's: no destination at all, a range not of whole elements, one name twice over
    // one place, a name too long.
    invalid(DestTable::new(&mut r, Vec::<Dest<'_>>::new()), "n is 0");
    invalid(
        DestTable::new(
            &mut r,
            [Dest::new("q", &mut buf[..2], &[4, 8]).unwrap().range(2, 8)],
        ),
        "whole elements",
    );
    let base = buf.as_mut_ptr();
    // SAFETY: both point inside `buf`, which outlives the (refused) table, and nothing else
    // uses `buf` meanwhile.
    let twice = unsafe {
        [
            Dest::from_raw_parts("q", base.cast(), &[4, 8], DType::F32).unwrap(),
            Dest::from_raw_parts("q", base.add(16).cast(), &[4, 8], DType::F32).unwrap(),
        ]
    };
    invalid(DestTable::new(&mut r, twice), "overlaps");
    let long = "w".repeat(wsync::MAX_NAME_BYTES + 1);
    invalid(
        DestTable::new(&mut r, [Dest::new(&long, &mut buf[..32], &[4, 8]).unwrap()]),
        "DestTable::new",
    );
    assert!(
        buf.iter().all(|x| x.to_bits() == 0),
        "a refused table wrote"
    );
}

#[test]
fn a_table_of_another_receiver_is_refused_and_the_iteration_goes_on() {
    let mut t = trainer(2);
    let mut r0 = receiver(&t.init, 0);
    let mut r1 = receiver(&t.init, 1);
    let mut mine = Engine::new();
    let mut theirs = Engine::new();
    {
        let table0 = mine.table(&mut r0);
        let table1 = theirs.table(&mut r1);
        let req = send(&mut t.sender, &ALL, 1, true);
        let mut recv = r0.receive(&req).unwrap();
        let e = recv.apply(&table1, ApplyFlags::NONE).unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument, "{e}");
        assert!(e.message().contains("another receiver"), "{e}");
        recv.apply(&table0, ApplyFlags::NONE).unwrap();
        recv.end().unwrap();
        let mut recv = r1.receive(&req).unwrap();
        recv.apply(&table1, ApplyFlags::PARTIAL | ApplyFlags::COMPLETE)
            .unwrap();
        recv.end().unwrap();
    }
    assert!(mine.holds(1) && theirs.holds(1));
    t.sender.flush(SEC).unwrap();
}

#[test]
fn apply_flags_combine_as_the_header_bits() {
    assert_eq!(ApplyFlags::NONE.bits(), 0);
    assert_eq!(ApplyFlags::default(), ApplyFlags::NONE);
    assert_eq!(ApplyFlags::PARTIAL.bits(), wsync::sys::WSYNC_APPLY_PARTIAL);
    assert_eq!(
        ApplyFlags::COMPLETE.bits(),
        wsync::sys::WSYNC_APPLY_COMPLETE
    );
    let mut both = ApplyFlags::PARTIAL;
    both |= ApplyFlags::COMPLETE;
    assert_eq!(both, ApplyFlags::PARTIAL | ApplyFlags::COMPLETE);
    assert!(both.contains(ApplyFlags::PARTIAL) && both.contains(ApplyFlags::COMPLETE));
    assert!(!ApplyFlags::PARTIAL.contains(ApplyFlags::COMPLETE));
}

#[test]
fn landing_is_refused_by_name_on_a_kind_that_maps_the_trainers_memory() {
    let t = trainer(1);
    let mut r = receiver(&t.init, 0);
    let mut mine = Engine::new();
    let table = mine.table(&mut r);
    // SAFETY: refused, so nothing lands; `mine` outlives the receiver anyway.
    let e = unsafe { r.land(Some(&table)) }.unwrap_err();
    assert_eq!(e.status(), Status::Unsupported, "{e}");
    assert!(e.message().contains("does not land"), "{e}");
    // SAFETY: stops landing (which never started).
    unsafe { r.land(None) }.unwrap();
}
