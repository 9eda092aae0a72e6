//! The batch log: a copy of a shard restored from a snapshot catches up
//! with the source from the source's log and ends up holding the same
//! points, offsets and sequence numbers.

use std::collections::BTreeMap;

use proptest::prelude::*;
use shoal_engine::{
    Batch, BatchLogRetention, BatchOutcome, CopyMode, Error, Index, IndexOptions, IndexParams, LogEntry, Metric, Op, Point, Rejected,
    StoredPoint,
};

use crate::common::{Fixture, random_batch, rng, test_options};

const DIM: usize = 6;
const IDS: u64 = 30;

#[derive(Clone, Debug)]
enum ModelOp {
    Upsert(u64, Vec<f32>, bool),
    Delete(u64),
    DeleteIfPresent(u64),
}

/// A batch: its operations and, maybe, its place in source "a" or "b".
type ModelBatch = (Vec<ModelOp>, Option<(bool, u64)>);

fn vector() -> impl Strategy<Value = Vec<f32>> {
    proptest::collection::vec((-8i8..=8).prop_map(|x| f32::from(x) / 8.0), DIM)
        .prop_filter("cosine needs a direction", |v| v.iter().any(|x| *x != 0.0))
}

fn op() -> impl Strategy<Value = ModelOp> {
    prop_oneof![
        4 => (0..IDS, vector(), any::<bool>()).prop_map(|(id, v, p)| ModelOp::Upsert(id, v, p)),
        1 => (0..IDS).prop_map(ModelOp::Delete),
        2 => (0..IDS).prop_map(ModelOp::DeleteIfPresent),
    ]
}

/// Groups of batches, each group one commit. Offsets repeat, so some
/// sourced batches are re-sent ones the shard skips; strict deletes of
/// absent ids make some batches invalid.
fn groups() -> impl Strategy<Value = Vec<Vec<ModelBatch>>> {
    let batch = (proptest::collection::vec(op(), 0..12), proptest::option::of((any::<bool>(), 0u64..10)));
    let batch = batch.prop_filter("an empty batch needs a source", |(ops, s)| !ops.is_empty() || s.is_some());
    proptest::collection::vec(proptest::collection::vec(batch, 1..4), 2..14)
}

fn to_batch((ops, source): &ModelBatch) -> Batch {
    let ops = ops
        .iter()
        .map(|op| match op {
            ModelOp::Upsert(id, v, p) => Op::Upsert(Point { id: *id, vector: v.clone(), payload: p.then(|| vec![*id as u8; 3]) }),
            ModelOp::Delete(id) => Op::Delete(*id),
            ModelOp::DeleteIfPresent(id) => Op::DeleteIfPresent(*id),
        })
        .collect();
    let batch = Batch { ops, source: None };
    match source {
        Some((a, offset)) => batch.with_source(if *a { "a" } else { "b" }, *offset),
        None => batch,
    }
}

/// Every point of an index, by id.
fn points(index: &Index) -> BTreeMap<u64, StoredPoint> {
    let mut snap = index.snapshot().unwrap();
    (0..IDS).filter_map(|id| snap.get(id).unwrap().map(|p| (id, p))).collect()
}

/// Asserts two indexes hold the same points (vectors bit for bit),
/// offsets and sequence numbers.
fn assert_same(a: &Index, b: &Index, context: &str) {
    let (pa, pb) = (points(a), points(b));
    assert_eq!(pa.keys().collect::<Vec<_>>(), pb.keys().collect::<Vec<_>>(), "{context}: ids");
    for (id, p) in &pa {
        let q = &pb[id];
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&p.vector), bits(&q.vector), "{context}: vector of {id}");
        assert_eq!(p.payload, q.payload, "{context}: payload of {id}");
    }
    assert_eq!(a.offsets().unwrap(), b.offsets().unwrap(), "{context}: offsets");
    let (sa, sb) = (a.stats().unwrap(), b.stats().unwrap());
    assert_eq!((sa.live, sa.last_seq), (sb.live, sb.last_seq), "{context}: live and last_seq");
}

/// A copy of `index`'s last commit, opened in `dir`.
fn copy_of(index: &Index, dir: &std::path::Path, opts: IndexOptions) -> Index {
    let mut image = Vec::new();
    let info = index.copy_to(CopyMode::Plain, &mut image).unwrap();
    std::fs::write(dir.join("data.mdb"), &image).unwrap();
    let copy = Index::open(dir, opts).unwrap();
    assert_eq!(copy.stats().unwrap().last_seq, info.last_seq);
    copy
}

/// Applies a group on the source and checks what it reports against the
/// count of batches that must take a sequence number.
fn apply_group(index: &Index, group: &[ModelBatch], last_seq: &mut u64) {
    let outcomes = index.apply_group(group.iter().map(to_batch).collect()).unwrap();
    for o in &outcomes {
        match o {
            Ok(BatchOutcome::Applied { .. }) => *last_seq += 1,
            Ok(BatchOutcome::Skipped { .. }) | Err(Rejected::Invalid(_)) => {}
            Err(other) => panic!("an unfenced batch was refused: {other}"),
        }
    }
    assert_eq!(index.stats().unwrap().last_seq, *last_seq);
}

/// Catches `copy` up from `source`'s log, reading `read_bytes` at a time
/// and applying `chunk` entries per call; along the way re-applies what it
/// holds (skipped) and tries an entry past a gap (refused, nothing
/// applied).
fn catch_up(source: &Index, copy: &Index, read_bytes: u64, chunk: usize, turn: usize) {
    let mut round = turn;
    loop {
        let from = copy.stats().unwrap().last_seq + 1;
        let read = source.read_log(from, read_bytes).unwrap();
        assert_eq!(read.last_seq, source.stats().unwrap().last_seq);
        if read.entries.is_empty() {
            assert_eq!(from, read.last_seq + 1);
            break;
        }
        let seqs: Vec<u64> = read.entries.iter().map(|e| e.seq).collect();
        assert_eq!(seqs, (from..from + seqs.len() as u64).collect::<Vec<_>>(), "entries are consecutive from {from}");
        for part in read.entries.chunks(chunk.max(1)) {
            round += 1;
            let before = copy.stats().unwrap().last_seq;
            if round.is_multiple_of(3) && part.len() > 1 {
                // Out of order: the first entry left out.
                match copy.apply_log(part[1..].to_vec(), 0) {
                    Err(Error::LogGap { last, seq }) => assert_eq!((last, seq), (before, part[1].seq)),
                    other => panic!("an entry past a gap was accepted: {other:?}"),
                }
                if part.len() > 2 {
                    // A gap after the first: all or none, so not even the
                    // first is applied.
                    let gapped: Vec<LogEntry> = std::iter::once(part[0].clone()).chain(part[2..].iter().cloned()).collect();
                    match copy.apply_log(gapped, 0) {
                        Err(Error::LogGap { last, seq }) => assert_eq!((last, seq), (before + 1, part[2].seq)),
                        other => panic!("a gap was accepted: {other:?}"),
                    }
                }
                assert_eq!(copy.stats().unwrap().last_seq, before, "a refused call applied something");
            }
            let applied = copy.apply_log(part.to_vec(), 0).unwrap();
            assert_eq!((applied.applied, applied.skipped, applied.last_seq), (part.len(), 0, before + part.len() as u64));
            if round.is_multiple_of(2) {
                // Sent again (a retry after a lost answer): all skipped.
                let again = copy.apply_log(part.to_vec(), 0).unwrap();
                assert_eq!((again.applied, again.skipped, again.last_seq), (0, part.len(), applied.last_seq));
            }
        }
    }
}

fn check(metric: Metric, groups: Vec<Vec<ModelBatch>>, copy_at: usize, midway: usize, read_bytes: u64, chunk: usize) {
    let opts = test_options();
    let a = Fixture::with(IndexParams::new(DIM as u32, metric), opts.clone());
    let copy_at = copy_at % (groups.len() + 1);
    let midway = copy_at + midway % (groups.len() + 1 - copy_at);
    let mut last_seq = 0;
    for g in &groups[..copy_at] {
        apply_group(&a.index, g, &mut last_seq);
    }
    let dir = tempfile::tempdir().unwrap();
    let b = copy_of(&a.index, dir.path(), opts.clone());
    assert_same(&a.index, &b, "the copy");
    for g in &groups[copy_at..midway] {
        apply_group(&a.index, g, &mut last_seq);
    }
    // Part of the way, then the source goes on.
    catch_up(&a.index, &b, read_bytes, chunk, 0);
    assert_same(&a.index, &b, "caught up half-way");
    for g in &groups[midway..] {
        apply_group(&a.index, g, &mut last_seq);
    }
    catch_up(&a.index, &b, read_bytes, chunk, 1);
    assert_same(&a.index, &b, "caught up");
    // The copy's log continues the source's: same entries, same numbers.
    let from = a.index.stats().unwrap().batch_log_first_seq.max(b.stats().unwrap().batch_log_first_seq);
    assert_eq!(b.read_log(from, u64::MAX).unwrap().entries, a.index.read_log(from, u64::MAX).unwrap().entries);
    // And the copy survives a restart with all of it.
    drop(b);
    let b = Index::open(dir.path(), opts).unwrap();
    assert_same(&a.index, &b, "reopened");
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]

    #[test]
    fn a_copy_catches_up_from_the_log(
        metric in prop_oneof![Just(Metric::Cosine), Just(Metric::Dot), Just(Metric::Euclidean)],
        groups in groups(),
        copy_at: usize,
        midway: usize,
        read_bytes in prop_oneof![Just(1u64), 1u64..2_000, Just(u64::MAX)],
        chunk in 1usize..6,
    ) {
        check(metric, groups, copy_at, midway, read_bytes, chunk);
    }
}

/// An entry keeps saying what its batch did while later batches replace
/// and delete its points and their slots are vacuumed and reused: the log
/// holds most vectors by reference to the points' slots (`batch_log`), so
/// this is what the references must survive.
fn entries_outlive_their_points(metric: Metric, groups: Vec<Vec<ModelBatch>>, vacuum: Vec<bool>, max_bytes: u64) {
    let retention = BatchLogRetention { max_bytes, min_bytes: 0, ..BatchLogRetention::default() };
    let opts = IndexOptions { batch_log: retention, ..test_options() };
    let a = Fixture::with(IndexParams::new(DIM as u32, metric), opts.clone());
    let mut written: BTreeMap<u64, LogEntry> = BTreeMap::new();
    for (g, group) in groups.iter().enumerate() {
        let before = a.index.stats().unwrap().last_seq;
        a.index.apply_group(group.iter().map(to_batch).collect()).unwrap();
        // Right after its commit an entry reads as its batch left the points
        // (unless the retention took it in the same commit).
        let from = (before + 1).max(a.index.stats().unwrap().batch_log_first_seq);
        for e in a.index.read_log(from, u64::MAX).unwrap().entries {
            written.insert(e.seq, e);
        }
        if vacuum[g % vacuum.len()] {
            a.index.vacuum(usize::MAX).unwrap();
        }
        let s = a.index.stats().unwrap();
        let read = a.index.read_log(s.batch_log_first_seq, u64::MAX).unwrap();
        let held: Vec<&LogEntry> = written.range(s.batch_log_first_seq..).map(|(_, e)| e).collect();
        assert_eq!(read.entries.iter().collect::<Vec<_>>(), held, "after group {g}");
    }
    // The same after a reopen.
    let s = a.index.stats().unwrap();
    let path = a.dir.path().join("shard");
    let Fixture { dir, index } = a;
    drop(index);
    let index = Index::open(&path, opts).unwrap();
    let read = index.read_log(s.batch_log_first_seq, u64::MAX).unwrap();
    assert_eq!(read.entries.iter().collect::<Vec<_>>(), written.range(s.batch_log_first_seq..).map(|(_, e)| e).collect::<Vec<_>>());
    drop(dir);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, ..ProptestConfig::default() })]

    #[test]
    fn entries_read_back_as_written_while_their_points_change(
        metric in prop_oneof![Just(Metric::Cosine), Just(Metric::Euclidean)],
        groups in groups(),
        vacuum in proptest::collection::vec(any::<bool>(), 1..4),
        max_bytes in prop_oneof![Just(u64::MAX), 200u64..4_000],
    ) {
        entries_outlive_their_points(metric, groups, vacuum, max_bytes);
    }
}

/// Every applied batch takes the next number, skipped and invalid ones
/// none; each entry holds what its batch did.
#[test]
fn entries_hold_what_each_batch_did() {
    let f = Fixture::new(2, Metric::Euclidean);
    let up = |id: u64, x: f32| Op::Upsert(Point { id, vector: vec![x, 1.0], payload: None });
    f.index.apply(Batch { ops: vec![up(1, 1.0), up(2, 2.0), up(3, 3.0)], source: None }.with_source("job", 4)).unwrap();
    // Re-sent: skipped, no number.
    f.index.apply(Batch { ops: vec![up(9, 9.0)], source: None }.with_source("job", 4)).unwrap();
    // Invalid: no number.
    assert!(f.index.apply(Batch { ops: vec![up(8, 8.0), Op::Delete(77)], source: None }).is_err());
    // 2 replaced twice, 3 deleted, 5 upserted then deleted, 6 never there.
    let ops = vec![up(2, 20.0), up(2, 21.0), Op::Delete(3), up(5, 5.0), Op::Delete(5), Op::DeleteIfPresent(6)];
    f.index.apply(Batch { ops, source: None }).unwrap();
    // Position only: a number and an entry with no points.
    f.index.apply(Batch::default().with_source("job", 5)).unwrap();
    // Changing nothing still counts.
    f.index.apply(Batch { ops: vec![Op::DeleteIfPresent(40)], source: None }).unwrap();
    let read = f.index.read_log(1, u64::MAX).unwrap();
    assert_eq!((read.first_seq, read.last_seq), (1, 4));
    let point = |id: u64, x: f32| Point { id, vector: vec![x, 1.0], payload: None };
    let job = |offset| Some(shoal_engine::SourceOffset { source: "job".into(), offset });
    assert_eq!(
        read.entries,
        vec![
            LogEntry { seq: 1, source: job(4), points: vec![point(1, 1.0), point(2, 2.0), point(3, 3.0)], deletes: vec![] },
            LogEntry { seq: 2, source: None, points: vec![point(2, 21.0)], deletes: vec![3] },
            LogEntry { seq: 3, source: job(5), points: vec![], deletes: vec![] },
            LogEntry { seq: 4, source: None, points: vec![], deletes: vec![] },
        ]
    );
    let stats = f.index.stats().unwrap();
    assert_eq!((stats.last_seq, stats.batch_log_first_seq, stats.batch_log_entries), (4, 1, 4));
    // Reading from the next number is empty; past it, the copies diverged.
    assert!(f.index.read_log(5, u64::MAX).unwrap().entries.is_empty());
    assert!(matches!(f.index.read_log(6, u64::MAX), Err(Error::LogAhead { from: 6, last: 4 })));
    // A small budget still returns one entry; 0 reads from 1.
    assert_eq!(f.index.read_log(0, 1).unwrap().entries.len(), 1);
}

/// Past the retention the oldest entries go, in the same commits; a copy
/// that fell behind them learns it must be re-seeded.
#[test]
fn retention_trims_the_oldest_and_says_when_a_copy_is_too_far_behind() {
    let mut rng = rng("retention_trims_the_oldest_and_says_when_a_copy_is_too_far_behind");
    let dim = 8;
    let opts = IndexOptions {
        batch_log: BatchLogRetention { max_batches: 5, max_bytes: u64::MAX, ..BatchLogRetention::default() },
        ..test_options()
    };
    let f = Fixture::with(IndexParams::new(dim, Metric::Cosine), opts.clone());
    f.index.apply(random_batch(&mut rng, dim as usize, 0..10)).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let early = copy_of(&f.index, dir.path(), opts.clone());
    for b in 1..20u64 {
        f.index.apply(random_batch(&mut rng, dim as usize, b * 10..b * 10 + 10)).unwrap();
        let s = f.index.stats().unwrap();
        assert_eq!((s.last_seq, s.batch_log_entries, s.batch_log_first_seq), (b + 1, (b + 1).min(5), (b + 1).saturating_sub(4).max(1)));
    }
    match f.index.read_log(2, u64::MAX) {
        Err(e @ Error::LogTruncated { from: 2, first: 16 }) => assert!(e.to_string().contains("re-seed"), "{e}"),
        other => panic!("expected the log to be truncated, got {other:?}"),
    }
    assert_eq!(f.index.read_log(16, u64::MAX).unwrap().entries.len(), 5);
    // The copy taken after batch 1 needs 2, which is gone.
    assert!(matches!(f.index.read_log(early.stats().unwrap().last_seq + 1, 1 << 20), Err(Error::LogTruncated { .. })));

    // By bytes: each entry of 10 points of 8-d is about 480 bytes; the
    // newest always stays, even alone over the limit.
    let opts = IndexOptions {
        batch_log: BatchLogRetention { max_batches: 1000, max_bytes: 1_200, ..BatchLogRetention::default() },
        ..test_options()
    };
    let f = f.reopen(opts.clone());
    f.index.apply(random_batch(&mut rng, dim as usize, 500..510)).unwrap();
    let s = f.index.stats().unwrap();
    assert_eq!((s.last_seq, s.batch_log_entries), (21, 2), "{s:?}");
    assert!(s.batch_log_bytes <= 1_200 && s.batch_log_bytes > 600, "{s:?}");
    f.index.apply(random_batch(&mut rng, dim as usize, 600..700)).unwrap();
    let s = f.index.stats().unwrap();
    assert_eq!((s.last_seq, s.batch_log_entries, s.batch_log_first_seq), (22, 1, 22), "{s:?}");
    assert!(s.batch_log_bytes > 1_200);

    // Off: batches are still numbered, nothing is kept, the old log goes.
    let f = f.reopen(IndexOptions { batch_log: BatchLogRetention::OFF, ..test_options() });
    f.index.apply(random_batch(&mut rng, dim as usize, 700..710)).unwrap();
    let s = f.index.stats().unwrap();
    assert_eq!((s.last_seq, s.batch_log_entries, s.batch_log_first_seq, s.batch_log_bytes), (23, 0, 24, 0));
    assert!(matches!(f.index.read_log(23, u64::MAX), Err(Error::LogTruncated { from: 23, first: 24 })));
    assert!(f.index.read_log(24, u64::MAX).unwrap().entries.is_empty());
    // On again: the log starts at the next batch.
    let f = f.reopen(opts);
    f.index.apply(random_batch(&mut rng, dim as usize, 800..810)).unwrap();
    let read = f.index.read_log(24, u64::MAX).unwrap();
    assert_eq!((read.first_seq, read.last_seq, read.entries.len()), (24, 24, 1));
}

/// The log holds at most `max_share` times what the shard's own points
/// take in it, never cut below `min_bytes`: a shard rewriting the same
/// points keeps only its newest batches, and one that grows keeps more.
#[test]
fn retention_follows_the_size_of_the_shard() {
    let mut rng = rng("retention_follows_the_size_of_the_shard");
    let dim = 8u32;
    let retention = BatchLogRetention { max_batches: 1000, max_bytes: u64::MAX, max_share: 2.0, min_bytes: 0 };
    let limit = |live: u64| retention.byte_limit(live, dim as usize);
    assert_eq!(limit(10), 2 * 10 * (12 + 4 * 8));
    let f = Fixture::with(IndexParams::new(dim, Metric::Cosine), IndexOptions { batch_log: retention, ..test_options() });
    // The same 10 points, 20 times: each entry (~480 bytes) is about half
    // the limit of a 10-point shard (880 bytes).
    for _ in 0..20 {
        f.index.apply(random_batch(&mut rng, dim as usize, 0..10)).unwrap();
        let s = f.index.stats().unwrap();
        assert!(s.batch_log_bytes <= limit(s.live) || s.batch_log_entries == 1, "{s:?}");
    }
    let s = f.index.stats().unwrap();
    assert_eq!((s.live, s.last_seq), (10, 20));
    assert!((1..=2).contains(&s.batch_log_entries), "{s:?}");
    // Growing: 30 batches of 10 new points each; the limit grows faster
    // than the log, so nothing more goes.
    let kept = s.batch_log_entries;
    for b in 1..=30u64 {
        f.index.apply(random_batch(&mut rng, dim as usize, b * 10..b * 10 + 10)).unwrap();
    }
    let s = f.index.stats().unwrap();
    assert_eq!(s.live, 310);
    assert_eq!(s.batch_log_entries, kept + 30, "{s:?}");
    assert!(s.batch_log_bytes <= limit(s.live), "{s:?}");
    // Whatever is kept reads back whole, from the first retained number.
    let read = f.index.read_log(s.batch_log_first_seq, u64::MAX).unwrap();
    assert_eq!(read.entries.len() as u64, s.batch_log_entries);

    // The floor: 20 rewrites of 10 points fit in 20,000 bytes: each is
    // an entry (454 bytes) and the 10 old vectors it replaced, which the
    // log keeps for the entries before it (48 bytes each).
    let floor = BatchLogRetention { min_bytes: 20_000, ..retention };
    let f = Fixture::with(IndexParams::new(dim, Metric::Cosine), IndexOptions { batch_log: floor, ..test_options() });
    for _ in 0..20 {
        f.index.apply(random_batch(&mut rng, dim as usize, 0..10)).unwrap();
    }
    let s = f.index.stats().unwrap();
    assert_eq!(s.batch_log_entries, 20, "{s:?}");
    assert_eq!(s.batch_log_bytes, 454 + 19 * (454 + 10 * 48), "{s:?}");
}

/// A copy applies entries of the source's log with the source's numbers:
/// later, its own log serves a third copy.
#[test]
fn a_caught_up_copy_serves_its_own_log() {
    let mut rng = rng("a_caught_up_copy_serves_its_own_log");
    let dim = 8usize;
    let a = Fixture::new(dim as u32, Metric::Dot);
    let (db, dc) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let b = copy_of(&a.index, db.path(), test_options());
    let c = copy_of(&a.index, dc.path(), test_options());
    for i in 0..6u64 {
        a.index.apply(random_batch(&mut rng, dim, i * 20..i * 20 + 25).with_source("job", i)).unwrap();
    }
    b.apply_log(a.index.read_log(1, u64::MAX).unwrap().entries, 0).unwrap();
    c.apply_log(b.read_log(1, u64::MAX).unwrap().entries, 0).unwrap();
    assert_eq!(c.stats().unwrap().last_seq, 6);
    assert_eq!(c.offsets().unwrap(), a.index.offsets().unwrap());
    assert_eq!(c.stats().unwrap().live, a.index.stats().unwrap().live);
}
