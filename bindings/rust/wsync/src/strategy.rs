//! Strategies and their options.

use std::ffi::{c_char, CStr};
use std::fmt::{self, Write as _};
use std::ptr::NonNull;

use wsync_sys as sys;

use crate::error::{c_string, check, take_blob, Error, Result, Status};

/// A strategy: a kind (`"shm"`, ...) with its options. Trainers make the init info and their
/// sender from it; engines make their receiver from it.
///
/// `Send` (it may move to another thread) but not `Sync`: the library requires one thread at a
/// time per handle, which `&mut self` and the missing `Sync` enforce.
#[must_use = "dropping a Strategy destroys it"]
pub struct Strategy {
    raw: NonNull<sys::wsync_strategy_t>,
}

// SAFETY: wsync.h: "A handle may move between threads"; a Strategy is used through `&mut self`
// or, for read-only queries, `&self` of a type that is not Sync, so one thread at a time.
unsafe impl Send for Strategy {}

impl Strategy {
    /// Creates a strategy of `kind` with options given as a JSON object text
    /// (`r#"{"receivers": 2}"#`); `""` means all defaults. Options are strictly validated: an
    /// unknown key or a value of the wrong type or range fails with
    /// [`Status::InvalidArgument`] naming the key; a kind this build does not know fails with
    /// [`Status::Unsupported`], one whose run-time dependency is missing with
    /// [`Status::Unavailable`]. Does not block.
    ///
    /// # Errors
    /// [`Status::InvalidArgument`] for invalid options (or text holding a NUL byte);
    /// [`Status::Unsupported`] for an unknown kind, or if the loaded library is older than
    /// this binding needs ([`crate::check_version`]); [`Status::Unavailable`] when the kind's
    /// run-time dependency is missing.
    pub fn new(kind: &str, options_json: &str) -> Result<Strategy> {
        crate::check_version()?;
        let kind_c = c_string("strategy kind", kind)?;
        let options_c = c_string("options", options_json)?;
        let mut out: *mut sys::wsync_strategy_t = std::ptr::null_mut();
        // SAFETY: both strings are valid NUL-terminated text borrowed for the call; `out` is a
        // valid out-pointer the library writes a new handle (or NULL) to.
        check(unsafe {
            sys::wsync_strategy_create(kind_c.as_ptr(), options_c.as_ptr(), &mut out)
        })?;
        let raw = NonNull::new(out)
            .ok_or_else(|| Error::new(Status::Internal, "wsync_strategy_create returned NULL"))?;
        Ok(Strategy { raw })
    }

    /// [`Strategy::new`] with options from an [`Options`] builder.
    ///
    /// # Errors
    /// As [`Strategy::new`].
    pub fn with_options(kind: &str, options: &Options) -> Result<Strategy> {
        Strategy::new(kind, &options.to_json())
    }

    /// The strategy's kind name.
    ///
    /// # Errors
    /// [`Status::Internal`] if the library returns no name or one that is not UTF-8 (a library
    /// bug).
    pub fn kind(&self) -> Result<&'static str> {
        let mut kind: *const c_char = std::ptr::null();
        // SAFETY: `self.raw` is a live strategy; `kind` is a valid out-pointer.
        check(unsafe { sys::wsync_strategy_kind(self.raw.as_ptr(), &mut kind) })?;
        if kind.is_null() {
            return Err(Error::new(
                Status::Internal,
                "wsync_strategy_kind returned NULL",
            ));
        }
        // SAFETY: the header promises static text that is never freed.
        let text: &'static CStr = unsafe { CStr::from_ptr(kind) };
        text.to_str()
            .map_err(|_| Error::new(Status::Internal, "strategy kind is not UTF-8"))
    }

    /// Trainer side: makes the init info every sender and receiver of this sync is created from
    /// (for `"shm"`: the shared-memory segment, reserved and pre-faulted, so this takes time
    /// proportional to `buckets x bucket_bytes`). Forward the bytes to every engine. Call once;
    /// a second call fails with [`Status::WrongState`].
    ///
    /// # Errors
    /// [`Status::WrongState`] on a second call; [`Status::NoMemory`] or [`Status::System`]
    /// when the kind cannot reserve its shared memory or other resources.
    pub fn create_init_info(&mut self) -> Result<Vec<u8>> {
        let mut blob = sys::wsync_blob_t::default();
        // SAFETY: `self.raw` is a live strategy used by this thread only (`&mut self`); `blob`
        // is a valid out-parameter.
        check(unsafe { sys::wsync_strategy_create_init_info(self.raw.as_ptr(), &mut blob) })?;
        // SAFETY: on success the blob is the library's and is not used again.
        Ok(unsafe { take_blob(blob) })
    }

    pub(crate) fn as_mut_ptr(&mut self) -> *mut sys::wsync_strategy_t {
        self.raw.as_ptr()
    }
}

impl Drop for Strategy {
    fn drop(&mut self) {
        // SAFETY: `self.raw` came from wsync_strategy_create and is destroyed exactly once.
        // Senders and receivers made from it stay valid (they hold what they need).
        unsafe { sys::wsync_strategy_destroy(self.raw.as_ptr()) }
    }
}

impl fmt::Debug for Strategy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Strategy")
            .field("kind", &self.kind().unwrap_or("?"))
            .finish()
    }
}

/// One option value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OptionValue {
    /// A non-negative integer (`"receivers": 2`).
    UInt(u64),
    /// A boolean (`"checksum": true`).
    Bool(bool),
    /// A string (for kinds that take one).
    Str(String),
}

/// A small builder for the JSON options object of [`Strategy::new`] and [`crate::Plan::new`]
/// (or pass it to [`Strategy::with_options`] and [`crate::Plan::with_options`]).
///
/// ```
/// let opts = wsync::Options::new()
///     .uint("receivers", 2)
///     .uint("bucket_bytes", 64 << 20)
///     .boolean("checksum", true);
/// assert_eq!(opts.to_json(), r#"{"receivers": 2, "bucket_bytes": 67108864, "checksum": true}"#);
/// ```
///
/// Keys keep their first position; setting a key again replaces its value. The library, not the
/// builder, validates keys and ranges (see [`crate::describe_options`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Options {
    entries: Vec<(String, OptionValue)>,
}

impl Options {
    /// No options: the kind's defaults.
    #[must_use]
    pub fn new() -> Options {
        Options::default()
    }

    /// Sets `key` to `value`.
    #[must_use]
    pub fn set(mut self, key: &str, value: OptionValue) -> Options {
        match self.entries.iter_mut().find(|(k, _)| k == key) {
            Some(entry) => entry.1 = value,
            None => self.entries.push((key.to_string(), value)),
        }
        self
    }

    /// Sets an integer option.
    #[must_use]
    pub fn uint(self, key: &str, value: u64) -> Options {
        self.set(key, OptionValue::UInt(value))
    }

    /// Sets a boolean option.
    #[must_use]
    pub fn boolean(self, key: &str, value: bool) -> Options {
        self.set(key, OptionValue::Bool(value))
    }

    /// Sets a string option.
    #[must_use]
    pub fn string(self, key: &str, value: &str) -> Options {
        self.set(key, OptionValue::Str(value.to_string()))
    }

    /// The options as a JSON object text (`"{}"` when empty).
    #[must_use]
    pub fn to_json(&self) -> String {
        let mut out = String::from("{");
        for (i, (key, value)) in self.entries.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            push_json_string(&mut out, key);
            out.push_str(": ");
            match value {
                OptionValue::UInt(v) => out.push_str(&v.to_string()),
                OptionValue::Bool(b) => out.push_str(if *b { "true" } else { "false" }),
                OptionValue::Str(s) => push_json_string(&mut out, s),
            }
        }
        out.push('}');
        out
    }
}

impl fmt::Display for Options {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_json())
    }
}

fn push_json_string(out: &mut String, s: &str) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            c if u32::from(c) < 0x20 => {
                // Writing into a String cannot fail.
                let _ = write!(out, "\\u{:04x}", u32::from(c));
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// Escape hatches to the C handle, for calls this binding does not wrap yet.
impl Strategy {
    /// The `wsync_strategy_t` handle, still owned by this value: do not destroy it, and use it only as
    /// wsync.h allows while this value is alive (one thread at a time).
    #[must_use]
    pub fn as_raw(&self) -> *mut sys::wsync_strategy_t {
        self.raw.as_ptr()
    }

    /// Gives up ownership: the caller must destroy the returned handle (once).
    #[must_use = "the handle leaks unless it is destroyed"]
    pub fn into_raw(self) -> *mut sys::wsync_strategy_t {
        let this = std::mem::ManuallyDrop::new(self);
        this.raw.as_ptr()
    }

    /// Takes ownership of a handle made by the C API (or by [`Strategy::into_raw`]).
    ///
    /// # Safety
    /// `raw` must be a live handle of that type that nothing else destroys or uses afterwards.
    #[must_use = "dropping it destroys the handle"]
    pub unsafe fn from_raw(raw: std::ptr::NonNull<sys::wsync_strategy_t>) -> Strategy {
        Strategy { raw }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_render_as_a_json_object_and_replace_keys() {
        assert_eq!(Options::new().to_json(), "{}");
        let o = Options::new()
            .uint("a", 1)
            .boolean("b", false)
            .uint("a", 7)
            .string("s", "x\"\\\n\u{1}");
        assert_eq!(o.to_json(), r#"{"a": 7, "b": false, "s": "x\"\\\n\u0001"}"#);
        let parsed = crate::json::parse(&o.to_json()).unwrap();
        assert_eq!(
            parsed.get("s").and_then(|v| v.as_str()),
            Some("x\"\\\n\u{1}")
        );
    }
}
