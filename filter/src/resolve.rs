//! A filter resolved against a shard's field indexes: every condition
//! becomes a test of one field's value, by its ordered key, which the
//! indexes answer for all points at once and a payload for one.

use crate::error::{FilterError, at, push_index};
use crate::field_type::FieldType;
use crate::keys::{ord_f64, ord_i64, parse_datetime};
use crate::language::{Bound, Condition, Filter, MatchValue, Range};

/// What a shard's index on a field is, for [`resolve`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Indexed {
    /// Its number in the shard's keys.
    pub id: u16,
    /// What it holds.
    pub kind: FieldType,
    /// While built online: how far, in percent.
    pub building: Option<u32>,
}

/// Why a filter cannot be answered.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ResolveError {
    /// The filter is wrong for these indexes.
    Invalid(FilterError),
    /// A field's index is still being built (and no scan was allowed).
    Building {
        /// Where in the filter.
        path: String,
        /// The field.
        field: String,
        /// How far the build is.
        percent: u32,
    },
}

/// One condition on one field.
#[derive(Clone, Debug, PartialEq)]
pub struct Leaf {
    /// The field's name (its path, dotted).
    pub field: String,
    /// How the field's value is read.
    pub kind: FieldType,
    /// The index's number, if the field has a ready index (else the
    /// payloads answer: a scan the request allowed).
    pub index: Option<u16>,
    /// What it asks of the value.
    pub test: Test,
}

/// What a leaf asks of the field's value.
#[derive(Clone, Debug, PartialEq)]
pub enum Test {
    /// It holds one of these (keywords: among its strings).
    Keys(Vec<Key>),
    /// It is a number (or time) whose ordered key lies in `lo..=hi`.
    Range {
        /// Lowest key admitted.
        lo: u64,
        /// Highest key admitted.
        hi: u64,
    },
    /// It is missing, `null` or `[]`.
    Empty,
}

/// One value a [`Test::Keys`] looks for.
#[derive(Clone, Debug, PartialEq)]
pub enum Key {
    /// A string.
    Keyword(String),
    /// An integer's ordered key.
    Number(u64),
    /// A boolean.
    Bool(bool),
}

/// A prepared filter.
#[derive(Clone, Debug, PartialEq)]
pub enum Node {
    /// Every point.
    All,
    /// No point.
    None,
    /// One field's test.
    Leaf(Leaf),
    /// External ids, sorted.
    Ids(Vec<u64>),
    /// All of these.
    And(Vec<Node>),
    /// Any of these.
    Or(Vec<Node>),
    /// Not this.
    Not(Box<Node>),
}

/// Resolves `filter` (already [`Filter::check`]ed) against the indexes
/// `lookup` gives. A field without a ready index is refused unless
/// `allow_unindexed`.
pub fn resolve(filter: &Filter, lookup: &dyn Fn(&str) -> Option<Indexed>, allow_unindexed: bool) -> Result<Node, ResolveError> {
    let ctx = Ctx { lookup, allow_unindexed };
    ctx.filter(filter, &mut String::new())
}

struct Ctx<'s> {
    lookup: &'s dyn Fn(&str) -> Option<Indexed>,
    allow_unindexed: bool,
}

impl Ctx<'_> {
    fn filter(&self, f: &Filter, path: &mut String) -> Result<Node, ResolveError> {
        let mut all = Vec::new();
        let mut any = Vec::new();
        for (clause, conditions) in f.clauses() {
            for (i, c) in conditions.iter().enumerate() {
                let len = path.len();
                push_index(path, clause, i);
                let node = self.condition(c, path)?;
                path.truncate(len);
                match clause {
                    "must" => all.push(node),
                    "should" => any.push(node),
                    _ => all.push(negate(node)),
                }
            }
        }
        if !any.is_empty() {
            all.push(if any.len() == 1 { any.pop().unwrap_or(Node::None) } else { Node::Or(any) });
        }
        Ok(match all.len() {
            0 => Node::All,
            1 => all.pop().unwrap_or(Node::All),
            _ => Node::And(all),
        })
    }

    fn condition(&self, c: &Condition, path: &mut String) -> Result<Node, ResolveError> {
        match c {
            Condition::Filter(f) => self.filter(f, path),
            Condition::HasId { ids } => {
                let mut ids = ids.clone();
                ids.sort_unstable();
                ids.dedup();
                Ok(Node::Ids(ids))
            }
            Condition::Match { key, value } => {
                let kind = self.field(path, key, Some(value_kind(value)))?;
                Ok(Node::Leaf(Leaf {
                    test: Test::Keys(vec![self.key(path, ".match", key, kind.1, value)?]),
                    field: key.clone(),
                    kind: kind.1,
                    index: kind.0,
                }))
            }
            Condition::Any { key, values } => {
                let (index, kind) = self.field(path, key, values.first().map(value_kind))?;
                let keys = values
                    .iter()
                    .enumerate()
                    .map(|(i, v)| self.key(path, &format!(".any[{i}]"), key, kind, v))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Node::Leaf(Leaf { field: key.clone(), kind, index, test: Test::Keys(keys) }))
            }
            Condition::Range { key, range } => {
                let guess = if range.bounds().iter().any(|(_, b)| matches!(b, Some(Bound::Datetime(_)))) {
                    FieldType::Datetime
                } else {
                    FieldType::Float
                };
                let (index, kind) = self.field(path, key, Some(guess))?;
                match range_keys(path, key, kind, range)? {
                    Some((lo, hi)) => Ok(Node::Leaf(Leaf { field: key.clone(), kind, index, test: Test::Range { lo, hi } })),
                    None => Ok(Node::None),
                }
            }
            Condition::IsEmpty { key, empty } => {
                let (index, kind) = self.field(path, key, Some(FieldType::Keyword))?;
                let leaf = Node::Leaf(Leaf { field: key.clone(), kind, index, test: Test::Empty });
                Ok(if *empty { leaf } else { negate(leaf) })
            }
        }
    }

    /// The field's ready index and type; for a field without one, `guess`
    /// (what the condition's values say) if a scan is allowed.
    fn field(&self, path: &str, key: &str, guess: Option<FieldType>) -> Result<(Option<u16>, FieldType), ResolveError> {
        match (self.lookup)(key) {
            Some(def) => match def.building {
                None => Ok((Some(def.id), def.kind)),
                Some(_) if self.allow_unindexed => Ok((None, def.kind)),
                Some(percent) => {
                    Err(ResolveError::Building { path: path.trim_start_matches('.').to_owned(), field: key.to_owned(), percent })
                }
            },
            None if self.allow_unindexed => Ok((None, guess.unwrap_or(FieldType::Keyword))),
            None => Err(ResolveError::Invalid(at(
                path,
                format!(
                    "the field {key} has no index: create one (shoalctl index create), or set allow_unindexed to accept a scan of every point"
                ),
            ))),
        }
    }

    fn key(&self, path: &str, place: &str, field: &str, kind: FieldType, v: &MatchValue) -> Result<Key, ResolveError> {
        match (kind, v) {
            (FieldType::Keyword, MatchValue::Keyword(s)) => Ok(Key::Keyword(s.clone())),
            (FieldType::Integer, MatchValue::Integer(i)) => Ok(Key::Number(ord_i64(*i))),
            (FieldType::Bool, MatchValue::Bool(b)) => Ok(Key::Bool(*b)),
            (kind, v) => Err(ResolveError::Invalid(at(
                &format!("{path}{place}"),
                format!(
                    "the field {field} is indexed as {kind}: it cannot match {}{}",
                    v.type_name(),
                    match kind {
                        FieldType::Float | FieldType::Datetime => "; use a range",
                        FieldType::Keyword | FieldType::Integer | FieldType::Bool => "",
                    }
                ),
            ))),
        }
    }
}

fn value_kind(v: &MatchValue) -> FieldType {
    match v {
        MatchValue::Keyword(_) => FieldType::Keyword,
        MatchValue::Integer(_) => FieldType::Integer,
        MatchValue::Bool(_) => FieldType::Bool,
    }
}

fn negate(node: Node) -> Node {
    match node {
        Node::All => Node::None,
        Node::None => Node::All,
        Node::Not(n) => *n,
        other @ (Node::Leaf(_) | Node::Ids(_) | Node::And(_) | Node::Or(_)) => Node::Not(Box::new(other)),
    }
}

/// The ordered keys `lo..=hi` of a range on a field of `kind`, `None` if
/// no value can lie in it.
fn range_keys(path: &str, field: &str, kind: FieldType, r: &Range) -> Result<Option<(u64, u64)>, ResolveError> {
    let wrong = |name: &str, what: &str| {
        ResolveError::Invalid(at(&format!("{path}.range.{name}"), format!("the field {field} is indexed as {kind}: its bounds are {what}")))
    };
    match kind {
        FieldType::Keyword | FieldType::Bool => {
            Err(ResolveError::Invalid(at(&format!("{path}.range"), format!("the field {field} is indexed as {kind}: it has no ranges"))))
        }
        FieldType::Float => {
            let mut lo = 1u64;
            let mut hi = u64::MAX;
            for (name, b) in r.bounds() {
                let Some(b) = b else { continue };
                let f = match b {
                    Bound::Integer(i) => *i as f64,
                    Bound::Number(f) => *f,
                    Bound::Datetime(_) => return Err(wrong(name, "numbers")),
                };
                let k = ord_f64(f);
                match name {
                    "gt" => lo = lo.max(k.saturating_add(1)),
                    "gte" => lo = lo.max(k),
                    "lt" => hi = hi.min(k.saturating_sub(1)),
                    _ => hi = hi.min(k),
                }
            }
            Ok((lo <= hi).then_some((lo, hi)))
        }
        FieldType::Integer | FieldType::Datetime => {
            let mut lo = i64::MIN + 1;
            let mut hi = i64::MAX;
            for (name, b) in r.bounds() {
                let Some(b) = b else { continue };
                let lower = matches!(name, "gt" | "gte");
                // The bound as the whole numbers it lets in: (value, open).
                let (n, open): (Option<i64>, bool) = match (kind, b) {
                    (FieldType::Integer, Bound::Integer(i)) => (Some(*i), matches!(name, "gt" | "lt")),
                    (FieldType::Integer, Bound::Number(f)) => match whole(*f, lower, matches!(name, "gt" | "lt")) {
                        Whole::At(n) => (Some(n), false),
                        Whole::Nothing => return Ok(None),
                        Whole::Unbounded => (None, false),
                    },
                    (FieldType::Datetime, Bound::Datetime(s)) => match parse_datetime(s) {
                        Some(t) => (Some(t), matches!(name, "gt" | "lt")),
                        None => {
                            return Err(ResolveError::Invalid(at(
                                &format!("{path}.range.{name}"),
                                format!("{s:?} is not an RFC 3339 time"),
                            )));
                        }
                    },
                    (FieldType::Integer, Bound::Datetime(_)) => return Err(wrong(name, "numbers")),
                    (_, _) => return Err(wrong(name, "RFC 3339 times")),
                };
                let Some(n) = n else { continue };
                if lower {
                    let n = if open { n.checked_add(1) } else { Some(n) };
                    match n {
                        Some(n) => lo = lo.max(n),
                        None => return Ok(None),
                    }
                } else {
                    let n = if open { n.checked_sub(1) } else { Some(n) };
                    match n {
                        Some(n) => hi = hi.min(n),
                        None => return Ok(None),
                    }
                }
            }
            Ok((lo <= hi).then(|| (ord_i64(lo), ord_i64(hi))))
        }
    }
}

enum Whole {
    /// The bound is this whole number, closed.
    At(i64),
    /// No integer passes it.
    Nothing,
    /// Every integer passes it.
    Unbounded,
}

/// A fractional bound on an integer field as a closed whole bound: the
/// least integer above (`lower`) or the greatest below it.
fn whole(f: f64, lower: bool, open: bool) -> Whole {
    let n = match (lower, open) {
        (true, false) => f.ceil(),
        (true, true) => f.floor() + 1.0,
        (false, false) => f.floor(),
        (false, true) => f.ceil() - 1.0,
    };
    // 2^63: past i64 either way.
    const TOP: f64 = 9_223_372_036_854_775_808.0;
    if n >= TOP {
        if lower { Whole::Nothing } else { Whole::Unbounded }
    } else if n <= -TOP {
        if lower { Whole::Unbounded } else { Whole::Nothing }
    } else {
        Whole::At(n as i64)
    }
}

impl Filter {
    /// Checks the filter against field indexes `fields` (all taken as
    /// ready), as a shard does before it answers: a field without an index
    /// (unless `allow_unindexed`), a value of the wrong type for its
    /// index. What a coordinator checks once for every shard.
    pub fn check_against(&self, fields: &[(String, FieldType)], allow_unindexed: bool) -> Result<(), FilterError> {
        self.check()?;
        let ready: Vec<(&str, Indexed)> = fields
            .iter()
            .enumerate()
            .map(|(i, (name, kind))| (name.as_str(), Indexed { id: i as u16, kind: *kind, building: None }))
            .collect();
        let lookup = |field: &str| ready.iter().find(|(n, _)| *n == field).map(|(_, i)| *i);
        match resolve(self, &lookup, allow_unindexed) {
            Ok(_) => Ok(()),
            Err(ResolveError::Invalid(e)) => Err(e),
            Err(ResolveError::Building { path, field, .. }) => {
                Err(FilterError { path, reason: format!("the index on field {field} is being built") })
            }
        }
    }
}
