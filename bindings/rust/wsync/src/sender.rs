//! The trainer side: a sender turns chunks of tensors into request blobs.

use std::fmt;
use std::ptr::NonNull;
use std::time::Duration;

use wsync_sys as sys;

use crate::error::{
    check, check_sender, sender_failures, take_blob, Error, Failure, Result, Status,
};
use crate::plan::{Part, Plan};
use crate::strategy::Strategy;
use crate::tensor::TensorRef;

/// The trainer's end of a sync.
///
/// `Send`, not `Sync`: it may move to another thread, and every call takes `&mut self` or is a
/// read-only query on a type no two threads can share. Dropping it abandons a version left
/// open.
#[must_use = "dropping a Sender destroys it (and abandons a version left open)"]
pub struct Sender {
    raw: NonNull<sys::wsync_sender_t>,
}

/// `struct_size` of the chunks passed to the library.
// `wsync_chunk_t` is a few dozen bytes: the cast cannot truncate.
#[allow(clippy::cast_possible_truncation)]
const CHUNK_STRUCT_SIZE: u32 = std::mem::size_of::<sys::wsync_chunk_t>() as u32;

// SAFETY: wsync.h: "A handle may move between threads"; calls are serialised by `&mut self`
// and by Sender not being Sync.
unsafe impl Send for Sender {}

impl Sender {
    /// Creates the sender from the init info `strategy` made with
    /// [`Strategy::create_init_info`]. For `"shm"` it must be that same strategy: a blob of
    /// another strategy fails with [`Status::Mismatch`], a corrupt one with
    /// [`Status::Malformed`]. Does not block.
    ///
    /// # Errors
    /// [`Status::Mismatch`] for init info of another strategy or kind, [`Status::Malformed`]
    /// (or [`Status::Integrity`]) for a corrupt one; for `"nccl_broadcast"`, which joins the
    /// group here, [`Status::Timeout`] or [`Status::Peer`] if the receivers do not all join (a
    /// receiver on this sender's GPU is refused at its creation and never joins), and
    /// [`Status::Mismatch`] when `strategy`'s `device` is another GPU than the init info names.
    pub fn new(strategy: &mut Strategy, init: &[u8]) -> Result<Sender> {
        let mut out: *mut sys::wsync_sender_t = std::ptr::null_mut();
        // SAFETY: the strategy is live and used by this thread only (`&mut`); `init` is
        // borrowed for the call with its exact length; `out` is a valid out-pointer.
        check(unsafe {
            sys::wsync_sender_create(strategy.as_mut_ptr(), init.as_ptr(), init.len(), &mut out)
        })?;
        let raw = NonNull::new(out)
            .ok_or_else(|| Error::new(Status::Internal, "wsync_sender_create returned NULL"))?;
        Ok(Sender { raw })
    }

    /// Sends one chunk (the tensors, in order) and returns its request blob; forward those
    /// bytes to every receiver. `last` marks the chunk that commits the current sync version
    /// (its request carries the version's manifest); no tensors with `last` is the same as
    /// [`Sender::commit`].
    ///
    /// The tensors' bytes are read during the call only (for `"shm"` they are copied into a
    /// bucket), so they may change as soon as it returns. The library validates every
    /// descriptor first: zero-size tensors, duplicate or over-long names, unsupported dtypes or
    /// devices fail with [`Status::InvalidArgument`] (or [`Status::Unsupported`]) naming the
    /// tensor, nothing is published and the version is untouched. Blocks while every bucket is
    /// still being read by some receiver, up to the strategy's `timeout_ms`; then fails with
    /// [`Status::Timeout`] (or [`Status::Peer`] if a receiver died or failed, with each
    /// receiver's part in [`Error::failures`]), and a version that had published a chunk is
    /// abandoned.
    ///
    /// Takes anything that iterates over `&TensorRef`: a slice, a `Vec`, or the tensors of one
    /// planned chunk (`chunk.indices().iter().map(|&i| &tensors[i])`).
    ///
    /// # Errors
    /// [`Status::InvalidArgument`] or [`Status::Unsupported`] for a descriptor the library
    /// refuses (nothing is sent); [`Status::Timeout`] or [`Status::Peer`], with
    /// [`Error::failures`], when receivers hold every bucket past `timeout_ms` or failed (the
    /// version is abandoned).
    pub fn send_chunk<'t, 'd: 't>(
        &mut self,
        tensors: impl IntoIterator<Item = &'t TensorRef<'d>>,
        last: bool,
    ) -> Result<Vec<u8>> {
        self.send_inner(tensors, None, last)
    }

    /// [`Sender::send_chunk`] for a chunk that carries parts of split tensors
    /// (`wsync_sender_send_parts`): `parts[k]` is the range of `tensors[k]` to send
    /// ([`Part::WHOLE`] for a tensor sent whole). Each `TensorRef` describes the *whole* tensor;
    /// only its range is read. The parts of one tensor must follow each other in one version
    /// (offset 0 first, each next where the previous ended, the last ending at the tensor's
    /// size, at most one per chunk), and no chunk may commit the version while a tensor's parts
    /// are incomplete. [`Sender::send_plan`] does all of this from a plan made with
    /// `"split": true`.
    ///
    /// # Errors
    /// [`Status::InvalidArgument`] when `parts` and `tensors` differ in length, or naming the
    /// tensor for a range that breaks the rules above (nothing is published; the version stays
    /// open); [`Status::Unsupported`] from a sender with delta sync on; otherwise as
    /// [`Sender::send_chunk`].
    pub fn send_parts<'t, 'd: 't>(
        &mut self,
        tensors: impl IntoIterator<Item = &'t TensorRef<'d>>,
        parts: &[Part],
        last: bool,
    ) -> Result<Vec<u8>> {
        self.send_inner(tensors, Some(parts), last)
    }

    fn send_inner<'t, 'd: 't>(
        &mut self,
        tensors: impl IntoIterator<Item = &'t TensorRef<'d>>,
        parts: Option<&[Part]>,
        last: bool,
    ) -> Result<Vec<u8>> {
        // The descriptors borrow names, shapes and data from `tensors`, which outlive the call.
        let raw: Vec<sys::wsync_tensor_t> = tensors.into_iter().map(TensorRef::raw).collect();
        let raw_parts: Option<Vec<sys::wsync_part_t>> =
            parts.map(|p| p.iter().map(|x| x.raw()).collect());
        if let Some(p) = &raw_parts {
            if p.len() != raw.len() {
                return Err(Error::invalid(format!(
                    "send_parts: {} parts for {} tensors (one range per tensor)",
                    p.len(),
                    raw.len()
                )));
            }
        }
        let chunk = sys::wsync_chunk_t {
            // An empty closing chunk is passed as the header asks: tensors NULL, count 0.
            tensors: if raw.is_empty() {
                std::ptr::null()
            } else {
                raw.as_ptr()
            },
            count: raw.len(),
            flags: if last { sys::WSYNC_CHUNK_LAST } else { 0 },
            struct_size: CHUNK_STRUCT_SIZE,
        };
        let mut request = sys::wsync_blob_t::default();
        // For both calls: the sender is live and used by this thread only (`&mut self`).
        // `chunk` points at `raw.len()` descriptors whose names, shapes and data are borrowed
        // from TensorRefs alive for the whole call; each TensorRef's data was checked to hold
        // the shape's byte size (or vouched for by its unsafe constructor). `request` is a
        // valid out-parameter.
        let status = match &raw_parts {
            // SAFETY: as above; `p` holds one range per descriptor (checked), alive for the call.
            Some(p) => unsafe {
                sys::wsync_sender_send_parts(self.raw.as_ptr(), &chunk, p.as_ptr(), &mut request)
            },
            // SAFETY: as above.
            None => unsafe {
                sys::wsync_sender_send_chunk(self.raw.as_ptr(), &chunk, &mut request)
            },
        };
        // SAFETY: the sender is live and used by this thread only.
        unsafe { check_sender(status, self.raw.as_ptr()) }?;
        // SAFETY: on success the blob is the library's and is not used again.
        Ok(unsafe { take_blob(request) })
    }

    /// Commits the current version without data (the same as an empty chunk flagged last) and
    /// returns its request blob, to forward to every receiver like any request; for a
    /// producer that learns only after its last chunk that it is done. Fails with
    /// [`Status::WrongState`] when the version has no chunk yet; blocks and fails like
    /// [`Sender::send_chunk`] (a failure abandons the version).
    ///
    /// # Errors
    /// [`Status::WrongState`] when the current version has no chunk yet; otherwise as
    /// [`Sender::send_chunk`].
    pub fn commit(&mut self) -> Result<Vec<u8>> {
        let mut request = sys::wsync_blob_t::default();
        // SAFETY: the sender is live and used by this thread only (`&mut self`); `request` is a
        // valid out-parameter.
        let status = unsafe { sys::wsync_sender_commit(self.raw.as_ptr(), &mut request) };
        // SAFETY: the sender is live and used by this thread only.
        unsafe { check_sender(status, self.raw.as_ptr()) }?;
        // SAFETY: on success the blob is the library's and is not used again.
        Ok(unsafe { take_blob(request) })
    }

    /// Abandons the current version if it has published a chunk (no-op otherwise): receivers
    /// that began it fail it with [`Status::Abandoned`], and the next chunk begins a new
    /// version number. Use it when the trainer gives up on a sync between chunks (its own
    /// error). Does not block.
    ///
    /// # Errors
    /// Only if the library refuses the call (a library bug for a live sender).
    pub fn abandon(&mut self) -> Result<()> {
        // SAFETY: the sender is live and used by this thread only (`&mut self`).
        check(unsafe { sys::wsync_sender_abandon(self.raw.as_ptr()) })
    }

    /// Stops waiting for receiver `index` (a dead, frozen or failing engine) so the others keep
    /// syncing: [`Sender::flush`] no longer waits for it. The receiver, if still alive, fails
    /// its next call with [`Status::Peer`]; a receiver made afterwards with the same index
    /// re-attaches from the next version that begins. [`Status::InvalidArgument`] for an index
    /// out of range, [`Status::Unsupported`] for kinds whose group is fixed
    /// (`"nccl_broadcast"`). Does not block.
    ///
    /// # Errors
    /// [`Status::InvalidArgument`] for `index` out of range; [`Status::Unsupported`] for kinds
    /// whose group is fixed.
    pub fn drop_receiver(&mut self, index: u32) -> Result<()> {
        // SAFETY: the sender is live and used by this thread only (`&mut self`).
        check(unsafe { sys::wsync_sender_drop_receiver(self.raw.as_ptr(), index) })
    }

    /// The receivers' failures the last failed call (`send_chunk`, `commit`, `flush`) found,
    /// oldest first; empty after a call that succeeded. A failed call's [`Error::failures`]
    /// holds the same.
    #[must_use]
    pub fn failures(&self) -> Vec<Failure> {
        // SAFETY: the sender is live; Sender is not Sync, so no other thread uses it now.
        unsafe { sender_failures(self.raw.as_ptr()) }
    }

    /// Sends one whole sync version as `plan` groups `tensors` (the same tensors, in the same
    /// order, that the plan was made from), calling `forward` with each request as soon as it
    /// exists, so receivers can start (and free buckets) while later chunks are packed. The
    /// plan's last chunk is flagged last. Returns the number of chunks sent.
    ///
    /// Stops at the first error of the library or of `forward`, abandoning the version (a
    /// failed send has abandoned it already; an error of `forward` or of the plan would leave
    /// it open, and receivers that began it must learn it will not complete).
    ///
    /// # Errors
    /// The first error of `forward`, or of the library converted with `E::from`: as
    /// [`Sender::send_chunk`], and [`Status::InvalidArgument`] when the plan names a tensor
    /// beyond `tensors`.
    pub fn send_plan<E>(
        &mut self,
        tensors: &[TensorRef<'_>],
        plan: &Plan,
        mut forward: impl FnMut(&[u8]) -> std::result::Result<(), E>,
    ) -> std::result::Result<usize, E>
    where
        E: From<Error>,
    {
        let result = self.send_plan_inner(tensors, plan, &mut forward);
        if result.is_err() {
            // Best effort: the caller's error is the one to report.
            let _ = self.abandon();
        }
        result
    }

    fn send_plan_inner<E>(
        &mut self,
        tensors: &[TensorRef<'_>],
        plan: &Plan,
        forward: &mut impl FnMut(&[u8]) -> std::result::Result<(), E>,
    ) -> std::result::Result<usize, E>
    where
        E: From<Error>,
    {
        let chunks = plan.len();
        for c in 0..chunks {
            let chunk = plan.chunk(c)?;
            if let Some(&bad) = chunk.indices().iter().find(|&&i| i >= tensors.len()) {
                return Err(Error::invalid(format!(
                    "plan chunk {c} names tensor {bad}, but only {} tensors were given",
                    tensors.len()
                ))
                .into());
            }
            let picked = chunk.indices().iter().map(|&i| &tensors[i]);
            let request = if chunk.has_parts() {
                self.send_parts(picked, &chunk.parts(), c + 1 == chunks)?
            } else {
                self.send_chunk(picked, c + 1 == chunks)?
            };
            forward(&request)?;
        }
        Ok(chunks)
    }

    /// Waits until every receiver (but dropped ones) has acknowledged every chunk sent so far.
    /// Fails with [`Status::Peer`] when a receiver failed a chunk, died or detached owing one
    /// (on `shm` and `cuda_ipc` after every other receiver has answered or failed, or at the
    /// deadline, so one error names every engine that failed), or with [`Status::Timeout`]
    /// after `timeout` naming the receivers that did not answer when none failed;
    /// [`Error::failures`] gives each receiver's part as data (its own status and
    /// message, version, chunk). Each failure is reported once. The trainer may then
    /// [`Sender::drop_receiver`] the failed ones and flush again, or resend the version. A zero
    /// timeout polls; timeouts are rounded up to whole milliseconds.
    ///
    /// # Errors
    /// [`Status::Peer`] when a receiver failed, died or detached owing a chunk;
    /// [`Status::Timeout`] when some did not acknowledge by `timeout`. Both carry
    /// [`Error::failures`].
    pub fn flush(&mut self, timeout: Duration) -> Result<()> {
        let ms = timeout.as_nanos().div_ceil(1_000_000);
        let ms = i64::try_from(ms).unwrap_or(i64::MAX);
        // SAFETY: the sender is live and used by this thread only (`&mut self`).
        let status = unsafe { sys::wsync_sender_flush(self.raw.as_ptr(), ms) };
        // SAFETY: as above.
        unsafe { check_sender(status, self.raw.as_ptr()) }
    }

    /// Waits until the trainer may free or reallocate memory it shared up to `version` that
    /// `version` no longer uses ([`Sender::ALL_VERSIONS`]: any memory it shared). Only
    /// `cuda_ipc` with `packed: false` shares the trainer's own memory: receivers keep imported
    /// allocations open while versions use them, and CUDA makes freeing memory still imported
    /// undefined behaviour. Sync a version that no longer names the old memory, flush it, wait
    /// for it here, then free. Other kinds return at once. Fails with `InvalidArgument` for a
    /// version this sender has not finished, `Timeout` naming the receivers that still map the
    /// memory ([`Error::failures`] lists them). Blocks up to `timeout`, rounded up to whole
    /// milliseconds.
    ///
    /// # Errors
    /// [`Status::InvalidArgument`] for a version this sender has not finished;
    /// [`Status::Timeout`] (with [`Error::failures`]) when receivers still map the memory at
    /// `timeout`.
    pub fn wait_released(&mut self, version: u64, timeout: Duration) -> Result<()> {
        let ms = timeout.as_nanos().div_ceil(1_000_000);
        let ms = i64::try_from(ms).unwrap_or(i64::MAX);
        // SAFETY: the sender is live and used by this thread only (`&mut self`).
        let status = unsafe { sys::wsync_sender_wait_released(self.raw.as_ptr(), version, ms) };
        // SAFETY: as above.
        unsafe { check_sender(status, self.raw.as_ptr()) }
    }

    /// Orders the GPU kinds' reads of the tensors after the work the caller queued on `stream`
    /// (a `CUstream` / `cudaStream_t`) instead of after the legacy default stream; null restores
    /// the legacy default stream. `shm` accepts and ignores it. Does not block.
    ///
    /// # Safety
    /// `stream` must be null or a CUDA stream of the sender's GPU and context that stays valid
    /// until the next call of this method or the sender is dropped.
    ///
    /// # Errors
    /// The library's status if it refuses the call.
    pub unsafe fn set_stream(&mut self, stream: *mut std::ffi::c_void) -> Result<()> {
        // SAFETY: the sender is live and used by this thread only (`&mut self`); the stream's
        // validity is the caller's promise.
        check(unsafe { sys::wsync_sender_set_stream(self.raw.as_ptr(), stream) })
    }

    /// The sender's arena: host memory in the `"shm"` segment, or since libwsync 0.8 the
    /// `"ucx"` trainer's own memory (the strategy's `"arena_bytes"` option; libwsync 0.5) where
    /// the trainer may keep its tensors, as its first byte and length; `None` for other kinds
    /// and without the option.
    ///
    /// A tensor passed to [`Sender::send_chunk`] whose bytes lie wholly in the arena, starting a
    /// multiple of 256 bytes from its first byte, is sent in place: the engines read it there
    /// instead of the trainer packing it into a bucket (`"ucx"`: a whole chunk laid out there
    /// as it would be packed, else none of it; see `wsync_sender_arena` in wsync.h). It is
    /// then borrowed until the version
    /// is acknowledged: write it only after [`Sender::flush`] returns `Ok` (with checksums on,
    /// an earlier write fails the version on the engines with [`Status::Integrity`]; with them
    /// off it may be loaded torn). Make such tensors with [`TensorRef::from_raw_parts`], whose
    /// safety contract is exactly that rule.
    ///
    /// The memory is the library's, mapped while this sender (for `"shm"`, or the strategy
    /// that created it) lives: do not use the pointer after both are dropped.
    ///
    /// # Errors
    /// Only if the library refuses the call (a library bug for a live sender).
    ///
    /// [`TensorRef::from_raw_parts`]: crate::TensorRef::from_raw_parts
    pub fn arena(&self) -> Result<Option<(NonNull<u8>, usize)>> {
        let mut base: *mut std::ffi::c_void = std::ptr::null_mut();
        let mut bytes = 0u64;
        // SAFETY: the sender is live; Sender is not Sync, so no other thread uses it now; both
        // out-pointers are valid.
        check(unsafe { sys::wsync_sender_arena(self.raw.as_ptr(), &mut base, &mut bytes) })?;
        let len = usize::try_from(bytes)
            .map_err(|_| Error::new(Status::Internal, "arena larger than the address space"))?;
        Ok(NonNull::new(base.cast::<u8>()).map(|p| (p, len)))
    }

    /// [`Sender::wait_released`]: every version (no receiver maps anything of the sender).
    pub const ALL_VERSIONS: u64 = sys::WSYNC_ALL_VERSIONS;

    /// The sync version the next chunk will belong to (1 before any chunk is sent, or, for a
    /// `cuda_ipc` sender made again on init info an earlier sole sender used, the version after
    /// the newest that one began: see `wsync_sender_version` in wsync.h).
    ///
    /// # Errors
    /// Only if the library refuses the call (a library bug for a live sender).
    pub fn version(&self) -> Result<u64> {
        let mut v = 0u64;
        // SAFETY: the sender is live; Sender is not Sync, so no other thread uses it now;
        // `v` is a valid out-pointer.
        check(unsafe { sys::wsync_sender_version(self.raw.as_ptr(), &mut v) })?;
        Ok(v)
    }
}

impl Drop for Sender {
    fn drop(&mut self) {
        // SAFETY: `self.raw` came from wsync_sender_create and is destroyed exactly once. This
        // does not wait for receivers (call flush first); for "shm" the segment is unlinked.
        unsafe { sys::wsync_sender_destroy(self.raw.as_ptr()) }
    }
}

impl fmt::Debug for Sender {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Sender")
            .field("version", &self.version().ok())
            .finish()
    }
}

/// Merges the partial requests of several senders of one chunk (one per trainer GPU, for kinds
/// with several senders) into one request. Every part must be of one kind, version and chunk;
/// kinds with a single sender (`"shm"`) accept exactly one part and return a copy (more fail
/// with [`Status::Unsupported`]). No parts, or an empty part, is [`Status::InvalidArgument`].
///
/// # Errors
/// [`Status::InvalidArgument`] for no parts or an empty part; [`Status::Unsupported`] for more
/// than one part of a single-sender kind; [`Status::Mismatch`] for parts of different kinds,
/// versions or chunks (or, for `"cuda_ipc"`, one GPU in two parts); [`Status::Malformed`] for
/// a corrupt part.
pub fn merge_requests(parts: &[&[u8]]) -> Result<Vec<u8>> {
    let raw: Vec<sys::wsync_blob_t> = parts
        .iter()
        .map(|p| sys::wsync_blob_t {
            data: p.as_ptr().cast_mut(),
            size: p.len(),
        })
        .collect();
    let mut out = sys::wsync_blob_t::default();
    // SAFETY: `raw` holds `parts.len()` blobs borrowed for the call (the library only reads
    // them); `out` is a valid out-parameter.
    check(unsafe { sys::wsync_request_merge(raw.as_ptr(), raw.len(), &mut out) })?;
    // SAFETY: on success the blob is the library's and is not used again.
    Ok(unsafe { take_blob(out) })
}

/// Escape hatches to the C handle, for calls this binding does not wrap yet.
impl Sender {
    /// The `wsync_sender_t` handle, still owned by this value: do not destroy it, and use it only as
    /// wsync.h allows while this value is alive (one thread at a time).
    #[must_use]
    pub fn as_raw(&self) -> *mut sys::wsync_sender_t {
        self.raw.as_ptr()
    }

    /// Gives up ownership: the caller must destroy the returned handle (once).
    #[must_use = "the handle leaks unless it is destroyed"]
    pub fn into_raw(self) -> *mut sys::wsync_sender_t {
        let this = std::mem::ManuallyDrop::new(self);
        this.raw.as_ptr()
    }

    /// Takes ownership of a handle made by the C API (or by [`Sender::into_raw`]).
    ///
    /// # Safety
    /// `raw` must be a live handle of that type that nothing else destroys or uses afterwards.
    #[must_use = "dropping it destroys the handle"]
    pub unsafe fn from_raw(raw: std::ptr::NonNull<sys::wsync_sender_t>) -> Sender {
        Sender { raw }
    }
}
