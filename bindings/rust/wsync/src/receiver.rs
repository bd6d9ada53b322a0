//! The engine side: a receiver turns request blobs into receive iterations over tensor views.
//! See the crate docs, "Lifetimes of views", for how borrows keep views valid.

use std::ffi::{c_void, CStr};
use std::fmt;
use std::iter::FusedIterator;
use std::marker::PhantomData;
use std::mem::ManuallyDrop;
use std::ptr::NonNull;

use wsync_sys as sys;

use crate::dest::{ApplyFlags, ApplyResult, DestTable};
use crate::error::{check, Error, Result, Status};
use crate::plan::Part;
use crate::strategy::Strategy;
use crate::tensor::{DType, Device, Element};

/// The engine's end of a sync: receiver number `index` of the init info.
///
/// `Send`, not `Sync`. Dropping it detaches it (the sender learns this); an open iteration
/// cannot exist at that point because it borrows the receiver.
#[must_use = "dropping a Receiver detaches it from the sync"]
pub struct Receiver {
    raw: NonNull<sys::wsync_receiver_t>,
    index: u32,
}

// SAFETY: wsync.h: "A handle may move between threads"; calls are serialised by `&mut self`
// and by Receiver not being Sync. An iteration borrows the receiver mutably, so the two are
// always used by the same thread together.
unsafe impl Send for Receiver {}

impl Receiver {
    /// Creates receiver number `index` (0 .. receivers-1 as the init info says). For `"shm"` it
    /// maps the segment and registers this process. An index out of range fails with
    /// [`Status::InvalidArgument`], an index held by a live process with
    /// [`Status::WrongState`], a vanished segment with [`Status::Unavailable`], a blob of
    /// another role or kind with [`Status::Mismatch`], a corrupt one with
    /// [`Status::Malformed`]. Does not block.
    ///
    /// # Errors
    /// [`Status::InvalidArgument`] for `index` out of range; [`Status::WrongState`] when a live
    /// process holds `index`; [`Status::Unavailable`] when the segment is gone;
    /// [`Status::Mismatch`] for init info of another role or kind; [`Status::Malformed`] (or
    /// [`Status::Integrity`]) for a corrupt one. `"nccl_broadcast"`, which joins the group
    /// here: [`Status::Unsupported`] at once, before any NCCL call, for a receiver on the
    /// sender's GPU (NCCL takes one GPU per rank; an engine on the trainer's GPU uses
    /// `"cuda_ipc"`); [`Status::Timeout`] when the group is not complete by `timeout_ms`;
    /// [`Status::Peer`] when NCCL fails the init (invalid usage: another receiver on this GPU,
    /// named as the likely cause); [`Status::Mismatch`] for another NCCL major.minor.
    pub fn new(strategy: &mut Strategy, init: &[u8], index: u32) -> Result<Receiver> {
        let mut out: *mut sys::wsync_receiver_t = std::ptr::null_mut();
        // SAFETY: the strategy is live and used by this thread only (`&mut`); `init` is
        // borrowed for the call with its exact length; `out` is a valid out-pointer.
        check(unsafe {
            sys::wsync_receiver_create(
                strategy.as_mut_ptr(),
                init.as_ptr(),
                init.len(),
                index,
                &mut out,
            )
        })?;
        let raw = NonNull::new(out)
            .ok_or_else(|| Error::new(Status::Internal, "wsync_receiver_create returned NULL"))?;
        Ok(Receiver { raw, index })
    }

    /// The receiver index this receiver was created with.
    #[must_use]
    pub fn index(&self) -> u32 {
        self.index
    }

    /// Starts receiving the chunk `request` describes. The request is fully validated before
    /// any tensor memory is touched: malformed bytes fail with [`Status::Malformed`], another
    /// kind or a stale, replayed or out-of-order chunk with [`Status::Mismatch`]. Chunks must
    /// be received in the order they were sent. Does not block for `"shm"`. For `"ucx"` it
    /// pulls the chunk, up to the receiver's `timeout_ms`; a chunk of more than 4 MiB is pulled
    /// in pieces while the loader reads it (this returns once it is leased, each tensor's
    /// first read waits for its bytes, and [`Recv::end`] for the rest; `wsync.h`).
    ///
    /// The returned [`Recv`] borrows the receiver until it is ended; end it with
    /// [`Recv::end`] to learn whether the chunk was acknowledged as good.
    ///
    /// # Errors
    /// [`Status::Malformed`] or [`Status::Integrity`] for corrupt request bytes;
    /// [`Status::Mismatch`] for a request of another kind or a stale, replayed or out-of-order
    /// chunk; [`Status::Skipped`] for a later chunk of a version that already failed here
    /// ([`Status::Abandoned`] when the sender abandoned it);
    /// [`Status::Peer`] when the sender dropped this receiver; [`Status::Timeout`] for GPU
    /// kinds whose waits run out.
    pub fn receive(&mut self, request: &[u8]) -> Result<Recv<'_>> {
        let mut out: *mut sys::wsync_recv_t = std::ptr::null_mut();
        // SAFETY: the receiver is live and used by this thread only (`&mut self`, and no other
        // iteration can be open because it would hold that borrow); `request` is borrowed for
        // the call; `out` is a valid out-pointer.
        check(unsafe {
            sys::wsync_receiver_receive(
                self.raw.as_ptr(),
                request.as_ptr(),
                request.len(),
                &mut out,
            )
        })?;
        let raw = NonNull::new(out)
            .ok_or_else(|| Error::new(Status::Internal, "wsync_receiver_receive returned NULL"))?;
        let mut info = sys::wsync_recv_info_t::sized();
        // SAFETY: `raw` is the live iteration just created; `info` is a valid out-pointer.
        let status = unsafe { sys::wsync_recv_info(raw.as_ptr(), &mut info) };
        // Build the Recv first so that a failure below still ends the iteration (its Drop).
        let mut recv = Recv {
            raw,
            info: RecvInfo::default(),
            yielded: 0,
            exhausted: false,
            failed_by_library: false,
            _receiver: PhantomData,
        };
        check(status)?;
        recv.info = RecvInfo {
            version: info.version,
            bytes: info.bytes,
            chunk_index: info.chunk_index,
            last: info.flags & sys::WSYNC_CHUNK_LAST != 0,
            count: usize::try_from(info.count).map_err(|_| {
                Error::new(
                    Status::Internal,
                    format!("{} tensors in one chunk", info.count),
                )
            })?,
            version_chunks: info.version_chunks,
            version_tensors: info.version_tensors,
            version_bytes: info.version_bytes,
        };
        Ok(recv)
    }

    /// The CUDA stream (a `CUstream` / `cudaStream_t`) the loader queues its copies out of the
    /// views on: GPU kinds release each chunk after the work queued there, instead of after the
    /// legacy default stream; null restores the legacy default stream. `shm` accepts and
    /// ignores it. Needs `&mut self`, so no iteration is open. Does not block.
    ///
    /// # Safety
    /// `stream` must be null or a CUDA stream of the receiver's GPU and context that stays
    /// valid until the next call of this method or the receiver is dropped.
    ///
    /// # Errors
    /// The library's status if it refuses the call.
    pub unsafe fn set_stream(&mut self, stream: *mut std::ffi::c_void) -> Result<()> {
        // SAFETY: the receiver is live, used by this thread only and has no open iteration
        // (`&mut self`); the stream's validity is the caller's promise.
        check(unsafe { sys::wsync_receiver_set_stream(self.raw.as_ptr(), stream) })
    }

    /// Lands the chunks this receiver pulls straight in the host destinations of `table`
    /// (`wsync_receiver_land`, 0.8), `None` to stop: on `ucx` over its data stream, each tensor
    /// with exactly one destination of its dtype and shape is read from the socket into it and
    /// hashed as it lands, and [`Recv::apply`](crate::Recv::apply) then verifies it without a
    /// copy. Destinations are written while a chunk is pulled, before the apply; a chunk that
    /// fails may leave them partly written (its version does not complete). Needs `&mut self`,
    /// so no iteration is open. Does not block.
    ///
    /// # Safety
    /// The memory of every host destination of `table` must stay allocated and untouched by
    /// anything else while a chunk may land in it: until the next call of this method, or the
    /// receiver is dropped (the table itself may be dropped earlier; the library keeps what it
    /// needs).
    ///
    /// # Errors
    /// [`Status::Unsupported`](crate::Status::Unsupported) for a kind that does not land bytes
    /// (`shm`, `cuda_ipc`, `nccl_broadcast`, `ucx` with `device`);
    /// [`Status::InvalidArgument`](crate::Status::InvalidArgument) for a table of another
    /// receiver.
    pub unsafe fn land(&mut self, table: Option<&crate::DestTable<'_>>) -> Result<()> {
        let raw = table.map_or(std::ptr::null(), crate::DestTable::as_raw);
        // SAFETY: the receiver is live, used by this thread only and has no open iteration
        // (`&mut self`); `raw` is null or a live table; the memory's lifetime is the caller's
        // promise.
        check(unsafe { sys::wsync_receiver_land(self.raw.as_ptr(), raw) })
    }

    /// Brings this receiver's view up to date without a request and says where it stands: a
    /// version the sender abandoned, or a trainer that died, fails the open version here. Call
    /// it when requests stop coming, or after a failed chunk, to decide whether to roll back
    /// (see the crate README, "Rolling back"). Needs `&mut self`, so no iteration can be open
    /// (the library would refuse with [`Status::WrongState`]). Does not block.
    ///
    /// # Errors
    /// Only if the library refuses the call; with `&mut self` no iteration can be open, so
    /// [`Status::WrongState`] is out of reach.
    pub fn poll(&mut self) -> Result<ReceiverState> {
        let mut raw = sys::wsync_receiver_state_t::sized();
        // SAFETY: the receiver is live and used by this thread only (`&mut self`, and no
        // iteration borrows it); `raw` is a valid out-pointer whose struct_size bounds writes.
        check(unsafe { sys::wsync_receiver_poll(self.raw.as_ptr(), &mut raw) })?;
        Ok(ReceiverState {
            completed_version: raw.completed_version,
            open_version: raw.open_version,
            failed_version: raw.failed_version,
            failed_status: Status::from_code(raw.failed_status),
            dropped: raw.flags & sys::WSYNC_RECEIVER_DROPPED != 0,
            sender_gone: raw.flags & sys::WSYNC_RECEIVER_SENDER_GONE != 0,
            orders_loader_work: raw.flags & sys::WSYNC_RECEIVER_ORDERS_LOADER_WORK != 0,
        })
    }

    /// The newest committed version whose every chunk this receiver received, verified and
    /// ended successfully and whose manifest matched (0 if none). A version with a failed,
    /// missing or abandoned chunk never becomes complete, so an engine can keep serving its old
    /// weights.
    ///
    /// # Errors
    /// Only if the library refuses the call (a library bug for a live receiver).
    pub fn completed_version(&self) -> Result<u64> {
        let mut v = 0u64;
        // SAFETY: the receiver is live; Receiver is not Sync and an open iteration would hold
        // `&mut self`, so nothing else uses it now; `v` is a valid out-pointer.
        check(unsafe { sys::wsync_receiver_completed_version(self.raw.as_ptr(), &mut v) })?;
        Ok(v)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        // SAFETY: `self.raw` came from wsync_receiver_create and is destroyed exactly once. No
        // Recv borrows it any more (the borrow checker ensures that; a Recv leaked with
        // mem::forget is ended as failed by the library here).
        unsafe { sys::wsync_receiver_destroy(self.raw.as_ptr()) }
    }
}

impl fmt::Debug for Receiver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Receiver")
            .field("index", &self.index)
            .field("completed_version", &self.completed_version().ok())
            .finish_non_exhaustive()
    }
}

/// Where a receiver stands ([`Receiver::poll`]): the rollback hook.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ReceiverState {
    /// As [`Receiver::completed_version`].
    pub completed_version: u64,
    /// Version begun here and neither committed nor failed, or 0.
    pub open_version: u64,
    /// Newest version begun here that failed or was abandoned, or 0.
    pub failed_version: u64,
    /// Why `failed_version` failed ([`Status::Abandoned`], the loader's status,
    /// [`Status::Integrity`], [`Status::Peer`] when the trainer died); `None` when it is 0.
    pub failed_status: Option<Status>,
    /// The sender dropped this receiver.
    pub dropped: bool,
    /// The trainer's process is gone.
    pub sender_gone: bool,
    /// Chunks are acknowledged only once the loader's work queued on the receiver's stream
    /// before ending them has run (`"cuda_ipc"` with `"synchronize"`): a loader copying on that
    /// stream need not wait for its copies itself.
    pub orders_loader_work: bool,
}

/// What a receive iteration carries; the chunk that commits a version (`last`) also carries
/// the version's manifest, which the library checks when the iteration ends.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct RecvInfo {
    /// Sync version of this chunk.
    pub version: u64,
    /// Payload bytes of all tensors.
    pub bytes: u64,
    /// 0-based position of the chunk within its version.
    pub chunk_index: u32,
    /// Whether this chunk commits the version.
    pub last: bool,
    /// Number of tensors (0 for a commit without data).
    pub count: usize,
    /// With `last`: chunks in the version (manifest), else 0.
    pub version_chunks: u32,
    /// With `last`: tensors in the version, else 0.
    pub version_tensors: u64,
    /// With `last`: payload bytes of the version, else 0.
    pub version_bytes: u64,
}

/// An open receive iteration over one chunk, borrowing its [`Receiver`].
///
/// Iterate with [`Recv::views`] (or `for view in &mut recv`), then call [`Recv::end`], which
/// acknowledges the chunk to the sender and says whether every tensor was taken (yielded as a
/// view or copied with [`Recv::copy_into`]) and verified.
///
/// When loading fails, call [`Recv::fail`] with the loader's status and message, at any point,
/// also after the last view: the sender's flush then reports them as a [`crate::Failure`] and
/// the version is not completed here.
///
/// Only [`Recv::end`] can complete a chunk. Dropping a `Recv` without `end` or `fail` (an early
/// return with `?`, a `break`, a panic) fails it: the chunk is acknowledged as failed with
/// [`Status::WrongState`] ("the receive iteration was dropped without `end()`", or "the loader
/// panicked" during a panic), the sender's flush reports it as a [`crate::Failure`], and the
/// version is not completed here, even when every view had been taken: the loader that
/// returned early may not have loaded the last one.
#[must_use = "a receive iteration must be ended with end() (or fail()); dropping it fails the chunk"]
pub struct Recv<'r> {
    raw: NonNull<sys::wsync_recv_t>,
    info: RecvInfo,
    yielded: usize,
    exhausted: bool,
    /// A call on it failed inside the library (its error is what `end` reports).
    failed_by_library: bool,
    _receiver: PhantomData<&'r mut Receiver>,
}

// SAFETY: the iteration holds the unique borrow of its receiver; moving both to another thread
// together keeps "one thread at a time" for the receiver and everything made from it.
unsafe impl Send for Recv<'_> {}

impl<'r> Recv<'r> {
    /// The chunk's summary (version, bytes, chunk index, last flag, tensor count). While a
    /// [`Views`] iterator borrows the iteration, read it with [`Views::info`].
    #[must_use]
    pub fn info(&self) -> RecvInfo {
        self.info
    }

    /// Number of tensors in the chunk.
    #[must_use]
    pub fn len(&self) -> usize {
        self.info.count
    }

    /// Whether the chunk has no tensors (a commit without data, [`crate::Sender::commit`]).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.info.count == 0
    }

    /// Dry run: describes tensor `i` (0 .. len-1) without touching its bytes, so a loader can
    /// check names, dtypes and shapes before any byte moves. An index out of range fails with
    /// [`Status::InvalidArgument`].
    ///
    /// # Errors
    /// [`Status::InvalidArgument`] for `i` out of range; [`Status::Malformed`] for a name that
    /// is not UTF-8.
    pub fn peek(&self, i: usize) -> Result<Meta<'_>> {
        let mut t = sys::wsync_tensor_t::default();
        // SAFETY: the iteration is live (not ended: ending consumes `self`); Recv is not Sync,
        // so no other thread uses it; `t` is a valid out-pointer.
        check(unsafe { sys::wsync_recv_peek(self.raw.as_ptr(), i, &mut t) })?;
        // SAFETY: the library filled `t` describing tensor `i`; its name and shape stay valid
        // until wsync_recv_end, which cannot happen while the returned Meta borrows `self`.
        unsafe { Meta::from_raw(&t) }
    }

    /// Dry run of every tensor, in chunk order.
    ///
    /// # Errors
    /// As [`Recv::peek`].
    pub fn metas(&self) -> Result<Vec<Meta<'_>>> {
        (0..self.info.count).map(|i| self.peek(i)).collect()
    }

    /// The views, as a standard iterator whose items borrow this iteration (see the module
    /// docs). After an error the iterator ends; [`Recv::end`] then returns that error.
    ///
    /// Parts of split tensors come too (a Python trainer's `send_model` splits tensors larger
    /// than its `chunk_bytes` by default): such a view has the whole tensor's name, dtype and
    /// shape, and [`View::part`] says which of its bytes it holds; a tensor sent whole has
    /// `part().offset == 0` and `byte_len()` its size.
    pub fn views(&mut self) -> Views<'_, 'r> {
        Views { recv: self }
    }

    /// The next view: `None` at the end (or after an error was returned once). Parts of split
    /// tensors included, as for [`Recv::views`].
    pub fn next_view(&mut self) -> Option<Result<View<'_>>> {
        // SAFETY: the View's lifetime is tied to `&mut self`, which keeps the iteration open.
        unsafe { self.next_raw() }
    }

    /// The next view, parts of split tensors included (`wsync_recv_next_part`), with the
    /// range of the whole tensor it carries: `None` at the end (or after an error was returned
    /// once). A part's view keeps the whole tensor's name, dtype and shape, but its bytes
    /// ([`View::byte_len`], [`View::bytes`], [`View::as_slice`]) are only the part's: byte
    /// `part.offset` of the whole tensor onwards, `part.bytes` of them (a multiple of the
    /// element size), so `as_slice::<T>()` gives elements `part.offset / std::mem::size_of::<T>()`
    /// onwards. A whole tensor comes with `Part { offset: 0, bytes: <its size> }`. A Python
    /// trainer's `send_model` splits tensors larger than its `chunk_bytes` by default; this is
    /// [`Recv::next_view`] with [`View::part`] alongside.
    ///
    /// # Errors
    /// As [`Recv::next_view`] (a checksum mismatch names the tensor; a patch is refused).
    pub fn next_part_view(&mut self) -> Option<Result<(View<'_>, Part)>> {
        // SAFETY: the View's lifetime is tied to `&mut self`, which keeps the iteration open.
        unsafe { self.next_raw() }.map(|r| r.map(|v| (v, v.part())))
    }

    /// The bookkeeping after `wsync_recv_next` or `wsync_recv_next_part`: `None` at the end,
    /// `Some(Err)` for a failed call (both end the iteration's views), `Some(Ok)` for a view.
    fn advance(&mut self, status: sys::wsync_status_t, has: bool) -> Option<Result<()>> {
        if let Err(e) = check(status) {
            self.exhausted = true;
            self.failed_by_library = true;
            return Some(Err(e));
        }
        if !has {
            self.exhausted = true;
            return None;
        }
        self.yielded += 1;
        Some(Ok(()))
    }

    /// Yields the next view with a caller-chosen lifetime.
    ///
    /// # Safety
    /// `'v` must not outlive this iteration: the caller must keep the `Recv` from being ended or
    /// dropped while a `View<'v>` exists (a borrow of the `Recv` for `'v` does that).
    unsafe fn next_raw<'v>(&mut self) -> Option<Result<View<'v>>> {
        if self.exhausted {
            return None;
        }
        let mut t = sys::wsync_tensor_t::default();
        let mut p = sys::wsync_part_t::default();
        let mut has = false;
        // SAFETY: the iteration is live (not ended) and used by this thread only (`&mut self`);
        // `t`, `p` and `has` are valid out-pointers. Parts of split tensors come too (a Python
        // trainer's default; user trial: `views()` refused them, naming C functions).
        let status =
            unsafe { sys::wsync_recv_next_part(self.raw.as_ptr(), &mut t, &mut p, &mut has) };
        if let Err(e) = self.advance(status, has)? {
            return Some(Err(e));
        }
        // SAFETY: the library filled `t` with a view whose name and shape stay valid until
        // wsync_recv_end and whose data holds `p.bytes` readable bytes as long; the caller
        // guarantees `'v` ends before that.
        let view = unsafe { View::from_raw(&t) }.and_then(|mut v| {
            let fits = p
                .offset
                .checked_add(p.bytes)
                .is_some_and(|end| end <= v.len as u64);
            let len = usize::try_from(p.bytes)
                .ok()
                .filter(|_| fits)
                .ok_or_else(|| {
                    Error::new(
                        Status::Internal,
                        format!(
                            "tensor '{}': part {} + {} is outside its {} bytes",
                            v.name, p.offset, p.bytes, v.len
                        ),
                    )
                })?;
            v.len = len;
            v.offset = p.offset;
            Ok(v)
        });
        if view.is_err() {
            self.exhausted = true;
        }
        Some(view)
    }

    /// Copies bytes `offset .. offset + dst.len()` of tensor `i` into `dst` with the library's
    /// copy loop (`wsync_recv_copy`: aligned stores whatever `dst`'s alignment, non-temporal for
    /// large copies), verifying the tensor's checksum in the same pass the first time any of it
    /// is taken. The tensor then counts as taken: [`Recv::next_view`] skips it. An empty `dst`
    /// copies nothing and takes nothing.
    ///
    /// # Errors
    /// [`Status::InvalidArgument`] naming an index or range out of bounds (the iteration goes
    /// on); [`Status::Integrity`] naming the tensor on a checksum mismatch (the iteration is
    /// failed and `dst` holds unspecified bytes); [`Status::Unsupported`] for device-memory
    /// strategies; the iteration's own error once it has failed.
    pub fn copy_into(&mut self, i: usize, offset: u64, dst: &mut [u8]) -> Result<()> {
        // SAFETY: the iteration is live and used by this thread only (`&mut self`, so no view
        // borrows it and `dst` cannot alias a view); `dst` is valid for writes of its length
        // for the call, and the library keeps nothing.
        check(unsafe {
            sys::wsync_recv_copy(
                self.raw.as_ptr(),
                i,
                offset,
                dst.as_mut_ptr().cast::<c_void>(),
                dst.len() as u64,
            )
        })
    }

    /// Copies tensor `i` whole into `dst` (`wsync_recv_copy` at offset 0), typed: the tensor's
    /// dtype must be exactly `T::DTYPE` and `dst` must hold exactly its elements (the product
    /// of its shape). The checked form of [`Recv::copy_into`] for loaders that own whole
    /// tensors (a shard loader copies byte ranges with `copy_into`). A split tensor's entries
    /// ([`Recv::part`]) each fill their range of the same `dst`, chunk by chunk.
    ///
    /// # Errors
    /// [`Status::Mismatch`] naming the tensor and both dtypes; [`Status::InvalidArgument`]
    /// naming it and both element counts (the iteration goes on, nothing is taken); otherwise as
    /// [`Recv::copy_into`].
    pub fn copy_tensor_into<T: Element>(&mut self, i: usize, dst: &mut [T]) -> Result<()> {
        let meta = self.peek(i)?;
        if meta.dtype() != T::DTYPE {
            return Err(Error::new(
                Status::Mismatch,
                format!(
                    "tensor '{}' is {}, not {}",
                    meta.name(),
                    meta.dtype(),
                    T::DTYPE
                ),
            ));
        }
        self.copy_tensor_bits_into(i, dst)
    }

    /// As [`Recv::copy_tensor_into`] for any dtype whose elements are `T`'s size: the raw bits
    /// (a `bfloat16` tensor into `&mut [u16]` without the `half` feature, a `float8` one into
    /// `&mut [u8]`).
    ///
    /// # Errors
    /// [`Status::Mismatch`] naming the tensor and its dtype when its elements are not
    /// `size_of::<T>()` bytes; otherwise as [`Recv::copy_tensor_into`].
    pub fn copy_tensor_raw_into<T: Element>(&mut self, i: usize, dst: &mut [T]) -> Result<()> {
        let meta = self.peek(i)?;
        if meta.dtype().size() != Some(std::mem::size_of::<T>()) {
            return Err(Error::new(
                Status::Mismatch,
                format!(
                    "tensor '{}' is {}, whose elements are not {} bytes",
                    meta.name(),
                    meta.dtype(),
                    std::mem::size_of::<T>()
                ),
            ));
        }
        self.copy_tensor_bits_into(i, dst)
    }

    // The length check and copy of copy_tensor_into / copy_tensor_raw_into (dtype checked).
    fn copy_tensor_bits_into<T: Element>(&mut self, i: usize, dst: &mut [T]) -> Result<()> {
        let meta = self.peek(i)?;
        let bytes = meta.byte_len()?;
        if std::mem::size_of_val(dst) != bytes {
            return Err(Error::new(
                Status::InvalidArgument,
                format!(
                    "tensor '{}' has {} elements; the destination holds {}",
                    meta.name(),
                    bytes / std::mem::size_of::<T>(),
                    dst.len()
                ),
            ));
        }
        // SAFETY: T is Element (plain old data), so its bytes may be overwritten with any
        // values; the byte slice covers exactly `dst` for this call.
        let raw = unsafe { std::slice::from_raw_parts_mut(dst.as_mut_ptr().cast::<u8>(), bytes) };
        self.copy_into(i, 0, raw)
    }

    /// Loads the chunk into the destinations of `table` with one call (`wsync_recv_apply`,
    /// libwsync 0.6): every entry whose name has destinations is copied into each of them, as
    /// [`Recv::copy_into`] with the destination's range would (checksum verified in the same
    /// pass; a part of a split tensor writes its share of the range; a patch is applied onto
    /// its one destination), and counts as taken: [`Recv::next_view`] skips it. Entries a view
    /// or a copy took already are not taken again.
    ///
    /// Every entry is checked before any byte moves: a name without a destination (unless
    /// [`ApplyFlags::PARTIAL`], which leaves it for views or copies), a dtype or shape other
    /// than its destination's, and with [`ApplyFlags::COMPLETE`] on the chunk that commits a
    /// version a destination this version never wrote, are refused with the iteration
    /// unchanged: the loader may take the chunk another way, or [`Recv::fail`] it.
    ///
    /// For host memory the copies are done when it returns. The GPU kinds queue one kernel
    /// launch on the loader's stream ([`Receiver::set_stream`]) and return without waiting:
    /// the destinations hold the bytes once that stream ran it, and (with `"synchronize"`) the
    /// chunk is acknowledged only after that, as for a copy into device memory.
    ///
    /// ```no_run
    /// # fn demo(receiver: &mut wsync::Receiver, request: &[u8]) -> wsync::Result<()> {
    /// use wsync::{ApplyFlags, Dest, DestTable};
    /// let mut embed = vec![0f32; 1024 * 64];
    /// let table = DestTable::new(receiver, [Dest::new("embed", &mut embed, &[1024, 64])?])?;
    /// let mut recv = receiver.receive(request)?;
    /// let done = recv.apply(&table, ApplyFlags::COMPLETE)?;
    /// assert_eq!(done.unmatched, 0);
    /// recv.end()?;
    /// drop(table); // ends the borrow of `embed`
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Status::Mismatch`] naming the tensor (or the destinations never written) and the
    /// version, and [`Status::InvalidArgument`] for a table of another receiver, or device
    /// memory freed or remapped since the table was made (naming it): the iteration is then
    /// unchanged. [`Status::Unsupported`] for a patch with several destinations. After the
    /// checks, as [`Recv::copy_into`]: [`Status::Integrity`] naming the tensor fails the
    /// iteration (destinations of the entries before it are written); the iteration's own
    /// error once it has failed; a driver error's status if queuing fails.
    pub fn apply(&mut self, table: &DestTable<'_>, flags: ApplyFlags) -> Result<ApplyResult> {
        let mut out = sys::wsync_apply_result_t::sized();
        // SAFETY: the iteration is live and used by this thread only (`&mut self`, so no view
        // borrows it); the table is live for the call (borrowed, and not Sync), and its memory
        // is borrowed for the table's lifetime: host slices exclusively, each exactly the bytes
        // its range takes (checked when the table was made), so the library writes only inside
        // them; raw destinations are their constructor's contract. `out` is a valid out-pointer
        // whose struct_size bounds the library's writes.
        check(unsafe {
            sys::wsync_recv_apply(self.raw.as_ptr(), table.as_raw(), flags.bits(), &mut out)
        })?;
        Ok(ApplyResult::from_raw(&out))
    }

    /// The range of the whole tensor that entry `i` carries (`wsync_recv_part`): a part of a
    /// split tensor, or `Part { offset: 0, bytes: <the tensor's size> }` for a whole tensor. A
    /// part's [`Meta`] is the whole tensor's (name, dtype, shape); only this range of its bytes
    /// is in this chunk. [`Recv::copy_into`] loads parts transparently: its offset counts bytes
    /// of the whole tensor, so copying every entry whole (offset 0, the tensor's size) into the
    /// same buffer fills a split tensor chunk by chunk. Views carry parts too, each with its
    /// range ([`View::part`]).
    ///
    /// # Errors
    /// [`Status::InvalidArgument`] when `i` is out of range.
    pub fn part(&self, i: usize) -> Result<Part> {
        let mut out = sys::wsync_part_t::default();
        // SAFETY: the iteration is live; `out` is a valid out-pointer; no tensor byte is read.
        check(unsafe { sys::wsync_recv_part(self.raw.as_ptr(), i, &mut out) })?;
        Ok(Part {
            offset: out.offset,
            bytes: out.bytes,
        })
    }

    /// Whether entry `i` crossed as a delta patch (`wsync_recv_peek` flags it
    /// `WSYNC_TENSOR_PATCH`): take it with [`Recv::patch`] or [`Recv::copy_into`] (into memory
    /// holding the previous version), not as a view.
    ///
    /// # Errors
    /// [`Status::InvalidArgument`] for `i` out of range.
    pub fn is_patch(&self, i: usize) -> Result<bool> {
        let mut t = sys::wsync_tensor_t::default();
        // SAFETY: the iteration is live; `t` is a valid out-pointer; no tensor byte is read.
        check(unsafe { sys::wsync_recv_peek(self.raw.as_ptr(), i, &mut t) })?;
        Ok(t.flags & sys::WSYNC_TENSOR_PATCH != 0)
    }

    /// Entry `i`, which crossed as a delta patch, as flat indices and values
    /// (`wsync_recv_patch`, libwsync 0.5), copied out of the iteration at this call (a patch
    /// is the changed elements only, so the copy is small; the bytes lie in memory another
    /// process can write, which a safe `&[T]` must never see change). The library first checks
    /// the base version against this receiver's completed one, the patch bytes' checksum and
    /// the indices' order and range; the entry is then taken ([`Recv::next_view`] skips it) and
    /// applying it is the caller's: writing `values[k]` at flat element `indices[k]` of the
    /// tensor as of [`PatchRef::base_version`] gives this chunk's version. The library cannot
    /// check the result without the tensor ([`PatchRef::result_xxh3`] is for the caller); if the
    /// caller cannot apply it, [`Recv::fail`] the chunk so the version does not complete here.
    /// A write to the bucket between the library's check and the copy (a trainer that stopped
    /// waiting for this engine, or another process) tears the copy: check the applied tensor
    /// against [`PatchRef::result_xxh3`] before serving it.
    ///
    /// # Errors
    /// [`Status::InvalidArgument`] naming a dense entry or an index out of range (the iteration
    /// goes on); [`Status::Mismatch`] naming both versions when the base is not this receiver's
    /// completed version, [`Status::Integrity`] or [`Status::Malformed`] (naming the tensor)
    /// for bad patch bytes: the iteration is then failed.
    pub fn patch(&mut self, i: usize) -> Result<PatchRef<'_>> {
        let mut out = sys::wsync_patch_t::sized();
        // SAFETY: the iteration is live and used by this thread only (`&mut self`); `out` is a
        // valid out-pointer of its declared size.
        check(unsafe { sys::wsync_recv_patch(self.raw.as_ptr(), i, &mut out) })?;
        let meta = self.peek(i)?;
        let count = usize::try_from(out.count)
            .map_err(|_| Error::new(Status::Malformed, "patch count exceeds usize"))?;
        let esize = meta.byte_len()? / usize::try_from(out.elements.max(1)).unwrap_or(usize::MAX);
        let values_len = count.checked_mul(esize).ok_or_else(|| {
            Error::new(Status::Malformed, "patch values exceed the address space")
        })?;
        // SAFETY: the library checked `count` indices of `index_bits` and `count` elements of
        // `esize` bytes at these addresses, aligned as the header says and mapped until the
        // iteration ends, which cannot happen during this call (`&mut self`). Raw copies into
        // the new Vecs' capacity make no reference to the shared bytes (as View::to_vec), and
        // every bit pattern is a valid i32, i64 or u8.
        let (indices, values) = unsafe {
            let indices = if out.index_bits == 32 {
                PatchIndexBuf::I32(copy_out(out.indices.cast::<i32>(), count))
            } else {
                PatchIndexBuf::I64(copy_out(out.indices.cast::<i64>(), count))
            };
            (indices, copy_out(out.values.cast::<u8>(), values_len))
        };
        Ok(PatchRef {
            name: meta.name(),
            shape: meta.shape(),
            dtype: meta.dtype(),
            indices,
            values,
            base_version: out.base_version,
            elements: out.elements,
            base_xxh3: out.base_xxh3,
            result_xxh3: out.result_xxh3,
        })
    }

    /// Ends the iteration and acknowledges the chunk to the sender. `Ok(())` only if every
    /// tensor was taken (yielded, copied with [`Recv::copy_into`] or applied with
    /// [`Recv::apply`]) and verified; an
    /// iteration ended early fails with
    /// [`Status::WrongState`] (the chunk is acknowledged as failed), a failed one with its
    /// error (e.g. [`Status::Integrity`]). The iteration is freed either way.
    ///
    /// # Errors
    /// [`Status::WrongState`] when a tensor was not taken; the iteration's own error
    /// ([`Status::Integrity`], [`Status::Mismatch`] for a manifest that differs,
    /// [`Status::Abandoned`]...) when it failed. Either way the chunk counts as failed.
    pub fn end(self) -> Result<()> {
        let this = ManuallyDrop::new(self);
        // SAFETY: the iteration is live; it is ended exactly once, here, and `this` is never
        // dropped, so Drop does not end it again. No view borrows it (`self` was moved in).
        check(unsafe { sys::wsync_recv_end(this.raw.as_ptr()) })
    }

    /// Ends the iteration with the loader's outcome: `Ok` ends it ([`Recv::end`], whose error
    /// is returned if it fails), `Err(e)` fails it with `e`'s status and message
    /// ([`Recv::fail`]) and returns `e`, so the engine's own error reaches the trainer's flush
    /// (as a [`crate::Failure`]) instead of "dropped without end()":
    ///
    /// ```no_run
    /// # fn load(_: &str, _: u64, _: &[u8]) -> wsync::Result<()> { Ok(()) }
    /// # fn f(receiver: &mut wsync::Receiver, request: &[u8]) -> wsync::Result<()> {
    /// let mut recv = receiver.receive(request)?;
    /// let loaded = (|| -> wsync::Result<()> {
    ///     for view in recv.views() {
    ///         let view = view?;
    ///         load(view.name(), view.part().offset, &view.to_bytes()?)?;
    ///     }
    ///     Ok(())
    /// })();
    /// recv.finish(loaded)?;
    /// # Ok(()) }
    /// ```
    ///
    /// An error the library itself raised for this iteration (a checksum, a trainer that
    /// dropped the receiver) stays the iteration's: the trainer hears that one, and it is
    /// returned.
    ///
    /// # Errors
    /// `result`'s error, converted to [`Error`]; or [`Recv::end`]'s.
    pub fn finish<T, E: Into<Error>>(self, result: std::result::Result<T, E>) -> Result<T> {
        match result {
            Ok(value) => self.end().map(|()| value),
            Err(e) => {
                let e: Error = e.into();
                if self.failed_by_library {
                    // The library failed the chunk already and will acknowledge its own error.
                    return Err(self.end().err().unwrap_or(e));
                }
                let _ = self.fail(e.status(), e.message());
                Err(e)
            }
        }
    }

    /// Fails the iteration at any point, also after its last view (a loader that found a
    /// tensor it cannot load, or failed once every view was taken): the chunk is acknowledged
    /// as failed with `status` and `message`, which reach the sender's flush as its error text
    /// and as a [`crate::Failure`]; the version is not completed here. The message is cut to
    /// 255 bytes (on a character boundary) and NUL bytes in it become spaces. The iteration is
    /// freed either way.
    ///
    /// # Errors
    /// Only if the library refuses the call; the chunk is failed and freed regardless.
    pub fn fail(self, status: Status, message: &str) -> Result<()> {
        let this = ManuallyDrop::new(self);
        let text = fail_message(message);
        // SAFETY: the iteration is live; it is failed (and freed) exactly once, here, and
        // `this` is never dropped. No view borrows it (`self` was moved in). `text` is
        // NUL-terminated and borrowed for the call.
        check(unsafe { sys::wsync_recv_fail(this.raw.as_ptr(), status.code(), text.as_ptr()) })
    }
}

/// `message` as `wsync_recv_fail` takes it: at most 255 bytes cut on a character boundary, no
/// interior NUL.
fn fail_message(message: &str) -> std::ffi::CString {
    let mut end = message.len().min(255);
    while !message.is_char_boundary(end) {
        end -= 1;
    }
    let bytes: Vec<u8> = message.as_bytes()[..end]
        .iter()
        .map(|&b| if b == 0 { b' ' } else { b })
        .collect();
    std::ffi::CString::new(bytes).expect("NUL bytes were replaced")
}

impl Drop for Recv<'_> {
    fn drop(&mut self) {
        // A loader that returned early (`?`), broke out of its loop or panicked did not say it
        // loaded the chunk, even if it had every view: only `end` completes one.
        let why = if std::thread::panicking() {
            c"the loader panicked"
        } else {
            c"the receive iteration was dropped without end() (an early return or break in the loader?)"
        };
        // SAFETY: not ended yet (`end`/`fail` skip Drop); failed and freed exactly once, here;
        // nothing borrows it; the message is a NUL-terminated literal. The status is dropped:
        // the chunk is acknowledged as failed either way, which the sender's flush reports.
        let _ = unsafe {
            sys::wsync_recv_fail(self.raw.as_ptr(), sys::WSYNC_ERR_WRONG_STATE, why.as_ptr())
        };
    }
}

impl fmt::Debug for Recv<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Recv")
            .field("info", &self.info)
            .field("yielded", &self.yielded)
            .finish()
    }
}

/// Iterator over the views of a [`Recv`]; items borrow the iteration for `'it`.
#[must_use = "iterators are lazy: no view is taken until it is iterated"]
pub struct Views<'it, 'r> {
    recv: &'it mut Recv<'r>,
}

impl Views<'_, '_> {
    /// The chunk's summary, as [`Recv::info`], readable while iterating (the iterator holds
    /// the `Recv`'s mutable borrow, so `recv.info()` is out of reach inside a `for` loop).
    #[must_use]
    pub fn info(&self) -> RecvInfo {
        self.recv.info
    }

    /// Number of views yielded so far by this iteration (by any iterator or
    /// [`Recv::next_view`]); tensors copied with [`Recv::copy_into`] are not counted.
    #[must_use]
    pub fn yielded(&self) -> usize {
        self.recv.yielded
    }
}

impl<'it> Iterator for Views<'it, '_> {
    type Item = Result<View<'it>>;

    fn next(&mut self) -> Option<Self::Item> {
        // SAFETY: `self.recv` is borrowed for 'it, so the Recv cannot be ended or dropped while
        // any View<'it> exists.
        unsafe { self.recv.next_raw() }
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        if self.recv.exhausted {
            (0, Some(0))
        } else {
            // An error may end it early (lower bound 0); the upper bound leaves room for one
            // error item in case the library reports one where no view remains.
            (
                0,
                Some(self.recv.info.count.saturating_sub(self.recv.yielded) + 1),
            )
        }
    }
}

impl FusedIterator for Views<'_, '_> {}

// The borrowing iterator is called `views()`, as the crate docs name it; `iter_mut` would be a
// second name for it.
#[allow(clippy::into_iter_without_iter)]
impl<'it, 'r> IntoIterator for &'it mut Recv<'r> {
    type Item = Result<View<'it>>;
    type IntoIter = Views<'it, 'r>;

    fn into_iter(self) -> Views<'it, 'r> {
        self.views()
    }
}

/// Turns a library-owned NUL-terminated name into `&'a str`.
///
/// # Safety
/// `p` must be NULL or point at a NUL-terminated string valid for `'a`.
unsafe fn name_from<'a>(p: *const std::ffi::c_char) -> Result<&'a str> {
    if p.is_null() {
        return Err(Error::new(
            Status::Internal,
            "the library gave a tensor without a name",
        ));
    }
    // SAFETY: the caller guarantees a valid NUL-terminated string for 'a.
    let c: &'a CStr = unsafe { CStr::from_ptr(p) };
    c.to_str().map_err(|_| {
        Error::new(
            Status::Malformed,
            format!(
                "tensor name {:?} in the request is not UTF-8",
                c.to_string_lossy()
            ),
        )
    })
}

/// Turns a library-owned shape into `&'a [i64]`.
///
/// # Safety
/// When `ndim > 0`, `p` must point at `ndim` extents valid for `'a`.
unsafe fn shape_from<'a>(p: *const i64, ndim: i32) -> Result<&'a [i64]> {
    let n = usize::try_from(ndim)
        .map_err(|_| Error::new(Status::Internal, format!("the library gave ndim {ndim}")))?;
    if n == 0 {
        return Ok(&[]);
    }
    if p.is_null() {
        return Err(Error::new(
            Status::Internal,
            "the library gave a NULL shape",
        ));
    }
    // SAFETY: the caller guarantees `n` valid, aligned extents for 'a.
    Ok(unsafe { std::slice::from_raw_parts(p, n) })
}

fn byte_len(name: &str, shape: &[i64], dtype: DType) -> Result<usize> {
    let esize = dtype.size().ok_or_else(|| {
        Error::new(
            Status::Unsupported,
            format!("tensor '{name}': dtype {dtype} has no whole-byte element size"),
        )
    })?;
    shape
        .iter()
        .try_fold(esize, |acc, &e| acc.checked_mul(usize::try_from(e).ok()?))
        .filter(|&n| isize::try_from(n).is_ok())
        .ok_or_else(|| {
            Error::new(
                Status::Malformed,
                format!("tensor '{name}': shape {shape:?} is too large"),
            )
        })
}

// A patch's indices as copied out (PatchRef owns them; PatchIndices borrows them).
#[derive(Debug, Clone)]
enum PatchIndexBuf {
    I32(Vec<i32>),
    I64(Vec<i64>),
}

/// `n` elements copied from `src` into a new Vec.
///
/// # Safety
/// `src` must be valid for reads of `n` elements of `T` (aligned; any bytes, which another
/// process may write meanwhile) and every bit pattern must be a valid `T`.
unsafe fn copy_out<T: Copy>(src: *const T, n: usize) -> Vec<T> {
    let mut out: Vec<T> = Vec::with_capacity(n);
    if n > 0 {
        // SAFETY: forwarded from the caller; the destination is the Vec's capacity of n
        // elements, written through a raw pointer before set_len makes it readable.
        unsafe {
            std::ptr::copy_nonoverlapping(src, out.as_mut_ptr(), n);
            out.set_len(n);
        }
    }
    out
}

/// A patch's flat element indices: `i32` for tensors of at most 2^31 elements, else `i64`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PatchIndices<'it> {
    /// Every index fits in `i32` (vLLM's sparse patches use int32 flat indices).
    I32(&'it [i32]),
    /// A tensor of more than 2^31 elements.
    I64(&'it [i64]),
}

impl PatchIndices<'_> {
    /// Number of indices.
    #[must_use]
    pub fn len(&self) -> usize {
        match self {
            PatchIndices::I32(s) => s.len(),
            PatchIndices::I64(s) => s.len(),
        }
    }

    /// Whether the patch changes nothing.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Index `k` widened to `u64`, or `None` past the end.
    #[must_use]
    #[allow(clippy::cast_sign_loss)] // the library hands out indices >= 0
    pub fn get(&self, k: usize) -> Option<u64> {
        match self {
            PatchIndices::I32(s) => s.get(k).map(|&x| x as u64),
            PatchIndices::I64(s) => s.get(k).map(|&x| x as u64),
        }
    }
}

/// A delta patch of an iteration ([`Recv::patch`]): the changed elements' flat row-major
/// indices (strictly increasing) and their new bytes in the tensor's dtype, copied out of the
/// shared bucket; the name and shape are borrowed from the iteration.
#[derive(Debug, Clone)]
pub struct PatchRef<'it> {
    name: &'it str,
    shape: &'it [i64],
    dtype: DType,
    indices: PatchIndexBuf,
    values: Vec<u8>,
    base_version: u64,
    elements: u64,
    base_xxh3: u64,
    result_xxh3: u64,
}

impl<'it> PatchRef<'it> {
    /// The tensor's name.
    #[must_use]
    pub fn name(&self) -> &'it str {
        self.name
    }
    /// The whole tensor's shape.
    #[must_use]
    pub fn shape(&self) -> &'it [i64] {
        self.shape
    }
    /// The tensor's element type.
    #[must_use]
    pub fn dtype(&self) -> DType {
        self.dtype
    }
    /// The changed elements' flat indices.
    #[must_use]
    pub fn indices(&self) -> PatchIndices<'_> {
        match &self.indices {
            PatchIndexBuf::I32(v) => PatchIndices::I32(v),
            PatchIndexBuf::I64(v) => PatchIndices::I64(v),
        }
    }
    /// The changed elements' new bytes, one element after another, in index order.
    #[must_use]
    pub fn values(&self) -> &[u8] {
        &self.values
    }
    /// The version the patch applies to (this receiver's completed version).
    #[must_use]
    pub fn base_version(&self) -> u64 {
        self.base_version
    }
    /// The whole tensor's element count.
    #[must_use]
    pub fn elements(&self) -> u64 {
        self.elements
    }
    /// XXH3-64 (seed 0) of the whole tensor's bytes at the base version.
    #[must_use]
    pub fn base_xxh3(&self) -> u64 {
        self.base_xxh3
    }
    /// XXH3-64 (seed 0) of the whole tensor's bytes once patched: the caller's check.
    #[must_use]
    pub fn result_xxh3(&self) -> u64 {
        self.result_xxh3
    }
}

/// Dry-run description of a tensor in an iteration: no data.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Meta<'a> {
    name: &'a str,
    shape: &'a [i64],
    dtype: DType,
    device: Device,
}

impl<'a> Meta<'a> {
    /// # Safety
    /// `t` must be a descriptor the library filled whose name and shape are valid for `'a`.
    unsafe fn from_raw(t: &sys::wsync_tensor_t) -> Result<Meta<'a>> {
        // SAFETY: forwarded from the caller.
        let name = unsafe { name_from(t.name) }?;
        // SAFETY: forwarded from the caller.
        let shape = unsafe { shape_from(t.shape, t.ndim) }?;
        Ok(Meta {
            name,
            shape,
            dtype: DType::from_raw(t.dtype),
            device: Device::from_raw(t.device),
        })
    }

    /// The tensor's name.
    #[must_use]
    pub fn name(&self) -> &'a str {
        self.name
    }

    /// The extents (empty for a scalar).
    #[must_use]
    pub fn shape(&self) -> &'a [i64] {
        self.shape
    }

    /// The element type.
    #[must_use]
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Where the bytes will be.
    #[must_use]
    pub fn device(&self) -> Device {
        self.device
    }

    /// Size in bytes.
    ///
    /// # Errors
    /// [`Status::Unsupported`] for a dtype without a whole-byte element size;
    /// [`Status::Malformed`] for a shape whose size overflows `isize`.
    pub fn byte_len(&self) -> Result<usize> {
        byte_len(self.name, self.shape, self.dtype)
    }
}

/// A received tensor, borrowing the iteration it came from (`'it`).
///
/// Zero-copy where the strategy allows: for `"shm"` the bytes are read-only shared memory that
/// the sender does not write until the iteration is ended, unless it drops this receiver
/// meanwhile (`Sender::drop_receiver`, e.g. after this engine outlasted the trainer's flush
/// deadline): it then packs later versions into the same bucket, under the view, and the
/// iteration fails with [`Status::Peer`] at its next call. A process with write access to the
/// segment (same user: it is mode 0600) can write it too. So the bytes may change while a view
/// lives, which a Rust reference must never see: the safe way to load a view is to copy it out
/// ([`View::copy_to`], [`View::to_vec`], [`View::copy_bytes_to`]), then call [`Recv::end`],
/// which fails if the bytes could have changed. Borrowing them in place ([`View::bytes`],
/// [`View::as_slice`]) is `unsafe`, with that contract.
#[derive(Clone, Copy)]
pub struct View<'it> {
    name: &'it str,
    shape: &'it [i64],
    dtype: DType,
    device: Device,
    data: *const u8,
    /// The bytes here: the whole tensor's, or a part's.
    len: usize,
    /// Where they start within the whole tensor (0 unless a part).
    offset: u64,
    /// The whole tensor's bytes.
    whole: usize,
    read_only: bool,
    _it: PhantomData<&'it [u8]>,
}

// SAFETY: a View is a read-only window (address, length, name, shape) into memory that the
// library keeps valid and unchanged until the iteration ends, which the `'it` borrow of the Recv
// outlasts; reading shared immutable bytes from several threads is sound (as for `&[u8]`), and
// no View method calls into the library. A device view only hands out its address.
unsafe impl Send for View<'_> {}
// SAFETY: as for Send: every method takes `&self` and only reads.
unsafe impl Sync for View<'_> {}

impl<'it> View<'it> {
    /// # Safety
    /// `t` must be a view the library filled whose data, name and shape are valid for `'it`.
    unsafe fn from_raw(t: &sys::wsync_tensor_t) -> Result<View<'it>> {
        // SAFETY: forwarded from the caller.
        let name = unsafe { name_from(t.name) }?;
        // SAFETY: forwarded from the caller.
        let shape = unsafe { shape_from(t.shape, t.ndim) }?;
        let dtype = DType::from_raw(t.dtype);
        let len = byte_len(name, shape, dtype)?;
        if t.data.is_null() {
            return Err(Error::new(
                Status::Internal,
                format!("tensor '{name}': NULL data"),
            ));
        }
        Ok(View {
            name,
            shape,
            dtype,
            device: Device::from_raw(t.device),
            data: t.data.cast_const().cast(),
            len,
            offset: 0,
            whole: len,
            read_only: t.flags & sys::WSYNC_TENSOR_READ_ONLY != 0,
            _it: PhantomData,
        })
    }

    /// The tensor's name.
    #[must_use]
    pub fn name(&self) -> &'it str {
        self.name
    }

    /// The extents (empty for a scalar).
    #[must_use]
    pub fn shape(&self) -> &'it [i64] {
        self.shape
    }

    /// The element type.
    #[must_use]
    pub fn dtype(&self) -> DType {
        self.dtype
    }

    /// Where the bytes are.
    #[must_use]
    pub fn device(&self) -> Device {
        self.device
    }

    /// Whether the memory must not be written (always true for `"shm"`).
    #[must_use]
    pub fn is_read_only(&self) -> bool {
        self.read_only
    }

    /// Size in bytes of what this view holds: the whole tensor's, or for a part of a split
    /// tensor the part's ([`View::part`]).
    #[must_use]
    pub fn byte_len(&self) -> usize {
        self.len
    }

    /// Which bytes of the whole tensor this view holds: `Part { offset: 0, bytes: <its size> }`
    /// for a tensor sent whole; for a part of a split tensor (a tensor larger than a bucket,
    /// sent over consecutive chunks of one version; a Python trainer's default), bytes
    /// `offset .. offset + bytes` of it, row-major. Load it at that place:
    /// `whole[part.offset as usize..][..view.byte_len()]`.
    #[must_use]
    pub fn part(&self) -> Part {
        Part {
            offset: self.offset,
            bytes: self.len as u64,
        }
    }

    /// Whether this view holds only a part of its tensor ([`View::part`]).
    #[must_use]
    pub fn is_part(&self) -> bool {
        self.len != self.whole
    }

    /// Number of elements of the whole tensor, from its shape (1 for a scalar). For a part
    /// ([`Recv::next_part_view`]) the view's bytes hold fewer: `byte_len() / element size`.
    #[must_use]
    pub fn elements(&self) -> usize {
        // byte_len succeeded, so every extent fits in usize and the product cannot overflow.
        self.shape
            .iter()
            .map(|&e| usize::try_from(e).unwrap_or(0))
            .product()
    }

    /// The first byte, on [`View::device`]: for device memory (e.g. CUDA), to hand to that
    /// device's copy functions. Valid while the view lives.
    #[must_use]
    pub fn data_ptr(&self) -> *const c_void {
        self.data.cast()
    }

    /// The bytes in place, for tensors in host memory; [`Status::Unsupported`] for device memory
    /// (use [`View::data_ptr`] there). Prefer the copies ([`View::copy_bytes_to`],
    /// [`View::copy_to`]), which are safe.
    ///
    /// # Safety
    /// Nothing may write the bytes while the returned slice (or anything derived from it) is
    /// used. The library's own sender does not, unless it drops this receiver while the view
    /// lives (a trainer that stops waiting for this engine: keep the time between `receive` and
    /// `end` well under the trainer's flush deadline, and do not serve anything loaded if `end`
    /// fails); no other process may write the segment (for `"shm"`, any process of the same
    /// user could).
    ///
    /// # Errors
    /// [`Status::Unsupported`] when the tensor is not in host memory.
    pub unsafe fn bytes(&self) -> Result<&'it [u8]> {
        self.host("use data_ptr()")?;
        // SAFETY: host memory the library keeps mapped with `len` bytes (shape x element size,
        // computed with overflow checks) until the iteration ends, which 'it outlives; that
        // nothing writes it while the slice is used is the caller's contract.
        Ok(unsafe { std::slice::from_raw_parts(self.data, self.len) })
    }

    /// The elements in place as `&[T]`, when the dtype is exactly `T::DTYPE` (e.g. `f32` for
    /// `float32`); [`Status::Mismatch`] otherwise. Prefer [`View::copy_to`], which is safe.
    ///
    /// # Safety
    /// As for [`View::bytes`].
    ///
    /// # Errors
    /// [`Status::Mismatch`] when the dtype is not `T::DTYPE`; otherwise as
    /// [`View::as_raw_elements`].
    pub unsafe fn as_slice<T: Element>(&self) -> Result<&'it [T]> {
        self.exact_dtype::<T>()?;
        // SAFETY: forwarded from the caller.
        unsafe { self.as_raw_elements() }
    }

    /// The elements in place as `&[T]` for any dtype of the same element size, e.g. `bfloat16`
    /// as `u16` bits; [`Status::Mismatch`] when the sizes differ.
    ///
    /// # Safety
    /// As for [`View::bytes`].
    ///
    /// # Errors
    /// [`Status::Mismatch`] when the element sizes differ; [`Status::Unsupported`] for device
    /// memory or bytes not aligned for `T`.
    pub unsafe fn as_raw_elements<T: Element>(&self) -> Result<&'it [T]> {
        self.same_size::<T>()?;
        // SAFETY: forwarded from the caller.
        let bytes = unsafe { self.bytes() }?;
        if (bytes.as_ptr() as usize) % std::mem::align_of::<T>() != 0 {
            return Err(Error::new(
                Status::Unsupported,
                format!(
                    "tensor '{}' is not aligned for {}",
                    self.name,
                    std::any::type_name::<T>()
                ),
            ));
        }
        // SAFETY: `bytes` is valid for 'it, aligned for T (checked), and its length is a
        // multiple of std::mem::size_of::<T>() (len = elements x dtype size = elements x size_of T);
        // Element guarantees every bit pattern is a valid T.
        Ok(unsafe {
            std::slice::from_raw_parts(
                bytes.as_ptr().cast::<T>(),
                bytes.len() / std::mem::size_of::<T>(),
            )
        })
    }

    /// Copies the view's bytes into `dst`, which must be exactly [`View::byte_len`] long (any
    /// alignment). Safe whatever happens to the bytes meanwhile: no reference to them is made;
    /// if the trainer dropped this receiver while it copied, the copy may hold another
    /// version's bytes, and [`Recv::end`] then fails with [`Status::Peer`] (do not serve it).
    /// For large tensors [`Recv::copy_into`] / [`Recv::copy_tensor_into`] are faster (the
    /// library's copy loop, checksum fused) and need no view.
    ///
    /// # Errors
    /// [`Status::InvalidArgument`] naming the tensor and both sizes when `dst` is not
    /// `byte_len()` long; [`Status::Unsupported`] for device memory.
    pub fn copy_bytes_to(&self, dst: &mut [u8]) -> Result<()> {
        self.host("copy it with the device's functions from data_ptr()")?;
        if dst.len() != self.len {
            return Err(Error::new(
                Status::InvalidArgument,
                format!(
                    "tensor '{}' has {} bytes here; the destination has {}",
                    self.name,
                    self.len,
                    dst.len()
                ),
            ));
        }
        // SAFETY: the source is host memory mapped with `len` bytes while the view lives; the
        // destination is a distinct `&mut [u8]` of the same length (it cannot overlap the
        // view: the mapping is read-only for "shm", library-owned otherwise). A raw copy makes
        // no reference to the source: a write to it meanwhile (another process) tears the copy,
        // which the iteration then reports; no `&[u8]` in this process ever sees it change.
        unsafe { std::ptr::copy_nonoverlapping(self.data, dst.as_mut_ptr(), self.len) };
        Ok(())
    }

    /// Copies the elements into `dst` when the dtype is exactly `T::DTYPE`; `dst.len()` must be
    /// the number of elements here (`byte_len() / std::mem::size_of::<T>()`). Safe, as
    /// [`View::copy_bytes_to`].
    ///
    /// # Errors
    /// [`Status::Mismatch`] naming both dtypes; [`Status::InvalidArgument`] for another length;
    /// [`Status::Unsupported`] for device memory.
    pub fn copy_to<T: Element>(&self, dst: &mut [T]) -> Result<()> {
        self.exact_dtype::<T>()?;
        self.copy_raw_to(dst)
    }

    /// As [`View::copy_to`] for any dtype of `T`'s element size (e.g. `bfloat16` as `u16`).
    ///
    /// # Errors
    /// [`Status::Mismatch`] when the element sizes differ; otherwise as [`View::copy_to`].
    pub fn copy_raw_to<T: Element>(&self, dst: &mut [T]) -> Result<()> {
        self.same_size::<T>()?;
        // SAFETY: T is Element (plain old data, no padding), so its bytes may be written with
        // any values; the byte slice covers exactly `dst` and lives as long as this borrow.
        let bytes = unsafe {
            std::slice::from_raw_parts_mut(
                dst.as_mut_ptr().cast::<u8>(),
                std::mem::size_of_val(dst),
            )
        };
        self.copy_bytes_to(bytes)
    }

    /// The bytes, copied into a new `Vec<u8>` (any dtype), as [`View::copy_bytes_to`].
    ///
    /// # Errors
    /// [`Status::Unsupported`] for device memory.
    pub fn to_bytes(&self) -> Result<Vec<u8>> {
        let mut out = vec![0u8; self.len];
        self.copy_bytes_to(&mut out)?;
        Ok(out)
    }

    /// The elements, copied into a new `Vec<T>` (dtype exactly `T::DTYPE`).
    ///
    /// # Errors
    /// As [`View::copy_to`].
    pub fn to_vec<T: Element>(&self) -> Result<Vec<T>> {
        self.exact_dtype::<T>()?;
        self.same_size::<T>()?;
        let n = self.len / std::mem::size_of::<T>();
        self.host("copy it with the device's functions from data_ptr()")?;
        let mut out: Vec<T> = Vec::with_capacity(n);
        // SAFETY: the source is host memory mapped with `len` bytes while the view lives (as in
        // copy_bytes_to); the destination is the new Vec's capacity of n elements, n x size_of
        // T == len bytes (same_size), written through a raw pointer (no reference to the
        // uninitialised bytes) before set_len makes them readable; every bit pattern is a
        // valid T (Element).
        unsafe {
            std::ptr::copy_nonoverlapping(self.data, out.as_mut_ptr().cast::<u8>(), self.len);
            out.set_len(n);
        }
        Ok(out)
    }

    fn host(&self, hint: &str) -> Result<()> {
        if self.device.is_host() {
            return Ok(());
        }
        Err(Error::new(
            Status::Unsupported,
            format!(
                "tensor '{}' is in {} memory; {hint}",
                self.name, self.device
            ),
        ))
    }

    fn exact_dtype<T: Element>(&self) -> Result<()> {
        if self.dtype == T::DTYPE {
            return Ok(());
        }
        Err(Error::new(
            Status::Mismatch,
            format!("tensor '{}' is {}, not {}", self.name, self.dtype, T::DTYPE),
        ))
    }

    fn same_size<T: Element>(&self) -> Result<()> {
        if self.dtype.size() == Some(std::mem::size_of::<T>()) {
            return Ok(());
        }
        Err(Error::new(
            Status::Mismatch,
            format!(
                "tensor '{}' is {}, whose elements are not {} bytes",
                self.name,
                self.dtype,
                std::mem::size_of::<T>()
            ),
        ))
    }
}

impl fmt::Debug for View<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("View")
            .field("name", &self.name)
            .field("dtype", &self.dtype.to_string())
            .field("shape", &self.shape)
            .field("device", &self.device.to_string())
            .field("bytes", &self.len)
            .finish()
    }
}

/// Escape hatches to the C handle, for calls this binding does not wrap yet.
impl Receiver {
    /// The `wsync_receiver_t` handle, still owned by this value: do not destroy it, and use it only as
    /// wsync.h allows while this value is alive (one thread at a time).
    #[must_use]
    pub fn as_raw(&self) -> *mut sys::wsync_receiver_t {
        self.raw.as_ptr()
    }

    /// Gives up ownership: the caller must destroy the returned handle (once).
    #[must_use = "the handle leaks unless it is destroyed"]
    pub fn into_raw(self) -> *mut sys::wsync_receiver_t {
        let this = std::mem::ManuallyDrop::new(self);
        this.raw.as_ptr()
    }

    /// Takes ownership of a handle made by the C API (or by [`Receiver::into_raw`]), created as receiver number `index`.
    ///
    /// # Safety
    /// `raw` must be a live handle of that type that nothing else destroys or uses afterwards.
    #[must_use = "dropping it destroys the handle"]
    pub unsafe fn from_raw(raw: std::ptr::NonNull<sys::wsync_receiver_t>, index: u32) -> Receiver {
        Receiver { raw, index }
    }
}

#[cfg(test)]
mod tests {
    use super::fail_message;

    #[test]
    fn fail_messages_are_cut_on_a_character_boundary_without_nul() {
        assert_eq!(fail_message("a\0b").as_bytes(), b"a b");
        let long = format!("{}é", "x".repeat(254));
        assert_eq!(fail_message(&long).as_bytes(), "x".repeat(254).as_bytes());
        assert_eq!(fail_message(&"y".repeat(300)).as_bytes().len(), 255);
    }
}
