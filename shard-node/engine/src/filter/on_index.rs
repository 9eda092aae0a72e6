//! A prepared filter answered from the field indexes of one transaction.
//!
//! Each part becomes either the exact set of internal ids it matches
//! ([`Set::Ids`], from the value sets, cheap whatever its size) or, where
//! that set would cost more to build than it saves (a range over many
//! values, the complement of a set, a field read from payloads), a check
//! made one id at a time ([`Set::Check`]) with an estimate of how many
//! points pass it. The planner (`planner`) chooses how to search from
//! what it gets, and a walk asks the check of every node it meets.

use heed::RoTxn;
use roaring::RoaringBitmap;

use crate::error::Result;
use crate::fields::columns::{self, ColumnCache};
use crate::fields::postings;
use crate::session;
use crate::store::Store;
use crate::tombstone_set::TombstoneSet;

use super::prepare::{Key, Leaf, Node, Test};

/// Ids sampled from a column to estimate a range's share of the points.
const SAMPLES: u32 = 256;

/// Exactly some ids: as a bitmap (what sets combine as), or as the sorted
/// list a column pass or a check of each id gave (what a scan reads, and
/// turning it into a bitmap and back cost more than the scan's own
/// comparisons at ten thousand ids).
pub(crate) enum Ids {
    Bits(RoaringBitmap),
    Sorted(Vec<u32>),
}

impl Ids {
    pub(crate) fn len(&self) -> u64 {
        match self {
            Ids::Bits(b) => b.len(),
            Ids::Sorted(v) => v.len() as u64,
        }
    }

    #[inline]
    pub(crate) fn contains(&self, id: u32) -> bool {
        match self {
            Ids::Bits(b) => b.contains(id),
            Ids::Sorted(v) => v.binary_search(&id).is_ok(),
        }
    }

    pub(crate) fn into_bits(self) -> RoaringBitmap {
        match self {
            Ids::Bits(b) => b,
            // Sorted and without repeats by construction.
            Ids::Sorted(v) => RoaringBitmap::from_sorted_iter(v).unwrap_or_default(),
        }
    }

    fn and(self, other: Ids) -> Ids {
        Ids::Bits(self.into_bits() & other.into_bits())
    }
}

/// What a filter, or part of one, matches.
pub(crate) enum Set {
    /// Exactly these ids, all live.
    Ids(Ids),
    /// The ids passing `check` (which may pass retired ids too).
    Check {
        check: Check,
        /// The share of the live points estimated to pass.
        share: f64,
        /// How many live points pass, when known exactly.
        count: Option<u64>,
    },
}

/// A test of one id.
pub(crate) enum Check {
    In(RoaringBitmap),
    NotIn(RoaringBitmap),
    /// The field's column value lies in `lo..=hi`.
    Range {
        field: u16,
        lo: u64,
        hi: u64,
    },
    /// Read from the id's payload.
    Payload(Leaf),
    And(Vec<Check>),
    Or(Vec<Check>),
    Not(Box<Check>),
}

/// Sizes that decide how a part is answered.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Limits {
    /// A range estimated to match up to this many points is gathered from
    /// its value sets (giving up past twice as many); a wider one is
    /// checked point by point.
    pub(crate) gather: u64,
    /// Leave a range that only a pass over its whole column would gather
    /// as a check with its estimate (`Check::Range`, no count): a search
    /// gathers it only if its plan compares every match, since a walk asks
    /// about just the nodes it meets, far fewer than the column holds.
    pub(crate) defer_passes: bool,
}

/// Evaluates prepared filters in one transaction.
pub(crate) struct Evaluator<'t> {
    store: &'t Store,
    txn: &'t RoTxn<'t>,
    next_id: u32,
    live: u64,
    limits: Limits,
    /// Where `txn`'s column blocks are.
    columns: &'t mut ColumnCache,
}

impl<'t> Evaluator<'t> {
    /// # Safety
    /// `columns` must be empty or hold only what was read through `txn`.
    pub(crate) unsafe fn new(
        store: &'t Store,
        txn: &'t RoTxn<'t>,
        next_id: u32,
        live: u64,
        limits: Limits,
        columns: &'t mut ColumnCache,
    ) -> Self {
        Evaluator { store, txn, next_id, live, limits, columns }
    }

    #[inline]
    fn column_value(&mut self, field: u16, id: u32) -> Result<u64> {
        // SAFETY: the cache holds only what `self.txn` read (`new`'s contract).
        unsafe { self.columns.get(self.store, self.txn, field, id) }
    }

    fn share(&self, count: u64) -> f64 {
        if self.live == 0 { 0.0 } else { (count as f64 / self.live as f64).min(1.0) }
    }

    /// What `node` matches.
    pub(crate) fn eval(&mut self, node: &Node) -> Result<Set> {
        Ok(match node {
            Node::All => Set::Check { check: Check::Not(Box::new(Check::In(RoaringBitmap::new()))), share: 1.0, count: Some(self.live) },
            Node::None => Set::Ids(Ids::Bits(RoaringBitmap::new())),
            Node::Ids(ids) => {
                let mut set = RoaringBitmap::new();
                for &id in ids {
                    if let Some(internal) = session::lookup_external(self.store, self.txn, id)? {
                        set.insert(internal);
                    }
                }
                Set::Ids(Ids::Bits(set))
            }
            Node::Leaf(leaf) => self.leaf(leaf)?,
            Node::And(parts) => self.and(parts)?,
            Node::Or(parts) => {
                let sets = parts.iter().map(|p| self.eval(p)).collect::<Result<Vec<_>>>()?;
                if sets.iter().all(|s| matches!(s, Set::Ids(_))) {
                    let mut union = RoaringBitmap::new();
                    for s in sets {
                        if let Set::Ids(b) = s {
                            union |= b.into_bits();
                        }
                    }
                    Set::Ids(Ids::Bits(union))
                } else {
                    let none = sets.iter().map(|s| 1.0 - self.set_share(s)).product::<f64>();
                    Set::Check { check: Check::Or(sets.into_iter().map(into_check).collect()), share: 1.0 - none, count: None }
                }
            }
            Node::Not(inner) => match self.eval(inner)? {
                Set::Ids(b) => {
                    let count = self.live.saturating_sub(b.len());
                    Set::Check { check: Check::NotIn(b.into_bits()), share: self.share(count), count: Some(count) }
                }
                Set::Check { check, share, count } => {
                    Set::Check { check: Check::Not(Box::new(check)), share: 1.0 - share, count: count.map(|c| self.live.saturating_sub(c)) }
                }
            },
        })
    }

    fn set_share(&self, s: &Set) -> f64 {
        match s {
            Set::Ids(b) => self.share(b.len()),
            Set::Check { share, .. } => *share,
        }
    }

    fn and(&mut self, parts: &[Node]) -> Result<Set> {
        let mut ids: Option<Ids> = None;
        let mut checks = Vec::new();
        let mut share = 1.0;
        // Ranges last: once the other parts leave fewer ids than a range
        // matches, checking those ids' values beats gathering the range.
        let (ranges, rest): (Vec<&Node>, Vec<&Node>) = parts.iter().partition(|p| indexed_range(p).is_some());
        for p in rest {
            meet(self.eval(p)?, &mut ids, &mut share, &mut checks);
        }
        for p in ranges {
            let Some((field, lo, hi, whole)) = indexed_range(p) else { continue };
            let (estimate, spread) = self.sampled(field, lo, hi)?;
            let set = match &ids {
                Some(few) if (few.len() as f64) < estimate => {
                    Set::Check { check: Check::Range { field, lo, hi }, share: self.share(estimate.round() as u64), count: None }
                }
                _ => self.range(field, lo, hi, whole, estimate, spread)?,
            };
            meet(set, &mut ids, &mut share, &mut checks);
        }
        match ids {
            None => Ok(Set::Check { check: Check::And(checks), share, count: None }),
            Some(ids) if checks.is_empty() => Ok(Set::Ids(ids)),
            // Few enough to check each now: exact, and a scan can use it.
            Some(ids) if ids.len() <= self.limits.gather.saturating_mul(4) => {
                let check = Check::And(checks);
                let mut keep = Vec::new();
                for id in ids.into_bits().iter() {
                    if self.check(&check, id)? {
                        keep.push(id);
                    }
                }
                Ok(Set::Ids(Ids::Sorted(keep)))
            }
            Some(ids) => {
                let share = self.share(ids.len()) * share;
                checks.insert(0, Check::In(ids.into_bits()));
                Ok(Set::Check { check: Check::And(checks), share, count: None })
            }
        }
    }

    /// A range of `field`'s numbers estimated to hold `estimate` points:
    /// gathered if few (from its value sets when they are few, else by a
    /// pass over the column), else checked point by point.
    fn range(&mut self, field: u16, lo: u64, hi: u64, whole: bool, estimate: f64, spread: f64) -> Result<Set> {
        if estimate > self.limits.gather as f64 {
            return Ok(Set::Check { check: Check::Range { field, lo, hi }, share: self.share(estimate.round() as u64), count: None });
        }
        // A sample sees a narrow range's values about once each, so it
        // takes every point for a value of its own; whole numbers bound it.
        let spread = if whole { spread.min(postings::whole_span(self.store, self.txn, field, lo, hi)? as f64) } else { spread };
        // A value's set costs about what 500 ids of a column pass do.
        let max_values = (self.next_id as usize / 500).max(16);
        if spread <= max_values as f64
            && let Some(set) = postings::range_union(self.store, self.txn, field, lo, hi, max_values)?
        {
            return Ok(Set::Ids(Ids::Bits(set)));
        }
        if self.limits.defer_passes {
            return Ok(Set::Check { check: Check::Range { field, lo, hi }, share: self.share(estimate.round() as u64), count: None });
        }
        Ok(Set::Ids(Ids::Sorted(columns::ids_in_range(self.store, self.txn, field, lo, hi)?)))
    }

    /// The ids of a range, by a pass over its column.
    pub(crate) fn gather_range(&mut self, field: u16, lo: u64, hi: u64) -> Result<Set> {
        Ok(Set::Ids(Ids::Sorted(columns::ids_in_range(self.store, self.txn, field, lo, hi)?)))
    }

    fn leaf(&mut self, leaf: &Leaf) -> Result<Set> {
        let Some(field) = leaf.index else {
            // Unknown until every payload is read: taken as half.
            return Ok(Set::Check { check: Check::Payload(leaf.clone()), share: 0.5, count: None });
        };
        let (store, txn) = (self.store, self.txn);
        match &leaf.test {
            Test::Keys(keys) => {
                let mut set = RoaringBitmap::new();
                for k in keys {
                    let key = match k {
                        Key::Keyword(s) => postings::keyword_key(field, s),
                        Key::Number(n) => postings::number_key(field, *n).to_vec(),
                        Key::Bool(b) => postings::bool_key(field, *b),
                    };
                    set |= postings::read(store, txn, &key)?;
                }
                Ok(Set::Ids(Ids::Bits(set)))
            }
            Test::Empty => {
                let present = postings::read(store, txn, &postings::key(field, postings::PRESENT, &[]))?;
                let count = self.live.saturating_sub(present.len());
                Ok(Set::Check { check: Check::NotIn(present), share: self.share(count), count: Some(count) })
            }
            &Test::Range { lo, hi } => {
                let (estimate, spread) = self.sampled(field, lo, hi)?;
                self.range(field, lo, hi, whole_numbers(leaf), estimate, spread)
            }
        }
    }

    /// Points estimated to hold a value of `field` in `lo..=hi`, from
    /// [`SAMPLES`] ids spread over the id space, and how many distinct
    /// values the range is estimated to hold (what gathering it from its
    /// value sets costs).
    fn sampled(&mut self, field: u16, lo: u64, hi: u64) -> Result<(f64, f64)> {
        let n = self.next_id;
        if n == 0 {
            return Ok((0.0, 0.0));
        }
        let samples = SAMPLES.min(n);
        let mut hits: Vec<u64> = Vec::new();
        for j in 0..samples {
            // Evenly spread, starting half a step in.
            let id = ((u64::from(j) * 2 + 1) * u64::from(n) / (2 * u64::from(samples))) as u32;
            let v = self.column_value(field, id)?;
            if lo <= v && v <= hi {
                hits.push(v);
            }
        }
        let found = hits.len() as f64;
        let estimate = found / f64::from(samples) * f64::from(n);
        hits.sort_unstable();
        hits.dedup();
        // Values seen once each in the sample are taken as unique to a
        // point: as many values as points.
        let spread = if found == 0.0 { 0.0 } else { estimate * hits.len() as f64 / found };
        Ok((estimate, spread))
    }

    /// True if `id` passes `check`.
    pub(crate) fn check(&mut self, check: &Check, id: u32) -> Result<bool> {
        Ok(match check {
            Check::In(b) => b.contains(id),
            Check::NotIn(b) => !b.contains(id),
            &Check::Range { field, lo, hi } => {
                let v = self.column_value(field, id)?;
                lo <= v && v <= hi
            }
            Check::Payload(leaf) => {
                let payload = self.store.dbs.payloads.get(self.txn, id).map_err(|e| self.store.err(e))?;
                let object = payload.and_then(crate::fields::value::payload_object);
                super::on_payload::leaf_matches(leaf, object.as_ref())
            }
            Check::And(v) => {
                for c in v {
                    if !self.check(c, id)? {
                        return Ok(false);
                    }
                }
                true
            }
            Check::Or(v) => {
                for c in v {
                    if self.check(c, id)? {
                        return Ok(true);
                    }
                }
                false
            }
            Check::Not(c) => !self.check(c, id)?,
        })
    }
}

/// Every live id passing `check`, by a pass over the id space.
pub(crate) fn matching_ids(
    eval: &mut Evaluator<'_>,
    check: &Check,
    next_id: u32,
    tombstones: Option<&TombstoneSet>,
) -> Result<RoaringBitmap> {
    let mut out = RoaringBitmap::new();
    for id in 0..next_id {
        if tombstones.is_some_and(|t| t.contains(id)) {
            continue;
        }
        if eval.check(check, id)? {
            out.insert(id);
        }
    }
    Ok(out)
}

/// A range on an indexed field: (field, lo, hi).
fn indexed_range(node: &Node) -> Option<(u16, u64, u64, bool)> {
    if let Node::Leaf(leaf @ Leaf { index: Some(field), test: Test::Range { lo, hi }, .. }) = node {
        Some((*field, *lo, *hi, whole_numbers(leaf)))
    } else {
        None
    }
}

/// Whether the leaf's keys are whole numbers, one key apart.
fn whole_numbers(leaf: &Leaf) -> bool {
    matches!(leaf.kind, shoal_filter::FieldType::Integer | shoal_filter::FieldType::Datetime)
}

fn into_check(s: Set) -> Check {
    match s {
        Set::Ids(b) => Check::In(b.into_bits()),
        Set::Check { check, .. } => check,
    }
}

/// Folds one part of an AND into what the parts before it left: ids
/// intersect, checks pile up with their shares multiplied.
fn meet(set: Set, ids: &mut Option<Ids>, share: &mut f64, checks: &mut Vec<Check>) {
    match set {
        Set::Ids(b) => {
            *ids = Some(match ids.take() {
                Some(a) => a.and(b),
                None => b,
            });
        }
        Set::Check { check, share: s, .. } => {
            *share *= s;
            checks.push(check);
        }
    }
}
