//! A snapshot taken while a writer keeps committing is exactly one commit:
//! restored, it has the ids, vectors and search results the source had at
//! the commit its manifest names.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use shoal_engine::{Hit, Index, SearchParams};
use shoal_snapshot::*;

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_under_ingest_is_the_state_of_one_commit() {
    let mut rng = rng("a_snapshot_under_ingest_is_the_state_of_one_commit");
    let dim = 16;
    let queries: Vec<Vec<f32>> = (0..10).map(|_| vector(&mut rng, dim)).collect();
    for b in backends("a_snapshot_under_ingest_is_the_state_of_one_commit") {
        let dir = tempfile::tempdir().unwrap();
        let index = index_with(&mut rng, dir.path(), dim, 2000);
        // Batch b (offset 10 + b) upserts 100 new points and replaces 10 old ones.
        let batches: Vec<_> = (0..400u64)
            .map(|b| {
                let (mut batch, mut points) = batch(&mut rng, dim, 10_000 + b * 100..10_100 + b * 100, 10 + b);
                let (replace, replaced) = crate::common::batch(&mut rng, dim, b * 5..b * 5 + 10, 0);
                batch.ops.extend(replace.ops);
                points.extend(replaced);
                (batch, points)
            })
            .collect();
        // What the source answered after each commit, recorded by the only
        // writer right after it committed.
        let stop = Arc::new(AtomicBool::new(false));
        let committed = Arc::new(AtomicU64::new(0));
        let writer = {
            let (index, stop, committed, queries) = (Arc::clone(&index), Arc::clone(&stop), Arc::clone(&committed), queries.clone());
            std::thread::spawn(move || {
                let mut seen: BTreeMap<u64, Vec<Vec<Hit>>> = BTreeMap::new();
                let mut written = Vec::new();
                for (batch, points) in batches {
                    if stop.load(Ordering::Relaxed) {
                        break;
                    }
                    let offset = batch.source.as_ref().unwrap().offset;
                    index.apply(batch).unwrap();
                    written.push((offset, points));
                    seen.insert(offset, queries.iter().map(|q| index.search(q, SearchParams::new(10, 80)).unwrap()).collect());
                    committed.fetch_add(1, Ordering::Relaxed);
                }
                (seen, written)
            })
        };
        while committed.load(Ordering::Relaxed) < 3 {
            tokio::time::sleep(std::time::Duration::from_millis(5)).await;
        }
        let target = SnapshotTarget { collection: "docs".into(), shard: 0, shard_count: 1, id: None };
        let m = create_snapshot(&b.store, Arc::clone(&index), &target, &small_chunks(), progress(Operation::Snapshot)).await.unwrap();
        let after = committed.load(Ordering::Relaxed);
        stop.store(true, Ordering::Relaxed);
        let (seen, written) = writer.join().unwrap();
        let offset = m.offset_pairs()[0].1;
        eprintln!("{}: snapshot at offset {offset}; the writer had committed {after} batches when it finished", b.name);
        assert!(offset >= 12, "the snapshot began after 3 commits");

        let dest = tempfile::tempdir().unwrap();
        let staging = dest.path().join("s");
        let src = RestoreSource { collection: "docs".into(), shard: 0, id: m.id.clone() };
        restore_to_staging(&b.store, &src, &staging, &restore_options(), progress(Operation::Restore)).await.unwrap();
        let copy = Index::open(&staging, engine_options()).unwrap();
        let batches_in = offset - 9;
        assert_eq!(copy.stats().unwrap().live, 2000 + 100 * batches_in, "{}", b.name);
        assert_eq!(m.points, 2000 + 100 * batches_in);
        // Same vectors for every id the batches up to the commit wrote (the
        // last write wins), and for the first points no batch replaced.
        let mut truth: BTreeMap<u64, Vec<f32>> = BTreeMap::new();
        for (_, points) in written.iter().filter(|(o, _)| *o <= offset) {
            truth.extend(points.iter().cloned());
        }
        for (id, v) in &truth {
            assert_eq!(&copy.get(*id).unwrap().unwrap().vector, v, "{}: id {id}", b.name);
        }
        for id in (written.len() as u64 * 5 + 10)..2000 {
            assert_eq!(copy.get(id).unwrap().unwrap().vector, index.get(id).unwrap().unwrap().vector);
        }
        assert!(copy.get(10_000 + batches_in * 100).unwrap().is_none(), "a point of a later batch");
        for (q, want) in queries.iter().zip(&seen[&offset]) {
            assert_eq!(&copy.search(q, SearchParams::new(10, 80)).unwrap(), want, "{}", b.name);
        }
    }
}
