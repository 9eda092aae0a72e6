//! Copying an index out (the primitive snapshots are built on).

use std::sync::atomic::{AtomicBool, Ordering};

use shoal_engine::{CopyMode, Index, Metric, SearchParams};

use crate::common::{Fixture, random_batch, random_vector, rng, test_options};

/// Copies taken while a writer keeps committing are each exactly one
/// commit: opened, they hold the counts and offsets the copy reported, and
/// answer searches like the source did at that commit.
#[test]
fn copies_under_ingest_are_one_commit_each() {
    let mut rng = rng("copies_under_ingest_are_one_commit_each");
    let dim = 16;
    let f = Fixture::new(dim as u32, Metric::Cosine);
    f.index.apply(random_batch(&mut rng, dim, 0..300).with_source("job", 0)).unwrap();
    let queries: Vec<Vec<f32>> = (0..20).map(|_| random_vector(&mut rng, dim)).collect();
    let stop = AtomicBool::new(false);
    let batches: Vec<_> = (1..200u64).map(|b| random_batch(&mut rng, dim, 250 + b * 50..300 + b * 50).with_source("job", b)).collect();
    std::thread::scope(|s| {
        let writer = s.spawn(|| {
            let mut applied = 0;
            for b in batches {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                f.index.apply(b).unwrap();
                applied += 1;
            }
            applied
        });
        for (round, mode) in [CopyMode::Plain, CopyMode::Compact, CopyMode::Plain, CopyMode::Compact].into_iter().enumerate() {
            let mut image = Vec::new();
            let info = f.index.copy_to(mode, &mut image).unwrap();
            assert_eq!(info.bytes, image.len() as u64);
            let offset = info.offsets.iter().find(|(s, _)| s == "job").map(|(_, o)| *o).unwrap();
            // Offset b means batches 0..=b are in: 300 + 50·b points.
            assert_eq!(info.live, 300 + 50 * offset, "round {round} ({mode:?}): {info:?}");
            let dir = tempfile::tempdir().unwrap();
            std::fs::write(dir.path().join("data.mdb"), &image).unwrap();
            let copy = Index::open(dir.path(), test_options()).unwrap();
            assert_eq!(copy.stats().unwrap().live, info.live);
            assert_eq!(copy.offsets().unwrap(), info.offsets);
            assert_eq!(copy.params(), f.index.params());
            for q in &queries {
                let hits = copy.search(q, SearchParams::new(5, 400)).unwrap();
                assert!(hits.iter().all(|h| h.id < 300 + 50 * offset), "a point after the copied commit");
            }
        }
        stop.store(true, Ordering::Relaxed);
        assert!(writer.join().unwrap() > 0);
    });
    // Quiet now: a copy equals the source, search for search.
    let mut image = Vec::new();
    f.index.copy_to(CopyMode::Compact, &mut image).unwrap();
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("data.mdb"), &image).unwrap();
    let copy = Index::open(dir.path(), test_options()).unwrap();
    for q in &queries {
        let p = SearchParams::new(10, 64);
        assert_eq!(copy.search(q, p).unwrap(), f.index.search(q, p).unwrap());
    }
}

/// A sink that fails stops the copy with an I/O error; the index goes on.
#[test]
fn a_failing_sink_stops_the_copy() {
    struct Broken(usize);
    impl std::io::Write for Broken {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            if self.0 == 0 {
                return Err(std::io::Error::other("sink broke"));
            }
            self.0 -= 1;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut rng = rng("a_failing_sink_stops_the_copy");
    let f = Fixture::new(64, Metric::Euclidean);
    f.index.apply(random_batch(&mut rng, 64, 0..3000)).unwrap();
    let err = f.index.copy_to(CopyMode::Plain, &mut Broken(1)).unwrap_err();
    assert!(err.to_string().contains("sink broke"), "{err}");
    f.index.apply(random_batch(&mut rng, 64, 3000..3100)).unwrap();
    assert_eq!(f.index.stats().unwrap().live, 3100);
    let mut image = Vec::new();
    let info = f.index.copy_to(CopyMode::Plain, &mut image).unwrap();
    assert_eq!(info.live, 3100);
    assert!(info.bytes <= f.index.used_bytes().unwrap());
}
