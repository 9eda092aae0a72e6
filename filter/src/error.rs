//! What is wrong with a filter, and where.

/// A filter that is malformed, or asks what the field indexes cannot
/// answer; `path` says where inside it (`must[1].range.gte`, or `(top)`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("filter {path}: {reason}")]
pub struct FilterError {
    /// Where in the filter, from its top.
    pub path: String,
    /// What is wrong there.
    pub reason: String,
}

/// A filter error at `path` (the top when empty).
pub(crate) fn at(path: &str, reason: String) -> FilterError {
    FilterError { path: if path.is_empty() { "(top)".to_owned() } else { path.trim_start_matches('.').to_owned() }, reason }
}

/// Appends `clause[i]` to a path.
pub(crate) fn push_index(path: &mut String, clause: &str, i: usize) {
    use std::fmt::Write;
    if !path.is_empty() {
        path.push('.');
    }
    let _ = write!(path, "{clause}[{i}]");
}
