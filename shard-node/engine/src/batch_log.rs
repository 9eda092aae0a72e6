//! The batch log: the shard's recent batches, kept so that another copy
//! of the shard (restored from a snapshot on another node) can catch up
//! with what was applied since, without the ingest job.
//!
//! Every applied batch takes the next sequence number (`State::last_seq`)
//! and its net effect is written to the `batch_log` database, in the same
//! write transaction as the batch. The oldest entries beyond the
//! retention are deleted in that transaction too; the state records the
//! first retained number and the bytes held, so the write path never
//! scans the log.
//!
//! An entry is stored in parts of [`PART_BYTES`], keyed (sequence number,
//! part) big-endian, so every part is appended to the B-tree and sits
//! inside a leaf page. Stored whole, an entry of a 10,000-point batch was
//! one value of 3,800 contiguous overflow pages: LMDB finds such a run in
//! its free list only by luck once the single pages of other commits have
//! cut the runs that trimmed entries freed, so each new entry grew the
//! file instead: under churn at 30k points with the log bounded to 3
//! batches, the file grew to 1.60x a fresh build's in 10 rounds, against
//! 1.24x in parts (`docs/benchmarks.md`, "Batch log entries whole or in
//! parts"). Parts fit in any free page.
//!
//! An entry holds what the batch did, not what it said: the points it
//! left (the last upsert of each id, its vector in stored form) and the
//! ids it emptied, so replaying it on a copy that holds what this one
//! held before the batch leaves the same points.

use heed::{RoTxn, RwTxn, WithoutTls};

use crate::batch::{Point, SourceOffset};
use crate::codec::State;
use crate::error::{Error, Result};
use crate::store::Store;
use crate::table::{LogPart, Seq, Table};

/// Bytes of an entry per stored part: two parts and their 12-byte keys
/// fill a 4 KiB leaf page (LMDB moves a value to overflow pages past
/// about 2,000 bytes).
pub(crate) const PART_BYTES: usize = 2000;

/// How many recent batches a shard keeps in its batch log.
///
/// The oldest entries go once the log holds more than `max_batches`
/// entries or more bytes than [`BatchLogRetention::byte_limit`]; the
/// newest entry always stays (so a batch larger than the limit can still
/// be caught up). A copy that falls further behind than the log reaches
/// must be re-seeded from a snapshot.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct BatchLogRetention {
    /// Entries kept at most; 0 turns the log off (batches still take
    /// sequence numbers, and an existing log is dropped by the next batch).
    pub max_batches: u64,
    /// Bytes kept at most, counted as the entries are read (a 384-d point
    /// weighs 1,548 bytes plus its payload, though the log stores most
    /// points by reference, in 13) plus the old vectors kept for them
    /// (1,552 bytes each at 384-d); docs/engine.md, "The batch log".
    pub max_bytes: u64,
    /// Bytes kept at most as a multiple of what the shard's live points
    /// weigh in the log (12 + 4·dim bytes each, payloads aside); 0: no such
    /// bound. Default 0.25: a copy further behind than a quarter of its
    /// shard re-inserts those points from the log, building the graph
    /// (~0.3 ms a point on two cores: 75 s for a quarter of a million
    /// points), where a snapshot restores a million points by copying pages
    /// in seconds (docs/scale.md).
    pub max_share: f64,
    /// The share bound never cuts the log below this many bytes, so a
    /// small shard still covers a move or a rejoin under ingest.
    pub min_bytes: u64,
}

impl Default for BatchLogRetention {
    fn default() -> Self {
        BatchLogRetention { max_batches: 10_000, max_bytes: 256 << 20, max_share: 0.25, min_bytes: 64 << 20 }
    }
}

impl BatchLogRetention {
    /// No log: batches are numbered but not kept.
    pub const OFF: BatchLogRetention = BatchLogRetention { max_batches: 0, max_bytes: 0, max_share: 0.0, min_bytes: 0 };

    /// True if no entry is kept.
    pub fn is_off(&self) -> bool {
        self.max_batches == 0
    }

    /// Bytes the log may hold for a shard of `live` points of `dim`
    /// dimensions.
    pub fn byte_limit(&self, live: u64, dim: usize) -> u64 {
        if self.max_share <= 0.0 {
            return self.max_bytes;
        }
        let points = live as f64 * (12 + 4 * dim) as f64;
        // Saturating: the cast clamps a product past u64::MAX.
        let share = (points * self.max_share) as u64;
        self.max_bytes.min(share.max(self.min_bytes))
    }
}

/// One applied batch as the batch log keeps it.
#[derive(Clone, Debug, PartialEq)]
pub struct LogEntry {
    /// Its sequence number in the shard (1 for the first batch).
    pub seq: u64,
    /// The batch's place in its source, if it had one.
    pub source: Option<SourceOffset>,
    /// The points the batch left, by ascending id: the last upsert of
    /// each id, the vector as stored (unit length under cosine).
    pub points: Vec<Point>,
    /// Ids that held a point before the batch and none after it, ascending.
    pub deletes: Vec<u64>,
}

/// What [`crate::Index::read_log`] returns.
#[derive(Clone, Debug, PartialEq)]
pub struct LogRead {
    /// Consecutive entries from the one asked for (none when it is the
    /// next one to be written).
    pub entries: Vec<LogEntry>,
    /// First sequence number the log still holds (`last_seq + 1` when it
    /// holds none).
    pub first_seq: u64,
    /// Sequence number of the last applied batch (0: none yet).
    pub last_seq: u64,
}

/// What [`crate::Index::apply_log`] did.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct LogApplied {
    /// The copy's last sequence number afterwards.
    pub last_seq: u64,
    /// Entries applied.
    pub applied: usize,
    /// Entries skipped because the copy held them already.
    pub skipped: usize,
}

/// Layout versions of an entry's value: 1 held every vector; 2 holds a
/// point's vector only where the index does not (see [`encode`]).
const VERSION_INLINE: u8 = 1;
const VERSION: u8 = 2;
const HAS_SOURCE: u8 = 1;
/// How a point of a version 2 entry holds its vector.
const BY_REFERENCE: u8 = 0;
const INLINE: u8 = 1;

/// Bytes an old vector kept for the log counts beyond its own: its two
/// keys' worth.
const OLD_VECTOR_OVERHEAD: u64 = 16;

/// What an entry weighs against the retention and a read's byte limit:
/// its size with every vector in it (layout 1), whatever it stores.
fn logical_bytes(source: Option<&SourceOffset>, deletes: usize, points: usize, payloads: usize, dim: usize) -> u64 {
    (2 + source.map_or(0, |s| 10 + s.source.len()) + 4 + 8 * deletes + 8 + points * (12 + 4 * dim) + payloads) as u64
}

/// Encodes an entry's value into `out` (cleared first) and returns its
/// logical size ([`logical_bytes`]). A point's vector is `None` when the
/// index holds it as the entry left it: the point's live slot does, until
/// a later batch replaces or deletes the point, which then keeps the old
/// vector under (id, its own number) in `log_vectors` while an entry may
/// need it (see `Index::write_batch_log`). At a million points that keeps
/// the log at a few bytes a point where it held a second copy of every
/// recent vector.
///
/// Layout 2: version, flags, the logical size (u64), then the source (u16
/// name length, name, u64 offset) if any, the deletes (u32 count, u64
/// each), and the points (u32 count, u32 dim, then per point u64 id, u32
/// payload tag (0: none, else length + 1), u8 [`BY_REFERENCE`] or
/// [`INLINE`] followed by the vector's f32s, and the payload).
/// Little-endian throughout.
pub(crate) fn encode<'a>(
    out: &mut Vec<u8>,
    source: Option<&SourceOffset>,
    deletes: &[u64],
    points: impl ExactSizeIterator<Item = (u64, Option<&'a [f32]>, Option<&'a [u8]>)> + Clone,
    dim: usize,
) -> u64 {
    out.clear();
    let payloads: usize = points.clone().map(|(_, _, p)| p.map_or(0, <[u8]>::len)).sum();
    let inline = points.clone().filter(|(_, v, _)| v.is_some()).count();
    let logical = logical_bytes(source, deletes.len(), points.len(), payloads, dim);
    out.reserve(
        10 + source.map_or(0, |s| 10 + s.source.len()) + 4 + 8 * deletes.len() + 8 + points.len() * 13 + inline * 4 * dim + payloads,
    );
    out.push(VERSION);
    out.push(if source.is_some() { HAS_SOURCE } else { 0 });
    out.extend_from_slice(&logical.to_le_bytes());
    if let Some(s) = source {
        // Source names are at most `MAX_SOURCE_BYTES` (255).
        out.extend_from_slice(&(s.source.len() as u16).to_le_bytes());
        out.extend_from_slice(s.source.as_bytes());
        out.extend_from_slice(&s.offset.to_le_bytes());
    }
    out.extend_from_slice(&(deletes.len() as u32).to_le_bytes());
    for id in deletes {
        out.extend_from_slice(&id.to_le_bytes());
    }
    out.extend_from_slice(&(points.len() as u32).to_le_bytes());
    out.extend_from_slice(&(dim as u32).to_le_bytes());
    for (id, vector, payload) in points {
        out.extend_from_slice(&id.to_le_bytes());
        let tag = payload.map_or(0, |p| p.len() as u32 + 1);
        out.extend_from_slice(&tag.to_le_bytes());
        match vector {
            Some(vector) => {
                debug_assert_eq!(vector.len(), dim);
                out.push(INLINE);
                out.extend_from_slice(crate::codec::vector_bytes(vector));
            }
            None => out.push(BY_REFERENCE),
        }
        if let Some(p) = payload {
            out.extend_from_slice(p);
        }
    }
    logical
}

/// An entry as stored: the points whose vectors the index holds (their
/// positions in `by_reference`) come with empty vectors.
#[derive(Debug)]
pub(crate) struct Decoded {
    pub(crate) entry: LogEntry,
    pub(crate) by_reference: Vec<usize>,
    /// Its size with every vector in it ([`logical_bytes`]).
    pub(crate) logical: u64,
}

/// Decodes what [`encode`] wrote (or layout 1); `None` if the bytes are
/// not an entry of `dim`-dimensional points.
pub(crate) fn decode(seq: u64, b: &[u8], dim: usize) -> Option<Decoded> {
    let mut r = Reader(b);
    let version = r.u8()?;
    if version != VERSION && version != VERSION_INLINE {
        return None;
    }
    let flags = r.u8()?;
    let stored_logical = if version == VERSION { Some(r.u64()?) } else { None };
    let source = if flags & HAS_SOURCE != 0 {
        let len = usize::from(r.u16()?);
        let name = std::str::from_utf8(r.take(len)?).ok()?.to_owned();
        Some(SourceOffset { source: name, offset: r.u64()? })
    } else {
        None
    };
    let n = r.u32()? as usize;
    let deletes = (0..n).map(|_| r.u64()).collect::<Option<Vec<u64>>>()?;
    let n = r.u32()? as usize;
    if r.u32()? as usize != dim {
        return None;
    }
    let (mut payloads, mut by_reference) = (0usize, Vec::new());
    let mut points = Vec::with_capacity(n.min(r.0.len() / 13));
    for i in 0..n {
        let id = r.u64()?;
        let tag = r.u32()? as usize;
        let inline = version == VERSION_INLINE || {
            match r.u8()? {
                INLINE => true,
                BY_REFERENCE => false,
                _ => return None,
            }
        };
        let vector = if inline {
            r.take(4 * dim)?.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
        } else {
            by_reference.push(i);
            Vec::new()
        };
        let payload = match tag {
            0 => None,
            len => Some(r.take(len - 1)?.to_vec()),
        };
        payloads += payload.as_ref().map_or(0, Vec::len);
        points.push(Point { id, vector, payload });
    }
    if !r.0.is_empty() {
        return None;
    }
    let logical = logical_bytes(source.as_ref(), deletes.len(), points.len(), payloads, dim);
    // Layout 1 is its own logical size; layout 2 says it, and must say it
    // right: the retention subtracts it when the entry goes.
    if stored_logical.is_some_and(|l| l != logical) || (version == VERSION_INLINE && logical != b.len() as u64) {
        return None;
    }
    Some(Decoded { entry: LogEntry { seq, source, points, deletes }, by_reference, logical })
}

/// The logical size an entry's first part says ([`encode`]), `None` if it
/// is too short to say; `stored` is the bytes of all its parts.
fn logical_of(first_part: &[u8], stored: u64) -> Option<u64> {
    match *first_part.first()? {
        VERSION_INLINE => Some(stored),
        VERSION => Some(u64::from_le_bytes(first_part.get(2..10)?.try_into().ok()?)),
        _ => None,
    }
}

struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Option<&'a [u8]> {
        let (head, rest) = self.0.split_at_checked(n)?;
        self.0 = rest;
        Some(head)
    }
    fn u8(&mut self) -> Option<u8> {
        Some(self.take(1)?[0])
    }
    fn u16(&mut self) -> Option<u16> {
        Some(u16::from_le_bytes(self.take(2)?.try_into().ok()?))
    }
    fn u32(&mut self) -> Option<u32> {
        Some(u32::from_le_bytes(self.take(4)?.try_into().ok()?))
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
}

/// Reads consecutive entries from `from` (0 reads as 1) of the log as of
/// `txn`, whose state is `state`, until the next one would take the
/// values past `max_bytes` (at least one entry when there is one).
pub(crate) fn read(store: &Store, txn: &RoTxn<'_, WithoutTls>, state: &State, from: u64, max_bytes: u64, dim: usize) -> Result<LogRead> {
    let from = from.max(1);
    let (first_seq, last_seq) = (state.log_first_seq, state.last_seq);
    if from < first_seq {
        return Err(Error::LogTruncated { from, first: first_seq });
    }
    if from > last_seq + 1 {
        return Err(Error::LogAhead { from, last: last_seq });
    }
    let corrupt = |detail: String| Error::Corrupt { path: store.path.clone(), detail };
    let mut entries = Vec::new();
    let mut bytes = 0u64;
    let mut value = Vec::new();
    let mut parts = store.dbs.batch_log.iter_from(txn, (from, 0)).map_err(|e| store.err(e))?.peekable();
    for expected in from..=last_seq {
        value.clear();
        let mut next_part = 0u32;
        while let Some(item) = parts.next_if(|item| item.as_ref().map_or(true, |((seq, _), _)| *seq == expected)) {
            let ((_, part), v) = item.map_err(|e| store.err(e))?;
            store.check_len(v.len(), || format!("batch log entry {expected}"))?;
            if part != next_part || v.len() > PART_BYTES {
                return Err(corrupt(format!("batch log entry {expected} has a stray part {part} of {} bytes", v.len())));
            }
            value.extend_from_slice(v);
            next_part += 1;
        }
        if next_part == 0 {
            let found = parts.peek().and_then(|item| item.as_ref().ok()).map(|((seq, _), _)| *seq);
            return Err(corrupt(match found {
                Some(seq) => format!("batch log entry {expected} is missing (found entry {seq})"),
                None => format!("batch log entry {expected} is missing"),
            }));
        }
        let Decoded { mut entry, by_reference, logical } =
            decode(expected, &value, dim).ok_or_else(|| corrupt(format!("batch log entry {expected} is malformed")))?;
        if !entries.is_empty() && bytes + logical > max_bytes {
            break;
        }
        bytes += logical;
        for i in by_reference {
            let point = &mut entry.points[i];
            point.vector = vector_as_of(store, txn, point.id, expected, dim)?;
        }
        entries.push(entry);
    }
    Ok(LogRead { entries, first_seq, last_seq })
}

/// The vector point `id` had after batch `seq`, which left it: the first
/// old vector kept for it by a later batch, else its live slot's.
fn vector_as_of(store: &Store, txn: &RoTxn<'_, WithoutTls>, id: u64, seq: u64, dim: usize) -> Result<Vec<f32>> {
    let corrupt = |detail: String| Error::Corrupt { path: store.path.clone(), detail };
    let vector_bytes = 4 * dim;
    let kept = store.dbs.log_vectors.iter_from(txn, (id, seq + 1)).map_err(|e| store.err(e))?.next();
    let bytes = match kept.transpose().map_err(|e| store.err(e))? {
        Some(((kept_id, _), v)) if kept_id == id => v,
        _ => {
            let internal = crate::session::lookup_external(store, txn, id)?.ok_or_else(|| {
                corrupt(format!("batch log entry {seq} refers to point {id}, which is neither live nor kept for the log"))
            })?;
            crate::session::stored_vector(store, txn, vector_bytes, crate::codec::vectors_block_nodes(vector_bytes) as u32, internal)?
        }
    };
    if bytes.len() != vector_bytes {
        return Err(corrupt(format!("the vector batch log entry {seq} keeps for point {id} has {} bytes", bytes.len())));
    }
    Ok(bytes.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
}

/// Keeps `vector` (as stored), the one point `id` had before batch `seq`
/// replaced or deleted it, for the entries that refer to it; returns the
/// bytes it counts against the retention.
pub(crate) fn keep_old_vector(store: &Store, wtxn: &mut RwTxn<'_>, id: u64, seq: u64, vector: &[u8]) -> heed::Result<u64> {
    store.dbs.log_vectors.put(wtxn, (id, seq), vector)?;
    store.dbs.log_vectors_by_seq.put(wtxn, (seq, id), &[])?;
    Ok(vector.len() as u64 + OLD_VECTOR_OVERHEAD)
}

/// Drops the old vectors of batches up to `seq` (no entry from `seq` on
/// refers to them); returns the bytes they counted.
pub(crate) fn drop_old_vectors(store: &Store, wtxn: &mut RwTxn<'_>, seq: u64, dim: usize) -> heed::Result<u64> {
    let mut gone = Vec::new();
    for item in store.dbs.log_vectors_by_seq.iter_from(wtxn, (0, 0))? {
        let ((kept_seq, id), _) = item?;
        if kept_seq > seq {
            break;
        }
        gone.push((kept_seq, id));
    }
    for &(kept_seq, id) in &gone {
        store.dbs.log_vectors.delete(wtxn, (id, kept_seq))?;
        store.dbs.log_vectors_by_seq.delete(wtxn, (kept_seq, id))?;
    }
    Ok(gone.len() as u64 * (4 * dim as u64 + OLD_VECTOR_OVERHEAD))
}

/// Drops every entry and old vector.
pub(crate) fn clear(store: &Store, wtxn: &mut RwTxn<'_>) -> heed::Result<()> {
    store.dbs.batch_log.clear(wtxn)?;
    store.dbs.log_vectors.clear(wtxn)?;
    store.dbs.log_vectors_by_seq.clear(wtxn)
}

/// Writes entry `seq` (`value`, as [`encode`] made it) after every entry
/// the log holds.
pub(crate) fn append(log: Table<LogPart>, wtxn: &mut RwTxn<'_>, seq: u64, value: &[u8]) -> heed::Result<()> {
    for (part, bytes) in parts(value) {
        log.append(wtxn, (seq, part), bytes)?;
    }
    Ok(())
}

/// An entry's parts, numbered from 0. An empty value still takes one
/// part, so that the entry exists.
fn parts(value: &[u8]) -> impl Iterator<Item = (u32, &[u8])> {
    value.chunks(PART_BYTES).chain(value.is_empty().then_some(&[][..])).enumerate().map(|(i, part)| (i as u32, part))
}

/// What [`delete`] found.
pub(crate) enum Deleted {
    /// The entry's logical size ([`logical_bytes`]).
    Entry(u64),
    Missing,
    /// Its first part does not say its size.
    Malformed,
}

/// Deletes entry `seq`.
pub(crate) fn delete(log: Table<LogPart>, wtxn: &mut RwTxn<'_>, seq: u64) -> heed::Result<Deleted> {
    let mut bytes = 0u64;
    let mut parts = 0usize;
    let mut head = [0u8; 10];
    let mut head_len = 0;
    for item in log.iter_from(wtxn, (seq, 0))? {
        let ((s, _), v) = item?;
        if s != seq {
            break;
        }
        if parts == 0 {
            head_len = v.len().min(head.len());
            head[..head_len].copy_from_slice(&v[..head_len]);
        }
        bytes += v.len() as u64;
        parts += 1;
    }
    if parts == 0 {
        return Ok(Deleted::Missing);
    }
    log.delete_range(wtxn, (seq, 0), (seq + 1, 0))?;
    Ok(logical_of(&head[..head_len], bytes).map_or(Deleted::Malformed, Deleted::Entry))
}

/// Splits the entries of a log written before entries were stored in
/// parts (one value per entry, keyed by its sequence number alone) into
/// parts. Runs once, on open; does nothing to a log already in parts.
pub(crate) fn split_whole_entries(store: &Store) -> Result<()> {
    let err = |e| store.err(e);
    let mut wtxn = store.env.write_txn().map_err(err)?;
    let whole: Table<Seq> = store.dbs.batch_log.retyped();
    if store.dbs.batch_log.first_raw_key(&wtxn).map_err(err)?.is_none_or(|k| k.len() != 8) {
        wtxn.abort();
        return Ok(());
    }
    let seqs = whole.iter(&wtxn).map_err(err)?.map(|item| item.map(|(seq, _)| seq)).collect::<heed::Result<Vec<u64>>>().map_err(err)?;
    tracing::info!(path = %store.path.display(), entries = seqs.len(), "splitting the batch log's entries into parts");
    for seq in seqs {
        let value = whole.get(&wtxn, seq).map_err(err)?.map(<[u8]>::to_vec).unwrap_or_default();
        whole.delete(&mut wtxn, seq).map_err(err)?;
        // Parts of `seq` sort after its whole key and before the next
        // one's, so they are not the largest keys: a plain put.
        for (part, bytes) in parts(&value) {
            store.dbs.batch_log.put(&mut wtxn, (seq, part), bytes).map_err(err)?;
        }
    }
    wtxn.commit().map_err(err)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// An entry, its dimension, and which of its points are logged by
    /// reference.
    fn entry() -> impl Strategy<Value = (LogEntry, usize, Vec<bool>)> {
        (1usize..6).prop_flat_map(|dim| {
            let point = (
                any::<u64>(),
                proptest::collection::vec(any::<f32>(), dim),
                proptest::option::of(proptest::collection::vec(any::<u8>(), 0..20)),
                any::<bool>(),
            );
            let source = proptest::option::of(("[a-z]{1,12}", any::<u64>()).prop_map(|(source, offset)| SourceOffset { source, offset }));
            (any::<u64>(), source, proptest::collection::vec(point, 0..8), proptest::collection::vec(any::<u64>(), 0..8), Just(dim))
                .prop_map(|(seq, source, points, deletes, dim)| {
                    let by_reference = points.iter().map(|p| p.3).collect();
                    let points = points.into_iter().map(|(id, vector, payload, _)| Point { id, vector, payload }).collect();
                    (LogEntry { seq, source, points, deletes }, dim, by_reference)
                })
        })
    }

    fn encoded(e: &LogEntry, dim: usize, by_reference: &[bool]) -> (Vec<u8>, u64) {
        let mut out = Vec::new();
        let points = e.points.iter().zip(by_reference).map(|(p, &r)| (p.id, (!r).then_some(p.vector.as_slice()), p.payload.as_deref()));
        let logical = encode(&mut out, e.source.as_ref(), &e.deletes, points, dim);
        (out, logical)
    }

    /// Layout 1, as builds before references wrote it: every vector inline.
    fn encoded_inline(e: &LogEntry, dim: usize) -> Vec<u8> {
        let mut out = vec![VERSION_INLINE, u8::from(e.source.is_some())];
        if let Some(s) = &e.source {
            out.extend_from_slice(&(s.source.len() as u16).to_le_bytes());
            out.extend_from_slice(s.source.as_bytes());
            out.extend_from_slice(&s.offset.to_le_bytes());
        }
        out.extend_from_slice(&(e.deletes.len() as u32).to_le_bytes());
        e.deletes.iter().for_each(|id| out.extend_from_slice(&id.to_le_bytes()));
        out.extend_from_slice(&(e.points.len() as u32).to_le_bytes());
        out.extend_from_slice(&(dim as u32).to_le_bytes());
        for p in &e.points {
            out.extend_from_slice(&p.id.to_le_bytes());
            out.extend_from_slice(&p.payload.as_ref().map_or(0, |p| p.len() as u32 + 1).to_le_bytes());
            out.extend_from_slice(crate::codec::vector_bytes(&p.vector));
            out.extend_from_slice(p.payload.as_deref().unwrap_or_default());
        }
        out
    }

    /// Points compared by their floats' bits (NaNs compare unequal).
    fn bits(e: &LogEntry) -> Vec<(u64, Vec<u32>, Option<Vec<u8>>)> {
        e.points.iter().map(|p| (p.id, p.vector.iter().map(|x| x.to_bits()).collect(), p.payload.clone())).collect()
    }

    proptest! {
        #[test]
        fn entries_round_trip_bit_for_bit((e, dim, by_reference) in entry()) {
            let (bytes, logical) = encoded(&e, dim, &by_reference);
            // Logical size: what layout 1 takes, every vector inline.
            let inline = encoded_inline(&e, dim);
            prop_assert_eq!(logical, inline.len() as u64);
            // Stored: the size, and a kind byte per point; vectors by
            // reference take nothing.
            let referred = by_reference.iter().filter(|&&r| r).count();
            prop_assert_eq!(bytes.len(), inline.len() + 8 + e.points.len() - referred * 4 * dim);
            let back = decode(e.seq, &bytes, dim).unwrap();
            let expected_refs: Vec<usize> = by_reference.iter().enumerate().filter(|(_, r)| **r).map(|(i, _)| i).collect();
            prop_assert_eq!(&back.by_reference, &expected_refs);
            prop_assert_eq!(back.logical, logical);
            let mut want = e.clone();
            for &i in &expected_refs {
                want.points[i].vector.clear();
            }
            prop_assert_eq!(bits(&back.entry), bits(&want));
            prop_assert_eq!((&back.entry.source, &back.entry.deletes, back.entry.seq), (&e.source, &e.deletes, e.seq));
            prop_assert_eq!(logical_of(&bytes[..bytes.len().min(PART_BYTES)], bytes.len() as u64), Some(logical));
        }

        /// Entries an older build wrote (every vector inline) read back
        /// whole, and weigh what they store.
        #[test]
        fn layout_1_entries_still_read((e, dim, _) in entry()) {
            let bytes = encoded_inline(&e, dim);
            let back = decode(e.seq, &bytes, dim).unwrap();
            prop_assert!(back.by_reference.is_empty());
            prop_assert_eq!(back.logical, bytes.len() as u64);
            prop_assert_eq!(bits(&back.entry), bits(&e));
            prop_assert_eq!(logical_of(&bytes, bytes.len() as u64), Some(bytes.len() as u64));
        }

        /// Cut short, extended or read with another dimension, an entry is
        /// refused, never misread.
        #[test]
        fn damaged_entries_are_refused((e, dim, by_reference) in entry(), cut in 0usize..1000) {
            for bytes in [encoded(&e, dim, &by_reference).0, encoded_inline(&e, dim)] {
                let cut = cut % bytes.len();
                prop_assert!(decode(e.seq, &bytes[..cut], dim).is_none());
                let mut longer = bytes.clone();
                longer.push(0);
                prop_assert!(decode(e.seq, &longer, dim).is_none());
                prop_assert!(decode(e.seq, &bytes, dim + 1).is_none());
            }
        }
    }
}
