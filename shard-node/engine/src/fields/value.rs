//! What a payload holds for an indexed field, and how numbers are keyed.
//!
//! A payload the indexes read is the byte [`PAYLOAD_JSON`] followed by a
//! JSON object (the shard node stores JSON payloads so; any other payload
//! holds no field). A field names a key of that object, or a dotted path
//! through nested objects.

use serde_json::Value;

use super::FieldType;

/// First byte of a payload holding JSON text.
pub const PAYLOAD_JSON: u8 = 1;
/// First byte of a payload holding opaque bytes.
pub const PAYLOAD_BINARY: u8 = 0;

/// A field's value in one payload, as its index sees it.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Extracted<'v> {
    /// Missing, `null` or `[]`: what `is_empty` matches.
    Absent,
    /// A value the index cannot hold (a number in a keyword field, a
    /// fraction in an integer field, a string that is no RFC 3339 time).
    Other,
    /// Distinct strings, in the order first met.
    Keywords(Vec<&'v str>),
    /// A number or a time, by its ordered key ([`ord_i64`], [`ord_f64`]).
    Number(u64),
    Bool(bool),
}

/// The JSON object a payload holds, if it holds one.
pub(crate) fn payload_object(bytes: &[u8]) -> Option<Value> {
    let (&tag, body) = bytes.split_first()?;
    if tag != PAYLOAD_JSON {
        return None;
    }
    serde_json::from_slice::<Value>(body).ok().filter(Value::is_object)
}

/// The value at `path` (object keys, outermost first) in `root`.
pub(crate) fn lookup<'v, 'p>(root: &'v Value, path: impl IntoIterator<Item = &'p str>) -> Option<&'v Value> {
    let mut at = root;
    for key in path {
        at = at.as_object()?.get(key)?;
    }
    Some(at)
}

/// What `value` (the field's value in a payload, if present) is to an
/// index of `kind`.
pub(crate) fn extract(value: Option<&Value>, kind: FieldType) -> Extracted<'_> {
    let value = match value {
        None | Some(Value::Null) => return Extracted::Absent,
        Some(Value::Array(a)) if a.is_empty() => return Extracted::Absent,
        Some(v) => v,
    };
    match kind {
        FieldType::Keyword => keywords(value),
        FieldType::Bool => value.as_bool().map_or(Extracted::Other, Extracted::Bool),
        FieldType::Integer => value.as_number().and_then(integer).map_or(Extracted::Other, |i| Extracted::Number(ord_i64(i))),
        FieldType::Float => match value.as_f64() {
            Some(f) if value.is_number() => Extracted::Number(ord_f64(f)),
            _ => Extracted::Other,
        },
        FieldType::Datetime => match value.as_str().and_then(parse_datetime) {
            Some(t) => Extracted::Number(ord_i64(t)),
            None => Extracted::Other,
        },
    }
}

fn keywords(value: &Value) -> Extracted<'_> {
    let fits = |s: &&str| s.len() <= MAX_KEYWORD_BYTES;
    if let Some(items) = value.as_array() {
        let mut out: Vec<&str> = Vec::new();
        for s in items.iter().filter_map(Value::as_str).filter(fits) {
            if !out.contains(&s) {
                out.push(s);
            }
        }
        return if out.is_empty() { Extracted::Other } else { Extracted::Keywords(out) };
    }
    value.as_str().filter(fits).map_or(Extracted::Other, |s| Extracted::Keywords(vec![s]))
}

/// A JSON number as an integer index holds it: whole, and above
/// `i64::MIN` (whose key is reserved for "no value" in a column).
pub(crate) fn integer(n: &serde_json::Number) -> Option<i64> {
    let i = match n.as_i64() {
        Some(i) => i,
        None => {
            let f = n.as_f64()?;
            // 2^63 is the first float past i64::MAX.
            if f.fract() != 0.0 || !(f > -TWO_63 && f < TWO_63) {
                return None;
            }
            f as i64
        }
    };
    (i != i64::MIN).then_some(i)
}

/// 2^63 as a float.
const TWO_63: f64 = 9_223_372_036_854_775_808.0;

pub(crate) use shoal_filter::{MAX_KEYWORD_BYTES, ord_f64, ord_i64, parse_datetime};

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn values_are_what_their_index_can_hold() {
        let p = json!({"tags": ["a", "b", "a", 3], "n": 5, "f": 2.5, "w": 4.0, "t": "2026-12-02T10:00:00.5Z",
                       "b": true, "none": null, "empty": [], "meta": {"lang": "en"}, "long": "x".repeat(300)});
        let get = |path: &str, kind| extract(lookup(&p, path.split('.')), kind);
        assert_eq!(get("tags", FieldType::Keyword), Extracted::Keywords(vec!["a", "b"]));
        assert_eq!(get("meta.lang", FieldType::Keyword), Extracted::Keywords(vec!["en"]));
        assert_eq!(get("n", FieldType::Keyword), Extracted::Other);
        assert_eq!(get("long", FieldType::Keyword), Extracted::Other);
        assert_eq!(get("n", FieldType::Integer), Extracted::Number(ord_i64(5)));
        assert_eq!(get("w", FieldType::Integer), Extracted::Number(ord_i64(4)));
        assert_eq!(get("f", FieldType::Integer), Extracted::Other);
        assert_eq!(get("f", FieldType::Float), Extracted::Number(ord_f64(2.5)));
        assert_eq!(get("n", FieldType::Float), Extracted::Number(ord_f64(5.0)));
        assert_eq!(get("b", FieldType::Bool), Extracted::Bool(true));
        assert_eq!(get("t", FieldType::Datetime), Extracted::Number(ord_i64(1_796_205_600_500_000)));
        assert_eq!(get("tags", FieldType::Datetime), Extracted::Other);
        for absent in ["none", "empty", "missing", "meta.missing", "n.deeper"] {
            assert_eq!(get(absent, FieldType::Keyword), Extracted::Absent, "{absent}");
        }
        assert_eq!(integer(&serde_json::Number::from(i64::MIN)), None);
        assert!(payload_object(b"\x01{\"a\":1}").is_some());
        assert!(payload_object(b"\x01[1]").is_none() && payload_object(b"\x00{}").is_none() && payload_object(b"\x01{").is_none());
    }
}
