//! Tied and aliased tensors on the wire: one wire tensor whose name joins every name it is
//! known under with `=` (`"transformer.wte.weight=lm_head.weight"`), so its bytes cross once.
//!
//! The convention is the library's across languages (docs/wire-format.md, "Aliases"): the
//! Python producers (`wsync.trainer.send_model`, `LazySource`) join the names of true aliases,
//! and an engine that reads wire names itself loads the tensor under every name
//! [`alias_names`] returns. [`join_alias_names`] builds the wire names on a Rust trainer, with
//! the same rules as Python's `wsync.trainer.join_alias_names`, so either side may be written
//! in either language.

/// The character that joins alias names in one wire name.
pub const ALIAS_SEPARATOR: char = '=';

/// The longest tensor name the library accepts, in UTF-8 bytes (`WSYNC_MAX_NAME_BYTES`).
pub const MAX_NAME_BYTES: usize = wsync_sys::WSYNC_MAX_NAME_BYTES;

/// The names one wire tensor loads under: `name` split at every `=`, or `name` alone when it
/// has no `=` or when a part would be empty (`"a="`, `"=b"`, `"a==b"` are taken whole: such a
/// name was never produced by joining).
///
/// ```
/// assert_eq!(wsync::alias_names("wte.weight=lm_head.weight"), ["wte.weight", "lm_head.weight"]);
/// assert_eq!(wsync::alias_names("odd="), ["odd="]);
/// ```
#[must_use]
pub fn alias_names(name: &str) -> Vec<&str> {
    let parts: Vec<&str> = name.split(ALIAS_SEPARATOR).collect();
    if parts.len() == 1 || parts.iter().any(|p| p.is_empty()) {
        vec![name]
    } else {
        parts
    }
}

/// The wire names that carry one tensor known under `names`: the names joined with `=` in
/// order, in as few joined names as fit [`MAX_NAME_BYTES`] each (a tensor under several wire
/// names crosses once per wire name); names that contain `=` or are empty cannot be joined
/// and come last, each alone.
///
/// ```
/// assert_eq!(wsync::join_alias_names(&["a", "odd=name", "b"]), ["a=b", "odd=name"]);
/// ```
#[must_use]
pub fn join_alias_names<S: AsRef<str>>(names: &[S]) -> Vec<String> {
    let mut out = Vec::new();
    let mut alone = Vec::new();
    let mut current: Vec<&str> = Vec::new();
    let mut size = 0usize;
    for name in names.iter().map(AsRef::as_ref) {
        if name.is_empty() || name.contains(ALIAS_SEPARATOR) {
            alone.push(name.to_owned());
            continue;
        }
        if !current.is_empty() && size + 1 + name.len() > MAX_NAME_BYTES {
            out.push(current.join("="));
            current.clear();
            size = 0;
        }
        size += name.len() + usize::from(!current.is_empty());
        current.push(name);
    }
    if !current.is_empty() {
        out.push(current.join("="));
    }
    out.extend(alone);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_split_only_where_every_part_is_a_name() {
        assert_eq!(alias_names("a=b=c"), ["a", "b", "c"]);
        assert_eq!(alias_names("plain.weight"), ["plain.weight"]);
        for whole in ["a=", "=a", "a==b", "=", ""] {
            assert_eq!(alias_names(whole), [whole], "{whole:?}");
        }
    }

    #[test]
    fn joining_round_trips_and_keeps_each_wire_name_within_the_limit() {
        // The same case as Python's test_producers: five 402-byte names fit two per wire name.
        let long: Vec<String> = (0..5).map(|i| format!("{}.{i}", "x".repeat(400))).collect();
        let joined = join_alias_names(&long);
        assert_eq!(joined.len(), 3);
        assert!(joined.iter().all(|n| n.len() <= MAX_NAME_BYTES));
        let back: Vec<&str> = joined.iter().flat_map(|n| alias_names(n)).collect();
        assert_eq!(back, long);
        // A name at the limit stays alone; multi-byte names count bytes, not chars.
        let max = "y".repeat(MAX_NAME_BYTES);
        assert_eq!(
            join_alias_names(&[max.as_str(), "z"]),
            [max.clone(), "z".to_owned()]
        );
        let wide = "é".repeat(300); // 600 bytes: two do not fit one name
        assert_eq!(join_alias_names(&[wide.as_str(), wide.as_str()]).len(), 2);
    }

    #[test]
    fn names_that_cannot_be_joined_come_last_alone() {
        assert_eq!(
            join_alias_names(&["a", "odd=name", "b", ""]),
            ["a=b", "odd=name", ""]
        );
        assert_eq!(join_alias_names::<&str>(&[]), Vec::<String>::new());
    }
}
