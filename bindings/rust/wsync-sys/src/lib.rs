//! Raw declarations of libwsync's C ABI, `include/wsync.h` (version 0.2).
//!
//! Written by hand in the shape a generator would produce, so building needs no `bindgen` and
//! no C compiler. Every function, type and constant of the header is here under its C name;
//! the header stays the contract, and its comments (ownership, blocking, threads) apply
//! unchanged. Two tests keep this file honest: `tests/layout.rs` compares every struct's size,
//! alignment and field offsets with what the loaded library reports through
//! [`wsync_abi_layout`], and `tests/header.rs` parses `wsync.h` and checks that every function
//! name and every constant's value appears here.
//!
//! Use the `wsync` crate for a safe API; this crate is for that crate and for code that needs
//! exactly the C calls.
//!
//! Representation choices:
//! - `wsync_status_t` is an `i32` alias with one constant per status, not a Rust `enum`: the
//!   header says new codes may be added, and a value a Rust enum does not list would be
//!   undefined behaviour.
//! - `bool` is C99 `_Bool`, which Rust's `bool` matches in size, alignment and values.
//! - Handles are zero-sized opaque structs behind raw pointers, never dereferenced.
//! - Structs that may grow carry `struct_size` (0.2): callers set it to `size_of` the struct as
//!   declared here (the `sized()` constructors do), so a newer library knows which layout it
//!   was given and writes outputs only up to that size.

#![no_std]
#![deny(unsafe_op_in_unsafe_fn)]
#![allow(non_camel_case_types)]

use core::ffi::{c_char, c_void};
use core::marker::{PhantomData, PhantomPinned};

// =============================================================================================
// 1. Versions and statuses
// =============================================================================================

/// Major version of the header these declarations were written from.
pub const WSYNC_VERSION_MAJOR: u32 = 0;
/// Minor version of the header these declarations were written from.
pub const WSYNC_VERSION_MINOR: u32 = 7;
/// Patch version of the header these declarations were written from.
pub const WSYNC_VERSION_PATCH: u32 = 0;
/// `MAJOR * 10000 + MINOR * 100 + PATCH`, the header's one formula.
pub const WSYNC_VERSION_NUMBER: u32 =
    WSYNC_VERSION_MAJOR * 10000 + WSYNC_VERSION_MINOR * 100 + WSYNC_VERSION_PATCH;

/// Status of a call: `WSYNC_OK` (0) or one of the pinned `WSYNC_ERR_*` codes. 32 bits wide
/// (the header forces the enum to 32 bits). Unknown values must be treated as errors.
pub type wsync_status_t = i32;

/// Success.
pub const WSYNC_OK: wsync_status_t = 0;
/// A NULL, out-of-range or ill-formed argument or option.
pub const WSYNC_ERR_INVALID_ARGUMENT: wsync_status_t = 1;
/// Valid, but not supported by this strategy or build.
pub const WSYNC_ERR_UNSUPPORTED: wsync_status_t = 2;
/// A run-time dependency is missing (driver, NCCL, /dev/shm).
pub const WSYNC_ERR_UNAVAILABLE: wsync_status_t = 3;
/// A blob is truncated, corrupt, foreign or of a wrong version.
pub const WSYNC_ERR_MALFORMED: wsync_status_t = 4;
/// Well-formed but does not fit: other strategy, stale request, chunk out of order.
pub const WSYNC_ERR_MISMATCH: wsync_status_t = 5;
/// A deadline passed before the peers answered.
pub const WSYNC_ERR_TIMEOUT: wsync_status_t = 6;
/// A peer died, detached, or reported failure.
pub const WSYNC_ERR_PEER: wsync_status_t = 7;
/// An allocation or a shared-memory reservation failed.
pub const WSYNC_ERR_NO_MEMORY: wsync_status_t = 8;
/// A call out of order (e.g. receive while iterating).
pub const WSYNC_ERR_WRONG_STATE: wsync_status_t = 9;
/// An operating-system call failed; the message has errno.
pub const WSYNC_ERR_SYSTEM: wsync_status_t = 10;
/// A bug in libwsync.
pub const WSYNC_ERR_INTERNAL: wsync_status_t = 11;
/// Received bytes or a blob failed their checksum.
pub const WSYNC_ERR_INTEGRITY: wsync_status_t = 12;
/// The sender abandoned the version (a send failed, `wsync_sender_abandon`, or the trainer died
/// mid-version).
pub const WSYNC_ERR_ABANDONED: wsync_status_t = 13;
/// A later chunk of a version that already failed here, skipped unread (since 0.7.0).
pub const WSYNC_ERR_SKIPPED: wsync_status_t = 14;
/// Not a status: forces the C enum to 32 bits.
pub const WSYNC_STATUS_FORCE_32BIT_: wsync_status_t = 0x7fff_ffff;

// =============================================================================================
// 2. Tensors, chunks and blobs
// =============================================================================================

/// Element type, laid out as `DLPack`'s `DLDataType`; codes are `WSYNC_DTYPE_*`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct wsync_dtype_t {
    /// `WSYNC_DTYPE_*`.
    pub code: u8,
    /// Bits per lane: 8, 16, 32, 64, ...
    pub bits: u8,
    /// 1 for scalars.
    pub lanes: u16,
}

/// Signed integer.
pub const WSYNC_DTYPE_INT: u8 = 0;
/// Unsigned integer.
pub const WSYNC_DTYPE_UINT: u8 = 1;
/// IEEE floating point.
pub const WSYNC_DTYPE_FLOAT: u8 = 2;
/// bfloat16.
pub const WSYNC_DTYPE_BFLOAT: u8 = 4;
/// Complex (two floats per element).
pub const WSYNC_DTYPE_COMPLEX: u8 = 5;
/// Boolean, one byte per element.
pub const WSYNC_DTYPE_BOOL: u8 = 6;
/// float8 e3m4.
pub const WSYNC_DTYPE_FLOAT8_E3M4: u8 = 7;
/// float8 e4m3.
pub const WSYNC_DTYPE_FLOAT8_E4M3: u8 = 8;
/// float8 e4m3b11fnuz.
pub const WSYNC_DTYPE_FLOAT8_E4M3B11FNUZ: u8 = 9;
/// float8 e4m3fn.
pub const WSYNC_DTYPE_FLOAT8_E4M3FN: u8 = 10;
/// float8 e4m3fnuz.
pub const WSYNC_DTYPE_FLOAT8_E4M3FNUZ: u8 = 11;
/// float8 e5m2.
pub const WSYNC_DTYPE_FLOAT8_E5M2: u8 = 12;
/// float8 e5m2fnuz.
pub const WSYNC_DTYPE_FLOAT8_E5M2FNUZ: u8 = 13;
/// float8 e8m0fnu.
pub const WSYNC_DTYPE_FLOAT8_E8M0FNU: u8 = 14;
/// float6 e2m3fn.
pub const WSYNC_DTYPE_FLOAT6_E2M3FN: u8 = 15;
/// float6 e3m2fn.
pub const WSYNC_DTYPE_FLOAT6_E3M2FN: u8 = 16;
/// float4 e2m1fn.
pub const WSYNC_DTYPE_FLOAT4_E2M1FN: u8 = 17;

/// Where a tensor's bytes live, laid out as `DLPack`'s `DLDevice`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct wsync_device_t {
    /// `WSYNC_DEVICE_*`.
    pub type_: i32,
    /// Device ordinal; 0 for host memory.
    pub index: i32,
}

/// Host memory.
pub const WSYNC_DEVICE_CPU: i32 = 1;
/// CUDA device memory.
pub const WSYNC_DEVICE_CUDA: i32 = 2;
/// Pinned host memory (treated as host memory).
pub const WSYNC_DEVICE_CUDA_HOST: i32 = 3;
/// `ROCm` device memory.
pub const WSYNC_DEVICE_ROCM: i32 = 10;
/// `ROCm` pinned host memory.
pub const WSYNC_DEVICE_ROCM_HOST: i32 = 11;
/// CUDA managed memory.
pub const WSYNC_DEVICE_CUDA_MANAGED: i32 = 13;

/// Most dimensions a tensor may have.
pub const WSYNC_MAX_NDIM: i32 = 16;
/// Most tensors one chunk may hold (receivers refuse more).
pub const WSYNC_MAX_CHUNK_TENSORS: usize = 4_194_304;
/// Longest tensor name in bytes, without the NUL.
pub const WSYNC_MAX_NAME_BYTES: usize = 1024;
/// Largest blob (init info or request) any call reads: 256 MiB (0.5).
pub const WSYNC_MAX_BLOB_BYTES: usize = 268_435_456;

/// `wsync_tensor_t.flags`: set on views whose memory must not be written.
pub const WSYNC_TENSOR_READ_ONLY: u32 = 1;
/// `wsync_tensor_t.flags` from `wsync_recv_peek()`: the entry crossed as a delta patch; take it
/// with [`wsync_recv_patch`] or [`wsync_recv_copy`], not as a view (0.5).
pub const WSYNC_TENSOR_PATCH: u32 = 2;

/// A tensor descriptor (input) or view (output). See the header for every field's rules.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct wsync_tensor_t {
    /// NUL-terminated UTF-8, 1..=`WSYNC_MAX_NAME_BYTES` bytes.
    pub name: *const c_char,
    /// First element.
    pub data: *mut c_void,
    /// `ndim` extents, each >= 1.
    pub shape: *const i64,
    /// NULL, or `ndim` row-major strides in elements.
    pub strides: *const i64,
    /// 0..=`WSYNC_MAX_NDIM`; 0 is a scalar.
    pub ndim: i32,
    /// Element type.
    pub dtype: wsync_dtype_t,
    /// Where the bytes live.
    pub device: wsync_device_t,
    /// `WSYNC_TENSOR_*`; 0 on input.
    pub flags: u32,
    /// 0 or `size_of::<wsync_tensor_t>()` (the 0.2 layout); in an array the first element's
    /// value is the stride and every element must carry the same value.
    pub struct_size: u32,
}

/// `size_of::<T>()` as the `u32` a `struct_size` field holds.
// The structs with `struct_size` are a few hundred bytes at most: the cast cannot truncate.
#[allow(clippy::cast_possible_truncation)]
const fn struct_size_of<T>() -> u32 {
    core::mem::size_of::<T>() as u32
}

impl wsync_tensor_t {
    /// [`Default::default`] with `struct_size` set to this declaration's size.
    #[must_use]
    pub fn sized() -> Self {
        Self {
            struct_size: struct_size_of::<Self>(),
            ..Self::default()
        }
    }
}

impl Default for wsync_tensor_t {
    /// All pointers NULL, all numbers 0 (`struct_size` too: the 0.2 layout): the state the
    /// library expects to overwrite.
    fn default() -> Self {
        Self {
            name: core::ptr::null(),
            data: core::ptr::null_mut(),
            shape: core::ptr::null(),
            strides: core::ptr::null(),
            ndim: 0,
            dtype: wsync_dtype_t::default(),
            device: wsync_device_t::default(),
            flags: 0,
            struct_size: 0,
        }
    }
}

/// `wsync_chunk_t.flags`: this chunk commits the current sync version.
pub const WSYNC_CHUNK_LAST: u32 = 1;

/// The tensors moved by one `wsync_sender_send_chunk()`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct wsync_chunk_t {
    /// `count` descriptors, borrowed for the call.
    pub tensors: *const wsync_tensor_t,
    /// At least 1; or 0 with `WSYNC_CHUNK_LAST` and `tensors` NULL: an empty closing chunk,
    /// the same as `wsync_sender_commit()`.
    pub count: usize,
    /// `WSYNC_CHUNK_*`.
    pub flags: u32,
    /// 0 or `size_of::<wsync_chunk_t>()`.
    pub struct_size: u32,
}

/// A byte range of one tensor (a part of a split tensor, 0.5): `bytes` 0 is the whole tensor.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct wsync_part_t {
    /// First byte of the part within the whole tensor.
    pub offset: u64,
    /// The part's size; 0: the whole tensor (offset 0).
    pub bytes: u64,
}

/// A delta patch as flat element indices and values, written by [`wsync_recv_patch`] (0.5).
/// The pointers stay valid until the iteration ends.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct wsync_patch_t {
    /// Set by the caller: 0 or `size_of::<wsync_patch_t>()`.
    pub struct_size: u32,
    /// 32: `indices` are `i32` (at most 2^31 elements); 64: `i64`.
    pub index_bits: u32,
    /// The version the patch applies to (the receiver's completed one).
    pub base_version: u64,
    /// Changed elements: entries of `indices` and of `values`.
    pub count: u64,
    /// The tensor's element count.
    pub elements: u64,
    /// `count` flat row-major indices, strictly increasing, each < `elements`.
    pub indices: *const c_void,
    /// `count` elements of the tensor's dtype, in index order (the new bits).
    pub values: *const c_void,
    /// XXH3-64 (seed 0) of the tensor's bytes at `base_version`.
    pub base_xxh3: u64,
    /// XXH3-64 (seed 0) of the tensor's bytes once patched.
    pub result_xxh3: u64,
}

impl wsync_patch_t {
    /// All zero but `struct_size`: ready for [`wsync_recv_patch`].
    #[must_use]
    pub fn sized() -> Self {
        Self {
            struct_size: struct_size_of::<Self>(),
            ..Self::default()
        }
    }
}

impl Default for wsync_patch_t {
    fn default() -> Self {
        Self {
            struct_size: 0,
            index_bits: 0,
            base_version: 0,
            count: 0,
            elements: 0,
            indices: core::ptr::null(),
            values: core::ptr::null(),
            base_xxh3: 0,
            result_xxh3: 0,
        }
    }
}

/// Bytes owned by the library; free with [`wsync_blob_free`].
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct wsync_blob_t {
    /// First byte, or NULL.
    pub data: *mut u8,
    /// Number of bytes.
    pub size: usize,
}

impl Default for wsync_blob_t {
    /// `{NULL, 0}`, the empty blob.
    fn default() -> Self {
        Self {
            data: core::ptr::null_mut(),
            size: 0,
        }
    }
}

// =============================================================================================
// Opaque handles
// =============================================================================================

macro_rules! opaque {
    ($($(#[$doc:meta])* $name:ident;)*) => {$(
        $(#[$doc])*
        #[repr(C)]
        pub struct $name {
            _private: [u8; 0],
            // Not Send, not Sync, not Unpin: only the library knows what is behind it.
            _marker: PhantomData<(*mut u8, PhantomPinned)>,
        }
    )*};
}

opaque! {
    /// A strategy (opaque).
    wsync_strategy_t;
    /// A sender, trainer side (opaque).
    wsync_sender_t;
    /// A receiver, engine side (opaque).
    wsync_receiver_t;
    /// An open receive iteration (opaque).
    wsync_recv_t;
    /// A plan: tensors grouped into chunks (opaque).
    wsync_plan_t;
    /// A destination table: where each wire tensor of a receiver lands (opaque; 0.6).
    wsync_dest_table_t;
}

// =============================================================================================
// 4. Receiver failures as the sender learns them
// =============================================================================================

/// `wsync_failure_t.what`: the receiver failed a chunk (its loader, checksum, order).
pub const WSYNC_FAILURE_FAILED: u32 = 1;
/// `wsync_failure_t.what`: the receiver's process died owing a chunk.
pub const WSYNC_FAILURE_DIED: u32 = 2;
/// `wsync_failure_t.what`: the receiver was destroyed owing a chunk.
pub const WSYNC_FAILURE_DETACHED: u32 = 3;
/// `wsync_failure_t.what`: the receiver did not answer by the deadline.
pub const WSYNC_FAILURE_TIMEOUT: u32 = 4;
/// `wsync_failure_t.what`: the receiver was dropped by the sender.
pub const WSYNC_FAILURE_DROPPED: u32 = 5;
/// `wsync_failure_t.chunk_index` when no chunk is known (`UINT32_MAX`).
pub const WSYNC_NO_CHUNK: u32 = u32::MAX;
/// `wsync_sender_wait_released`: every version, i.e. no receiver maps anything of the sender.
pub const WSYNC_ALL_VERSIONS: u64 = u64::MAX;

/// One receiver's failure as the sender learnt it: data, not only text.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct wsync_failure_t {
    /// Set by the caller: 0 or `size_of::<wsync_failure_t>()`.
    pub struct_size: u32,
    /// `WSYNC_FAILURE_*`.
    pub what: u32,
    /// The receiver's own status; `WSYNC_ERR_PEER` for a death, `WSYNC_ERR_TIMEOUT`.
    pub status: wsync_status_t,
    /// Receiver index.
    pub receiver: u32,
    /// Version of the chunk, 0 if unknown.
    pub version: u64,
    /// Chunk within that version, or [`WSYNC_NO_CHUNK`].
    pub chunk_index: u32,
    /// The receiver's pid as it saw itself, 0 if unknown (for messages only).
    pub pid: i32,
    /// The receiver's own message, NUL-terminated, possibly cut.
    pub message: [c_char; 256],
}

impl wsync_failure_t {
    /// All zero but `struct_size`, set to this declaration's size: ready for
    /// [`wsync_sender_failure`].
    #[must_use]
    pub fn sized() -> Self {
        Self {
            struct_size: struct_size_of::<Self>(),
            ..Self::default()
        }
    }
}

impl Default for wsync_failure_t {
    /// All zero (`struct_size` 0: the 0.2 layout).
    fn default() -> Self {
        Self {
            struct_size: 0,
            what: 0,
            status: WSYNC_OK,
            receiver: 0,
            version: 0,
            chunk_index: 0,
            pid: 0,
            message: [0; 256],
        }
    }
}

// =============================================================================================
// 5. Receiver state and receive iteration summary
// =============================================================================================

/// `wsync_receiver_state_t.flags`: the sender dropped this receiver.
pub const WSYNC_RECEIVER_DROPPED: u32 = 1;
/// `wsync_receiver_state_t.flags`: the trainer's process is gone (`"shm"`, `"cuda_ipc"`).
pub const WSYNC_RECEIVER_SENDER_GONE: u32 = 2;
/// `wsync_receiver_state_t.flags`: chunks are acknowledged only after the loader's work queued
/// on the receiver's stream before ending them (`"cuda_ipc"` with `"synchronize"`; 0.5).
pub const WSYNC_RECEIVER_ORDERS_LOADER_WORK: u32 = 4;

/// Where a receiver stands: the rollback hook (see the header's section 5).
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct wsync_receiver_state_t {
    /// Set by the caller: 0 or `size_of::<wsync_receiver_state_t>()`.
    pub struct_size: u32,
    /// `WSYNC_RECEIVER_*`.
    pub flags: u32,
    /// As `wsync_receiver_completed_version()`.
    pub completed_version: u64,
    /// Version begun here and neither committed nor failed, or 0.
    pub open_version: u64,
    /// Newest version begun here that failed or was abandoned, or 0.
    pub failed_version: u64,
    /// Why `failed_version` failed; `WSYNC_OK` when it is 0.
    pub failed_status: wsync_status_t,
    /// Written 0.
    pub reserved_: u32,
}

impl wsync_receiver_state_t {
    /// All zero but `struct_size`: ready for [`wsync_receiver_poll`].
    #[must_use]
    pub fn sized() -> Self {
        Self {
            struct_size: struct_size_of::<Self>(),
            ..Self::default()
        }
    }
}

/// What an iteration carries; with `WSYNC_CHUNK_LAST` also the version's manifest.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct wsync_recv_info_t {
    /// Set by the caller: 0 or `size_of::<wsync_recv_info_t>()`.
    pub struct_size: u32,
    /// `WSYNC_CHUNK_LAST` if this chunk commits the version.
    pub flags: u32,
    /// Sync version of this chunk.
    pub version: u64,
    /// Payload bytes of all tensors.
    pub bytes: u64,
    /// Number of tensors (0 for a commit without data).
    pub count: u64,
    /// 0-based position of the chunk within its version.
    pub chunk_index: u32,
    /// With `WSYNC_CHUNK_LAST`: chunks in the version (manifest), else 0.
    pub version_chunks: u32,
    /// With `WSYNC_CHUNK_LAST`: tensors in the version, else 0.
    pub version_tensors: u64,
    /// With `WSYNC_CHUNK_LAST`: payload bytes of the version, else 0.
    pub version_bytes: u64,
}

impl wsync_recv_info_t {
    /// All zero but `struct_size`: ready for [`wsync_recv_info`].
    #[must_use]
    pub fn sized() -> Self {
        Self {
            struct_size: struct_size_of::<Self>(),
            ..Self::default()
        }
    }
}

// =============================================================================================
// 5. Destination tables: a whole chunk loaded by one call (0.6)
// =============================================================================================

/// One destination of a table ([`wsync_dest_table_create`]): which wire tensor it takes (name,
/// dtype, shape: checked against the request before any byte moves), where its bytes land, and
/// which bytes of it it takes (`src_offset`, `bytes`, as [`wsync_recv_copy`]'s offset and len).
/// Borrowed for the create call; the table copies names and shapes, not the memory.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct wsync_dest_t {
    /// The wire tensor's name as the request carries it (1..=`WSYNC_MAX_NAME_BYTES` bytes,
    /// NUL-terminated).
    pub name: *const c_char,
    /// Where byte `src_offset` of the wire tensor lands: host memory the caller owns, or device
    /// memory of the receiver's GPU.
    pub data: *mut c_void,
    /// `ndim` extents the wire tensor must have.
    pub shape: *const i64,
    /// 0..=`WSYNC_MAX_NDIM`.
    pub ndim: i32,
    /// The dtype the wire tensor must have (no cast is made).
    pub dtype: wsync_dtype_t,
    /// First byte of the wire tensor taken; a multiple of the element size.
    pub src_offset: u64,
    /// Bytes taken from `src_offset`; 0: the rest of the tensor.
    pub bytes: u64,
    /// Must be 0.
    pub flags: u32,
    /// 0 or `size_of::<wsync_dest_t>()`.
    pub struct_size: u32,
}

impl wsync_dest_t {
    /// [`Default::default`] with `struct_size` set to this declaration's size.
    #[must_use]
    pub fn sized() -> Self {
        Self {
            struct_size: struct_size_of::<Self>(),
            ..Self::default()
        }
    }
}

impl Default for wsync_dest_t {
    /// All pointers NULL, all numbers 0 (`struct_size` too).
    fn default() -> Self {
        Self {
            name: core::ptr::null(),
            data: core::ptr::null_mut(),
            shape: core::ptr::null(),
            ndim: 0,
            dtype: wsync_dtype_t::default(),
            src_offset: 0,
            bytes: 0,
            flags: 0,
            struct_size: 0,
        }
    }
}

/// [`wsync_recv_apply`] flag: tensors of the chunk without a destination are left for the
/// caller (views, [`wsync_recv_copy`]) instead of refused.
pub const WSYNC_APPLY_PARTIAL: u32 = 1;
/// [`wsync_recv_apply`] flag: on the chunk that commits a version (`WSYNC_CHUNK_LAST`), refuse
/// unless every destination of the table was written by this version's applies (this chunk's
/// included), so a version that misses a tensor the engine holds never commits here.
pub const WSYNC_APPLY_COMPLETE: u32 = 2;

/// What [`wsync_recv_apply`] did.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct wsync_apply_result_t {
    /// Set by the caller: 0 or `size_of::<wsync_apply_result_t>()`.
    pub struct_size: u32,
    /// Device kernel launches queued (0 or 1 for the GPU kinds).
    pub launches: u32,
    /// Entries of the chunk taken.
    pub tensors: u64,
    /// Destinations written (several per tied tensor).
    pub writes: u64,
    /// Entries without a destination (left, `WSYNC_APPLY_PARTIAL`).
    pub unmatched: u64,
    /// Bytes written into destinations.
    pub bytes: u64,
    /// 0.6.1: the driver's device copies queued (one per destination of
    /// [`WSYNC_APPLY_DRIVER_COPY_MIN`] bytes or more, on the GPU kinds).
    pub device_copies: u64,
}

/// The 0.6.0 layout's size of `wsync_apply_result_t` (every field before `device_copies`): a
/// caller built then passes it and gets those fields (0.7.0 accepts every older layout).
pub const WSYNC_APPLY_RESULT_SIZE_0_6_0: u32 = 40;

/// The smallest device destination `wsync_recv_apply` gives to the driver's own copy.
pub const WSYNC_APPLY_DRIVER_COPY_MIN: u32 = 4 << 20;

impl wsync_apply_result_t {
    /// All zero but `struct_size`: ready for [`wsync_recv_apply`].
    #[must_use]
    pub fn sized() -> Self {
        Self {
            struct_size: struct_size_of::<Self>(),
            ..Self::default()
        }
    }
}

// =============================================================================================
// Functions, in the header's order
// =============================================================================================

extern "C" {
    // --- 1. versions and statuses ----------------------------------------------------------

    /// The loaded library's version number (`MAJOR * 10000 + MINOR * 100 + PATCH`).
    pub fn wsync_version_number() -> u32;
    /// The loaded library's version as static text; never NULL, never freed.
    pub fn wsync_version_string() -> *const c_char;
    /// Static name of a status; `"WSYNC_ERR_UNKNOWN"` for unknown values.
    pub fn wsync_status_string(status: wsync_status_t) -> *const c_char;
    /// Message of the calling thread's last failure; never NULL; valid until the next failure.
    pub fn wsync_last_error() -> *const c_char;

    // --- 2. blobs and strings ----------------------------------------------------------------

    /// Frees `blob->data` and sets `*blob` to `{NULL, 0}`; NULL is a no-op.
    pub fn wsync_blob_free(blob: *mut wsync_blob_t);
    /// Frees a string returned by the library; NULL is a no-op.
    pub fn wsync_string_free(str_: *mut c_char);

    // --- 3. strategies -------------------------------------------------------------------------

    /// Creates a strategy of `kind` with JSON options (NULL or "" for defaults).
    pub fn wsync_strategy_create(
        kind: *const c_char,
        options_json: *const c_char,
        out: *mut *mut wsync_strategy_t,
    ) -> wsync_status_t;
    /// Destroys a strategy; NULL is a no-op.
    pub fn wsync_strategy_destroy(strategy: *mut wsync_strategy_t);
    /// Writes the strategy's kind name (static text) to `*kind_out`.
    pub fn wsync_strategy_kind(
        strategy: *const wsync_strategy_t,
        kind_out: *mut *const c_char,
    ) -> wsync_status_t;
    /// Lists the kinds this build knows as JSON; free with [`wsync_string_free`].
    pub fn wsync_strategy_kinds(json_out: *mut *mut c_char) -> wsync_status_t;
    /// Describes a kind's options as JSON; free with [`wsync_string_free`].
    pub fn wsync_strategy_describe_options(
        kind: *const c_char,
        json_out: *mut *mut c_char,
    ) -> wsync_status_t;
    /// Makes the init info (once per strategy); free with [`wsync_blob_free`].
    pub fn wsync_strategy_create_init_info(
        strategy: *mut wsync_strategy_t,
        out: *mut wsync_blob_t,
    ) -> wsync_status_t;

    // --- 4. sender ----------------------------------------------------------------------------

    /// Creates a sender from init info.
    pub fn wsync_sender_create(
        strategy: *mut wsync_strategy_t,
        init: *const u8,
        len: usize,
        out: *mut *mut wsync_sender_t,
    ) -> wsync_status_t;
    /// Destroys a sender without waiting; NULL is a no-op.
    pub fn wsync_sender_destroy(sender: *mut wsync_sender_t);
    /// Sends one chunk and writes its request blob. Blocks up to the strategy's `timeout_ms`.
    pub fn wsync_sender_send_chunk(
        sender: *mut wsync_sender_t,
        chunk: *const wsync_chunk_t,
        request_out: *mut wsync_blob_t,
    ) -> wsync_status_t;
    /// `wsync_sender_send_chunk` with one range per tensor (`parts` NULL or `chunk.count` of
    /// them): parts of split tensors (0.5).
    pub fn wsync_sender_send_parts(
        sender: *mut wsync_sender_t,
        chunk: *const wsync_chunk_t,
        parts: *const wsync_part_t,
        request_out: *mut wsync_blob_t,
    ) -> wsync_status_t;
    /// Commits the current version without data; writes the request to forward. Blocks like
    /// `send_chunk`; a failure abandons the version.
    pub fn wsync_sender_commit(
        sender: *mut wsync_sender_t,
        request_out: *mut wsync_blob_t,
    ) -> wsync_status_t;
    /// Abandons the current version if it has published a chunk. Does not block.
    pub fn wsync_sender_abandon(sender: *mut wsync_sender_t) -> wsync_status_t;
    /// Waits until every receiver (but dropped ones) acknowledged every chunk. Blocks up to
    /// `timeout_ms`.
    pub fn wsync_sender_flush(sender: *mut wsync_sender_t, timeout_ms: i64) -> wsync_status_t;
    /// Waits until no receiver maps memory the sender shared up to `version` that `version`
    /// no longer uses ([`WSYNC_ALL_VERSIONS`]: any memory), so the trainer may free it. Returns
    /// at once for kinds that copy while sending. Blocks up to `timeout_ms`.
    pub fn wsync_sender_wait_released(
        sender: *mut wsync_sender_t,
        version: u64,
        timeout_ms: i64,
    ) -> wsync_status_t;
    /// The sync version the next chunk will belong to.
    pub fn wsync_sender_version(
        sender: *const wsync_sender_t,
        version_out: *mut u64,
    ) -> wsync_status_t;
    /// Stops waiting for receiver `index`. Does not block.
    pub fn wsync_sender_drop_receiver(sender: *mut wsync_sender_t, index: u32) -> wsync_status_t;
    /// The CUDA stream (`CUstream`) the caller queues its writes to the tensors on; NULL: the
    /// legacy default stream. Borrowed until the next call or the sender's destruction.
    pub fn wsync_sender_set_stream(
        sender: *mut wsync_sender_t,
        stream: *mut c_void,
    ) -> wsync_status_t;
    /// The sender's arena (shm's `"arena_bytes"`): `*base`/`*bytes`, NULL/0 without one.
    /// Tensors lying in it (256-byte aligned) are sent in place and borrowed until flushed.
    pub fn wsync_sender_arena(
        sender: *const wsync_sender_t,
        base: *mut *mut c_void,
        bytes: *mut u64,
    ) -> wsync_status_t;
    /// How many receiver failures the sender's last failed call found.
    pub fn wsync_sender_failure_count(
        sender: *const wsync_sender_t,
        count_out: *mut usize,
    ) -> wsync_status_t;
    /// Failure `i` of the last failed call, written up to `out->struct_size`.
    pub fn wsync_sender_failure(
        sender: *const wsync_sender_t,
        i: usize,
        out: *mut wsync_failure_t,
    ) -> wsync_status_t;
    /// Merges the partial requests of several senders of one chunk.
    pub fn wsync_request_merge(
        parts: *const wsync_blob_t,
        n: usize,
        out: *mut wsync_blob_t,
    ) -> wsync_status_t;

    // --- 5. receiver and receive iteration -------------------------------------------------

    /// Creates receiver number `index` from init info.
    pub fn wsync_receiver_create(
        strategy: *mut wsync_strategy_t,
        init: *const u8,
        len: usize,
        index: u32,
        out: *mut *mut wsync_receiver_t,
    ) -> wsync_status_t;
    /// Destroys a receiver (ending an open iteration as failed); NULL is a no-op.
    pub fn wsync_receiver_destroy(receiver: *mut wsync_receiver_t);
    /// Starts receiving the chunk a request describes.
    pub fn wsync_receiver_receive(
        receiver: *mut wsync_receiver_t,
        request: *const u8,
        len: usize,
        out: *mut *mut wsync_recv_t,
    ) -> wsync_status_t;
    /// The newest sync version this receiver completed successfully (0 if none).
    pub fn wsync_receiver_completed_version(
        receiver: *const wsync_receiver_t,
        version_out: *mut u64,
    ) -> wsync_status_t;
    /// Brings the receiver's view up to date and writes it, up to `out->struct_size`. Not while
    /// an iteration is open.
    pub fn wsync_receiver_poll(
        receiver: *mut wsync_receiver_t,
        out: *mut wsync_receiver_state_t,
    ) -> wsync_status_t;
    /// The CUDA stream (`CUstream`) the loader queues its copies out of views on; NULL: the
    /// legacy default stream. Borrowed until the next call or the receiver's destruction.
    pub fn wsync_receiver_set_stream(
        receiver: *mut wsync_receiver_t,
        stream: *mut c_void,
    ) -> wsync_status_t;
    /// Lands the chunks this receiver pulls straight in the host destinations of `table` (made
    /// for it; NULL stops): `ucx` over its data stream reads each tensor with exactly one
    /// destination of its dtype and shape from the socket into it (0.8). The destinations'
    /// memory must stay writable until landing stops or the receiver is destroyed.
    pub fn wsync_receiver_land(
        receiver: *mut wsync_receiver_t,
        table: *const wsync_dest_table_t,
    ) -> wsync_status_t;
    /// Writes the iteration's summary, up to `info->struct_size` (set it first).
    pub fn wsync_recv_info(it: *const wsync_recv_t, info: *mut wsync_recv_info_t)
        -> wsync_status_t;
    /// Describes tensor `i` without touching its bytes (`view->data` is NULL).
    pub fn wsync_recv_peek(
        it: *const wsync_recv_t,
        i: usize,
        view: *mut wsync_tensor_t,
    ) -> wsync_status_t;
    /// Yields the next tensor view, or `*has_view = false` at the end.
    pub fn wsync_recv_next(
        it: *mut wsync_recv_t,
        view: *mut wsync_tensor_t,
        has_view: *mut bool,
    ) -> wsync_status_t;
    /// `wsync_recv_next` that also yields parts: the view's data is the part's first byte (0.5).
    pub fn wsync_recv_next_part(
        it: *mut wsync_recv_t,
        view: *mut wsync_tensor_t,
        part: *mut wsync_part_t,
        has_view: *mut bool,
    ) -> wsync_status_t;
    /// The byte range entry `i` carries of its tensor (0.5).
    pub fn wsync_recv_part(
        it: *const wsync_recv_t,
        i: usize,
        out: *mut wsync_part_t,
    ) -> wsync_status_t;
    /// Copies bytes `[offset, offset + len)` of tensor `i` into `dst` (host memory, `len`
    /// bytes) with the library's copy loop, verifying the tensor's checksum in the same pass.
    pub fn wsync_recv_copy(
        it: *mut wsync_recv_t,
        i: usize,
        offset: u64,
        dst: *mut c_void,
        len: u64,
    ) -> wsync_status_t;
    /// Entry `i`, which crossed as a delta patch, as flat indices and values, checked without
    /// the base (base version, checksum, structure); the entry is then taken and the engine
    /// applies it (0.5).
    pub fn wsync_recv_patch(
        it: *mut wsync_recv_t,
        i: usize,
        out: *mut wsync_patch_t,
    ) -> wsync_status_t;
    /// Makes a destination table for `receiver` from `n >= 1` destinations (borrowed for the
    /// call; names and shapes are copied, not the memory), each checked now (name, dtype,
    /// shape, range, data; device memory of the receiver's GPU for the GPU kinds). Free it with
    /// [`wsync_dest_table_destroy`], before or after the receiver (0.6).
    pub fn wsync_dest_table_create(
        receiver: *mut wsync_receiver_t,
        dests: *const wsync_dest_t,
        n: usize,
        out: *mut *mut wsync_dest_table_t,
    ) -> wsync_status_t;
    /// Frees a table; NULL is a no-op. Work a [`wsync_recv_apply`] queued keeps no reference to
    /// it (0.6).
    pub fn wsync_dest_table_destroy(table: *mut wsync_dest_table_t);
    /// Loads the chunk of `it` into the destinations of `table` (made for the iteration's
    /// receiver), as [`wsync_recv_copy`] of every matched entry into each of its destinations;
    /// every entry is checked first, and a refusal leaves the iteration unchanged. GPU kinds
    /// queue one kernel launch on the loader's stream and return without waiting. `flags`:
    /// `WSYNC_APPLY_*`; `out` may be NULL, else written up to `out->struct_size` (0.6).
    pub fn wsync_recv_apply(
        it: *mut wsync_recv_t,
        table: *const wsync_dest_table_t,
        flags: u32,
        out: *mut wsync_apply_result_t,
    ) -> wsync_status_t;
    /// Ends (acknowledges and frees) an iteration; `it` is invalid afterwards.
    pub fn wsync_recv_end(it: *mut wsync_recv_t) -> wsync_status_t;
    /// Fails an iteration at any point (also after its last view) with `status` and `message`
    /// (NULL or NUL-terminated UTF-8, cut to 255 bytes); frees it; `it` is invalid afterwards.
    pub fn wsync_recv_fail(
        it: *mut wsync_recv_t,
        status: wsync_status_t,
        message: *const c_char,
    ) -> wsync_status_t;

    // --- 6. planner ---------------------------------------------------------------------------

    /// Groups `n` tensor descriptors into chunks.
    pub fn wsync_plan_create(
        metas: *const wsync_tensor_t,
        n: usize,
        options_json: *const c_char,
        out: *mut *mut wsync_plan_t,
    ) -> wsync_status_t;
    /// Destroys a plan; NULL is a no-op.
    pub fn wsync_plan_destroy(plan: *mut wsync_plan_t);
    /// Number of chunks.
    pub fn wsync_plan_chunk_count(
        plan: *const wsync_plan_t,
        count_out: *mut usize,
    ) -> wsync_status_t;
    /// Chunk `i`: ascending indices into the planned metas (owned by the plan), and its bytes.
    pub fn wsync_plan_chunk(
        plan: *const wsync_plan_t,
        i: usize,
        indices_out: *mut *const usize,
        count_out: *mut usize,
        bytes_out: *mut u64,
    ) -> wsync_status_t;
    /// Chunk `i`'s ranges, one per index (owned by the plan; 0.5).
    pub fn wsync_plan_chunk_parts(
        plan: *const wsync_plan_t,
        i: usize,
        parts_out: *mut *const wsync_part_t,
    ) -> wsync_status_t;

    // --- 7. blobs and introspection -----------------------------------------------------------

    /// Renders any blob as JSON; free with [`wsync_string_free`].
    pub fn wsync_blob_describe(
        blob: *const u8,
        len: usize,
        json_out: *mut *mut c_char,
    ) -> wsync_status_t;
    /// Sizes, alignments and field offsets of the header's structs as JSON; free with
    /// [`wsync_string_free`].
    pub fn wsync_abi_layout(json_out: *mut *mut c_char) -> wsync_status_t;
}

// =============================================================================================
// The library this crate was built against
// =============================================================================================

/// `WSYNC_VERSION_NUMBER` of the `wsync.h` that build.rs found beside the library it linked
/// (its include directory, or a `CMake` build directory's source tree), or 0 if it found none
/// (a docs-only build). The `wsync` crate requires the loaded library to be at least this.
pub const WSYNC_BUILT_AGAINST_VERSION_NUMBER: u32 = parse_u32(env!("WSYNC_SYS_BUILT_AGAINST"));

const fn parse_u32(text: &str) -> u32 {
    let bytes = text.as_bytes();
    let mut value = 0u32;
    let mut i = 0;
    while i < bytes.len() {
        assert!(
            bytes[i].is_ascii_digit(),
            "WSYNC_SYS_BUILT_AGAINST is not a number"
        );
        value = value * 10 + (bytes[i] - b'0') as u32;
        i += 1;
    }
    value
}
