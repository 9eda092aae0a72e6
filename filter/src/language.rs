//! The language: filters, their conditions, their limits, and the checks
//! that need no field index.

use crate::error::{FilterError, at, push_index};
use crate::field_type::check_name;
use crate::keys::{MAX_KEYWORD_BYTES, parse_datetime};

/// Points that match every condition of `must`, at least one of `should`
/// (if it has any) and none of `must_not`. The empty filter matches every
/// point.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Filter {
    /// All of these.
    pub must: Vec<Condition>,
    /// At least one of these, if any.
    pub should: Vec<Condition>,
    /// None of these.
    pub must_not: Vec<Condition>,
}

/// One condition of a filter.
#[derive(Clone, Debug, PartialEq)]
pub enum Condition {
    /// The field holds `value` (for a keyword array: among its strings).
    Match {
        /// The field's name.
        key: String,
        /// The value.
        value: MatchValue,
    },
    /// The field holds one of `values`.
    Any {
        /// The field's name.
        key: String,
        /// The values, all of one type.
        values: Vec<MatchValue>,
    },
    /// The field holds a number or time within the bounds.
    Range {
        /// The field's name.
        key: String,
        /// The bounds; at least one.
        range: Range,
    },
    /// The field is missing, `null` or `[]` (`empty: true`), or holds
    /// something (`empty: false`).
    IsEmpty {
        /// The field's name.
        key: String,
        /// Which of the two.
        empty: bool,
    },
    /// The point's id is one of these.
    HasId {
        /// External ids.
        ids: Vec<u64>,
    },
    /// A nested filter.
    Filter(Filter),
}

/// A value to match.
#[derive(Clone, Debug, PartialEq)]
pub enum MatchValue {
    /// A string (keyword fields).
    Keyword(String),
    /// A whole number (integer fields).
    Integer(i64),
    /// A boolean (bool fields).
    Bool(bool),
}

/// Bounds of a range; unset ones are open.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Range {
    /// Greater than.
    pub gt: Option<Bound>,
    /// Greater than or equal.
    pub gte: Option<Bound>,
    /// Less than.
    pub lt: Option<Bound>,
    /// Less than or equal.
    pub lte: Option<Bound>,
}

/// One bound of a range.
#[derive(Clone, Debug, PartialEq)]
pub enum Bound {
    /// A whole number.
    Integer(i64),
    /// A number (finite).
    Number(f64),
    /// An RFC 3339 time, for datetime fields.
    Datetime(String),
}

/// Deepest nesting a filter may have (the top filter is depth 1).
pub const MAX_FILTER_DEPTH: usize = 8;
/// Most conditions one filter may hold, nested ones included.
pub const MAX_FILTER_CONDITIONS: usize = 256;
/// Most values one `any` may list.
pub const MAX_ANY_VALUES: usize = 1024;
/// Most ids one `has_id` may list.
pub const MAX_HAS_IDS: usize = 10_000;

impl Filter {
    /// True if it has no condition: it matches every point.
    pub fn is_empty(&self) -> bool {
        self.must.is_empty() && self.should.is_empty() && self.must_not.is_empty()
    }

    /// Checks what needs no index: size, depth and values. The error
    /// names the place in the filter.
    pub fn check(&self) -> Result<(), FilterError> {
        let mut count = 0;
        self.check_at(&mut String::new(), 1, &mut count)
    }

    fn check_at(&self, path: &mut String, depth: usize, count: &mut usize) -> Result<(), FilterError> {
        if depth > MAX_FILTER_DEPTH {
            return Err(at(path, format!("nested deeper than {MAX_FILTER_DEPTH} levels")));
        }
        for (clause, conditions) in self.clauses() {
            for (i, c) in conditions.iter().enumerate() {
                let len = path.len();
                push_index(path, clause, i);
                *count += 1;
                if *count > MAX_FILTER_CONDITIONS {
                    return Err(at(path, format!("the filter holds more than {MAX_FILTER_CONDITIONS} conditions")));
                }
                c.check_at(path, depth, count)?;
                path.truncate(len);
            }
        }
        Ok(())
    }

    /// The three clauses with their names.
    pub fn clauses(&self) -> [(&'static str, &[Condition]); 3] {
        [("must", &self.must), ("should", &self.should), ("must_not", &self.must_not)]
    }
}

impl Condition {
    fn check_at(&self, path: &mut String, depth: usize, count: &mut usize) -> Result<(), FilterError> {
        match self {
            Condition::Match { key, value } => {
                check_key(path, key)?;
                check_value(path, ".match", value)
            }
            Condition::Any { key, values } => {
                check_key(path, key)?;
                if values.is_empty() {
                    return Err(at(&format!("{path}.any"), "lists no value".into()));
                }
                if values.len() > MAX_ANY_VALUES {
                    return Err(at(&format!("{path}.any"), format!("lists {} values, more than {MAX_ANY_VALUES}", values.len())));
                }
                for (i, v) in values.iter().enumerate() {
                    check_value(path, &format!(".any[{i}]"), v)?;
                }
                let kind = std::mem::discriminant(&values[0]);
                if let Some(i) = values.iter().position(|v| std::mem::discriminant(v) != kind) {
                    return Err(at(&format!("{path}.any[{i}]"), "is of another type than the first value".into()));
                }
                Ok(())
            }
            Condition::Range { key, range } => {
                check_key(path, key)?;
                let bounds = range.bounds();
                if bounds.iter().all(|(_, b)| b.is_none()) {
                    return Err(at(&format!("{path}.range"), "has no bound: give gt, gte, lt or lte".into()));
                }
                for (name, bound) in bounds {
                    if let Some(Bound::Number(f)) = bound
                        && !f.is_finite()
                    {
                        return Err(at(&format!("{path}.range.{name}"), format!("{f} is not a finite number")));
                    }
                    if let Some(Bound::Datetime(s)) = bound
                        && parse_datetime(s).is_none()
                    {
                        return Err(at(&format!("{path}.range.{name}"), format!("{s:?} is not an RFC 3339 time")));
                    }
                }
                if range.gt.is_some() && range.gte.is_some() || range.lt.is_some() && range.lte.is_some() {
                    return Err(at(&format!("{path}.range"), "gives both gt and gte, or both lt and lte".into()));
                }
                Ok(())
            }
            Condition::IsEmpty { key, .. } => check_key(path, key),
            Condition::HasId { ids } => {
                if ids.len() > MAX_HAS_IDS {
                    return Err(at(&format!("{path}.has_id"), format!("lists {} ids, more than {MAX_HAS_IDS}", ids.len())));
                }
                Ok(())
            }
            Condition::Filter(f) => f.check_at(path, depth + 1, count),
        }
    }
}

impl Range {
    /// The bounds with their names.
    pub fn bounds(&self) -> [(&'static str, Option<&Bound>); 4] {
        [("gt", self.gt.as_ref()), ("gte", self.gte.as_ref()), ("lt", self.lt.as_ref()), ("lte", self.lte.as_ref())]
    }
}

fn check_key(path: &str, key: &str) -> Result<(), FilterError> {
    check_name(key).map_err(|_| at(&format!("{path}.key"), format!("{key:?} is not a field name")))
}

fn check_value(path: &str, place: &str, value: &MatchValue) -> Result<(), FilterError> {
    match value {
        MatchValue::Keyword(s) if s.len() > MAX_KEYWORD_BYTES => {
            Err(at(&format!("{path}{place}"), format!("a keyword of {} bytes; keywords are at most {MAX_KEYWORD_BYTES}", s.len())))
        }
        MatchValue::Integer(i64::MIN) => Err(at(&format!("{path}{place}"), "-2^63 cannot be indexed".into())),
        MatchValue::Keyword(_) | MatchValue::Integer(_) | MatchValue::Bool(_) => Ok(()),
    }
}

impl MatchValue {
    /// The type's name, for messages.
    pub fn type_name(&self) -> &'static str {
        match self {
            MatchValue::Keyword(_) => "a keyword",
            MatchValue::Integer(_) => "an integer",
            MatchValue::Bool(_) => "a boolean",
        }
    }
}
