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
use crate::error::{InvalidInput, Location, Rejected, Result};
use crate::params::IndexParams;

/// What one write of a group is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A batch from a writer: skipped if its source offset was applied
    /// already, else it takes the next sequence number.
    Fresh,
    /// An entry of another copy's batch log with its sequence number:
    /// applied only if it is the next one, skipped if held already. Its
    /// vectors are in stored form.
    Replay(u64),
    /// Raises the epoch; its batch is empty.
    Fence,
}

/// One write of a group: a batch, what kind of write it is, its epoch
/// (0: unfenced).
pub(crate) struct Item {
    pub(crate) batch: Batch,
    pub(crate) kind: Kind,
    pub(crate) epoch: u64,
}

/// What an accepted item did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Done {
    /// A batch's outcome, and the sequence number it took if applied.
    Batch(BatchOutcome, Option<u64>),
    Fenced {
        epoch: u64,
    },
    Replayed {
        skipped: bool,
    },
}

/// Checks an item's batch on its own and brings its vectors into stored
/// form. A fence has nothing to check.
pub(crate) fn prepare_item(item: &mut Item, params: &IndexParams, max_payload: usize) -> Result<(), InvalidInput> {
    match item.kind {
        Kind::Fence => Ok(()),
        Kind::Fresh => prepare(&mut item.batch, params, max_payload, false),
        Kind::Replay(_) => prepare(&mut item.batch, params, max_payload, true),
    }
}

/// Squared length a stored cosine vector may differ from 1 by and still
/// be taken as stored (f32 rounding of a normalised 384-d vector leaves
/// about 1e-6).
const UNIT_TOLERANCE: f64 = 1e-4;

/// Checks a batch on its own and brings its vectors into stored form.
/// `stored`: the batch comes from a batch log, its vectors are in stored
/// form already and are kept bit for bit (normalising a unit vector again
/// could move its last bits); it may be empty (a batch that changed
/// nothing still has its sequence number).
pub(crate) fn prepare(batch: &mut Batch, params: &IndexParams, max_payload: usize, stored: bool) -> Result<(), InvalidInput> {
    // A batch without operations is only meaningful as a position in a
    // source: a coordinator records a source's offset on every shard, also
    // on those that received no point of that batch.
    if batch.ops.is_empty() && batch.source.is_none() && !stored {
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
        if let Op::DeleteWhere { filter, .. } = o {
            filter.check().map_err(|e| at_op(op, e.into()))?;
        }
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
            let unit = || (crate::metric::squared_length(&p.vector) - 1.0).abs() <= UNIT_TOLERANCE;
            if !(stored && (params.metric != crate::Metric::Cosine || unit())) {
                params.metric.prepare(&mut p.vector);
            }
        }
    }
    Ok(())
}

/// A filter's error as the error of operation `op` of its batch.
fn at_op(op: usize, e: InvalidInput) -> InvalidInput {
    if let InvalidInput::Filter { path, reason } = e {
        InvalidInput::Filter { path: format!("of operation {op}: {path}"), reason }
    } else {
        e
    }
}

/// A point the commit adds, borrowing from its batch.
pub(crate) struct NewPoint<'b> {
    pub(crate) external: u64,
    pub(crate) vector: &'b [f32],
    pub(crate) payload: Option<&'b [u8]>,
}

/// An accepted batch as the batch log records it: what it did.
pub(crate) struct Logged {
    /// Its sequence number.
    pub(crate) seq: u64,
    /// Its position in the group.
    pub(crate) item: usize,
    /// Positions of its upserts that left a point, by ascending id.
    pub(crate) upserts: Vec<usize>,
    /// Ids it emptied that held a point before it, ascending.
    pub(crate) deletes: Vec<u64>,
}

/// Everything one write transaction must do.
pub(crate) struct Plan<'b> {
    /// One per input item, in order.
    pub(crate) outcomes: Vec<Result<Done, Rejected>>,
    /// Points to add, in the order they receive internal ids.
    pub(crate) inserts: Vec<NewPoint<'b>>,
    /// Existing internal ids to retire (deleted or replaced), ascending.
    pub(crate) tombstones: Vec<u32>,
    /// External ids that end up with no live point.
    pub(crate) removed: Vec<u64>,
    /// New highest offset per source.
    pub(crate) offsets: Vec<(&'b str, u64)>,
    /// The accepted batches, in sequence order, for the batch log.
    pub(crate) logged: Vec<Logged>,
    /// The shard's epoch after the group.
    pub(crate) epoch: u64,
    /// The last sequence number after the group.
    pub(crate) last_seq: u64,
}

impl Plan<'_> {
    /// True if the transaction would change nothing of a state at epoch
    /// `epoch`.
    pub(crate) fn is_empty(&self, epoch: u64) -> bool {
        self.inserts.is_empty() && self.tombstones.is_empty() && self.offsets.is_empty() && self.logged.is_empty() && self.epoch == epoch
    }
}

/// What a delete by filter matches: the points the index holds that match
/// it (external ids), and the prepared filter for the points the group
/// wrote before it.
pub(crate) struct Matching {
    pub(crate) committed: Vec<u64>,
    pub(crate) node: crate::filter::prepare::Node,
}

impl Matching {
    fn matches(&self, external: u64, payload: Option<&[u8]>) -> bool {
        crate::filter::on_payload::matches_stored(&self.node, external, payload)
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

/// Where a group starts: the shard's epoch and last sequence number.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Start {
    pub(crate) epoch: u64,
    pub(crate) last_seq: u64,
}

/// Resolves prepared items against the index. `checked[i]` is the result
/// of [`prepare_item`] for item `i`; `lookup` maps an external id to its
/// live internal id; `stored_offset` reads a source's highest applied
/// offset. An item refused for any reason leaves no trace, not even the
/// epoch it carried.
pub(crate) fn resolve<'b>(
    items: &'b [Item],
    checked: &[Result<(), InvalidInput>],
    start: Start,
    mut lookup: impl FnMut(u64) -> Result<Option<u32>>,
    mut stored_offset: impl FnMut(&str) -> Result<Option<u64>>,
    mut matching: impl FnMut(&crate::Filter, bool) -> Result<Result<Matching, InvalidInput>>,
) -> Result<Plan<'b>> {
    let mut known: FxHashMap<u64, Option<u32>> = FxHashMap::default();
    let mut fate: FxHashMap<u64, Fate> = FxHashMap::default();
    let mut offsets: FxHashMap<&'b str, u64> = FxHashMap::default();
    let mut outcomes = Vec::with_capacity(items.len());
    let mut logged = Vec::new();
    let Start { mut epoch, mut last_seq } = start;

    for (b, (item, check)) in items.iter().zip(checked).enumerate() {
        if let Err(e) = check {
            outcomes.push(Err(Rejected::Invalid(e.clone())));
            continue;
        }
        // Epoch 0 is an unfenced writer: accepted at any epoch, raising
        // nothing. A fence of 0 would lower the epoch (always at least 1).
        if item.kind == Kind::Fence && item.epoch < epoch {
            outcomes.push(Err(Rejected::EpochLowered { current: epoch, requested: item.epoch }));
            continue;
        }
        if item.epoch != 0 && item.epoch < epoch {
            outcomes.push(Err(Rejected::StaleEpoch { current: epoch, carried: item.epoch }));
            continue;
        }
        // Adopted once the item is accepted.
        let raised = epoch.max(item.epoch);
        let batch = &item.batch;
        match item.kind {
            Kind::Fence => {
                epoch = raised;
                outcomes.push(Ok(Done::Fenced { epoch }));
                continue;
            }
            Kind::Replay(seq) if seq <= last_seq => {
                epoch = raised;
                outcomes.push(Ok(Done::Replayed { skipped: true }));
                continue;
            }
            Kind::Replay(seq) if seq != last_seq + 1 => {
                outcomes.push(Err(Rejected::LogGap { last: last_seq, seq }));
                continue;
            }
            Kind::Replay(_) => {}
            Kind::Fresh => {
                if let Some(s) = &batch.source {
                    let current = match offsets.get(s.source.as_str()) {
                        Some(&o) => Some(o),
                        None => stored_offset(&s.source)?,
                    };
                    if let Some(current) = current.filter(|&c| s.offset <= c) {
                        epoch = raised;
                        outcomes.push(Ok(Done::Batch(BatchOutcome::Skipped { current }, None)));
                        continue;
                    }
                }
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
                Op::DeleteWhere { filter, allow_unindexed } => {
                    let m = match matching(filter, *allow_unindexed)? {
                        Ok(m) => m,
                        Err(e) => {
                            rejected = Some(at_op(op, e));
                            break;
                        }
                    };
                    // Held now: as the index holds it unless the group
                    // changed it; then its last upsert's payload decides.
                    let mut gone: Vec<u64> =
                        m.committed.iter().copied().filter(|id| !local.contains_key(id) && !fate.contains_key(id)).collect();
                    for (id, f) in local.iter().chain(fate.iter().filter(|(id, _)| !local.contains_key(*id))) {
                        if let Fate::Upsert { batch: b, op: o } = *f
                            && let Op::Upsert(p) = &items[b].batch.ops[o]
                            && m.matches(*id, p.payload.as_deref())
                        {
                            gone.push(*id);
                        }
                    }
                    for id in gone {
                        local.insert(id, Fate::Deleted);
                    }
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
            outcomes.push(Err(Rejected::Invalid(e)));
            continue;
        }
        // Each id counts once, by what the batch did to it (the rule is
        // documented on `BatchOutcome::Applied`); the same pass gathers
        // what the batch log records.
        let (mut upserted, mut deleted, mut missing) = (0, 0, 0);
        let mut upserts: Vec<(u64, usize)> = Vec::new();
        let mut deletes: Vec<u64> = Vec::new();
        for (id, f) in &local {
            match f {
                Fate::Upsert { op, .. } => {
                    upserted += 1;
                    upserts.push((*id, *op));
                }
                Fate::Deleted if held_before(*id, &fate, &mut known, &mut lookup)? => {
                    deleted += 1;
                    deletes.push(*id);
                }
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
            // A replayed entry's seq decides whether it applies, not its
            // offset; the offset only ever grows.
            let offset = match item.kind {
                Kind::Replay(_) => {
                    let current = match offsets.get(s.source.as_str()) {
                        Some(&o) => Some(o),
                        None => stored_offset(&s.source)?,
                    };
                    current.map_or(s.offset, |c| c.max(s.offset))
                }
                Kind::Fresh | Kind::Fence => s.offset,
            };
            offsets.insert(s.source.as_str(), offset);
        }
        epoch = raised;
        last_seq += 1;
        upserts.sort_unstable();
        deletes.sort_unstable();
        logged.push(Logged { seq: last_seq, item: b, upserts: upserts.into_iter().map(|(_, op)| op).collect(), deletes });
        outcomes.push(Ok(match item.kind {
            Kind::Replay(_) => Done::Replayed { skipped: false },
            Kind::Fresh | Kind::Fence => Done::Batch(BatchOutcome::Applied { upserted, deleted, missing }, Some(last_seq)),
        }));
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
                if let Op::Upsert(p) = &items[batch].batch.ops[op] {
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
    Ok(Plan { outcomes, inserts: inserts.into_iter().map(|(_, _, p)| p).collect(), tombstones, removed, offsets, logged, epoch, last_seq })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::batch::Point;

    fn prepare_raw(batch: &mut Batch, params: &IndexParams, max_payload: usize) -> Result<(), InvalidInput> {
        prepare(batch, params, max_payload, false)
    }

    fn up(id: u64) -> Op {
        Op::Upsert(Point { id, vector: vec![1.0, 0.0], payload: None })
    }

    /// A plan's parts, owned.
    struct Resolved {
        outcomes: Vec<Result<BatchOutcome, InvalidInput>>,
        /// External ids, in the order they receive internal ids.
        inserts: Vec<u64>,
        tombstones: Vec<u32>,
        removed: Vec<u64>,
        offsets: Vec<(String, u64)>,
    }

    fn resolve_items<'b>(items: &'b [Item], start: Start, existing: &[(u64, u32)], stored: &[(&str, u64)]) -> Plan<'b> {
        let checked: Vec<_> = items.iter().map(|_| Ok(())).collect();
        resolve(
            items,
            &checked,
            start,
            |id| Ok(existing.iter().find(|e| e.0 == id).map(|e| e.1)),
            |s| Ok(stored.iter().find(|e| e.0 == s).map(|e| e.1)),
            |_, _| Ok(Ok(Matching { committed: Vec::new(), node: crate::filter::prepare::Node::None })),
        )
        .unwrap()
    }

    /// Resolves unfenced batches.
    fn run(batches: &[Batch], existing: &[(u64, u32)], stored: &[(&str, u64)]) -> Resolved {
        let items: Vec<Item> = batches.iter().map(|b| Item { batch: b.clone(), kind: Kind::Fresh, epoch: 0 }).collect();
        let plan = resolve_items(&items, Start { epoch: 1, last_seq: 0 }, existing, stored);
        let outcomes = plan
            .outcomes
            .iter()
            .map(|o| match o {
                Ok(Done::Batch(b, _)) => Ok(b.clone()),
                Err(Rejected::Invalid(e)) => Err(e.clone()),
                other => panic!("unexpected outcome {other:?}"),
            })
            .collect();
        Resolved {
            outcomes,
            inserts: plan.inserts.iter().map(|p| p.external).collect(),
            tombstones: plan.tombstones,
            removed: plan.removed,
            offsets: plan.offsets.iter().map(|(s, o)| (s.to_string(), *o)).collect(),
        }
    }

    #[test]
    fn later_ops_win_and_replacements_retire_the_old_node() {
        let batches = [Batch { ops: vec![up(1), up(2), Op::Delete(2), up(3), up(1)], source: None }];
        let plan = run(&batches, &[(3, 30)], &[]);
        let ids: Vec<u64> = plan.inserts.clone();
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
        assert_eq!(plan.offsets, vec![("a".to_owned(), 6), ("b".to_owned(), 1)]);
        assert_eq!(plan.inserts, vec![2, 4]);
    }

    #[test]
    fn prepare_rejects_before_touching_anything() {
        let params = IndexParams::new(2, crate::Metric::Cosine);
        let mut empty = Batch::default();
        assert_eq!(prepare_raw(&mut empty, &params, 10), Err(InvalidInput::EmptyBatch));
        let mut position_only = Batch::default().with_source("job", 3);
        assert_eq!(prepare_raw(&mut position_only, &params, 10), Ok(()));
        let mut big = Batch { ops: vec![Op::Upsert(Point { id: 1, vector: vec![1.0, 1.0], payload: Some(vec![0; 11]) })], source: None };
        assert_eq!(prepare_raw(&mut big, &params, 10), Err(InvalidInput::PayloadTooLarge { op: 0, len: 11, max: 10 }));
        let mut named = Batch::upserts([(1, vec![1.0, 1.0])]).with_source("", 1);
        assert!(matches!(prepare_raw(&mut named, &params, 10), Err(InvalidInput::BadSourceName { len: 0, .. })));
        for mut last in [Batch::upserts([(1, vec![1.0, 1.0])]).with_source("job", u64::MAX), Batch::default().with_source("job", u64::MAX)]
        {
            assert_eq!(prepare_raw(&mut last, &params, 10), Err(InvalidInput::OffsetOutOfRange { offset: u64::MAX }));
        }
        assert_eq!(prepare_raw(&mut Batch::default().with_source("job", u64::MAX - 1), &params, 10), Ok(()));
        let mut ok = Batch::upserts([(1, vec![3.0, 4.0])]);
        prepare_raw(&mut ok, &params, 10).unwrap();
        let Op::Upsert(p) = &ok.ops[0] else { unreachable!() };
        assert_eq!(p.vector, vec![0.6, 0.8]);
    }
}
