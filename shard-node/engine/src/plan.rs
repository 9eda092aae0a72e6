//! Turning batches into a plan: validate, resolve ids, skip replays.
//!
//! Validation happens in two steps. [`prepare`] checks everything that does
//! not depend on the index (dimensions, finiteness, payload sizes) and
//! normalises vectors in place. [`resolve`] runs inside the write transaction
//! and checks what does (deletes of ids that must exist, offsets already
//! applied), then says exactly which internal ids to retire and which points
//! to add. A batch that fails either step is rejected whole and leaves no
//! trace; the other batches of a group commit still go ahead.

use rustc_hash::{FxHashMap, FxHashSet};

use crate::batch::{Batch, BatchOutcome, MAX_SOURCE_BYTES, Op};
use crate::error::{InvalidInput, Location, Result};
use crate::params::IndexParams;

/// Checks a batch on its own and brings its vectors into stored form.
pub(crate) fn prepare(batch: &mut Batch, params: &IndexParams, max_payload: usize) -> Result<(), InvalidInput> {
    // A batch without operations is only meaningful as a position in a
    // source: a coordinator records a source's offset on every shard, also
    // on those that received no point of that batch.
    if batch.ops.is_empty() && batch.source.is_none() {
        return Err(InvalidInput::EmptyBatch);
    }
    if let Some(s) = &batch.source
        && (s.source.is_empty() || s.source.len() > MAX_SOURCE_BYTES)
    {
        return Err(InvalidInput::BadSourceName { len: s.source.len(), max: MAX_SOURCE_BYTES });
    }
    // Accepted, the highest offset would be the last: no later batch of
    // the source could ever be above it.
    if let Some(s) = &batch.source
        && s.offset == u64::MAX
    {
        return Err(InvalidInput::OffsetOutOfRange { offset: s.offset });
    }
    for (op, o) in batch.ops.iter().enumerate() {
        if let Op::Upsert(p) = o {
            params.metric.validate(&p.vector, params.dim as usize).map_err(|error| InvalidInput::Vector { at: Location::Op(op), error })?;
            if let Some(len) = p.payload.as_ref().map(Vec::len)
                && len > max_payload
            {
                return Err(InvalidInput::PayloadTooLarge { op, len, max: max_payload });
            }
        }
    }
    for o in &mut batch.ops {
        if let Op::Upsert(p) = o {
            params.metric.prepare(&mut p.vector);
        }
    }
    Ok(())
}

/// A point the commit adds, borrowing from its batch.
pub(crate) struct NewPoint<'b> {
    pub(crate) external: u64,
    pub(crate) vector: &'b [f32],
    pub(crate) payload: Option<&'b [u8]>,
}

/// Everything one write transaction must do.
pub(crate) struct Plan<'b> {
    /// One per input batch, in order.
    pub(crate) outcomes: Vec<Result<BatchOutcome, InvalidInput>>,
    /// Points to add, in the order they receive internal ids.
    pub(crate) inserts: Vec<NewPoint<'b>>,
    /// Existing internal ids to retire (deleted or replaced), ascending.
    pub(crate) tombstones: Vec<u32>,
    /// External ids that end up with no live point.
    pub(crate) removed: Vec<u64>,
    /// New highest offset per source.
    pub(crate) offsets: Vec<(&'b str, u64)>,
}

impl Plan<'_> {
    /// True if the transaction would change nothing.
    pub(crate) fn is_empty(&self) -> bool {
        self.inserts.is_empty() && self.tombstones.is_empty() && self.offsets.is_empty()
    }
}

/// Final fate of an external id within the group.
#[derive(Clone, Copy)]
enum Fate {
    Upsert { batch: usize, op: usize },
    Deleted,
}

/// True if `id` held a point before the batch being resolved: as earlier
/// batches of the group left it, else as the index holds it.
fn held_before(
    id: u64,
    fate: &FxHashMap<u64, Fate>,
    known: &mut FxHashMap<u64, Option<u32>>,
    lookup: &mut impl FnMut(u64) -> Result<Option<u32>>,
) -> Result<bool> {
    Ok(match fate.get(&id) {
        Some(Fate::Upsert { .. }) => true,
        Some(Fate::Deleted) => false,
        None => match known.get(&id) {
            Some(internal) => internal.is_some(),
            None => {
                let internal = lookup(id)?;
                known.insert(id, internal);
                internal.is_some()
            }
        },
    })
}

/// Resolves prepared batches against the index. `checked[i]` is the result
/// of [`prepare`] for batch `i`; `lookup` maps an external id to its live
/// internal id; `stored_offset` reads a source's highest applied offset.
pub(crate) fn resolve<'b>(
    batches: &'b [Batch],
    checked: &[Result<(), InvalidInput>],
    mut lookup: impl FnMut(u64) -> Result<Option<u32>>,
    mut stored_offset: impl FnMut(&str) -> Result<Option<u64>>,
) -> Result<Plan<'b>> {
    let mut known: FxHashMap<u64, Option<u32>> = FxHashMap::default();
    let mut fate: FxHashMap<u64, Fate> = FxHashMap::default();
    let mut offsets: FxHashMap<&'b str, u64> = FxHashMap::default();
    let mut outcomes = Vec::with_capacity(batches.len());

    for (b, (batch, check)) in batches.iter().zip(checked).enumerate() {
        if let Err(e) = check {
            outcomes.push(Err(e.clone()));
            continue;
        }
        if let Some(s) = &batch.source {
            let current = match offsets.get(s.source.as_str()) {
                Some(&o) => Some(o),
                None => stored_offset(&s.source)?,
            };
            if let Some(current) = current.filter(|&c| s.offset <= c) {
                outcomes.push(Ok(BatchOutcome::Skipped { current }));
                continue;
            }
        }
        // Apply the batch to a local journal first, so that a rejected
        // batch leaves the group's state untouched.
        let mut local: FxHashMap<u64, Fate> = FxHashMap::default();
        // Ids a `DeleteIfPresent` found without a point.
        let mut found_absent: FxHashSet<u64> = FxHashSet::default();
        let mut rejected = None;
        for (op, o) in batch.ops.iter().enumerate() {
            match o {
                Op::Upsert(p) => {
                    local.insert(p.id, Fate::Upsert { batch: b, op });
                }
                Op::Delete(id) | Op::DeleteIfPresent(id) => {
                    let exists = match local.get(id) {
                        Some(Fate::Upsert { .. }) => true,
                        Some(Fate::Deleted) => false,
                        None => held_before(*id, &fate, &mut known, &mut lookup)?,
                    };
                    match (exists, o) {
                        (true, _) => {
                            local.insert(*id, Fate::Deleted);
                        }
                        (false, Op::DeleteIfPresent(_)) => {
                            found_absent.insert(*id);
                        }
                        (false, _) => {
                            rejected = Some(InvalidInput::UnknownId { op, id: *id });
                            break;
                        }
                    }
                }
            }
        }
        if let Some(e) = rejected {
            outcomes.push(Err(e));
            continue;
        }
        // Each id counts once, by what the batch did to it (the rule is
        // documented on `BatchOutcome::Applied`).
        let (mut upserted, mut deleted, mut missing) = (0, 0, 0);
        for (id, f) in &local {
            match f {
                Fate::Upsert { .. } => upserted += 1,
                Fate::Deleted if held_before(*id, &fate, &mut known, &mut lookup)? => deleted += 1,
                Fate::Deleted => {}
            }
        }
        for id in &found_absent {
            if local.get(id).is_none_or(|f| matches!(f, Fate::Deleted)) && !held_before(*id, &fate, &mut known, &mut lookup)? {
                missing += 1;
            }
        }
        fate.extend(local);
        if let Some(s) = &batch.source {
            offsets.insert(s.source.as_str(), s.offset);
        }
        outcomes.push(Ok(BatchOutcome::Applied { upserted, deleted, missing }));
    }

    let mut inserts: Vec<(usize, usize, NewPoint<'b>)> = Vec::new();
    let mut tombstones = Vec::new();
    let mut removed = Vec::new();
    for (&external, &f) in &fate {
        let old = match known.get(&external) {
            Some(&old) => old,
            None => lookup(external)?,
        };
        tombstones.extend(old);
        match f {
            Fate::Upsert { batch, op } => {
                if let Op::Upsert(p) = &batches[batch].ops[op] {
                    inserts.push((batch, op, NewPoint { external, vector: &p.vector, payload: p.payload.as_deref() }));
                }
            }
            Fate::Deleted if old.is_some() => removed.push(external),
            Fate::Deleted => {}
        }
    }
    // Input order decides internal ids, so the same input builds the same
    // index whatever the hash map's order.
    inserts.sort_unstable_by_key(|&(b, op, _)| (b, op));
    tombstones.sort_unstable();
    removed.sort_unstable();
    let mut offsets: Vec<(&'b str, u64)> = offsets.into_iter().collect();
    offsets.sort_unstable();
    Ok(Plan { outcomes, inserts: inserts.into_iter().map(|(_, _, p)| p).collect(), tombstones, removed, offsets })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Point;

    fn up(id: u64) -> Op {
        Op::Upsert(Point { id, vector: vec![1.0, 0.0], payload: None })
    }

    fn run<'b>(batches: &'b [Batch], existing: &[(u64, u32)], stored: &[(&str, u64)]) -> Plan<'b> {
        let checked: Vec<_> = batches.iter().map(|_| Ok(())).collect();
        resolve(
            batches,
            &checked,
            |id| Ok(existing.iter().find(|e| e.0 == id).map(|e| e.1)),
            |s| Ok(stored.iter().find(|e| e.0 == s).map(|e| e.1)),
        )
        .unwrap()
    }

    #[test]
    fn later_ops_win_and_replacements_retire_the_old_node() {
        let batches = [Batch { ops: vec![up(1), up(2), Op::Delete(2), up(3), up(1)], source: None }];
        let plan = run(&batches, &[(3, 30)], &[]);
        let ids: Vec<u64> = plan.inserts.iter().map(|p| p.external).collect();
        assert_eq!(ids, vec![3, 1], "id 1's last upsert (op 4) comes after id 3's (op 3)");
        assert_eq!(plan.tombstones, vec![30]);
        assert!(plan.removed.is_empty(), "id 2 never existed outside the batch");
        // 1 and 3 are left upserted; 2 existed only inside the batch.
        assert_eq!(plan.outcomes, vec![Ok(BatchOutcome::Applied { upserted: 2, deleted: 0, missing: 0 })]);
    }

    #[test]
    fn a_bad_delete_rejects_only_its_batch() {
        let batches = [
            Batch { ops: vec![up(1)], source: None },
            Batch { ops: vec![up(5), Op::Delete(9)], source: None },
            Batch { ops: vec![Op::Delete(1), Op::Delete(7)], source: None },
        ];
        let plan = run(&batches, &[(7, 70)], &[]);
        assert_eq!(plan.outcomes[1], Err(InvalidInput::UnknownId { op: 1, id: 9 }));
        assert!(plan.inserts.is_empty(), "1 was deleted by batch 2, 5 was rejected with batch 1");
        assert_eq!(plan.tombstones, vec![70]);
        assert_eq!(plan.removed, vec![7]);
    }

    #[test]
    fn deletes_if_present_count_what_was_missing() {
        let batches = [Batch { ops: vec![Op::DeleteIfPresent(7), Op::DeleteIfPresent(8), up(9), Op::DeleteIfPresent(9)], source: None }];
        let plan = run(&batches, &[(7, 70)], &[]);
        // 9 was upserted and deleted by the batch: neither counts.
        assert_eq!(plan.outcomes, vec![Ok(BatchOutcome::Applied { upserted: 0, deleted: 1, missing: 1 })]);
        assert_eq!(plan.tombstones, vec![70]);
        assert!(plan.inserts.is_empty());
    }

    /// Each id counts once, in the one count that says what the batch did
    /// to it, however often the batch names it.
    #[test]
    fn repeated_ids_count_once_by_what_the_batch_did_to_them() {
        let applied = |upserted, deleted, missing| Ok(BatchOutcome::Applied { upserted, deleted, missing });
        let existing = [(1, 10), (2, 20), (3, 30), (4, 40)];
        let cases: Vec<(Vec<Op>, Result<BatchOutcome, InvalidInput>)> = vec![
            // The last upsert wins: one point.
            (vec![up(7), up(7), up(7)], applied(1, 0, 0)),
            (vec![up(1), up(1)], applied(1, 0, 0)),
            // Replaced after a delete: the id still holds a point.
            (vec![Op::Delete(1), up(1)], applied(1, 0, 0)),
            // Upserted, then deleted: an existing point is gone...
            (vec![up(1), Op::Delete(1)], applied(0, 1, 0)),
            // ...a point that lived only in the batch changes nothing.
            (vec![up(7), Op::Delete(7)], applied(0, 0, 0)),
            (vec![up(7), Op::DeleteIfPresent(7)], applied(0, 0, 0)),
            // Deleted twice, the second time finding nothing: one delete.
            (vec![Op::DeleteIfPresent(2), Op::DeleteIfPresent(2)], applied(0, 1, 0)),
            (vec![Op::Delete(2), Op::DeleteIfPresent(2)], applied(0, 1, 0)),
            // A strict delete of what the batch already deleted is refused.
            (vec![Op::Delete(2), Op::Delete(2)], Err(InvalidInput::UnknownId { op: 1, id: 2 })),
            // Missing twice: one missing id.
            (vec![Op::DeleteIfPresent(8), Op::DeleteIfPresent(8)], applied(0, 0, 1)),
            (vec![Op::DeleteIfPresent(8), up(8), Op::Delete(8)], applied(0, 0, 1)),
            (vec![Op::DeleteIfPresent(8), up(8)], applied(1, 0, 0)),
            (
                vec![up(1), up(7), Op::Delete(2), Op::DeleteIfPresent(3), Op::DeleteIfPresent(8), up(1), up(3), Op::Delete(4)],
                applied(3, 2, 1),
            ),
        ];
        for (ops, want) in cases {
            let batches = [Batch { ops: ops.clone(), source: None }];
            assert_eq!(run(&batches, &existing, &[]).outcomes, vec![want], "{ops:?}");
        }
    }

    /// "Before the batch" is as the group's earlier batches left the id.
    #[test]
    fn counts_start_from_the_earlier_batches_of_the_group() {
        let batches = [
            Batch { ops: vec![Op::Delete(1), up(7)], source: None },
            Batch { ops: vec![Op::DeleteIfPresent(1), Op::DeleteIfPresent(7), up(1)], source: None },
            Batch { ops: vec![up(1), Op::DeleteIfPresent(1)], source: None },
        ];
        let plan = run(&batches, &[(1, 10)], &[]);
        assert_eq!(
            plan.outcomes,
            vec![
                Ok(BatchOutcome::Applied { upserted: 1, deleted: 1, missing: 0 }),
                // 1 was already gone, and comes back; 7 existed since batch 0.
                Ok(BatchOutcome::Applied { upserted: 1, deleted: 1, missing: 0 }),
                Ok(BatchOutcome::Applied { upserted: 0, deleted: 1, missing: 0 }),
            ]
        );
    }

    #[test]
    fn replays_are_skipped_and_offsets_advance() {
        let batches = [
            Batch { ops: vec![up(1)], source: None }.with_source("a", 5),
            Batch { ops: vec![up(2)], source: None }.with_source("a", 6),
            Batch { ops: vec![up(3)], source: None }.with_source("a", 6),
            Batch { ops: vec![up(4)], source: None }.with_source("b", 1),
        ];
        let plan = run(&batches, &[], &[("a", 5)]);
        assert_eq!(plan.outcomes[0], Ok(BatchOutcome::Skipped { current: 5 }));
        assert_eq!(plan.outcomes[2], Ok(BatchOutcome::Skipped { current: 6 }));
        assert_eq!(plan.offsets, vec![("a", 6), ("b", 1)]);
        assert_eq!(plan.inserts.iter().map(|p| p.external).collect::<Vec<_>>(), vec![2, 4]);
    }

    #[test]
    fn prepare_rejects_before_touching_anything() {
        let params = IndexParams::new(2, crate::Metric::Cosine);
        let mut empty = Batch::default();
        assert_eq!(prepare(&mut empty, &params, 10), Err(InvalidInput::EmptyBatch));
        let mut position_only = Batch::default().with_source("job", 3);
        assert_eq!(prepare(&mut position_only, &params, 10), Ok(()));
        let mut big = Batch { ops: vec![Op::Upsert(Point { id: 1, vector: vec![1.0, 1.0], payload: Some(vec![0; 11]) })], source: None };
        assert_eq!(prepare(&mut big, &params, 10), Err(InvalidInput::PayloadTooLarge { op: 0, len: 11, max: 10 }));
        let mut named = Batch::upserts([(1, vec![1.0, 1.0])]).with_source("", 1);
        assert!(matches!(prepare(&mut named, &params, 10), Err(InvalidInput::BadSourceName { len: 0, .. })));
        for mut last in [Batch::upserts([(1, vec![1.0, 1.0])]).with_source("job", u64::MAX), Batch::default().with_source("job", u64::MAX)]
        {
            assert_eq!(prepare(&mut last, &params, 10), Err(InvalidInput::OffsetOutOfRange { offset: u64::MAX }));
        }
        assert_eq!(prepare(&mut Batch::default().with_source("job", u64::MAX - 1), &params, 10), Ok(()));
        let mut ok = Batch::upserts([(1, vec![3.0, 4.0])]);
        prepare(&mut ok, &params, 10).unwrap();
        let Op::Upsert(p) = &ok.ops[0] else { unreachable!() };
        assert_eq!(p.vector, vec![0.6, 0.8]);
    }
}
