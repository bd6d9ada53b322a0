//! Safe Rust API of libwsync: move model weights from RL trainers to inference engines.
//!
//! The trainer makes a [`Strategy`], its init info ([`Strategy::create_init_info`]) and a
//! [`Sender`]; each engine makes a [`Receiver`] from the same init-info bytes. Every training
//! step the trainer sends chunks of [`TensorRef`]s (grouped by a [`Plan`]) and gets one request
//! blob per chunk; a controller forwards those bytes to every engine, which iterates over the
//! chunk's [`View`]s, copies them into its parameters and ends the iteration, acknowledging the
//! chunk. [`Sender::flush`] returns once every engine has acknowledged every chunk.
//!
//! ```no_run
//! use std::time::Duration;
//! use wsync::{Options, Receiver, Sender, Strategy, TensorRef};
//!
//! # fn main() -> wsync::Result<()> {
//! // Trainer.
//! let opts = Options::new().uint("receivers", 1).uint("bucket_bytes", 1 << 20);
//! let mut strategy = Strategy::with_options("shm", &opts)?;
//! let init = strategy.create_init_info()?;            // forward to every engine
//! let mut sender = Sender::new(&mut strategy, &init)?;
//!
//! // Engine (usually another process, given `init` by the controller).
//! let mut engine_strategy = Strategy::new("shm", "")?;
//! let mut receiver = Receiver::new(&mut engine_strategy, &init, 0)?;
//!
//! let weights = vec![0.5f32; 1024];
//! let request = sender.send_chunk(&[TensorRef::new("layers.0.w", &weights, &[32, 32])?], true)?;
//!
//! let mut recv = receiver.receive(&request)?;          // forwarded request bytes
//! for view in recv.views() {
//!     let view = view?;
//!     let values: Vec<f32> = view.to_vec()?;           // copied out; dtype checked
//!     assert_eq!(values.len(), 1024);
//! }
//! recv.end()?;                                         // acknowledges the chunk
//! sender.flush(Duration::from_secs(10))?;
//! assert_eq!(receiver.completed_version()?, 1);
//! # Ok(()) }
//! ```
//!
//! # Features
//!
//! * `half`: the `wsync::half` module, `Bf16` (bfloat16) and `F16` (IEEE float16)
//!   element types with `f32` conversions, written in this crate (no crates.io dependency).
//!   Without it, hold 16-bit floats as `u16` bits ([`TensorRef::with_dtype`],
//!   [`View::as_raw_elements`]).
//! * `static`, `rpath`: how `wsync-sys` links libwsync (see the README).
//!
//! # Safety model
//!
//! * Handles ([`Strategy`], [`Sender`], [`Receiver`], [`Plan`]) own a `NonNull` pointer and free
//!   it in `Drop`. They are `Send` but not `Sync`: libwsync allows a handle to move between
//!   threads but requires callers to use it from one thread at a time.
//! * A receive iteration ([`Recv`]) mutably borrows its receiver, and every [`View`] borrows
//!   the iteration, so no view outlives the memory it points at and no second iteration can be
//!   opened on a receiver (both are compile errors; see "Lifetimes of views" below).
//! * [`TensorRef`] checks `shape x element size == slice length` before the library sees the
//!   pointer, so the library never reads past a Rust slice.
//! * Errors are [`Error`] values carrying the pinned [`Status`] and the library's message, read
//!   on the same thread immediately after the failing call.
//! * Nothing blocks forever: only [`Sender::send_chunk`] (up to the strategy's `timeout_ms`)
//!   and [`Sender::flush`] (up to its argument) wait.
//! * Handles do not survive `fork()`; create them in the process that uses them.
//!
//! # Threads
//!
//! Every handle may be moved to another thread, and none may be shared between threads:
//!
//! ```no_run
//! fn movable<T: Send>() {}
//! movable::<wsync::Strategy>();
//! movable::<wsync::Sender>();
//! movable::<wsync::Receiver>();
//! movable::<wsync::Recv<'static>>();
//! movable::<wsync::Plan>();
//! fn shared<T: Send + Sync>() {}
//! shared::<wsync::View<'static>>(); // read-only memory valid for the whole iteration
//! ```
//!
//! ```compile_fail,E0277
//! fn shared<T: Sync>() {}
//! shared::<wsync::Sender>(); // error[E0277]: cannot be shared between threads safely
//! ```
//!
//! ```compile_fail,E0277
//! fn shared<T: Sync>() {}
//! shared::<wsync::Receiver>();
//! ```
//!
//! ```compile_fail,E0277
//! fn shared<T: Sync>() {}
//! shared::<wsync::Strategy>();
//! ```
//!
//! ```compile_fail,E0277
//! fn shared<T: Sync>() {}
//! shared::<wsync::Plan>();
//! ```
//!
//! Borrowing a view's bytes in place is `unsafe` (for `"shm"` they are shared memory that a
//! trainer which drops this receiver writes again, and that another process of the same user
//! could write); copying them out is safe:
//!
//! ```compile_fail,E0133
//! # fn demo(view: &wsync::View<'_>) -> wsync::Result<()> {
//! let values: &[f32] = view.as_slice()?; // error[E0133]: call to unsafe function
//! # drop(values); Ok(()) }
//! ```
//!
//! ```
//! # fn demo(view: &wsync::View<'_>, mine: &mut [f32]) -> wsync::Result<()> {
//! view.copy_to(mine)?; // dtype and length checked; no reference into the shared bytes
//! # Ok(()) }
//! ```
//!
//! # Lifetimes of views
//!
//! ```text
//! Receiver --receive(&mut self)--> Recv<'r> --views(&mut self)--> Views<'it, 'r> --> View<'it>
//! ```
//!
//! * A [`Recv`] mutably borrows its [`Receiver`], so a second `receive` while an iteration is
//!   open does not compile (the library would refuse it with `WSYNC_ERR_WRONG_STATE`; that
//!   runtime error is only reachable by leaking a `Recv` with `mem::forget`), and the receiver
//!   cannot be dropped under it.
//! * A [`View`] borrows the `Recv` it came from, so it cannot outlive the iteration: ending it
//!   ([`Recv::end`], or dropping it) needs the `Recv` by value, which the borrow checker refuses
//!   while a view is alive. That is the library's rule: a view's data, name and shape stay
//!   valid until `wsync_recv_end()`.
//! * Because views stay valid until the end (not only until the next `wsync_recv_next`), a
//!   plain [`Iterator`] is sound: [`Views`] borrows the `Recv` for `'it` and yields
//!   `Result<View<'it>>`, so several views may be held at once (e.g. q, k and v, to fuse
//!   them). No lending iterator is needed; [`Recv::next_view`] is there for loops that prefer
//!   calling it directly.
//!
//! ```compile_fail,E0499
//! # fn demo(receiver: &mut wsync::Receiver, request: &[u8]) -> wsync::Result<()> {
//! let recv = receiver.receive(request)?;
//! let again = receiver.receive(request)?; // error[E0499]: one iteration per receiver
//! # drop(again); drop(recv); Ok(()) }
//! ```
//!
//! ```compile_fail,E0505
//! # fn demo(receiver: &mut wsync::Receiver, request: &[u8]) -> wsync::Result<()> {
//! let mut recv = receiver.receive(request)?;
//! let view = recv.views().next().unwrap()?;
//! recv.end()?;                 // error[E0505]: cannot move out of `recv` while borrowed
//! println!("{}", view.name()); // ...because the view is still used here
//! # Ok(()) }
//! ```
//!
//! ```compile_fail,E0505
//! # fn demo(mut receiver: wsync::Receiver, request: &[u8]) -> wsync::Result<()> {
//! let recv = receiver.receive(request)?;
//! drop(receiver);              // error[E0505]: the iteration still borrows the receiver
//! recv.end()
//! # }
//! ```

#![deny(unsafe_op_in_unsafe_fn)]
#![deny(missing_docs)]
#![warn(clippy::undocumented_unsafe_blocks)]

mod alias;
mod dest;
mod error;
#[cfg(feature = "half")]
pub mod half;
mod json;
mod plan;
mod receiver;
mod sender;
mod strategy;
mod tensor;

use std::ffi::{c_char, CStr};

pub use wsync_sys as sys;

pub use alias::{alias_names, join_alias_names, ALIAS_SEPARATOR, MAX_NAME_BYTES};
pub use dest::{ApplyFlags, ApplyResult, Dest, DestTable};
pub use error::{Error, Failure, FailureKind, Result, Status};
pub use plan::{plan, Part, Plan, PlanChunk};
pub use receiver::{
    Meta, PatchIndices, PatchRef, Receiver, ReceiverState, Recv, RecvInfo, View, Views,
};
pub use sender::{merge_requests, Sender};
pub use strategy::{OptionValue, Options, Strategy};
pub use tensor::{DType, Device, Element, TensorRef, TensorSpec};

use error::{c_string, check, take_string};

/// The loaded library's version as text, e.g. `"0.1.0"`.
#[must_use]
pub fn version() -> &'static str {
    // SAFETY: takes no arguments, never fails, returns static text that is never freed.
    let p = unsafe { sys::wsync_version_string() };
    if p.is_null() {
        return "";
    }
    // SAFETY: `p` is non-NULL static NUL-terminated text (see above).
    let text: &'static CStr = unsafe { CStr::from_ptr(p) };
    text.to_str().unwrap_or("")
}

/// The loaded library's version number, `major * 10000 + minor * 100 + patch`.
#[must_use]
pub fn version_number() -> u32 {
    // SAFETY: takes no arguments and never fails.
    unsafe { sys::wsync_version_number() }
}

/// Checks that the loaded library has the major version this binding was written for
/// ([`sys::WSYNC_VERSION_MAJOR`]) and is at least the minor version it declares
/// ([`sys::WSYNC_VERSION_MINOR`]: 0.3, whose structs and calls it uses); [`Status::Unsupported`]
/// otherwise. [`Strategy::new`] and [`Plan::new`] call it.
///
/// # Errors
/// [`Status::Unsupported`] for a library of another major version, or older than the
/// `wsync.h` this binding was built against; the message names both versions.
pub fn check_version() -> Result<()> {
    check_version_number(version_number())
}

/// The oldest library this build accepts: the `wsync.h` it was built against
/// ([`sys::WSYNC_BUILT_AGAINST_VERSION_NUMBER`], patch included), and never older than the
/// `MAJOR.MINOR.0` the declarations were written from (the bound when no header was found).
fn required_version_number() -> u32 {
    least_of(sys::WSYNC_BUILT_AGAINST_VERSION_NUMBER)
}

/// The declared `MAJOR.MINOR.0`, or `built_against` when that is newer. A function of its
/// argument (not of the constant) because the constant is 0 in a docs-only build (`DOCS_RS`, no
/// header), where clippy would call a `max` against it pointless.
fn least_of(built_against: u32) -> u32 {
    let declared = sys::WSYNC_VERSION_MAJOR * 10000 + sys::WSYNC_VERSION_MINOR * 100;
    declared.max(built_against)
}

fn version_text(number: u32) -> String {
    format!("{}.{}.{}", number / 10000, number / 100 % 100, number % 100)
}

fn check_version_number(loaded: u32) -> Result<()> {
    let text = version_text(loaded);
    if loaded / 10000 != sys::WSYNC_VERSION_MAJOR {
        return Err(Error::new(
            Status::Unsupported,
            format!(
                "the loaded libwsync is {text} (major {}), this binding was written for major {}",
                loaded / 10000,
                sys::WSYNC_VERSION_MAJOR
            ),
        ));
    }
    let least = required_version_number();
    if loaded < least {
        return Err(Error::new(
            Status::Unsupported,
            format!(
                "the loaded libwsync is {text}, this binding needs at least {} (the wsync.h it \
                 was built against, and at least the {}.{} structs and calls it declares: \
                 struct_size, wsync_recv_fail, wsync_sender_commit...); build or install a \
                 newer libwsync, or rebuild against the one loaded",
                version_text(least),
                sys::WSYNC_VERSION_MAJOR,
                sys::WSYNC_VERSION_MINOR
            ),
        ));
    }
    Ok(())
}

/// A strategy kind this build of the library knows.
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct KindInfo {
    /// The kind's name, as given to [`Strategy::new`].
    pub name: String,
    /// Whether its run-time dependencies are present.
    pub available: bool,
    /// Why it is unavailable (empty when available).
    pub reason: String,
    /// The run-time dependency the library found for it (e.g. the CUDA driver and its
    /// version), empty when it needs none or reports none.
    pub runtime: String,
    /// What the kind does differently, as the library reports it (libwsync 0.7).
    pub capabilities: Capabilities,
}

/// What a kind does differently (the `"capabilities"` of `wsync_strategy_kinds`; wsync.h says
/// what each means). A key the library does not report reads as `None`.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
#[non_exhaustive]
pub struct Capabilities {
    /// Where sender tensors and receiver views live: `"host"` and/or `"cuda"`.
    pub tensor_memory: Vec<String>,
    /// `"one"`, or `"many"` (several senders' requests of a chunk merge).
    pub senders: Option<String>,
    /// Whether [`Sender::drop_receiver`] lets the others go on.
    pub drop_receiver: Option<bool>,
    /// Whether a process made later with a held index (a restarted engine) takes part.
    pub reattach: Option<bool>,
    /// Whether receivers take each chunk together (one that fails fails it on all).
    pub collective: Option<bool>,
    /// Whether the sender and each receiver need a GPU of their own.
    pub gpu_per_receiver: Option<bool>,
    /// Where delta sync runs: `"none"`, `"host"` or `"device"`.
    pub delta: Option<String>,
}

impl Capabilities {
    fn from_json(v: Option<&json::Value>) -> Self {
        let Some(v) = v else { return Self::default() };
        let flag = |key: &str| v.get(key).and_then(json::Value::as_bool);
        let text = |key: &str| v.get(key).and_then(json::Value::as_str).map(str::to_string);
        Self {
            tensor_memory: v
                .get("tensor_memory")
                .and_then(json::Value::as_array)
                .map(|a| a.iter().filter_map(|m| m.as_str().map(str::to_string)).collect())
                .unwrap_or_default(),
            senders: text("senders"),
            drop_receiver: flag("drop_receiver"),
            reattach: flag("reattach"),
            collective: flag("collective"),
            gpu_per_receiver: flag("gpu_per_receiver"),
            delta: text("delta"),
        }
    }
}

/// The strategy kinds this build knows, and whether each can run here.
///
/// # Errors
/// [`Status::Internal`] if the library's JSON list cannot be read (a library bug).
pub fn kinds() -> Result<Vec<KindInfo>> {
    let mut out: *mut c_char = std::ptr::null_mut();
    // SAFETY: `out` is a valid out-pointer for a library-owned string.
    check(unsafe { sys::wsync_strategy_kinds(&mut out) })?;
    // SAFETY: on success `out` is the library's string, freed by take_string only.
    let text = unsafe { take_string(out) }?;
    let bad = |why: String| Error::new(Status::Internal, format!("kinds JSON: {why}: {text}"));
    let doc = json::parse(&text).map_err(bad)?;
    let list = doc.as_array().ok_or_else(|| bad("not an array".into()))?;
    list.iter()
        .map(|k| {
            Ok(KindInfo {
                name: k
                    .get("kind")
                    .and_then(json::Value::as_str)
                    .ok_or_else(|| bad("no kind".into()))?
                    .to_string(),
                available: k
                    .get("available")
                    .and_then(json::Value::as_bool)
                    .unwrap_or(false),
                reason: k
                    .get("reason")
                    .and_then(json::Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                runtime: k
                    .get("runtime")
                    .and_then(json::Value::as_str)
                    .unwrap_or("")
                    .to_string(),
                capabilities: Capabilities::from_json(k.get("capabilities")),
            })
        })
        .collect()
}

/// A kind's options as the library describes them: a JSON object
/// `{"key": {"type": "uint", "default": 2, "min": 1, "max": 64, "side": "sender", "doc": ...}}`.
/// An unknown kind fails with [`Status::Unsupported`].
///
/// # Errors
/// [`Status::Unsupported`] for an unknown kind; [`Status::InvalidArgument`] for a kind name
/// holding a NUL byte.
pub fn describe_options(kind: &str) -> Result<String> {
    let kind = c_string("strategy kind", kind)?;
    let mut out: *mut c_char = std::ptr::null_mut();
    // SAFETY: `kind` is NUL-terminated and borrowed for the call; `out` is a valid out-pointer.
    check(unsafe { sys::wsync_strategy_describe_options(kind.as_ptr(), &mut out) })?;
    // SAFETY: on success `out` is the library's string, freed by take_string only.
    unsafe { take_string(out) }
}

/// Renders any blob (init info or request, any kind) as JSON for logs and tools. The blob is
/// parsed with the same bounded parser receivers use; malformed input fails with
/// [`Status::Malformed`] saying where.
///
/// # Errors
/// [`Status::Malformed`] for bytes that are not a well-formed libwsync blob, saying where.
pub fn describe(blob: &[u8]) -> Result<String> {
    let mut out: *mut c_char = std::ptr::null_mut();
    // SAFETY: `blob` is borrowed for the call with its exact length; `out` is a valid
    // out-pointer.
    check(unsafe { sys::wsync_blob_describe(blob.as_ptr(), blob.len(), &mut out) })?;
    // SAFETY: on success `out` is the library's string, freed by take_string only.
    unsafe { take_string(out) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn other_major_or_older_minor_is_refused_with_a_clear_message() {
        let old = check_version_number(100).unwrap_err();
        assert_eq!(old.status(), Status::Unsupported);
        assert!(old.message().contains("is 0.1.0"), "{old}");
        let want = format!("needs at least {}", version_text(required_version_number()));
        assert!(old.message().contains(&want), "{old}");
        assert!(check_version_number(199).is_err());
        assert!(check_version_number(299).is_err());
        assert!(check_version_number(399).is_err());
        assert!(check_version_number(499).is_err());
        assert!(check_version_number(599).is_err());
        let major = check_version_number(10200).unwrap_err();
        assert!(major.message().contains("major 1"), "{major}");
        assert!(check_version_number(699).is_err());
        check_version_number(required_version_number()).unwrap();
        check_version_number(799).unwrap();
    }

    #[test]
    fn the_header_built_against_is_the_oldest_library_accepted() {
        let declared = sys::WSYNC_VERSION_MAJOR * 10000 + sys::WSYNC_VERSION_MINOR * 100;
        assert_eq!(
            least_of(0),
            declared,
            "no header found: the declared version"
        );
        assert_eq!(
            least_of(declared + 7),
            declared + 7,
            "a newer header raises the bound"
        );
        assert_eq!(
            least_of(declared - 1),
            declared,
            "an older header does not lower it"
        );
        let least = required_version_number();
        assert_eq!(least, least_of(sys::WSYNC_BUILT_AGAINST_VERSION_NUMBER));
        check_version_number(least).unwrap();
        let old = check_version_number(least - 1).unwrap_err();
        assert_eq!(old.status(), Status::Unsupported);
        let want = format!("needs at least {}", version_text(least));
        assert!(old.message().contains(&want), "{old}");
    }

    #[test]
    fn loaded_library_matches_this_binding() {
        check_version().unwrap();
        assert_eq!(version_number() / 10000, sys::WSYNC_VERSION_MAJOR);
        let parts: Vec<u32> = version().split('.').map(|p| p.parse().unwrap()).collect();
        assert_eq!(parts.len(), 3, "{}", version());
        assert_eq!(
            parts[0] * 10000 + parts[1] * 100 + parts[2],
            version_number()
        );
    }
}
