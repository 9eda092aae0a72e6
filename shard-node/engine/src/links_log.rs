//! The link log: bottom-layer lists of existing nodes that recent batches
//! changed, appended instead of patched into their blocks.
//!
//! A batch of 1,000 points changes the bottom lists of ~12,700 existing
//! nodes, and at 100k points those lists lie in 84% of the link blocks, so
//! patching them in place makes LMDB copy nearly every link page on every
//! commit (`docs/engine.md`, "The link log"; the figures are in
//! `docs/benchmarks.md`, "What a batch changes"). Appending them instead
//! writes one value of new pages per batch, keyed by the log epoch that
//! wrote it (big-endian, so only ever appended); every few batches a *fold*
//! patches everything the log holds into the blocks at once, dirtying each
//! page once for all of them, and empties the log.
//!
//! A reader must see, for each node, the newest list its own transaction
//! holds. [`LogIndex`] says where that is: for every id with a list in the
//! log, which value (a *slot*, in epoch order) and which record. It is
//! built in memory, one immutable version per log epoch, and shared by
//! structure between versions (a new version copies only the chunks whose
//! ids changed); a chunk holds only the ids that have a list in the log
//! (`sparse_chunk`), so the index grows with the log, not the index.
//! [`LogVersions`] pairs each read transaction with the version of the
//! state it reads, by the epoch stored in that state.
//!
//! Entries name records, not addresses, so a version stays valid when the
//! map is moved by a resize and can be made before its commit: each reader
//! resolves a slot's address through its own transaction (`view::TxnView`).
//!
//! Layout of a log value: a u32 LE count, then `count` records of a u32 LE
//! id and the list's fixed-size bytes (`codec::links_bytes(M0)`), sorted by
//! id, then zeros up to at least a page so that LMDB keeps the value in
//! overflow pages of its own, which no later commit rewrites.

use std::ops::Range;
use std::sync::Arc;

use parking_lot::Mutex;

use crate::error::{Error, Result};
use crate::sparse_chunk::{CHUNK, SparseChunk};
use crate::store::Store;

/// Most values the log holds before it must be folded (slots are 8 bits).
pub(crate) const MAX_VALUES: usize = 255;
/// Most records one value may hold (record numbers are 24 bits).
pub(crate) const MAX_RECORDS: usize = (1 << 24) - 1;

/// Bytes in front of a value's records.
pub(crate) const HEADER: usize = 4;

/// Where each id's newest logged list is, as of one log epoch.
#[derive(Clone, Default)]
pub(crate) struct LogIndex {
    /// Per chunk of ids, per id with a list in the log:
    /// `(slot + 1) << 24 | record`.
    chunks: Vec<Option<Arc<SparseChunk>>>,
    /// The epochs (keys) of the log's values; an entry's slot indexes this.
    values: Vec<u64>,
    /// Records each value holds (parallel to `values`).
    counts: Vec<u32>,
    /// Records in the log, superseded and folded ones included.
    records: u64,
    /// The fold under way, if one is.
    pass: Option<Pass>,
}

/// A fold done a range of blocks per commit (see `docs/engine.md`, "The
/// link log"): entries of ids below `cursor` have been folded and dropped
/// from the index, and once `cursor` passes the last block the first
/// `values` values hold nothing the index points at and are deleted.
///
/// Only the index knows a pass: the values keep the records it folded
/// until the pass ends, and those records hold exactly what the fold
/// wrote into their blocks (every later change of those lists is appended
/// in a newer value). So an index opened mid-pass reads the same lists
/// from the log that the blocks hold, and folds them again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Pass {
    /// Values being folded: the first `values` of the log.
    pub(crate) values: usize,
    /// The first id not folded yet (a block boundary).
    pub(crate) cursor: u32,
}

impl LogIndex {
    /// True if the log holds no list.
    #[inline]
    pub(crate) fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// Records in the log (a list changed by two batches counts twice).
    pub(crate) fn records(&self) -> u64 {
        self.records
    }

    /// Records in the log's largest value (0 if it is empty).
    pub(crate) fn largest_value(&self) -> u64 {
        self.counts.iter().copied().max().map_or(0, u64::from)
    }

    /// Values in the log.
    pub(crate) fn values(&self) -> &[u64] {
        &self.values
    }

    /// The fold under way, if one is.
    pub(crate) fn pass(&self) -> Option<Pass> {
        self.pass
    }

    /// Where `id`'s newest logged list is: `(slot, record)`.
    #[inline]
    pub(crate) fn get(&self, id: u32) -> Option<(usize, usize)> {
        let chunk = self.chunks.get(id as usize / CHUNK)?.as_ref()?;
        chunk.get(id as usize % CHUNK).map(decode)
    }

    /// Every id with a logged list, ascending, with where its list is.
    #[cfg(test)]
    pub(crate) fn entries(&self) -> impl Iterator<Item = (u32, (usize, usize))> + '_ {
        self.entries_in(0..u32::MAX)
    }

    /// The ids of `range` with a logged list, ascending, with where each
    /// list is. Reads only the chunks the range covers.
    pub(crate) fn entries_in(&self, range: Range<u32>) -> impl Iterator<Item = (u32, (usize, usize))> + '_ {
        let first = (range.start as usize / CHUNK).min(self.chunks.len());
        let last = (range.end as usize).div_ceil(CHUNK).min(self.chunks.len()).max(first);
        self.chunks[first..last]
            .iter()
            .enumerate()
            .flat_map(move |(c, chunk)| {
                chunk.iter().flat_map(move |ch| ch.iter().map(move |(i, e)| (((first + c) * CHUNK + i) as u32, decode(e))))
            })
            .filter(move |(id, _)| range.contains(id))
    }

    /// This version with the entries of `range` dropped (their lists were
    /// folded into their blocks) and the pass's cursor at `range.end`; a
    /// pass starts over the log's present values if none is under way.
    /// Ends the pass (see [`LogIndex::end_pass`]) if `end` says so.
    pub(crate) fn folded(&self, range: Range<u32>, end: bool) -> LogIndex {
        let mut next = self.clone();
        let values = self.pass.map_or(self.values.len(), |p| p.values);
        next.pass = Some(Pass { values, cursor: range.end });
        let first = range.start as usize / CHUNK;
        let last = (range.end as usize).div_ceil(CHUNK).min(next.chunks.len());
        for c in first..last {
            let lo = (c * CHUNK).max(range.start as usize);
            let hi = ((c + 1) * CHUNK).min(range.end as usize);
            if lo >= hi {
                continue;
            }
            let Some(chunk) = next.chunks[c].as_mut() else { continue };
            if lo == c * CHUNK && hi == (c + 1) * CHUNK {
                next.chunks[c] = None;
                continue;
            }
            let offsets = lo - c * CHUNK..hi - c * CHUNK;
            if chunk.any_in(offsets.clone()) {
                Arc::make_mut(chunk).clear(offsets);
            }
        }
        if end { next.end_pass() } else { next }
    }

    /// Ends the pass: forgets the values it folded and renumbers the slots
    /// of the rest. Every id the pass covered had its entry dropped, and
    /// later entries name later values, so no entry names a value it
    /// forgets.
    fn end_pass(mut self) -> LogIndex {
        let Some(pass) = self.pass.take() else { return self };
        let k = pass.values;
        if k == 0 {
            return self;
        }
        self.values.drain(..k);
        let dropped: u64 = self.counts.drain(..k).map(u64::from).sum();
        self.records -= dropped;
        let shift = (k as u32) << 24;
        for slot in self.chunks.iter_mut() {
            let Some(chunk) = slot.as_mut() else { continue };
            if chunk.is_empty() {
                *slot = None;
                continue;
            }
            for e in Arc::make_mut(chunk).values_mut() {
                debug_assert!(*e >> 24 > k as u32, "an entry names a value the pass folded");
                *e -= shift;
            }
        }
        self
    }

    /// The epochs (keys) of the values the pass under way folds, or that a
    /// pass starting now would (all of them): those the commit that ends
    /// it deletes.
    pub(crate) fn pass_values(&self) -> &[u64] {
        &self.values[..self.pass.map_or(self.values.len(), |p| p.values)]
    }

    /// This version plus one more value, keyed `epoch`, whose records hold
    /// the lists of `ids` (ascending, the order they are stored in).
    ///
    /// The caller keeps within [`MAX_VALUES`] and [`MAX_RECORDS`].
    pub(crate) fn with_value(&self, epoch: u64, ids: impl IntoIterator<Item = u32>) -> LogIndex {
        let mut next = self.clone();
        let slot = next.values.len();
        debug_assert!(slot < MAX_VALUES);
        next.values.push(epoch);
        next.counts.push(0);
        for (record, id) in ids.into_iter().enumerate() {
            debug_assert!(record < MAX_RECORDS);
            let c = id as usize / CHUNK;
            if next.chunks.len() <= c {
                next.chunks.resize(c + 1, None);
            }
            let chunk = next.chunks[c].get_or_insert_with(Default::default);
            // Copies the chunk if an older version still shares it.
            Arc::make_mut(chunk).set(id as usize % CHUNK, ((slot as u32 + 1) << 24) | record as u32);
            next.records += 1;
            next.counts[slot] += 1;
        }
        next
    }

    /// Memory the index's chunks take (shared chunks counted in full).
    pub(crate) fn bytes(&self) -> usize {
        self.chunks.iter().flatten().map(|c| c.bytes()).sum::<usize>() + self.chunks.len() * 8
    }

    /// Reads the whole log through `txn`: what [`crate::index::Index::open`]
    /// starts from. The log is bounded by the fold setting, so this reads at
    /// most that many records.
    pub(crate) fn load(store: &Store, txn: &heed::RoTxn<'_, heed::WithoutTls>, list_bytes: usize, next_id: u32) -> Result<LogIndex> {
        let corrupt = |detail: String| Error::Corrupt { path: store.path.clone(), detail };
        let mut index = LogIndex::default();
        for item in store.dbs.links0_log.iter(txn).map_err(|e| store.err(e))? {
            let (epoch, value) = item.map_err(|e| store.err(e))?;
            store.check_len(value.len(), || format!("link log value {epoch}"))?;
            if index.values.len() >= MAX_VALUES {
                return Err(corrupt(format!("link log holds more than {MAX_VALUES} values")));
            }
            let ids = value_ids(value, list_bytes, next_id).map_err(|why| corrupt(format!("link log value {epoch} {why}")))?;
            index = index.with_value(epoch, ids);
        }
        Ok(index)
    }
}

/// An entry's `(slot, record)`.
#[inline]
fn decode(e: u32) -> (usize, usize) {
    ((e >> 24) as usize - 1, (e & 0xFF_FFFF) as usize)
}

/// The ids whose lists a stored log value holds, checked to be whole
/// records, ascending and below `next_id`; Err says what is wrong (after
/// "link log value N").
pub(crate) fn value_ids(value: &[u8], list_bytes: usize, next_id: u32) -> std::result::Result<Vec<u32>, String> {
    let records = records(value, list_bytes).ok_or_else(|| "is malformed".to_owned())?;
    if records.len() > MAX_RECORDS {
        return Err(format!("holds more than {MAX_RECORDS} records"));
    }
    // Bounded by the value's real length, not by its count field.
    let mut ids = Vec::with_capacity(records.len());
    for r in records {
        let id = u32::from_le_bytes([r[0], r[1], r[2], r[3]]);
        if id >= next_id || ids.last().is_some_and(|&last| last >= id) {
            return Err(format!("names node {id} out of order or past the index"));
        }
        ids.push(id);
    }
    Ok(ids)
}

/// One value of the log as a transaction sees it, checked to hold the
/// whole records its count promises.
#[derive(Clone, Copy)]
pub(crate) struct Value<'t> {
    records: &'t [u8],
    list_bytes: usize,
}

impl<'t> Value<'t> {
    /// Reads the value of slot `slot` of `log` through `txn`.
    pub(crate) fn read(
        store: &Store,
        txn: &'t heed::RoTxn<'_, heed::WithoutTls>,
        log: &LogIndex,
        slot: usize,
        list_bytes: usize,
    ) -> Result<Value<'t>> {
        let corrupt = |detail: String| Error::Corrupt { path: store.path.clone(), detail };
        let epoch = log.values.get(slot).copied().ok_or_else(|| corrupt(format!("link log slot {slot} does not exist")))?;
        let value = store
            .dbs
            .links0_log
            .get(txn, epoch)
            .map_err(|e| store.err(e))?
            .ok_or_else(|| corrupt(format!("link log value {epoch} is missing")))?;
        store.check_len(value.len(), || format!("link log value {epoch}"))?;
        Value::parse(value, list_bytes).ok_or_else(|| corrupt(format!("link log value {epoch} is malformed")))
    }

    /// The records of a stored value, or `None` if its count promises more
    /// than it holds.
    pub(crate) fn parse(value: &'t [u8], list_bytes: usize) -> Option<Value<'t>> {
        let len = records(value, list_bytes)?.len().checked_mul(record_bytes(list_bytes))?;
        Some(Value { records: value.get(HEADER..HEADER.checked_add(len)?)?, list_bytes })
    }

    /// Records in the value.
    pub(crate) fn len(&self) -> usize {
        self.records.len() / record_bytes(self.list_bytes)
    }

    /// Where the records start (for readers that memoise the address for
    /// the life of their transaction; see [`list_at`]).
    pub(crate) fn start(&self) -> *const u8 {
        self.records.as_ptr()
    }

    /// The stored list of record `record`.
    pub(crate) fn list(&self, record: usize) -> Option<&'t [u8]> {
        // `record` may come from a damaged index: no arithmetic may wrap.
        let at = record.checked_mul(record_bytes(self.list_bytes))?.checked_add(4)?;
        self.records.get(at..at.checked_add(self.list_bytes)?)
    }
}

/// The address of record `record`'s list in a value whose records start at
/// `start` ([`Value::start`]); the caller checks `record` against the
/// value's length.
#[inline]
pub(crate) fn list_at(start: *const u8, record: usize, list_bytes: usize) -> *const u8 {
    start.wrapping_add(record * record_bytes(list_bytes) + 4)
}

/// Size of one record for lists of `list_bytes`.
#[inline]
pub(crate) fn record_bytes(list_bytes: usize) -> usize {
    4 + list_bytes
}

/// The records of a log value, or `None` if it is not one.
pub(crate) fn records(value: &[u8], list_bytes: usize) -> Option<std::slice::ChunksExact<'_, u8>> {
    let count = u32::from_le_bytes(value.get(..HEADER)?.try_into().ok()?) as usize;
    let len = count.checked_mul(record_bytes(list_bytes))?;
    Some(value.get(HEADER..HEADER.checked_add(len)?)?.chunks_exact(record_bytes(list_bytes)))
}

/// Bytes of a log value of `count` lists of `capacity` links, at least
/// `min_bytes` (see the module's notes).
pub(crate) fn value_bytes(count: usize, capacity: usize, min_bytes: usize) -> usize {
    (HEADER + count * record_bytes(crate::codec::links_bytes(capacity))).max(min_bytes)
}

/// Writes a log value from `(id, list)` pairs in ascending id order into
/// `out`, which has room for [`value_bytes`] and is zero-filled after.
pub(crate) fn write_value<'a>(
    lists: impl ExactSizeIterator<Item = (u32, &'a [u32])>,
    capacity: usize,
    out: &mut impl std::io::Write,
) -> std::io::Result<()> {
    let mut list = vec![0u8; crate::codec::links_bytes(capacity)];
    out.write_all(&(lists.len() as u32).to_le_bytes())?;
    for (id, ids) in lists {
        out.write_all(&id.to_le_bytes())?;
        crate::codec::write_links(ids, &mut list);
        out.write_all(&list)?;
    }
    Ok(())
}

/// The log index of every epoch a reader may still pair with.
///
/// A writer *stages* the version of the epoch it is about to commit before
/// the commit, and *settles* (retires older versions) after it. A reader
/// opens its transaction under the same lock ([`LogVersions::pair`]), so
/// whichever epoch its state holds, that version is there, and once it
/// holds the `Arc` no retirement can take it away.
pub(crate) struct LogVersions {
    versions: Mutex<Vec<(u64, Arc<LogIndex>)>>,
}

impl LogVersions {
    pub(crate) fn new(epoch: u64, index: LogIndex) -> Self {
        LogVersions { versions: Mutex::new(vec![(epoch, Arc::new(index))]) }
    }

    /// Runs `open` (which opens a read transaction and returns it with the
    /// log epoch of the state it reads) and pairs it with that epoch's index.
    pub(crate) fn pair<T>(&self, store: &Store, open: impl FnOnce() -> Result<(T, u64)>) -> Result<(T, Arc<LogIndex>)> {
        let versions = self.versions.lock();
        let (txn, epoch) = open()?;
        match versions.iter().find(|(e, _)| *e == epoch) {
            Some((_, index)) => Ok((txn, Arc::clone(index))),
            None => Err(Error::Corrupt {
                path: store.path.clone(),
                detail: format!("link log epoch {epoch} is not the committed one (the file changed under the index?)"),
            }),
        }
    }

    /// The version of `epoch`, if still kept.
    pub(crate) fn get(&self, epoch: u64) -> Option<Arc<LogIndex>> {
        self.versions.lock().iter().find(|(e, _)| *e == epoch).map(|(_, i)| Arc::clone(i))
    }

    /// Makes `index` the version of `epoch`, about to be committed.
    pub(crate) fn stage(&self, epoch: u64, index: Arc<LogIndex>) {
        let mut versions = self.versions.lock();
        versions.retain(|(e, _)| *e != epoch);
        versions.push((epoch, index));
    }

    /// The commit of `epoch` failed: forget its version.
    pub(crate) fn unstage(&self, epoch: u64) {
        self.versions.lock().retain(|(e, _)| *e != epoch);
    }

    /// `epoch` is committed: no new reader can see an older one.
    pub(crate) fn settle(&self, epoch: u64) {
        self.versions.lock().retain(|(e, _)| *e >= epoch);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn newer_values_shadow_older_ones_and_versions_stay_apart() {
        let v0 = LogIndex::default();
        let v1 = v0.with_value(3, [1, 5, 2000]);
        let v2 = v1.with_value(4, [5, 7]);
        assert_eq!(v0.get(5), None);
        assert_eq!(v1.get(5), Some((0, 1)));
        assert_eq!(v2.get(5), Some((1, 0)));
        assert_eq!(v2.get(1), Some((0, 0)));
        assert_eq!(v2.get(2000), Some((0, 2)));
        assert_eq!(v1.get(7), None, "an older version must not see a newer value");
        assert_eq!(v2.records(), 5);
        assert_eq!(v2.values(), &[3, 4]);
        let all: Vec<_> = v2.entries().collect();
        assert_eq!(all, vec![(1, (0, 0)), (5, (1, 0)), (7, (1, 1)), (2000, (0, 2))]);
    }

    #[test]
    fn a_pass_drops_the_ranges_it_folded_and_forgets_its_values_when_it_ends() {
        let v2 = LogIndex::default().with_value(3, [1, 5, 2000]).with_value(4, [5, 7]);
        assert_eq!(v2.pass(), None);
        assert_eq!(v2.pass_values(), &[3, 4], "a pass starting now folds every value");
        let s1 = v2.folded(0..6, false);
        assert_eq!(s1.pass(), Some(Pass { values: 2, cursor: 6 }));
        assert_eq!((s1.get(1), s1.get(5)), (None, None));
        assert_eq!((s1.get(7), s1.get(2000)), (Some((1, 1)), Some((0, 2))));
        assert_eq!(s1.records(), 5, "records stay until their values go");
        assert_eq!(v2.get(5), Some((1, 0)), "the version before the step changed");
        assert_eq!(s1.entries_in(6..2001).collect::<Vec<_>>(), vec![(7, (1, 1)), (2000, (0, 2))]);
        assert_eq!(s1.entries_in(6..2000).collect::<Vec<_>>(), vec![(7, (1, 1))]);
        // A batch appends during the pass: its value outlives the pass.
        let s2 = s1.with_value(6, [1, 3000]);
        assert_eq!(s2.pass_values(), &[3, 4]);
        let s3 = s2.folded(6..2048, false);
        assert_eq!(s3.pass(), Some(Pass { values: 2, cursor: 2048 }));
        let end = s2.folded(6..2048, true);
        assert_eq!(end.pass(), None);
        assert_eq!(end.values(), &[6]);
        assert_eq!(end.records(), 2);
        assert_eq!(end.entries().collect::<Vec<_>>(), vec![(1, (0, 0)), (3000, (0, 1))], "slots renumbered");
        assert_eq!(s2.get(3000), Some((2, 1)), "the version before the end changed");
        // A pass over an empty range of a chunk changes nothing but the cursor.
        assert_eq!(v2.folded(1500..1500, false).entries().count(), 4);
    }

    /// What a version must answer: for each id, the slot and record of its
    /// newest list, where slots count the values not yet forgotten.
    #[derive(Clone, Default)]
    struct Model {
        values: Vec<u64>,
        entries: std::collections::BTreeMap<u32, (usize, usize)>,
        pass: Option<Pass>,
    }

    proptest::proptest! {
        #[test]
        fn versions_answer_like_a_map_through_appends_and_passes(
            steps in proptest::collection::vec((proptest::collection::btree_set(0u32..5000, 0..300), 0u32..1500, proptest::bool::ANY), 1..30),
        ) {
            let mut index = LogIndex::default();
            let mut model = Model::default();
            let mut kept: Vec<(LogIndex, Model)> = Vec::new();
            for (epoch, (ids, step, append)) in steps.into_iter().enumerate() {
                if append && model.values.len() < 20 {
                    index = index.with_value(epoch as u64, ids.iter().copied());
                    let slot = model.values.len();
                    model.values.push(epoch as u64);
                    for (record, id) in ids.iter().enumerate() {
                        model.entries.insert(*id, (slot, record));
                    }
                } else {
                    let start = model.pass.map_or(0, |p| p.cursor);
                    let end = (start + step).min(5000);
                    let done = end == 5000;
                    index = index.folded(start..end, done);
                    let values = model.pass.map_or(model.values.len(), |p| p.values);
                    model.entries.retain(|id, _| !(start..end).contains(id));
                    model.pass = Some(Pass { values, cursor: end });
                    if done {
                        model.values.drain(..values);
                        model.entries.values_mut().for_each(|(slot, _)| *slot -= values);
                        model.pass = None;
                    }
                }
                kept.push((index.clone(), model.clone()));
            }
            // Every version still answers as it did when it was made.
            for (version, model) in &kept {
                proptest::prop_assert_eq!(version.values(), &model.values[..]);
                proptest::prop_assert_eq!(version.pass(), model.pass);
                let all: Vec<_> = version.entries().collect();
                proptest::prop_assert_eq!(all, model.entries.iter().map(|(i, e)| (*i, *e)).collect::<Vec<_>>());
                for id in (0..5100).step_by(7) {
                    proptest::prop_assert_eq!(version.get(id), model.entries.get(&id).copied());
                }
                let part: Vec<_> = version.entries_in(1000..3333).collect();
                proptest::prop_assert_eq!(part, model.entries.range(1000..3333).map(|(i, e)| (*i, *e)).collect::<Vec<_>>());
            }
        }
    }

    #[test]
    fn the_index_grows_with_the_log_not_the_ids() {
        // A thousand lists spread over a million ids, one per chunk nearly:
        // the dense chunks took 4 MiB; sparse ones take a bitmap per chunk
        // (~200 bytes) and their entries.
        let ids = (0..1000u32).map(|i| i * 1000);
        let index = LogIndex::default().with_value(1, ids);
        assert!(index.bytes() < 1000 * 220, "{} bytes", index.bytes());
        let packed = LogIndex::default().with_value(1, 0..100_000);
        assert!(packed.bytes() < 100_000 * 5, "{} bytes", packed.bytes());
    }

    #[test]
    fn values_round_trip_and_pad_to_a_page() {
        let lists: Vec<(u32, Vec<u32>)> = vec![(4, vec![1, 2, 3]), (9, vec![]), (12, vec![7; 32])];
        let mut out = Vec::new();
        write_value(lists.iter().map(|(id, l)| (*id, l.as_slice())), 32, &mut out).unwrap();
        assert_eq!(value_bytes(3, 32, 4096), 4096);
        assert_eq!(value_bytes(3, 32, 0), out.len());
        let lb = crate::codec::links_bytes(32);
        let recs: Vec<_> = records(&out, lb).unwrap().collect();
        assert_eq!(recs.len(), 3);
        for (r, (id, list)) in recs.iter().zip(&lists) {
            assert_eq!(u32::from_le_bytes(r[..4].try_into().unwrap()), *id);
            let mut got = Vec::new();
            assert!(crate::codec::decode_links(&r[4..], &mut got));
            assert_eq!(&got, list);
        }
        assert!(records(&out[..10], lb).is_none(), "a value cut short is not read");
    }
}
