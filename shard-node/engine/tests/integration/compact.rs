//! Compaction: the free pages of a churned file go back to the disk while
//! searches and batches go on, every point stays, and a compaction killed
//! at any moment leaves the index whole.

use std::collections::BTreeMap;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use rand::Rng;
use rand::rngs::StdRng;
use shoal_engine::{Batch, Index, IndexOptions, IndexParams, Metric, Op, Point, SearchParams};

use crate::common::{Fixture, random_vector, rng, spawn_child, test_options};

const DIM: usize = 16;

fn upserts(points: &BTreeMap<u64, Vec<f32>>) -> Batch {
    Batch {
        ops: points.iter().map(|(&id, v)| Op::Upsert(Point { id, vector: v.clone(), payload: Some(id.to_le_bytes().to_vec()) })).collect(),
        source: None,
    }
}

/// 3,000 points, then rounds that replace a third of them with new
/// vectors and delete and add a few: every round's commit frees the pages
/// it rewrote, and the file keeps them.
fn churned(rng: &mut StdRng, rounds: usize) -> (Fixture, BTreeMap<u64, Vec<f32>>) {
    let fx = Fixture::with(IndexParams::new(DIM as u32, Metric::Cosine), test_options());
    let mut points: BTreeMap<u64, Vec<f32>> = (0..3000).map(|id| (id, random_vector(rng, DIM))).collect();
    fx.index.apply(upserts(&points)).unwrap();
    let mut next = 3000;
    for _ in 0..rounds {
        let mut ops = Vec::new();
        let ids: Vec<u64> = points.keys().copied().collect();
        for &id in &ids {
            match rng.random_range(0..10) {
                0..3 => {
                    let v = random_vector(rng, DIM);
                    ops.push(Op::Upsert(Point { id, vector: v.clone(), payload: None }));
                    points.insert(id, v);
                }
                3 => {
                    ops.push(Op::Delete(id));
                    points.remove(&id);
                }
                _ => {}
            }
        }
        for _ in 0..100 {
            let v = random_vector(rng, DIM);
            ops.push(Op::Upsert(Point { id: next, vector: v.clone(), payload: None }));
            points.insert(next, v);
            next += 1;
        }
        fx.index.apply(Batch { ops, source: None }).unwrap();
        while fx.index.vacuum(500).unwrap().vacuumed > 0 {}
    }
    (fx, points)
}

/// Every point of `points` is in `index` with its vector, and nothing else.
fn assert_holds(index: &Index, points: &BTreeMap<u64, Vec<f32>>, context: &str) {
    assert_eq!(index.stats().unwrap().live, points.len() as u64, "{context}: live points");
    for (&id, v) in points {
        let got = index.get(id).unwrap().unwrap_or_else(|| panic!("{context}: point {id} is missing"));
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        for (a, b) in got.vector.iter().zip(v) {
            assert!((a - b / norm).abs() < 1e-5, "{context}: point {id} has another vector");
        }
    }
}

#[test]
fn compaction_gives_free_pages_back_and_keeps_every_point() {
    let mut rng = rng("compaction_gives_free_pages_back_and_keeps_every_point");
    let (fx, mut points) = churned(&mut rng, 6);
    let queries: Vec<Vec<f32>> = (0..30).map(|_| random_vector(&mut rng, DIM)).collect();
    let answers = |index: &Index| -> Vec<Vec<u64>> {
        queries.iter().map(|q| index.search(q, SearchParams::new(10, 64)).unwrap().iter().map(|h| h.id).collect()).collect()
    };
    let before = fx.index.stats().unwrap();
    let digest = fx.index.snapshot().unwrap().digest().unwrap();
    let found = answers(&fx.index);
    let free = fx.index.free_bytes().unwrap();
    assert!(free * 5 > before.disk_bytes, "the churn should leave a fifth of the file free: {free} of {}", before.disk_bytes);

    let o = fx.index.compact().unwrap();
    assert_eq!(o.bytes_before, before.disk_bytes);
    assert!(o.bytes_after + free / 2 < o.bytes_before, "{o:?} with {free} bytes free before");
    let after = fx.index.stats().unwrap();
    assert_eq!(after.disk_bytes, o.bytes_after);
    assert!(fx.index.free_bytes().unwrap() <= 16 * 4096, "free pages left: {}", fx.index.free_bytes().unwrap());
    // The tables and the free pages account for the whole file (two meta
    // pages aside), and every table the points live in holds pages.
    let tables: u64 = after.table_bytes.iter().map(|(_, b)| b).sum();
    assert_eq!(tables + after.free_bytes + 2 * 4096, after.disk_bytes, "{:?}", after.table_bytes);
    for name in ["vectors", "codes", "links0", "nodes", "external", "payloads", "batch_log"] {
        assert!(after.table_bytes.iter().any(|(t, b)| *t == name && *b > 0), "{name}: {:?}", after.table_bytes);
    }
    assert_eq!((after.live, after.tombstones, after.last_seq), (before.live, before.tombstones, before.last_seq));
    assert_eq!(fx.index.snapshot().unwrap().digest().unwrap(), digest, "the same points, vectors and payloads");
    assert_eq!(answers(&fx.index), found, "the same answers");
    assert!(!fx.dir.path().join("shard/.compact").exists(), "the staging copy is gone");

    // The compacted file takes batches and vacuums as before.
    let more: BTreeMap<u64, Vec<f32>> = (100_000..100_500).map(|id| (id, random_vector(&mut rng, DIM))).collect();
    fx.index.apply(upserts(&more)).unwrap();
    let gone: Vec<u64> = points.keys().copied().take(200).collect();
    fx.index.apply(Batch { ops: gone.iter().map(|&id| Op::Delete(id)).collect(), source: None }).unwrap();
    points.extend(more);
    for id in gone {
        points.remove(&id);
    }
    while fx.index.vacuum(500).unwrap().vacuumed > 0 {}
    assert_holds(&fx.index, &points, "after the compaction");
    let digest = fx.index.snapshot().unwrap().digest().unwrap();
    let fx = fx.reopen(test_options());
    assert_eq!(fx.index.snapshot().unwrap().digest().unwrap(), digest, "reopened");
}

/// The writer keeps the addresses of link blocks from batch to batch; a
/// compaction moves every page, so the batches after it must not use them
/// (debug builds check each kept address against the B-tree).
#[test]
fn batches_after_a_compaction_read_the_new_file() {
    let mut rng = rng("batches_after_a_compaction_read_the_new_file");
    // Lists of existing nodes go to the link log and no fold comes, so
    // most blocks stay as the first batches wrote them, addresses kept.
    let opts = IndexOptions { link_log: shoal_engine::LinkLog::Always { fold_lists: 1 << 20 }, ..test_options() };
    let fx = Fixture::with(IndexParams::new(DIM as u32, Metric::Cosine), opts.clone());
    let mut points = BTreeMap::new();
    for batch in 0..4u64 {
        let more: BTreeMap<u64, Vec<f32>> = (batch * 800..(batch + 1) * 800).map(|id| (id, random_vector(&mut rng, DIM))).collect();
        fx.index.apply(upserts(&more)).unwrap();
        points.extend(more);
    }
    fx.index.compact().unwrap();
    for batch in 4..6u64 {
        let more: BTreeMap<u64, Vec<f32>> = (batch * 800..(batch + 1) * 800).map(|id| (id, random_vector(&mut rng, DIM))).collect();
        fx.index.apply(upserts(&more)).unwrap();
        points.extend(more);
    }
    assert_holds(&fx.index, &points, "after the compaction");
    // Each point finds itself: its links, and its neighbours', were read
    // from the file as it is.
    let found =
        points.iter().filter(|(id, v)| fx.index.search(v, SearchParams::new(1, 32)).unwrap().first().map(|h| h.id) == Some(**id)).count();
    assert!(found * 100 >= points.len() * 99, "{found} of {} points find themselves", points.len());
    let digest = fx.index.snapshot().unwrap().digest().unwrap();
    let fx = fx.reopen(opts);
    assert_eq!(fx.index.snapshot().unwrap().digest().unwrap(), digest, "reopened");
}

#[test]
fn compact_due_follows_the_free_share_and_the_minimum_size() {
    let mut rng = rng("compact_due_follows_the_free_share_and_the_minimum_size");
    let (Fixture { dir, index }, _) = churned(&mut rng, 4);
    let file = index.stats().unwrap().disk_bytes;
    let share = index.free_bytes().unwrap() as f64 / file as f64;
    assert!(share > 0.1, "free share {share}");
    drop(index);
    let path = dir.path().join("shard");
    let due = |compact_free_ratio: f64, compact_min_bytes: u64| {
        let index = Index::open(&path, IndexOptions { compact_free_ratio, compact_min_bytes, ..test_options() }).unwrap();
        index.compact_due().unwrap()
    };
    assert!(due(share * 0.9, 0));
    assert!(!due(share * 1.1, 0), "below the ratio");
    assert!(!due(share * 0.9, file + 1), "below the minimum size");
    assert!(!due(0.0, 0), "ratio 0: never");
}

#[test]
fn searches_and_batches_go_on_while_it_compacts() {
    let mut rng = rng("searches_and_batches_go_on_while_it_compacts");
    let (fx, mut points) = churned(&mut rng, 3);
    let queries: Vec<Vec<f32>> = (0..20).map(|_| random_vector(&mut rng, DIM)).collect();
    let batches: Vec<BTreeMap<u64, Vec<f32>>> =
        (0..20u64).map(|b| (200_000 + b * 100..200_000 + (b + 1) * 100).map(|id| (id, random_vector(&mut rng, DIM))).collect()).collect();
    let done = AtomicBool::new(false);
    let mut compactions = 0;
    std::thread::scope(|s| {
        let searchers: Vec<_> = (0..2)
            .map(|_| {
                s.spawn(|| {
                    let mut n = 0u64;
                    while !done.load(Ordering::Relaxed) {
                        for q in &queries {
                            let hits = fx.index.search(q, SearchParams::new(10, 32)).expect("a search during compactions");
                            assert_eq!(hits.len(), 10);
                            n += 1;
                        }
                    }
                    n
                })
            })
            .collect();
        let writer = s.spawn(|| {
            for b in &batches {
                fx.index.apply(upserts(b)).expect("a batch during compactions");
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        while !writer.is_finished() || compactions < 3 {
            fx.index.compact().expect("a compaction under load");
            compactions += 1;
        }
        writer.join().unwrap();
        done.store(true, Ordering::Relaxed);
        for h in searchers {
            assert!(h.join().unwrap() > 0);
        }
    });
    for b in batches {
        points.extend(b);
    }
    assert_holds(&fx.index, &points, &format!("after {compactions} compactions under load"));
}

const CHILD: &str = "SHOAL_TEST_COMPACT_CHILD";
const NAME: &str = "compact::a_compaction_killed_at_any_moment_leaves_the_index_whole";

/// The child: batch, compaction, batch, compaction... until killed, saying
/// after each step how far it got.
fn compact_until_killed(dir: &Path) {
    let index = Index::open(dir, IndexOptions { durable: true, ..test_options() }).expect("the child opens the index");
    let mut rng = rng("compact_until_killed");
    for b in 0u64.. {
        let points: BTreeMap<u64, Vec<f32>> = (b * 50..(b + 1) * 50).map(|id| (1_000_000 + id, random_vector(&mut rng, DIM))).collect();
        index.apply(upserts(&points)).expect("batch");
        println!("applied {b}");
        index.compact().expect("compaction");
        println!("compacted {b}");
    }
}

#[test]
fn a_compaction_killed_at_any_moment_leaves_the_index_whole() {
    if let Ok(dir) = std::env::var(CHILD) {
        compact_until_killed(Path::new(&dir));
        return;
    }
    let mut rng = rng("a_compaction_killed_at_any_moment_leaves_the_index_whole");
    let (fx, points) = churned(&mut rng, 3);
    let Fixture { dir: tmp, index } = fx;
    drop(index);
    let dir = tmp.path().join("shard");
    let mut prev_extra = 0;
    for round in 0..4 {
        let (mut child, mut lines) = spawn_child(NAME, CHILD, &dir);
        let (t0, mut applied) = (Instant::now(), None);
        // Killed (SIGKILL) a random time after its second compaction: in a
        // batch, a copy or a swap.
        let mut compacted = 0;
        while compacted < 2 {
            let line = lines.next().expect("the child stopped talking").unwrap();
            if let Some(b) = line.strip_prefix("applied ") {
                applied = Some(b.parse::<u64>().unwrap());
            } else if line.starts_with("compacted ") {
                compacted += 1;
            }
            assert!(t0.elapsed() < Duration::from_secs(120), "the child is too slow");
        }
        std::thread::sleep(Duration::from_micros(rng.random_range(0..30_000)));
        child.kill().unwrap();
        child.wait().unwrap();
        // What it said before it died is still in the pipe: a small index
        // compacts in a few milliseconds, so it may have gone on for more
        // than one batch while this process slept.
        for line in lines.map_while(Result::ok) {
            if let Some(b) = line.strip_prefix("applied ") {
                applied = Some(b.parse::<u64>().unwrap());
            }
        }
        let index = Index::open(&dir, test_options()).expect("the index opens after the kill");
        assert!(!dir.join(".compact").exists(), "round {round}: the staging copy is removed at open");
        // Each child writes the same batches from the first: the batches it
        // reported are there, at most one more, and none an earlier child
        // wrote went missing.
        let reported = applied.unwrap() + 1;
        let extra = index.stats().unwrap().live - points.len() as u64;
        assert!(
            extra.is_multiple_of(50) && extra >= prev_extra.max(reported * 50) && extra <= prev_extra.max((reported + 1) * 50),
            "round {round}: {extra} points past the churn, {reported} batches reported, {prev_extra} before"
        );
        prev_extra = extra;
        let mut want = points.clone();
        want.extend((0..extra).map(|i| (1_000_000 + i, index.get(1_000_000 + i).unwrap().expect("a batch point").vector)));
        assert_holds(&index, &want, &format!("round {round}"));
        drop(index);
    }
    drop(tmp);
}

#[test]
fn a_staging_copy_left_behind_is_removed_at_open() {
    let fx = Fixture::new(DIM as u32, Metric::Cosine);
    let mut rng = rng("a_staging_copy_left_behind_is_removed_at_open");
    let points: BTreeMap<u64, Vec<f32>> = (0..100).map(|id| (id, random_vector(&mut rng, DIM))).collect();
    fx.index.apply(upserts(&points)).unwrap();
    let staging = fx.dir.path().join("shard/.compact");
    std::fs::create_dir(&staging).unwrap();
    std::fs::write(staging.join("data.mdb"), b"half a copy").unwrap();
    let fx = fx.reopen(test_options());
    assert!(!staging.exists());
    assert_holds(&fx.index, &points, "reopened");
}

/// A snapshot's copy holds a read transaction for its whole length: a
/// compaction asked for meanwhile gives up at once with `CompactBlocked`
/// (it would otherwise hold the writer lock, and batches, for up to
/// `resize_wait`), the copy completes, and the next compaction runs.
#[test]
fn a_compaction_gives_way_to_a_copy_in_progress() {
    let mut rng = rng("a_compaction_gives_way_to_a_copy_in_progress");
    let (fx, points) = churned(&mut rng, 3);
    let Fixture { dir, index } = fx;
    drop(index);
    let opts = IndexOptions { resize_wait: Duration::from_secs(120), ..test_options() };
    let index = Index::open(dir.path().join("shard"), opts).unwrap();
    /// A sink that takes its time, and says when the first bytes came.
    struct Slow<'a>(&'a AtomicBool);
    impl std::io::Write for Slow<'_> {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0.store(true, Ordering::Release);
            std::thread::sleep(Duration::from_millis(20));
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let started = AtomicBool::new(false);
    std::thread::scope(|s| {
        let copy = s.spawn(|| index.copy_to(shoal_engine::CopyMode::Plain, &mut Slow(&started)));
        while !started.load(Ordering::Acquire) {
            std::thread::sleep(Duration::from_millis(1));
        }
        assert!(!index.compact_due().unwrap(), "not due while a copy streams");
        let t = Instant::now();
        let err = index.compact().unwrap_err();
        assert!(matches!(err, shoal_engine::Error::CompactBlocked { .. }), "{err}");
        assert!(t.elapsed() < Duration::from_secs(30), "it waited {:?} instead of giving way", t.elapsed());
        let info = copy.join().unwrap().expect("the copy completes");
        assert_eq!(info.live, points.len() as u64);
    });
    index.compact().expect("a compaction once the copy is done");
    assert_holds(&index, &points, "after the copy and the compaction");
}
