//! Destination tables (libwsync 0.6): an engine declares once where each wire tensor lands
//! ([`DestTable`], made of [`Dest`]s), then loads a whole chunk with one call
//! ([`crate::Recv::apply`]) instead of one [`crate::Recv::copy_into`] per tensor.

use std::ffi::c_void;
use std::fmt;
use std::marker::PhantomData;
use std::ops::{BitOr, BitOrAssign};
use std::ptr::NonNull;

use wsync_sys as sys;

use crate::error::{check, Error, Result, Status};
use crate::receiver::Receiver;
use crate::tensor::{DType, Element, TensorSpec};

/// One destination of a [`DestTable`]: which wire tensor it takes (name, dtype and shape, which
/// the request's tensor must have exactly: no cast is made), which bytes of it
/// ([`Dest::range`]; the whole tensor by default), and the memory they land in, borrowed for
/// `'a`.
///
/// Several destinations may name one wire tensor (a tied weight kept twice): every one of them
/// is written. A wire tensor that lands inside a fused parameter (q, k and v in one qkv weight)
/// is a destination over that part of the parameter's memory (`split_at_mut`); a shard of a
/// tensor is a destination with a [`Dest::range`].
///
/// ```
/// # fn demo() -> wsync::Result<()> {
/// let mut qkv = vec![0f32; 8 * 8]; // q, k and v fused: rows 0-3, 4-5, 6-7
/// let (q, kv) = qkv.split_at_mut(4 * 8);
/// let (k, v) = kv.split_at_mut(2 * 8);
/// let mut shard = vec![0f32; 2 * 8];
/// let dests = [
///     wsync::Dest::new("q", q, &[4, 8])?,
///     wsync::Dest::new("k", k, &[2, 8])?,
///     wsync::Dest::new("v", v, &[2, 8])?,
///     wsync::Dest::new("w", &mut shard, &[4, 8])?.range(64, 64), // rows 2-3 of a [4, 8] "w"
/// ];
/// # drop(dests); Ok(()) }
/// ```
pub struct Dest<'a> {
    spec: TensorSpec,
    data: *mut c_void,
    /// The slice's length in bytes for a host destination; `None` for [`Dest::from_raw_parts`],
    /// whose size is the caller's promise.
    len: Option<usize>,
    src_offset: u64,
    bytes: u64,
    _memory: PhantomData<&'a mut [u8]>,
}

// SAFETY: a Dest holds the exclusive borrow of its memory (as `&'a mut [u8]`, which is Send) and
// owned metadata; it never touches the memory itself. For `from_raw_parts` the caller vouched
// for the memory for 'a.
unsafe impl Send for Dest<'_> {}

impl<'a> Dest<'a> {
    /// A destination in host memory for the wire tensor `name` of `T::DTYPE` and `shape`, e.g.
    /// `Dest::new("layers.0.w", &mut weights_f32, &[4096, 1024])`. `dst` is borrowed mutably for
    /// as long as the table made from it lives (the table writes it on every
    /// [`crate::Recv::apply`]): drop the table to read it. Without [`Dest::range`], `dst` must
    /// hold exactly the tensor's elements; [`DestTable::new`] checks that before the library
    /// sees the pointer, so the library can never write past the slice. Every kind writes host
    /// memory on the CPU before [`crate::Recv::apply`] returns; the GPU kinds refuse it
    /// (`"cuda_ipc"`, `"nccl_broadcast"`) or copy into it on the CPU (`"ucx"` with
    /// `"device"`). A slice made over memory the CUDA driver reports as device memory is the
    /// exception, since the GPU kinds queue their writes to it: declare such memory with
    /// [`Dest::from_raw_parts`].
    ///
    /// # Errors
    /// As [`Dest::with_dtype`].
    pub fn new<T: Element>(name: &str, dst: &'a mut [T], shape: &[i64]) -> Result<Dest<'a>> {
        Dest::with_dtype(name, dst, shape, T::DTYPE)
    }

    /// As [`Dest::new`] for a wire tensor of `dtype` held as `T`s of any type, e.g. bfloat16
    /// weights as `&mut [u16]` or packed fp8 as `&mut [u8]`; the slice's length in bytes must
    /// be the range's (checked by [`DestTable::new`]).
    ///
    /// # Errors
    /// [`Status::InvalidArgument`] for a NUL byte in `name` or a negative extent (everything
    /// else is checked when the table is made).
    pub fn with_dtype<T: Element>(
        name: &str,
        dst: &'a mut [T],
        shape: &[i64],
        dtype: DType,
    ) -> Result<Dest<'a>> {
        let spec = TensorSpec::new(name, shape, dtype)?;
        Ok(Dest {
            spec,
            len: Some(std::mem::size_of_val(dst)),
            data: dst.as_mut_ptr().cast::<c_void>(),
            src_offset: 0,
            bytes: 0,
            _memory: PhantomData,
        })
    }

    /// A destination in memory Rust cannot see as a slice: device memory of the receiver's GPU
    /// for the GPU kinds (`"cuda_ipc"`, `"nccl_broadcast"`, `"ucx"` with `"device"`), which
    /// the library checks with the driver when the table is made and again before each apply
    /// (memory freed or remapped since is refused by name), or host memory owned elsewhere.
    /// `data` is where byte `src_offset` of the wire tensor lands ([`Dest::range`]). Only the
    /// name and shape are checked here.
    ///
    /// # Safety
    /// From the moment the table is made until it is dropped and, for device memory, until the
    /// work [`crate::Recv::apply`] queued on the receiver's loader stream has run, `data` must
    /// point at the range's bytes (the whole tensor's size without [`Dest::range`]) of memory
    /// that stays allocated and that nothing else reads or writes while an apply may write it,
    /// and it must not overlap another destination of the table. Host memory must be writable
    /// by the CPU; a Rust reference to it must not be used while the table lives.
    ///
    /// # Errors
    /// [`Status::InvalidArgument`] for a NUL byte in `name` or a negative extent.
    pub unsafe fn from_raw_parts(
        name: &str,
        data: *mut c_void,
        shape: &[i64],
        dtype: DType,
    ) -> Result<Dest<'a>> {
        let spec = TensorSpec::new(name, shape, dtype)?;
        Ok(Dest {
            spec,
            data,
            len: None,
            src_offset: 0,
            bytes: 0,
            _memory: PhantomData,
        })
    }

    /// Takes only bytes `src_offset .. src_offset + bytes` of the wire tensor (`bytes` 0: the
    /// rest of it), as [`crate::Recv::copy_into`]'s offset and length: a shard of a tensor, or
    /// a slice of a fused one. Both must be whole elements. The memory holds the range: a host
    /// slice must be exactly `bytes` long (checked by [`DestTable::new`]), and byte
    /// `src_offset` of the tensor lands at its start. A part of a split tensor writes its
    /// share of the range.
    #[must_use]
    pub fn range(mut self, src_offset: u64, bytes: u64) -> Dest<'a> {
        self.src_offset = src_offset;
        self.bytes = bytes;
        self
    }

    /// The wire tensor's name.
    #[must_use]
    pub fn name(&self) -> &str {
        self.spec.name()
    }

    /// The shape the wire tensor must have.
    #[must_use]
    pub fn shape(&self) -> &[i64] {
        self.spec.shape()
    }

    /// The dtype the wire tensor must have.
    #[must_use]
    pub fn dtype(&self) -> DType {
        self.spec.dtype()
    }

    /// The range taken: `(src_offset, bytes)`, `bytes` 0 meaning the rest of the tensor.
    #[must_use]
    pub fn src_range(&self) -> (u64, u64) {
        (self.src_offset, self.bytes)
    }

    /// The C descriptor of destination `i`, borrowing `self` (name, shape). A host destination
    /// gets its slice's length as `bytes`, once that is checked to be the range's.
    fn raw(&self, i: usize) -> Result<sys::wsync_dest_t> {
        let mut bytes = self.bytes;
        if let Some(len) = self.len {
            bytes = self.host_range(i, len)?;
        }
        let tensor = self.spec.raw(std::ptr::null(), crate::Device::CPU);
        Ok(sys::wsync_dest_t {
            name: tensor.name,
            data: self.data,
            shape: tensor.shape,
            ndim: tensor.ndim,
            dtype: tensor.dtype,
            src_offset: self.src_offset,
            bytes,
            flags: 0,
            ..sys::wsync_dest_t::sized()
        })
    }

    /// The bytes a host destination takes, which must be its slice's `len`: the library then
    /// writes at most the slice.
    fn host_range(&self, i: usize, len: usize) -> Result<u64> {
        let who = || format!("destination {i} ('{}')", self.spec.name().escape_debug());
        let dtype = self.spec.dtype();
        let tensor = self.spec.byte_size().ok_or_else(|| {
            Error::invalid(match dtype.size() {
                None => format!("{}: dtype {dtype} has no whole-byte element size", who()),
                Some(_) => format!("{}: shape {:?} overflows 64 bits", who(), self.spec.shape()),
            })
        })?;
        let take = if self.bytes == 0 {
            tensor.checked_sub(self.src_offset).ok_or_else(|| {
                Error::invalid(format!(
                    "{}: src_offset {} is past the tensor's {tensor} bytes ({dtype} {:?})",
                    who(),
                    self.src_offset,
                    self.spec.shape()
                ))
            })?
        } else {
            self.bytes
        };
        if len == 0 {
            return Err(Error::invalid(format!(
                "{}: the slice is empty (a destination takes at least one element)",
                who()
            )));
        }
        if take != len as u64 {
            return Err(Error::invalid(format!(
                "{}: takes {take} bytes of the wire tensor ({dtype} {:?}, {} bytes, from byte {}), \
                 the slice has {len}",
                who(),
                self.spec.shape(),
                tensor,
                self.src_offset
            )));
        }
        Ok(take)
    }
}

impl fmt::Debug for Dest<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dest")
            .field("name", &self.spec.name())
            .field("dtype", &self.spec.dtype().to_string())
            .field("shape", &self.spec.shape())
            .field("src_offset", &self.src_offset)
            .field("bytes", &self.bytes)
            .field("host_slice", &self.len.is_some())
            .finish()
    }
}

/// Where each wire tensor of one receiver lands (`wsync_dest_table_create`), declared once and
/// applied to every chunk with [`crate::Recv::apply`]. Owns the C table (dropping it destroys
/// it) and holds the destinations' memory borrowed for `'a`: host slices stay mutably borrowed
/// until the table is dropped, so nothing in Rust reads them while an apply may write them.
///
/// Making a table over host memory is cheap (no driver calls): an engine that keeps its
/// weights in Rust slices and reads them between versions makes a table per version and drops
/// it after the version's last chunk. The table remembers which destinations each version
/// wrote, for [`ApplyFlags::COMPLETE`]: use one table for every chunk of a version.
///
/// `Send`, not `Sync` (an apply updates that record):
///
/// ```
/// fn movable<T: Send>() {}
/// movable::<wsync::DestTable<'static>>();
/// ```
///
/// ```compile_fail,E0277
/// fn shared<T: Sync>() {}
/// shared::<wsync::DestTable<'static>>();
/// ```
///
/// The memory stays borrowed while the table lives:
///
/// ```compile_fail,E0502
/// # fn demo(receiver: &mut wsync::Receiver) -> wsync::Result<()> {
/// let mut w = vec![0f32; 16];
/// let table = wsync::DestTable::new(receiver, [wsync::Dest::new("w", &mut w, &[16])?])?;
/// println!("{}", w[0]); // error[E0502]: `w` is still borrowed mutably by the table
/// drop(table);
/// # Ok(()) }
/// ```
#[must_use = "a destination table does nothing until it is applied with Recv::apply"]
pub struct DestTable<'a> {
    raw: NonNull<sys::wsync_dest_table_t>,
    count: usize,
    _memory: PhantomData<&'a mut [u8]>,
}

// SAFETY: the table is the library's object plus the exclusive borrow of the destinations'
// memory; libwsync allows moving it between threads, and `&mut`/`&` plus !Sync keep it to one
// thread at a time.
unsafe impl Send for DestTable<'_> {}

impl<'a> DestTable<'a> {
    /// Makes the table of `receiver` from `dests` (at least one), which it takes by value so
    /// that no memory is declared in two tables. Each destination is checked now, by the
    /// binding (a host slice must be exactly the bytes its range takes) and by the library
    /// (name, dtype, shape as for a sent tensor; the range within the tensor and whole
    /// elements; for a GPU receiver, device memory of its GPU; two destinations of one name
    /// that overlap are refused). The table may outlive the receiver; an apply on another
    /// receiver's iteration is refused. Needs `&mut Receiver`, so no iteration is open.
    ///
    /// # Errors
    /// [`Status::InvalidArgument`] naming the destination (index and name) and why;
    /// [`Status::NoMemory`].
    pub fn new(
        receiver: &mut Receiver,
        dests: impl IntoIterator<Item = Dest<'a>>,
    ) -> Result<DestTable<'a>> {
        let dests: Vec<Dest<'a>> = dests.into_iter().collect();
        let raw_dests = dests
            .iter()
            .enumerate()
            .map(|(i, d)| d.raw(i))
            .collect::<Result<Vec<_>>>()?;
        let mut out: *mut sys::wsync_dest_table_t = std::ptr::null_mut();
        // SAFETY: the receiver is live and used by this thread only (`&mut`, so no iteration is
        // open); `raw_dests` are valid descriptors whose names and shapes `dests` keeps alive for
        // the call (the library copies them); every host `data` is a slice exclusively borrowed
        // for 'a with exactly `bytes` bytes (checked by `Dest::raw`), raw ones are the caller's
        // promise; `out` is a valid out-pointer.
        check(unsafe {
            sys::wsync_dest_table_create(
                receiver.as_raw(),
                raw_dests.as_ptr(),
                raw_dests.len(),
                &mut out,
            )
        })?;
        let raw = NonNull::new(out)
            .ok_or_else(|| Error::new(Status::Internal, "wsync_dest_table_create returned NULL"))?;
        Ok(DestTable {
            raw,
            count: dests.len(),
            _memory: PhantomData,
        })
    }

    /// Number of destinations.
    #[must_use]
    pub fn dest_count(&self) -> usize {
        self.count
    }

    /// The `wsync_dest_table_t` handle, still owned by this value: do not destroy it.
    #[must_use]
    pub fn as_raw(&self) -> *const sys::wsync_dest_table_t {
        self.raw.as_ptr()
    }
}

impl Drop for DestTable<'_> {
    fn drop(&mut self) {
        // SAFETY: `self.raw` came from wsync_dest_table_create and is destroyed exactly once;
        // no apply is running (it would borrow the table); work an apply queued keeps no
        // reference to the table (wsync.h).
        unsafe { sys::wsync_dest_table_destroy(self.raw.as_ptr()) }
    }
}

impl fmt::Debug for DestTable<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DestTable")
            .field("dests", &self.count)
            .finish_non_exhaustive()
    }
}

/// Flags of [`crate::Recv::apply`] (`WSYNC_APPLY_*`), combined with `|`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct ApplyFlags(u32);

impl ApplyFlags {
    /// No flag: every tensor of the chunk must have a destination.
    pub const NONE: ApplyFlags = ApplyFlags(0);
    /// Tensors of the chunk without a destination are left for the caller (views,
    /// [`crate::Recv::copy_into`]) instead of refused.
    pub const PARTIAL: ApplyFlags = ApplyFlags(sys::WSYNC_APPLY_PARTIAL);
    /// On the chunk that commits a version: refuse unless every destination of the table was
    /// written by this version's applies (this chunk's included), so a version that misses a
    /// tensor the engine holds never commits here.
    pub const COMPLETE: ApplyFlags = ApplyFlags(sys::WSYNC_APPLY_COMPLETE);

    /// The `WSYNC_APPLY_*` bits.
    #[must_use]
    pub const fn bits(self) -> u32 {
        self.0
    }

    /// Whether every flag of `other` is set here.
    #[must_use]
    pub const fn contains(self, other: ApplyFlags) -> bool {
        self.0 & other.0 == other.0
    }
}

impl BitOr for ApplyFlags {
    type Output = ApplyFlags;
    fn bitor(self, rhs: ApplyFlags) -> ApplyFlags {
        ApplyFlags(self.0 | rhs.0)
    }
}

impl BitOrAssign for ApplyFlags {
    fn bitor_assign(&mut self, rhs: ApplyFlags) {
        self.0 |= rhs.0;
    }
}

/// What [`crate::Recv::apply`] did (`wsync_apply_result_t`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct ApplyResult {
    /// Device kernel launches queued (0 for host memory, 0 or 1 for the GPU kinds).
    pub launches: u32,
    /// Entries of the chunk taken.
    pub tensors: u64,
    /// Destinations written (several per tied tensor).
    pub writes: u64,
    /// Entries without a destination, left for views or copies ([`ApplyFlags::PARTIAL`]).
    pub unmatched: u64,
    /// Bytes written into destinations.
    pub bytes: u64,
    /// The driver's device copies queued (large destinations on the GPU kinds; 0.6.1).
    pub device_copies: u64,
}

impl ApplyResult {
    pub(crate) fn from_raw(r: &sys::wsync_apply_result_t) -> ApplyResult {
        ApplyResult {
            launches: r.launches,
            tensors: r.tensors,
            writes: r.writes,
            unmatched: r.unmatched,
            bytes: r.bytes,
            device_copies: r.device_copies,
        }
    }
}
