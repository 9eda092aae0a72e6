//! What a field index holds, and which names a field may have.

/// What a field index holds, and what a filter may ask of the field.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FieldType {
    /// Strings, or arrays of strings: `match` and `any`.
    Keyword,
    /// Whole numbers (i64): `match`, `any` and ranges.
    Integer,
    /// Numbers (f64): ranges.
    Float,
    /// `true` or `false`: `match`.
    Bool,
    /// RFC 3339 timestamps (`2026-12-02T10:00:00Z`), kept to the
    /// microsecond: ranges with RFC 3339 bounds.
    Datetime,
}

impl FieldType {
    /// Every type, in the order of their stored codes.
    pub const ALL: [FieldType; 5] = [FieldType::Keyword, FieldType::Integer, FieldType::Float, FieldType::Bool, FieldType::Datetime];

    /// The type's name in the API and in messages.
    pub fn name(self) -> &'static str {
        match self {
            FieldType::Keyword => "keyword",
            FieldType::Integer => "integer",
            FieldType::Float => "float",
            FieldType::Bool => "bool",
            FieldType::Datetime => "datetime",
        }
    }

    /// The type named `name` (as [`FieldType::name`] gives it).
    pub fn parse(name: &str) -> Option<FieldType> {
        FieldType::ALL.into_iter().find(|t| t.name() == name)
    }

    /// Numbers and times: what ranges apply to.
    pub fn is_numeric(self) -> bool {
        matches!(self, FieldType::Integer | FieldType::Float | FieldType::Datetime)
    }
}

impl std::fmt::Display for FieldType {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// Longest field name, in bytes.
pub const MAX_FIELD_NAME_BYTES: usize = 255;

/// Checks a field name: 1 to [`MAX_FIELD_NAME_BYTES`] bytes, dotted
/// segments none of which is empty.
pub fn check_name(field: &str) -> Result<(), String> {
    let ok = !field.is_empty() && field.len() <= MAX_FIELD_NAME_BYTES && field.split('.').all(|s| !s.is_empty());
    if ok { Ok(()) } else { Err(format!("field name {field:?} must be 1 to {MAX_FIELD_NAME_BYTES} bytes of dotted, non-empty segments")) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_and_types() {
        for name in ["", ".a", "a.", "a..b", &"x".repeat(256)] {
            assert!(check_name(name).is_err(), "{name:?}");
        }
        check_name("meta.lang").unwrap();
        assert_eq!(FieldType::parse("datetime"), Some(FieldType::Datetime));
        assert_eq!(FieldType::parse("text"), None);
    }
}
