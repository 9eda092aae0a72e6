//! A second snapshot uploads only the chunks that changed.

use std::sync::Arc;

use shoal_snapshot::*;

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_second_snapshot_uploads_only_what_changed() {
    let mut rng = rng("a_second_snapshot_uploads_only_what_changed");
    for b in backends("a_second_snapshot_uploads_only_what_changed") {
        let dir = tempfile::tempdir().unwrap();
        let index = index_with(&mut rng, dir.path(), 32, 4000);
        let target = SnapshotTarget { collection: "docs".into(), shard: 0, shard_count: 1, id: None };
        let opts = small_chunks();
        let snap = || create_snapshot(&b.store, Arc::clone(&index), &target, &opts, progress(Operation::Snapshot));
        let first = snap().await.unwrap();
        assert_eq!(first.uploaded_chunks as usize, distinct(&first), "{}: a first snapshot uploads every distinct chunk", b.name);

        // Nothing committed since: the same image, nothing to upload.
        let same = snap().await.unwrap();
        assert_eq!((same.uploaded_chunks, same.uploaded_bytes), (0, 0), "{}", b.name);
        assert_eq!(same.chunks, first.chunks);

        // A small ingest (20 points into 4,000) changes a few regions.
        index.apply(batch(&mut rng, 32, 50_000..50_020, 1000).0).unwrap();
        let second = snap().await.unwrap();
        let total = second.chunks.len();
        eprintln!(
            "{}: after 20 of 4,000 points: {} of {total} chunks uploaded ({} of {} stored bytes)",
            b.name, second.uploaded_chunks, second.uploaded_bytes, second.stored_bytes
        );
        assert!(second.uploaded_chunks > 0);
        assert!((second.uploaded_chunks as usize) * 2 < total, "{}: {} of {total} chunks uploaded", b.name, second.uploaded_chunks);
        assert_eq!(second.points, 4020);
    }
}

fn distinct(m: &Manifest) -> usize {
    m.chunks.iter().map(|c| &c.hash).collect::<std::collections::HashSet<_>>().len()
}
