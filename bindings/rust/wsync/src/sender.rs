//! The trainer side: a sender turns chunks of tensors into request blobs.

use std::fmt;
use std::ptr::NonNull;
use std::time::Duration;

use wsync_sys as sys;

use crate::error::{check, take_blob, Error, Result, Status};
use crate::plan::Plan;
use crate::strategy::Strategy;
use crate::tensor::TensorRef;

/// The trainer's end of a sync.
///
/// `Send`, not `Sync`: it may move to another thread, and every call takes `&mut self` or is a
/// read-only query on a type no two threads can share.
pub struct Sender {
    raw: NonNull<sys::wsync_sender_t>,
}

// SAFETY: wsync.h: "A handle may move between threads"; calls are serialised by `&mut self`
// and by Sender not being Sync.
unsafe impl Send for Sender {}

impl Sender {
    /// Creates the sender from the init info `strategy` made with
    /// [`Strategy::create_init_info`]. For `"shm"` it must be that same strategy: a blob of
    /// another strategy fails with [`Status::Mismatch`], a corrupt one with
    /// [`Status::Malformed`]. Does not block.
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
    /// bytes to every receiver. `last` marks the chunk that completes the current sync version.
    ///
    /// The tensors' bytes are read during the call only (for `"shm"` they are copied into a
    /// bucket), so they may change as soon as it returns. The library validates every
    /// descriptor first: zero-size tensors, duplicate or over-long names, unsupported dtypes or
    /// devices fail with [`Status::InvalidArgument`] (or [`Status::Unsupported`]) naming the
    /// tensor, and nothing is published. Blocks while every bucket is still being read by some
    /// receiver, up to the strategy's `timeout_ms`; then fails with [`Status::Timeout`] (or
    /// [`Status::Peer`] if a receiver died or failed).
    ///
    /// Takes anything that iterates over `&TensorRef`: a slice, a `Vec`, or the tensors of one
    /// planned chunk (`chunk.indices().iter().map(|&i| &tensors[i])`).
    pub fn send_chunk<'t, 'd: 't>(
        &mut self,
        tensors: impl IntoIterator<Item = &'t TensorRef<'d>>,
        last: bool,
    ) -> Result<Vec<u8>> {
        // The descriptors borrow names, shapes and data from `tensors`, which outlive the call.
        let raw: Vec<sys::wsync_tensor_t> = tensors.into_iter().map(TensorRef::raw).collect();
        let chunk = sys::wsync_chunk_t {
            tensors: raw.as_ptr(),
            count: raw.len(),
            flags: if last { sys::WSYNC_CHUNK_LAST } else { 0 },
            reserved_: 0,
        };
        let mut request = sys::wsync_blob_t::default();
        // SAFETY: the sender is live and used by this thread only (`&mut self`). `chunk` points
        // at `raw.len()` descriptors whose names, shapes and data are borrowed from TensorRefs
        // alive for the whole call; each TensorRef's data was checked to hold the shape's byte
        // size (or vouched for by its unsafe constructor). `request` is a valid out-parameter.
        check(unsafe { sys::wsync_sender_send_chunk(self.raw.as_ptr(), &chunk, &mut request) })?;
        // SAFETY: on success the blob is the library's and is not used again.
        Ok(unsafe { take_blob(request) })
    }

    /// Sends one whole sync version as `plan` groups `tensors` (the same tensors, in the same
    /// order, that the plan was made from), calling `forward` with each request as soon as it
    /// exists, so receivers can start (and free buckets) while later chunks are packed. The
    /// plan's last chunk is flagged last. Returns the number of chunks sent.
    ///
    /// Stops at the first error of the library or of `forward`.
    pub fn send_plan<E>(
        &mut self,
        tensors: &[TensorRef<'_>],
        plan: &Plan,
        mut forward: impl FnMut(&[u8]) -> std::result::Result<(), E>,
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
            let request = self.send_chunk(
                chunk.indices().iter().map(|&i| &tensors[i]),
                c + 1 == chunks,
            )?;
            forward(&request)?;
        }
        Ok(chunks)
    }

    /// Waits until every receiver has acknowledged every chunk sent so far. Fails with
    /// [`Status::Timeout`] after `timeout` naming the receivers that did not answer, or with
    /// [`Status::Peer`] naming a receiver that died, detached or failed a chunk (each failure
    /// is reported once). A zero timeout polls; timeouts are rounded up to whole milliseconds.
    pub fn flush(&mut self, timeout: Duration) -> Result<()> {
        let ms = timeout.as_nanos().div_ceil(1_000_000);
        let ms = i64::try_from(ms).unwrap_or(i64::MAX);
        // SAFETY: the sender is live and used by this thread only (`&mut self`).
        check(unsafe { sys::wsync_sender_flush(self.raw.as_ptr(), ms) })
    }

    /// The sync version the next chunk will belong to (1 before any chunk is sent).
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
