//! The planner: tensors grouped into chunks.

use std::fmt;
use std::ptr::NonNull;

use wsync_sys as sys;

use crate::error::{c_string, check, Error, Result, Status};
use crate::strategy::Options;
use crate::tensor::{Device, TensorSpec};

/// A plan: the library's grouping of a model's tensors into chunks.
///
/// Consecutive tensors of one module (the name without its last `group_depth` dotted parts)
/// stay in one chunk so an engine can fuse them; whole groups are batched in order while a chunk
/// stays within `chunk_bytes`. Deterministic: the same tensors give the same plan. `Send`, not
/// `Sync`.
#[must_use = "dropping a Plan destroys it"]
pub struct Plan {
    raw: NonNull<sys::wsync_plan_t>,
    chunks: usize,
}

// SAFETY: wsync.h: "A handle may move between threads"; Plan is not Sync and its queries
// take `&self`, so one thread at a time uses it.
unsafe impl Send for Plan {}

impl Plan {
    /// Plans `tensors` (their names, dtypes and shapes; data is ignored) with options as JSON
    /// (`""` for defaults): `"chunk_bytes"` (default 256 MiB) and `"group_depth"` (default 2;
    /// 0 disables grouping). Invalid tensors or options fail with [`Status::InvalidArgument`]
    /// naming them. Does not block.
    ///
    /// # Errors
    /// [`Status::InvalidArgument`] for an invalid tensor (bad dtype, shape, name) or option, or
    /// options text holding a NUL byte; [`Status::Unsupported`] if the loaded library is older
    /// than this binding needs ([`crate::check_version`]); [`Status::NoMemory`] if planning
    /// cannot allocate.
    pub fn new<T: AsRef<TensorSpec>>(tensors: &[T], options_json: &str) -> Result<Plan> {
        crate::check_version()?;
        let options = c_string("plan options", options_json)?;
        let metas: Vec<sys::wsync_tensor_t> = tensors
            .iter()
            .map(|t| t.as_ref().raw(std::ptr::null(), Device::CPU))
            .collect();
        let mut out: *mut sys::wsync_plan_t = std::ptr::null_mut();
        // SAFETY: `metas` holds `tensors.len()` descriptors borrowing names and shapes from
        // `tensors`, alive for the call (the library copies names); data is NULL, which the
        // planner ignores; `options` is NUL-terminated; `out` is a valid out-pointer.
        check(unsafe {
            sys::wsync_plan_create(metas.as_ptr(), metas.len(), options.as_ptr(), &mut out)
        })?;
        let raw = NonNull::new(out)
            .ok_or_else(|| Error::new(Status::Internal, "wsync_plan_create returned NULL"))?;
        // From here on `plan` owns the handle, so an error below still destroys it.
        let mut plan = Plan { raw, chunks: 0 };
        let mut count = 0usize;
        // SAFETY: `raw` is the live plan just made; `count` is a valid out-pointer.
        check(unsafe { sys::wsync_plan_chunk_count(plan.raw.as_ptr(), &mut count) })?;
        plan.chunks = count;
        Ok(plan)
    }

    /// [`Plan::new`] with options from an [`Options`] builder, as for
    /// [`Strategy::with_options`](crate::Strategy::with_options):
    /// `Plan::with_options(&specs, &Options::new().uint("chunk_bytes", 64 << 20))`.
    ///
    /// # Errors
    /// As [`Plan::new`].
    pub fn with_options<T: AsRef<TensorSpec>>(tensors: &[T], options: &Options) -> Result<Plan> {
        Plan::new(tensors, &options.to_json())
    }

    /// Number of chunks (at least 1).
    #[must_use]
    pub fn len(&self) -> usize {
        self.chunks
    }

    /// Whether the plan has no chunks (never true for a plan the library made).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.chunks == 0
    }

    /// Chunk `i`: indices into the planned tensors and its payload size. Out of range is
    /// [`Status::InvalidArgument`].
    ///
    /// # Errors
    /// [`Status::InvalidArgument`] if `i >= self.len()`; [`Status::Internal`] if the library
    /// returns no indices for a non-empty chunk.
    pub fn chunk(&self, i: usize) -> Result<PlanChunk<'_>> {
        let mut indices: *const usize = std::ptr::null();
        let mut count = 0usize;
        let mut bytes = 0u64;
        // SAFETY: the plan is live and not shared with another thread (not Sync); all three
        // are valid out-pointers.
        check(unsafe {
            sys::wsync_plan_chunk(self.raw.as_ptr(), i, &mut indices, &mut count, &mut bytes)
        })?;
        let indices: &[usize] = if count == 0 {
            &[]
        } else if indices.is_null() {
            return Err(Error::new(
                Status::Internal,
                "wsync_plan_chunk returned NULL indices",
            ));
        } else {
            // SAFETY: the library returned `count` indices owned by the plan, valid until the
            // plan is destroyed, which the `&self` borrow prevents while the slice lives.
            unsafe { std::slice::from_raw_parts(indices, count) }
        };
        let mut parts_ptr: *const sys::wsync_part_t = std::ptr::null();
        // SAFETY: the plan is live, `i` was just accepted by wsync_plan_chunk, and `parts_ptr`
        // is a valid out-pointer.
        check(unsafe { sys::wsync_plan_chunk_parts(self.raw.as_ptr(), i, &mut parts_ptr) })?;
        let parts: &[sys::wsync_part_t] = if count == 0 {
            &[]
        } else if parts_ptr.is_null() {
            return Err(Error::new(
                Status::Internal,
                "wsync_plan_chunk_parts returned NULL ranges",
            ));
        } else {
            // SAFETY: the library returned one range per index (`count`), owned by the plan
            // and valid until it is destroyed, which the `&self` borrow prevents.
            unsafe { std::slice::from_raw_parts(parts_ptr, count) }
        };
        Ok(PlanChunk {
            index: i,
            last: i + 1 == self.chunks,
            indices,
            parts,
            bytes,
        })
    }

    /// Every chunk, in order.
    ///
    /// # Errors
    /// As [`Plan::chunk`]; for a live plan only [`Status::Internal`] (a library bug).
    pub fn chunks(&self) -> Result<Vec<PlanChunk<'_>>> {
        (0..self.chunks).map(|i| self.chunk(i)).collect()
    }
}

impl Drop for Plan {
    fn drop(&mut self) {
        // SAFETY: `self.raw` came from wsync_plan_create and is destroyed exactly once; no
        // PlanChunk borrows it any more.
        unsafe { sys::wsync_plan_destroy(self.raw.as_ptr()) }
    }
}

impl fmt::Debug for Plan {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Plan")
            .field("chunks", &self.chunks)
            .finish_non_exhaustive()
    }
}

/// One chunk of a [`Plan`], borrowing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanChunk<'p> {
    index: usize,
    last: bool,
    indices: &'p [usize],
    parts: &'p [sys::wsync_part_t],
    bytes: u64,
}

impl<'p> PlanChunk<'p> {
    /// Position of the chunk in the plan.
    #[must_use]
    pub fn index(&self) -> usize {
        self.index
    }

    /// Whether it is the plan's last chunk (send it with `last = true`).
    #[must_use]
    pub fn is_last(&self) -> bool {
        self.last
    }

    /// Ascending indices into the tensors the plan was made from.
    #[must_use]
    pub fn indices(&self) -> &'p [usize] {
        self.indices
    }

    /// Payload bytes of the chunk's tensors (of their parts, for split tensors).
    #[must_use]
    pub fn bytes(&self) -> u64 {
        self.bytes
    }

    /// The range of each tensor of [`PlanChunk::indices`] that this chunk carries, in the same
    /// order: [`Part::WHOLE`] for a tensor sent whole (always, in a plan made without
    /// `"split": true`), else a part of a split tensor (a tensor larger than `chunk_bytes`,
    /// planned as consecutive parts, one per chunk). [`crate::Sender::send_plan`] sends them
    /// with [`crate::Sender::send_parts`].
    #[must_use]
    pub fn parts(&self) -> Vec<Part> {
        self.parts
            .iter()
            .map(|p| Part {
                offset: p.offset,
                bytes: p.bytes,
            })
            .collect()
    }

    /// Whether some tensor of the chunk is a part of a split tensor.
    #[must_use]
    pub fn has_parts(&self) -> bool {
        self.parts.iter().any(|p| p.bytes != 0)
    }
}

/// A byte range of one tensor (`wsync_part_t`): bytes `offset .. offset + bytes` of the whole
/// tensor, row-major. A tensor larger than a chunk crosses as consecutive parts of one version
/// (split tensors, libwsync 0.5). `bytes == 0` means the whole tensor ([`Part::WHOLE`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub struct Part {
    /// First byte of the part within the whole tensor.
    pub offset: u64,
    /// The part's size in bytes; 0: the whole tensor (then `offset` is 0).
    pub bytes: u64,
}

impl Part {
    /// The whole tensor.
    pub const WHOLE: Part = Part {
        offset: 0,
        bytes: 0,
    };

    pub(crate) fn raw(self) -> sys::wsync_part_t {
        sys::wsync_part_t {
            offset: self.offset,
            bytes: self.bytes,
        }
    }
}

/// Plans `tensors`: the same as [`Plan::new`].
///
/// # Errors
/// As [`Plan::new`].
pub fn plan<T: AsRef<TensorSpec>>(tensors: &[T], options_json: &str) -> Result<Plan> {
    Plan::new(tensors, options_json)
}

/// Escape hatches to the C handle, for calls this binding does not wrap yet.
impl Plan {
    /// The `wsync_plan_t` handle, still owned by this value: do not destroy it, and use it only
    /// as wsync.h allows while this value is alive (one thread at a time).
    #[must_use]
    pub fn as_raw(&self) -> *mut sys::wsync_plan_t {
        self.raw.as_ptr()
    }

    /// Gives up ownership: the caller must destroy the returned handle (once, with
    /// `wsync_plan_destroy`).
    #[must_use = "the handle leaks unless it is destroyed"]
    pub fn into_raw(self) -> *mut sys::wsync_plan_t {
        let this = std::mem::ManuallyDrop::new(self);
        this.raw.as_ptr()
    }

    /// Takes ownership of a handle made by the C API (`wsync_plan_create`) or by
    /// [`Plan::into_raw`]. The chunk count is read once, here; a handle the library cannot
    /// count (which a live one never is) gives an empty plan.
    ///
    /// # Safety
    /// `raw` must be a live `wsync_plan_t` that nothing else destroys or uses afterwards.
    #[must_use = "dropping it destroys the handle"]
    pub unsafe fn from_raw(raw: NonNull<sys::wsync_plan_t>) -> Plan {
        let mut count = 0usize;
        // SAFETY: the caller guarantees `raw` is a live plan owned by us from here on;
        // `count` is a valid out-pointer.
        let status = unsafe { sys::wsync_plan_chunk_count(raw.as_ptr(), &mut count) };
        let chunks = if status == sys::WSYNC_OK { count } else { 0 };
        Plan { raw, chunks }
    }
}
