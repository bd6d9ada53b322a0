//! The planner: tensors grouped into chunks.

use std::fmt;
use std::ptr::NonNull;

use wsync_sys as sys;

use crate::error::{c_string, check, Error, Result, Status};
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

    /// Number of chunks (at least 1).
    pub fn len(&self) -> usize {
        self.chunks
    }

    /// Whether the plan has no chunks (never true for a plan the library made).
    pub fn is_empty(&self) -> bool {
        self.chunks == 0
    }

    /// Chunk `i`: indices into the planned tensors and its payload size. Out of range is
    /// [`Status::InvalidArgument`].
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
        Ok(PlanChunk {
            index: i,
            last: i + 1 == self.chunks,
            indices,
            bytes,
        })
    }

    /// Every chunk, in order.
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
            .finish()
    }
}

/// One chunk of a [`Plan`], borrowing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlanChunk<'p> {
    index: usize,
    last: bool,
    indices: &'p [usize],
    bytes: u64,
}

impl<'p> PlanChunk<'p> {
    /// Position of the chunk in the plan.
    pub fn index(&self) -> usize {
        self.index
    }

    /// Whether it is the plan's last chunk (send it with `last = true`).
    pub fn is_last(&self) -> bool {
        self.last
    }

    /// Ascending indices into the tensors the plan was made from.
    pub fn indices(&self) -> &'p [usize] {
        self.indices
    }

    /// Payload bytes of the chunk's tensors.
    pub fn bytes(&self) -> u64 {
        self.bytes
    }
}

/// Plans `tensors`: the same as [`Plan::new`].
pub fn plan<T: AsRef<TensorSpec>>(tensors: &[T], options_json: &str) -> Result<Plan> {
    Plan::new(tensors, options_json)
}
