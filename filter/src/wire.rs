//! Filters and field types to and from the `shoal.v1` wire messages, the
//! one conversion both shard nodes and coordinators use.

use shoal_proto::{ShoalError, v1};

use crate::{Bound, Condition, FieldType, Filter, MatchValue, Range};

/// The filter a wire filter stands for, checked whole ([`Filter::check`]):
/// an error names the place in the filter (`filter must[1].range.gte: ...`).
pub fn from_proto(f: v1::Filter) -> Result<Filter, ShoalError> {
    let filter = filter(f, &mut String::new())?;
    filter.check().map_err(|e| ShoalError::invalid(e.to_string()))?;
    Ok(filter)
}

/// An optional wire filter: absent is the empty filter.
pub fn from_proto_opt(f: Option<v1::Filter>) -> Result<Filter, ShoalError> {
    f.map_or_else(|| Ok(Filter::default()), from_proto)
}

fn at(path: &str, reason: &str) -> ShoalError {
    let path = if path.is_empty() { "(top)" } else { path.trim_start_matches('.') };
    ShoalError::invalid(format!("filter {path}: {reason}"))
}

fn filter(f: v1::Filter, path: &mut String) -> Result<Filter, ShoalError> {
    let v1::Filter { must, should, must_not } = f;
    let mut out = Filter::default();
    for (name, list, slot) in
        [("must", must, &mut out.must), ("should", should, &mut out.should), ("must_not", must_not, &mut out.must_not)]
    {
        for (i, c) in list.into_iter().enumerate() {
            let len = path.len();
            if !path.is_empty() {
                path.push('.');
            }
            path.push_str(&format!("{name}[{i}]"));
            slot.push(condition(c, path)?);
            path.truncate(len);
        }
    }
    Ok(out)
}

fn condition(c: v1::Condition, path: &mut String) -> Result<Condition, ShoalError> {
    let v1::Condition { kind } = c;
    match kind {
        None => Err(at(path, "a condition must be a field condition, a nested filter or has_id")),
        Some(v1::condition::Kind::Filter(f)) => Ok(Condition::Filter(filter(f, path)?)),
        Some(v1::condition::Kind::HasId(v1::HasId { ids })) => Ok(Condition::HasId { ids }),
        Some(v1::condition::Kind::Field(v1::FieldCondition { key, test })) => {
            let place = |op: &str| format!("{path}.{op}");
            match test {
                None => Err(at(path, "a field condition needs one of match, any, range or is_empty")),
                Some(v1::field_condition::Test::Match(v)) => Ok(Condition::Match { key, value: value(v, &place("match"))? }),
                Some(v1::field_condition::Test::Any(v1::MatchAny { values })) => {
                    let values =
                        values.into_iter().enumerate().map(|(i, v)| value(v, &place(&format!("any[{i}]")))).collect::<Result<_, _>>()?;
                    Ok(Condition::Any { key, values })
                }
                Some(v1::field_condition::Test::Range(r)) => Ok(Condition::Range { key, range: range(r, &place("range"))? }),
                Some(v1::field_condition::Test::IsEmpty(empty)) => Ok(Condition::IsEmpty { key, empty }),
            }
        }
    }
}

fn value(v: v1::MatchValue, place: &str) -> Result<MatchValue, ShoalError> {
    match v.value {
        Some(v1::match_value::Value::Keyword(s)) => Ok(MatchValue::Keyword(s)),
        Some(v1::match_value::Value::Integer(i)) => Ok(MatchValue::Integer(i)),
        Some(v1::match_value::Value::Boolean(b)) => Ok(MatchValue::Bool(b)),
        None => Err(at(place, "a value must be a keyword, an integer or a boolean")),
    }
}

fn range(r: v1::Range, place: &str) -> Result<Range, ShoalError> {
    let v1::Range { gt, gte, lt, lte } = r;
    let b = |b: Option<v1::RangeBound>, name: &str| -> Result<Option<Bound>, ShoalError> {
        match b.map(|b| b.value) {
            None => Ok(None),
            Some(Some(v1::range_bound::Value::Number(f))) => Ok(Some(Bound::Number(f))),
            Some(Some(v1::range_bound::Value::Integer(i))) => Ok(Some(Bound::Integer(i))),
            Some(Some(v1::range_bound::Value::Datetime(s))) => Ok(Some(Bound::Datetime(s))),
            Some(None) => Err(at(&format!("{place}.{name}"), "a bound must be a number, an integer or an RFC 3339 time")),
        }
    };
    Ok(Range { gt: b(gt, "gt")?, gte: b(gte, "gte")?, lt: b(lt, "lt")?, lte: b(lte, "lte")? })
}

/// The wire form of a filter (shoalctl and tests build filters from JSON,
/// then send them).
pub fn to_proto(f: &Filter) -> v1::Filter {
    let list = |cs: &[Condition]| cs.iter().map(condition_to_proto).collect();
    v1::Filter { must: list(&f.must), should: list(&f.should), must_not: list(&f.must_not) }
}

fn condition_to_proto(c: &Condition) -> v1::Condition {
    use v1::field_condition::Test;
    let field = |key: &str, test: Test| v1::condition::Kind::Field(v1::FieldCondition { key: key.to_owned(), test: Some(test) });
    let kind = match c {
        Condition::Filter(f) => v1::condition::Kind::Filter(to_proto(f)),
        Condition::HasId { ids } => v1::condition::Kind::HasId(v1::HasId { ids: ids.clone() }),
        Condition::Match { key, value } => field(key, Test::Match(value_to_proto(value))),
        Condition::Any { key, values } => field(key, Test::Any(v1::MatchAny { values: values.iter().map(value_to_proto).collect() })),
        Condition::IsEmpty { key, empty } => field(key, Test::IsEmpty(*empty)),
        Condition::Range { key, range } => {
            let b = |b: &Option<Bound>| {
                b.as_ref().map(|b| v1::RangeBound {
                    value: Some(match b {
                        Bound::Number(f) => v1::range_bound::Value::Number(*f),
                        Bound::Integer(i) => v1::range_bound::Value::Integer(*i),
                        Bound::Datetime(s) => v1::range_bound::Value::Datetime(s.clone()),
                    }),
                })
            };
            field(key, Test::Range(v1::Range { gt: b(&range.gt), gte: b(&range.gte), lt: b(&range.lt), lte: b(&range.lte) }))
        }
    };
    v1::Condition { kind: Some(kind) }
}

fn value_to_proto(v: &MatchValue) -> v1::MatchValue {
    v1::MatchValue {
        value: Some(match v {
            MatchValue::Keyword(s) => v1::match_value::Value::Keyword(s.clone()),
            MatchValue::Integer(i) => v1::match_value::Value::Integer(*i),
            MatchValue::Bool(b) => v1::match_value::Value::Boolean(*b),
        }),
    }
}

/// The field type a wire one stands for.
pub fn field_type_from_proto(t: i32) -> Result<FieldType, ShoalError> {
    match v1::FieldType::try_from(t) {
        Ok(v1::FieldType::Keyword) => Ok(FieldType::Keyword),
        Ok(v1::FieldType::Integer) => Ok(FieldType::Integer),
        Ok(v1::FieldType::Float) => Ok(FieldType::Float),
        Ok(v1::FieldType::Bool) => Ok(FieldType::Bool),
        Ok(v1::FieldType::Datetime) => Ok(FieldType::Datetime),
        Ok(v1::FieldType::Unspecified) | Err(_) => {
            Err(ShoalError::invalid(format!("field type {t} is not one of KEYWORD, INTEGER, FLOAT, BOOL, DATETIME")))
        }
    }
}

/// The wire form of a field type.
pub fn field_type_to_proto(t: FieldType) -> v1::FieldType {
    match t {
        FieldType::Keyword => v1::FieldType::Keyword,
        FieldType::Integer => v1::FieldType::Integer,
        FieldType::Float => v1::FieldType::Float,
        FieldType::Bool => v1::FieldType::Bool,
        FieldType::Datetime => v1::FieldType::Datetime,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_cross_the_wire_unchanged_and_bad_ones_are_named() {
        let text = r#"{"must": [{"key": "tags", "any": ["a", "b"]}, {"key": "t", "range": {"gte": "2026-01-01T00:00:00Z", "lt": 5}}],
                       "should": [{"has_id": [3, 4]}, {"key": "n", "match": 7}],
                       "must_not": [{"must": [{"key": "x", "is_empty": false}, {"key": "f", "range": {"gt": 0.5}}]}]}"#;
        let f = crate::parse_json(text).unwrap();
        assert_eq!(from_proto(to_proto(&f)).unwrap(), f);
        let empty = v1::Filter { must: vec![v1::Condition { kind: None }], ..Default::default() };
        assert!(from_proto(empty).unwrap_err().to_string().contains("filter must[0]: a condition must be"));
        let no_test = v1::Filter {
            should: vec![
                v1::Condition { kind: Some(v1::condition::Kind::HasId(v1::HasId { ids: vec![] })) },
                v1::Condition { kind: Some(v1::condition::Kind::Field(v1::FieldCondition { key: "a".into(), test: None })) },
            ],
            ..Default::default()
        };
        assert!(from_proto(no_test).unwrap_err().to_string().contains("filter should[1]: a field condition needs"));
        let bad_range = v1::Filter {
            must: vec![v1::Condition {
                kind: Some(v1::condition::Kind::Field(v1::FieldCondition {
                    key: "a".into(),
                    test: Some(v1::field_condition::Test::Range(v1::Range::default())),
                })),
            }],
            ..Default::default()
        };
        assert!(from_proto(bad_range).unwrap_err().to_string().contains("filter must[0].range: has no bound"));
        assert!(field_type_from_proto(0).is_err() && field_type_from_proto(99).is_err());
        assert_eq!(field_type_from_proto(field_type_to_proto(FieldType::Float) as i32).unwrap(), FieldType::Float);
    }
}
