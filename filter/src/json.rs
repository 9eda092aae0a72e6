//! Filters written as JSON, the form `shoalctl search --filter`, the
//! benchmarks' case lists and docs/filters.md use:
//!
//! ```json
//! {"must": [{"key": "tags", "match": "django"},
//!           {"key": "rand", "range": {"gte": 10, "lt": 500}}],
//!  "should": [{"key": "lang", "any": ["en", "de"]}],
//!  "must_not": [{"key": "draft", "match": true}, {"has_id": [7, 9]},
//!               {"key": "title", "is_empty": true},
//!               {"must": [...]}]}
//! ```

use serde_json::Value;

use crate::error::{FilterError, at, push_index};
use crate::language::{Bound, Condition, Filter, MatchValue, Range};

/// Parses a filter from its JSON form, then checks it
/// ([`Filter::check`]). The error names the place in the filter.
pub fn parse_json(text: &str) -> Result<Filter, FilterError> {
    let value: Value = serde_json::from_str(text).map_err(|e| at("", format!("is not JSON: {e}")))?;
    let filter = filter(&value, &mut String::new())?;
    filter.check()?;
    Ok(filter)
}

fn filter(v: &Value, path: &mut String) -> Result<Filter, FilterError> {
    let Some(obj) = v.as_object() else {
        return Err(at(path, "must be an object with must, should and must_not lists".into()));
    };
    let mut f = Filter::default();
    for (name, list) in obj {
        let slot = match name.as_str() {
            "must" => &mut f.must,
            "should" => &mut f.should,
            "must_not" => &mut f.must_not,
            other => return Err(at(path, format!("unknown clause {other:?}: a filter holds must, should and must_not"))),
        };
        let Some(items) = list.as_array() else {
            return Err(at(&format!("{path}.{name}"), "must be a list of conditions".into()));
        };
        for (i, item) in items.iter().enumerate() {
            let len = path.len();
            push_index(path, name, i);
            slot.push(condition(item, path)?);
            path.truncate(len);
        }
    }
    Ok(f)
}

fn condition(v: &Value, path: &mut String) -> Result<Condition, FilterError> {
    let Some(obj) = v.as_object() else { return Err(at(path, "must be an object".into())) };
    if obj.keys().any(|k| matches!(k.as_str(), "must" | "should" | "must_not")) {
        return filter(v, path).map(Condition::Filter);
    }
    if let Some(ids) = obj.get("has_id") {
        if obj.len() != 1 {
            return Err(at(path, "has_id stands alone: no other key beside it".into()));
        }
        let ids = ids
            .as_array()
            .and_then(|a| a.iter().map(Value::as_u64).collect::<Option<Vec<u64>>>())
            .ok_or_else(|| at(&format!("{path}.has_id"), "must be a list of point ids (unsigned integers)".into()))?;
        return Ok(Condition::HasId { ids });
    }
    let key = match obj.get("key") {
        Some(Value::String(k)) => k.clone(),
        Some(_) => return Err(at(&format!("{path}.key"), "must be a string".into())),
        None => {
            let found: Vec<&str> = obj.keys().map(String::as_str).collect();
            return Err(at(
                path,
                format!(
                    "unknown condition {found:?}: expected key with match, any, range or is_empty; has_id; or a nested must/should/must_not"
                ),
            ));
        }
    };
    let ops: Vec<&str> = obj.keys().map(String::as_str).filter(|k| *k != "key").collect();
    let [op] = ops[..] else {
        return Err(at(path, format!("needs exactly one of match, any, range, is_empty beside key, got {ops:?}")));
    };
    let place = format!("{path}.{op}");
    let arg = &obj[op];
    match op {
        "match" => Ok(Condition::Match { key, value: match_value(arg, &place)? }),
        "any" => {
            let items = arg.as_array().ok_or_else(|| at(&place, "must be a list of values".into()))?;
            let values = items.iter().enumerate().map(|(i, x)| match_value(x, &format!("{place}[{i}]"))).collect::<Result<_, _>>()?;
            Ok(Condition::Any { key, values })
        }
        "range" => Ok(Condition::Range { key, range: range(arg, &place)? }),
        "is_empty" => match arg.as_bool() {
            Some(empty) => Ok(Condition::IsEmpty { key, empty }),
            None => Err(at(&place, "must be true or false".into())),
        },
        other => Err(at(path, format!("unknown operator {other:?}: expected match, any, range or is_empty"))),
    }
}

fn match_value(v: &Value, place: &str) -> Result<MatchValue, FilterError> {
    match v {
        Value::String(s) => Ok(MatchValue::Keyword(s.clone())),
        Value::Bool(b) => Ok(MatchValue::Bool(*b)),
        Value::Number(n) => n
            .as_i64()
            .map(MatchValue::Integer)
            .ok_or_else(|| at(place, format!("{n} is not an integer: match takes a keyword, an integer or a boolean"))),
        Value::Null | Value::Array(_) | Value::Object(_) => Err(at(place, "must be a keyword, an integer or a boolean".into())),
    }
}

fn range(v: &Value, place: &str) -> Result<Range, FilterError> {
    let Some(obj) = v.as_object() else { return Err(at(place, "must be an object of gt, gte, lt, lte".into())) };
    let mut r = Range::default();
    for (name, b) in obj {
        let slot = match name.as_str() {
            "gt" => &mut r.gt,
            "gte" => &mut r.gte,
            "lt" => &mut r.lt,
            "lte" => &mut r.lte,
            other => return Err(at(place, format!("unknown bound {other:?}: expected gt, gte, lt or lte"))),
        };
        let at_bound = format!("{place}.{name}");
        *slot = Some(match b {
            Value::Number(n) => match n.as_i64() {
                Some(i) => Bound::Integer(i),
                None => Bound::Number(n.as_f64().ok_or_else(|| at(&at_bound, format!("{n} is out of range")))?),
            },
            Value::String(s) => Bound::Datetime(s.clone()),
            Value::Null | Value::Bool(_) | Value::Array(_) | Value::Object(_) => {
                return Err(at(&at_bound, "must be a number or an RFC 3339 time".into()));
            }
        });
    }
    Ok(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shared_cases_parse() {
        let f = parse_json(r#"{"must": [{"key": "tags", "match": "file"}, {"key": "rand", "range": {"lt": 500}}]}"#).unwrap();
        assert_eq!(
            f.must,
            vec![
                Condition::Match { key: "tags".into(), value: MatchValue::Keyword("file".into()) },
                Condition::Range { key: "rand".into(), range: Range { lt: Some(Bound::Integer(500)), ..Range::default() } },
            ]
        );
        let f = parse_json(
            r#"{"must_not": [{"key": "tags", "match": "python"}, {"has_id": [1, 2]}, {"should": [{"key": "t", "is_empty": true}]}]}"#,
        )
        .unwrap();
        assert_eq!(f.must_not.len(), 3);
        assert!(matches!(&f.must_not[2], Condition::Filter(g) if g.should.len() == 1));
    }

    #[test]
    fn errors_name_the_place_in_the_filter() {
        let cases = [
            (r#"{"must": [{"key": "a", "matches": 1}]}"#, "filter must[0]: unknown operator \"matches\""),
            (r#"{"must": [{"key": "a", "match": 1.5}]}"#, "filter must[0].match: 1.5 is not an integer"),
            (
                r#"{"should": [{"must": [{"key": "a", "range": {"gte": "yesterday"}}]}]}"#,
                "filter should[0].must[0].range.gte: \"yesterday\"",
            ),
            (r#"{"must": [{"key": "a", "any": ["x", 1]}]}"#, "filter must[0].any[1]: is of another type"),
            (r#"{"must": [{"key": "a", "range": {}}]}"#, "filter must[0].range: has no bound"),
            (r#"{"must": [{"key": "a", "range": {"gt": 1, "gte": 2}}]}"#, "filter must[0].range: gives both gt and gte"),
            (r#"{"maybe": []}"#, "filter (top): unknown clause \"maybe\""),
            (r#"{"must": [{"has_id": [-1]}]}"#, "filter must[0].has_id: must be a list of point ids"),
            (r#"{"must": [{"key": "", "match": "x"}]}"#, "filter must[0].key: \"\" is not a field name"),
            (r#"{"must": [{"key": "a"}]}"#, "filter must[0]: needs exactly one of match"),
            (r#"[1]"#, "filter (top): must be an object"),
            (r#"{"must": "#, "filter (top): is not JSON"),
        ];
        for (text, want) in cases {
            let got = parse_json(text).unwrap_err().to_string();
            assert!(got.starts_with(want), "{text}: {got}");
        }
        let deep = (0..9).fold(r#"{"key": "a", "match": 1}"#.to_string(), |inner, _| format!(r#"{{"must": [{inner}]}}"#));
        let got = parse_json(&deep).unwrap_err().to_string();
        assert!(got.contains("nested deeper than 8 levels"), "{got}");
        let many = format!(r#"{{"should": [{}]}}"#, vec![r#"{"key": "a", "match": 1}"#; 257].join(","));
        assert!(parse_json(&many).unwrap_err().to_string().contains("more than 256 conditions"));
    }
}
