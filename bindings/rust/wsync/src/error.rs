//! Statuses and errors.

use std::ffi::{c_char, CStr, CString};
use std::fmt;

use wsync_sys as sys;

/// Why a call failed: one of libwsync's pinned status codes.
///
/// The codes are pinned forever, and the library may add new ones; a code this binding does not
/// know arrives as [`Status::Unknown`] (and the enum is `#[non_exhaustive]` so that matching on
/// it keeps a wildcard arm for codes added later).
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Status {
    /// A NULL, out-of-range or ill-formed argument or option (`WSYNC_ERR_INVALID_ARGUMENT`).
    InvalidArgument,
    /// Valid, but not supported by this strategy or build (`WSYNC_ERR_UNSUPPORTED`).
    Unsupported,
    /// A run-time dependency is missing (`WSYNC_ERR_UNAVAILABLE`).
    Unavailable,
    /// A blob is truncated, corrupt, foreign or of a wrong version (`WSYNC_ERR_MALFORMED`).
    Malformed,
    /// Well-formed but does not fit: other strategy, stale request, chunk out of order
    /// (`WSYNC_ERR_MISMATCH`).
    Mismatch,
    /// A deadline passed before the peers answered (`WSYNC_ERR_TIMEOUT`).
    Timeout,
    /// A peer died, detached, or reported failure (`WSYNC_ERR_PEER`).
    Peer,
    /// An allocation or a shared-memory reservation failed (`WSYNC_ERR_NO_MEMORY`).
    NoMemory,
    /// A call out of order (`WSYNC_ERR_WRONG_STATE`).
    WrongState,
    /// An operating-system call failed; the message has errno (`WSYNC_ERR_SYSTEM`).
    System,
    /// A bug in libwsync (`WSYNC_ERR_INTERNAL`).
    Internal,
    /// Received bytes or a blob failed their checksum (`WSYNC_ERR_INTEGRITY`).
    Integrity,
    /// The sender abandoned the version: a send failed, it called [`crate::Sender::abandon`], or
    /// the trainer died mid-version (`WSYNC_ERR_ABANDONED`, 0.2).
    Abandoned,
    /// A later chunk of a version that already failed here was skipped unread: nothing to load
    /// and nothing new to report (the version's own status is [`crate::ReceiverState`]'s
    /// `failed_status`); wait for the next version (`WSYNC_ERR_SKIPPED`, 0.7.0).
    Skipped,
    /// A code this binding does not know (added by a newer library).
    Unknown(i32),
}

impl Status {
    /// The status for a raw code; `None` for `WSYNC_OK` (0), which is not an error.
    #[must_use]
    pub fn from_code(code: i32) -> Option<Status> {
        Some(match code {
            sys::WSYNC_OK => return None,
            sys::WSYNC_ERR_INVALID_ARGUMENT => Status::InvalidArgument,
            sys::WSYNC_ERR_UNSUPPORTED => Status::Unsupported,
            sys::WSYNC_ERR_UNAVAILABLE => Status::Unavailable,
            sys::WSYNC_ERR_MALFORMED => Status::Malformed,
            sys::WSYNC_ERR_MISMATCH => Status::Mismatch,
            sys::WSYNC_ERR_TIMEOUT => Status::Timeout,
            sys::WSYNC_ERR_PEER => Status::Peer,
            sys::WSYNC_ERR_NO_MEMORY => Status::NoMemory,
            sys::WSYNC_ERR_WRONG_STATE => Status::WrongState,
            sys::WSYNC_ERR_SYSTEM => Status::System,
            sys::WSYNC_ERR_INTERNAL => Status::Internal,
            sys::WSYNC_ERR_INTEGRITY => Status::Integrity,
            sys::WSYNC_ERR_ABANDONED => Status::Abandoned,
            sys::WSYNC_ERR_SKIPPED => Status::Skipped,
            other => Status::Unknown(other),
        })
    }

    /// The raw code (`WSYNC_ERR_*`).
    #[must_use]
    pub fn code(self) -> i32 {
        match self {
            Status::InvalidArgument => sys::WSYNC_ERR_INVALID_ARGUMENT,
            Status::Unsupported => sys::WSYNC_ERR_UNSUPPORTED,
            Status::Unavailable => sys::WSYNC_ERR_UNAVAILABLE,
            Status::Malformed => sys::WSYNC_ERR_MALFORMED,
            Status::Mismatch => sys::WSYNC_ERR_MISMATCH,
            Status::Timeout => sys::WSYNC_ERR_TIMEOUT,
            Status::Peer => sys::WSYNC_ERR_PEER,
            Status::NoMemory => sys::WSYNC_ERR_NO_MEMORY,
            Status::WrongState => sys::WSYNC_ERR_WRONG_STATE,
            Status::System => sys::WSYNC_ERR_SYSTEM,
            Status::Internal => sys::WSYNC_ERR_INTERNAL,
            Status::Integrity => sys::WSYNC_ERR_INTEGRITY,
            Status::Abandoned => sys::WSYNC_ERR_ABANDONED,
            Status::Skipped => sys::WSYNC_ERR_SKIPPED,
            Status::Unknown(code) => code,
        }
    }

    /// The library's static name of the status, e.g. `"WSYNC_ERR_TIMEOUT"`
    /// (`"WSYNC_ERR_UNKNOWN"` for codes the loaded library does not know).
    #[must_use]
    pub fn name(self) -> &'static str {
        // SAFETY: wsync_status_string accepts any value, never fails, does not touch the
        // per-thread error, and returns static NUL-terminated text that is never freed.
        let p = unsafe { sys::wsync_status_string(self.code()) };
        if p.is_null() {
            return "WSYNC_ERR_UNKNOWN";
        }
        // SAFETY: `p` is non-NULL static text (see above), valid for the whole program.
        let text: &'static CStr = unsafe { CStr::from_ptr(p) };
        text.to_str().unwrap_or("WSYNC_ERR_UNKNOWN")
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How a receiver failed, as the sender learnt it (`wsync_failure_t.what`).
#[non_exhaustive]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// The receiver failed a chunk: its loader ([`crate::Recv::fail`]), a checksum, the order
    /// (`WSYNC_FAILURE_FAILED`).
    Failed,
    /// The receiver's process died owing a chunk (`WSYNC_FAILURE_DIED`).
    Died,
    /// The receiver was destroyed owing a chunk (`WSYNC_FAILURE_DETACHED`).
    Detached,
    /// The receiver did not answer by the deadline (`WSYNC_FAILURE_TIMEOUT`).
    Timeout,
    /// The receiver was dropped by the sender (`WSYNC_FAILURE_DROPPED`).
    Dropped,
    /// A kind this binding does not know (added by a newer library).
    Unknown(u32),
}

impl FailureKind {
    /// The kind for a raw `WSYNC_FAILURE_*` value.
    #[must_use]
    pub fn from_code(code: u32) -> FailureKind {
        match code {
            sys::WSYNC_FAILURE_FAILED => FailureKind::Failed,
            sys::WSYNC_FAILURE_DIED => FailureKind::Died,
            sys::WSYNC_FAILURE_DETACHED => FailureKind::Detached,
            sys::WSYNC_FAILURE_TIMEOUT => FailureKind::Timeout,
            sys::WSYNC_FAILURE_DROPPED => FailureKind::Dropped,
            other => FailureKind::Unknown(other),
        }
    }
}

/// One receiver's failure as the sender learnt it: data, not only text (`wsync_failure_t`).
/// [`Error::failures`] lists them for a failed [`crate::Sender::flush`],
/// [`crate::Sender::send_chunk`] or [`crate::Sender::commit`].
#[derive(Debug, Clone, PartialEq, Eq)]
#[non_exhaustive]
pub struct Failure {
    /// How it failed.
    pub what: FailureKind,
    /// The receiver's own status (e.g. [`Status::Mismatch`] from its loader);
    /// [`Status::Peer`] for a death, [`Status::Timeout`] for no answer.
    pub status: Status,
    /// Receiver index.
    pub receiver: u32,
    /// Version of the chunk, 0 if unknown.
    pub version: u64,
    /// Chunk within that version, `None` if unknown.
    pub chunk_index: Option<u32>,
    /// The receiver's pid as it saw itself, 0 if unknown; for messages only.
    pub pid: i32,
    /// The receiver's own message (cut by the library at 255 bytes).
    pub message: String,
}

impl Failure {
    /// A failure of receiver `receiver` (version 0, no chunk, pid 0: set the public fields for
    /// more), for code that builds [`Error`]s of its own, e.g. test doubles of a sender.
    #[must_use]
    pub fn new(
        what: FailureKind,
        status: Status,
        receiver: u32,
        message: impl Into<String>,
    ) -> Failure {
        Failure {
            what,
            status,
            receiver,
            version: 0,
            chunk_index: None,
            pid: 0,
            message: message.into(),
        }
    }

    pub(crate) fn from_raw(raw: &sys::wsync_failure_t) -> Failure {
        let bytes: Vec<u8> = raw
            .message
            .iter()
            .take_while(|&&c| c != 0)
            .map(|&c| u8::from_ne_bytes(c.to_ne_bytes()))
            .collect();
        Failure {
            what: FailureKind::from_code(raw.what),
            status: Status::from_code(raw.status).unwrap_or(Status::Unknown(0)),
            receiver: raw.receiver,
            version: raw.version,
            chunk_index: (raw.chunk_index != sys::WSYNC_NO_CHUNK).then_some(raw.chunk_index),
            pid: raw.pid,
            message: String::from_utf8_lossy(&bytes).into_owned(),
        }
    }
}

impl fmt::Display for FailureKind {
    /// What the receiver did, as a verb phrase: "failed", "died", "detached", "timed out",
    /// "was dropped", or "failed (kind N)" for a kind this binding does not know.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FailureKind::Failed => f.write_str("failed"),
            FailureKind::Died => f.write_str("died"),
            FailureKind::Detached => f.write_str("detached"),
            FailureKind::Timeout => f.write_str("timed out"),
            FailureKind::Dropped => f.write_str("was dropped"),
            FailureKind::Unknown(code) => write!(f, "failed (kind {code})"),
        }
    }
}

impl fmt::Display for Failure {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "receiver {} {}", self.receiver, self.what)?;
        match self.chunk_index {
            Some(c) => write!(f, " (chunk {c} of version {})", self.version)?,
            None if self.version != 0 => write!(f, " (version {})", self.version)?,
            None => {}
        }
        write!(f, ": {}: {}", self.status, self.message)
    }
}

/// A failed call: the library's status and its message naming the cause (the option key, the
/// tensor, the receiver index, the peer's pid...), and for a sender call that failed because of
/// receivers, each receiver's failure as data ([`Error::failures`]).
///
/// The message is copied from `wsync_last_error()` on the calling thread right after the failing
/// call, so it always belongs to that call. Errors the binding detects itself before calling C
/// (a slice shorter than its shape, a name with a NUL byte) carry
/// [`Status::InvalidArgument`] and a message written here.
///
/// `Debug` prints what `Display` does, then each failure on its own line, so that
/// `fn main() -> Result<(), Box<dyn std::error::Error>>` reports a readable reason; `{:#?}`
/// prints the fields.
#[derive(Clone, PartialEq, Eq)]
pub struct Error {
    status: Status,
    message: String,
    failures: Vec<Failure>,
}

impl Error {
    /// The status.
    #[must_use]
    pub fn status(&self) -> Status {
        self.status
    }

    /// The message naming the cause (may be empty if the library gave none).
    #[must_use]
    pub fn message(&self) -> &str {
        &self.message
    }

    /// The receivers' failures behind a failed sender call (`send_chunk`, `commit`, `flush`),
    /// oldest first, read from `wsync_sender_failure` right after the call; empty for other
    /// errors.
    #[must_use]
    pub fn failures(&self) -> &[Failure] {
        &self.failures
    }

    /// An error with `status` and `message` and no receivers' failures: for code that wraps
    /// the binding (a forwarder, a loader, a test double) and reports in its terms.
    ///
    /// ```
    /// let e = wsync::Error::new(wsync::Status::Timeout, "controller: engine 3 did not answer");
    /// assert_eq!(e.to_string(), "WSYNC_ERR_TIMEOUT: controller: engine 3 did not answer");
    /// let io: std::io::Error = e.into();
    /// assert_eq!(io.kind(), std::io::ErrorKind::TimedOut);
    /// ```
    #[must_use]
    pub fn new(status: Status, message: impl Into<String>) -> Error {
        Error {
            status,
            message: message.into(),
            failures: Vec::new(),
        }
    }

    /// The same error carrying `failures` (see [`Error::failures`]).
    #[must_use]
    pub fn with_failures(mut self, failures: Vec<Failure>) -> Error {
        self.failures = failures;
        self
    }

    /// The same error (status and receivers' failures kept) with `context` and `": "` put
    /// before its message, saying what the caller was doing: `e.context("version 3: flush")`.
    /// Its [`Display`](fmt::Display) is then `STATUS: context: message`.
    ///
    /// ```
    /// use wsync::{Error, Status};
    /// let e = Error::new(Status::Peer, "receiver 1 detached").context("version 3: flush");
    /// assert_eq!(e.status(), Status::Peer);
    /// assert_eq!(e.message(), "version 3: flush: receiver 1 detached");
    /// assert_eq!(e.to_string(), "WSYNC_ERR_PEER: version 3: flush: receiver 1 detached");
    /// ```
    #[must_use]
    pub fn context(mut self, context: impl fmt::Display) -> Error {
        self.message = if self.message.is_empty() {
            context.to_string()
        } else {
            format!("{context}: {}", self.message)
        };
        self
    }

    pub(crate) fn invalid(message: impl Into<String>) -> Error {
        Error::new(Status::InvalidArgument, message)
    }

    /// The error for a failed status, with the calling thread's last message.
    fn from_failed_call(code: sys::wsync_status_t) -> Error {
        // SAFETY: wsync_last_error takes no arguments and never returns NULL; the text stays
        // valid until the next failing wsync call on this thread, and it is copied right here.
        let p = unsafe { sys::wsync_last_error() };
        let message = if p.is_null() {
            String::new()
        } else {
            // SAFETY: `p` is a valid NUL-terminated string (see above).
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        };
        let status = Status::from_code(code).unwrap_or(Status::Internal);
        Error {
            status,
            message: in_rust_terms(&message),
            failures: Vec::new(),
        }
    }
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.message.is_empty() {
            write!(f, "{}", self.status)
        } else {
            write!(f, "{}: {}", self.status, self.message)
        }
    }
}

impl fmt::Debug for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if f.alternate() {
            return f
                .debug_struct("Error")
                .field("status", &self.status)
                .field("message", &self.message)
                .field("failures", &self.failures)
                .finish();
        }
        fmt::Display::fmt(self, f)?;
        for failure in &self.failures {
            write!(f, "\n  {failure}")?;
        }
        Ok(())
    }
}

impl std::error::Error for Error {}

/// For code whose errors are `std::io::Error` (a forwarder writing requests to sockets, passed
/// to [`crate::Sender::send_plan`]): the kind follows the status, and the [`Error`] itself,
/// with its receivers' failures, stays reachable through
/// `io_error.get_ref().and_then(|e| e.downcast_ref::<wsync::Error>())`.
impl From<Error> for std::io::Error {
    fn from(e: Error) -> std::io::Error {
        use std::io::ErrorKind;
        let kind = match e.status {
            Status::InvalidArgument => ErrorKind::InvalidInput,
            Status::Unsupported => ErrorKind::Unsupported,
            Status::Unavailable => ErrorKind::NotFound,
            Status::Malformed | Status::Mismatch | Status::Integrity => ErrorKind::InvalidData,
            Status::Timeout => ErrorKind::TimedOut,
            Status::Peer | Status::Abandoned => ErrorKind::ConnectionAborted,
            Status::NoMemory => ErrorKind::OutOfMemory,
            _ => ErrorKind::Other,
        };
        std::io::Error::new(kind, e)
    }
}

/// `std::result::Result` with this crate's [`Error`].
pub type Result<T> = std::result::Result<T, Error>;

/// The C functions the library's messages name, and the calls of this crate that make them:
/// a Rust user is told `Recv::copy_into`, not `wsync_recv_copy` (user trial).
const RUST_NAMES: &[(&str, &str)] = &[
    ("wsync_recv_copy", "Recv::copy_into"),
    ("wsync_recv_next_part", "Recv::views"),
    ("wsync_recv_next", "Recv::views"),
    ("wsync_recv_apply", "Recv::apply"),
    ("wsync_recv_end", "Recv::end"),
    ("wsync_recv_fail", "Recv::fail"),
    ("wsync_recv_peek", "Recv::peek"),
    ("wsync_recv_part", "Recv::part"),
    ("wsync_recv_patch", "Recv::patch"),
    ("wsync_recv_info", "Recv::info"),
    ("wsync_dest_table_create", "DestTable::new"),
    ("wsync_sender_create", "Sender::new"),
    ("wsync_sender_send_chunk", "Sender::send_chunk"),
    ("wsync_sender_send_parts", "Sender::send_parts"),
    ("wsync_sender_commit", "Sender::commit"),
    ("wsync_sender_abandon", "Sender::abandon"),
    ("wsync_sender_flush", "Sender::flush"),
    ("wsync_sender_drop_receiver", "Sender::drop_receiver"),
    ("wsync_sender_wait_released", "Sender::wait_released"),
    ("wsync_sender_set_stream", "Sender::set_stream"),
    ("wsync_sender_version", "Sender::version"),
    ("wsync_receiver_create", "Receiver::new"),
    ("wsync_receiver_receive", "Receiver::receive"),
    ("wsync_receiver_poll", "Receiver::poll"),
    ("wsync_receiver_completed_version", "Receiver::completed_version"),
    ("wsync_receiver_set_stream", "Receiver::set_stream"),
    ("wsync_strategy_create", "Strategy::new"),
    ("wsync_strategy_create_init_info", "Strategy::create_init_info"),
    ("wsync_plan_create", "Plan::new"),
    ("wsync_request_merge", "wsync::merge_requests"),
];

/// `message` with every C function name of [`RUST_NAMES`] replaced by its Rust call (whole
/// identifiers only: `wsync_recv_next_part` is not `wsync_recv_next` followed by `_part`).
pub(crate) fn in_rust_terms(message: &str) -> String {
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some(at) = rest.find("wsync_") {
        out.push_str(&rest[..at]);
        let tail = &rest[at..];
        let len = tail
            .find(|c: char| !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_'))
            .unwrap_or(tail.len());
        let word = &tail[..len];
        match RUST_NAMES.iter().find(|(c, _)| *c == word) {
            Some((_, call)) => out.push_str(call),
            None => out.push_str(word),
        }
        rest = &tail[len..];
    }
    out.push_str(rest);
    out
}

/// Turns a status into a `Result`. Call it immediately after the C call, on the same thread, so
/// the message read is that call's.
pub(crate) fn check(code: sys::wsync_status_t) -> Result<()> {
    if code == sys::WSYNC_OK {
        Ok(())
    } else {
        Err(Error::from_failed_call(code))
    }
}

/// Like [`check`] for a call on `sender`: a failure also carries the receivers' failures the
/// sender recorded for that call.
///
/// # Safety
/// `sender` must be a live sender used by this thread only.
pub(crate) unsafe fn check_sender(
    code: sys::wsync_status_t,
    sender: *const sys::wsync_sender_t,
) -> Result<()> {
    check(code).map_err(|mut e| {
        // SAFETY: forwarded from the caller; the message was already copied by `check`.
        e.failures = unsafe { sender_failures(sender) };
        e
    })
}

/// The receivers' failures the sender's last failed call found (empty if it cannot tell).
///
/// # Safety
/// `sender` must be a live sender used by this thread only.
pub(crate) unsafe fn sender_failures(sender: *const sys::wsync_sender_t) -> Vec<Failure> {
    let mut count = 0usize;
    // SAFETY: forwarded from the caller; `count` is a valid out-pointer.
    if unsafe { sys::wsync_sender_failure_count(sender, &mut count) } != sys::WSYNC_OK {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(count);
    for i in 0..count {
        let mut raw = sys::wsync_failure_t::sized();
        // SAFETY: forwarded from the caller; `raw` is a valid out-pointer whose struct_size
        // says how much the library may write.
        if unsafe { sys::wsync_sender_failure(sender, i, &mut raw) } != sys::WSYNC_OK {
            break;
        }
        out.push(Failure::from_raw(&raw));
    }
    out
}

/// A NUL-terminated copy of `text` for C; a NUL byte inside is an [`Status::InvalidArgument`].
pub(crate) fn c_string(what: &str, text: &str) -> Result<CString> {
    CString::new(text).map_err(|e| {
        Error::invalid(format!(
            "{what} contains a NUL byte at position {}",
            e.nul_position()
        ))
    })
}

/// Copies a string the library returned and frees it with `wsync_string_free`.
///
/// # Safety
/// `p` must be NULL or a string returned by a libwsync function that is freed with
/// `wsync_string_free`, not used again by the caller.
pub(crate) unsafe fn take_string(p: *mut c_char) -> Result<String> {
    if p.is_null() {
        return Err(Error::new(
            Status::Internal,
            "the library returned no string",
        ));
    }
    // SAFETY: the caller guarantees `p` is a valid NUL-terminated string from the library.
    let text = unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned();
    // SAFETY: `p` came from the library, is freed once, and is not used afterwards.
    unsafe { sys::wsync_string_free(p) };
    Ok(text)
}

/// Copies a blob the library returned into a `Vec` and frees it with `wsync_blob_free`.
///
/// # Safety
/// `blob` must be `{NULL, 0}` or a blob returned by a libwsync function, not used again by the
/// caller.
pub(crate) unsafe fn take_blob(mut blob: sys::wsync_blob_t) -> Vec<u8> {
    let bytes = if blob.data.is_null() || blob.size == 0 {
        Vec::new()
    } else {
        // SAFETY: the library's blob points at `size` initialised bytes it owns.
        unsafe { std::slice::from_raw_parts(blob.data, blob.size) }.to_vec()
    };
    // SAFETY: the blob came from the library (or is empty, a no-op) and is freed exactly once.
    unsafe { sys::wsync_blob_free(&mut blob) };
    bytes
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn library_messages_name_the_rust_calls_not_the_c_functions() {
        assert_eq!(
            in_rust_terms("take it with wsync_recv_copy or wsync_recv_next_part"),
            "take it with Recv::copy_into or Recv::views"
        );
        assert_eq!(
            in_rust_terms("the trainer drops it, wsync_sender_drop_receiver, then"),
            "the trainer drops it, Sender::drop_receiver, then"
        );
        assert_eq!(in_rust_terms("wsync_unknown_call and wsync_"), "wsync_unknown_call and wsync_");
    }

    #[test]
    fn every_pinned_code_round_trips_and_ok_is_not_an_error() {
        assert_eq!(Status::from_code(0), None);
        for code in 1..=14 {
            let s = Status::from_code(code).expect("an error");
            assert!(!matches!(s, Status::Unknown(_)), "code {code} is pinned");
            assert_eq!(s.code(), code);
            assert!(s.name().starts_with("WSYNC_ERR_"), "{s:?} -> {}", s.name());
            assert_ne!(s.name(), "WSYNC_ERR_UNKNOWN");
        }
        assert_eq!(Status::from_code(99), Some(Status::Unknown(99)));
        assert_eq!(Status::Unknown(99).code(), 99);
        assert_eq!(Status::Unknown(99).name(), "WSYNC_ERR_UNKNOWN");
        assert_eq!(Status::Timeout.name(), "WSYNC_ERR_TIMEOUT");
        assert_eq!(Status::WrongState.to_string(), "WSYNC_ERR_WRONG_STATE");
    }

    #[test]
    fn failure_from_raw_reads_every_field() {
        let mut raw = sys::wsync_failure_t::sized();
        raw.what = sys::WSYNC_FAILURE_FAILED;
        raw.status = sys::WSYNC_ERR_MISMATCH;
        raw.receiver = 2;
        raw.version = 7;
        raw.chunk_index = 3;
        raw.pid = 42;
        for (d, s) in raw.message.iter_mut().zip(b"shape differs") {
            *d = c_char::from_ne_bytes([*s]);
        }
        let f = Failure::from_raw(&raw);
        assert_eq!(f.what, FailureKind::Failed);
        assert_eq!(f.status, Status::Mismatch);
        assert_eq!(
            (f.receiver, f.version, f.chunk_index, f.pid),
            (2, 7, Some(3), 42)
        );
        assert_eq!(f.message, "shape differs");
        assert_eq!(
            f.to_string(),
            "receiver 2 failed (chunk 3 of version 7): WSYNC_ERR_MISMATCH: shape differs"
        );
        for (kind, text) in [
            (FailureKind::Died, "died"),
            (FailureKind::Detached, "detached"),
            (FailureKind::Timeout, "timed out"),
            (FailureKind::Dropped, "was dropped"),
            (FailureKind::Unknown(9), "failed (kind 9)"),
        ] {
            assert_eq!(kind.to_string(), text);
        }
        raw.chunk_index = sys::WSYNC_NO_CHUNK;
        raw.what = 99;
        let f = Failure::from_raw(&raw);
        assert_eq!((f.chunk_index, f.what), (None, FailureKind::Unknown(99)));
    }

    #[test]
    fn display_joins_status_and_message() {
        let e = Error::new(Status::Peer, "shm: receiver 1 died");
        assert_eq!(e.to_string(), "WSYNC_ERR_PEER: shm: receiver 1 died");
        assert_eq!(Error::new(Status::Peer, "").to_string(), "WSYNC_ERR_PEER");
    }

    #[test]
    fn context_prefixes_the_message_and_keeps_status_and_failures() {
        let failure = Failure::new(FailureKind::Failed, Status::Integrity, 2, "bad sum");
        let e = Error::new(Status::Peer, "receiver 2 failed")
            .with_failures(vec![failure.clone()])
            .context("version 3")
            .context(format_args!("step {}", 7));
        assert_eq!(e.status(), Status::Peer);
        assert_eq!(e.message(), "step 7: version 3: receiver 2 failed");
        assert_eq!(e.failures(), &[failure]);
        let bare = Error::new(Status::Timeout, "").context("flush");
        assert_eq!(bare.to_string(), "WSYNC_ERR_TIMEOUT: flush");
    }

    #[test]
    fn debug_reads_like_display_with_one_line_per_failure() {
        let failure = Failure::new(FailureKind::Died, Status::Peer, 1, "pid 42 died");
        let e = Error::new(Status::Peer, "receiver 1 died").with_failures(vec![failure]);
        assert_eq!(
            format!("{e:?}"),
            "WSYNC_ERR_PEER: receiver 1 died\n  receiver 1 died: WSYNC_ERR_PEER: pid 42 died"
        );
        assert!(format!("{e:#?}").starts_with("Error {\n    status: Peer,"));
    }

    #[test]
    fn io_error_keeps_kind_status_and_failures() {
        let failure = Failure::new(FailureKind::Died, Status::Peer, 1, "pid 42 died");
        let e = Error::new(Status::Peer, "receiver 1 died").with_failures(vec![failure.clone()]);
        let io: std::io::Error = e.clone().into();
        assert_eq!(io.kind(), std::io::ErrorKind::ConnectionAborted);
        let inner = io
            .get_ref()
            .and_then(|i| i.downcast_ref::<Error>())
            .unwrap();
        assert_eq!(inner, &e);
        assert_eq!(inner.failures(), &[failure]);
        let timeout: std::io::Error = Error::new(Status::Timeout, "").into();
        assert_eq!(timeout.kind(), std::io::ErrorKind::TimedOut);
    }

    #[test]
    fn nul_in_a_string_for_c_is_invalid_argument() {
        let e = c_string("kind", "sh\0m").unwrap_err();
        assert_eq!(e.status(), Status::InvalidArgument);
        assert!(e.message().contains("position 2"), "{e}");
        assert_eq!(c_string("kind", "shm").unwrap().as_bytes(), b"shm");
    }
}
