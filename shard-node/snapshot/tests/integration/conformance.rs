//! What every backend must do: round trips, listing, large objects,
//! retention.

use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use rand::RngCore;
use shoal_engine::{Index, SearchParams};
use shoal_snapshot::*;

use crate::common::*;

fn target(id: Option<&str>) -> SnapshotTarget {
    SnapshotTarget { collection: "docs".into(), shard: 2, shard_count: 3, id: id.map(Into::into) }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_restores_to_an_identical_index() {
    let mut rng = rng("a_snapshot_restores_to_an_identical_index");
    let src_dir = tempfile::tempdir().unwrap();
    let source = index_with(&mut rng, src_dir.path(), 16, 3000);
    let queries: Vec<Vec<f32>> = (0..20).map(|_| vector(&mut rng, 16)).collect();
    for b in backends("a_snapshot_restores_to_an_identical_index") {
        // Tiny thresholds so multipart uploads and ranged reads both run.
        let mut opts = small_chunks();
        opts.transfer.multipart_threshold = 16 << 10;
        let sp = progress(Operation::Snapshot);
        let m = create_snapshot(&b.store, Arc::clone(&source), &target(None), &opts, Arc::clone(&sp)).await.unwrap();
        assert_eq!((m.points, m.shard, m.shard_count), (3000, 2, 3), "{}", b.name);
        assert_eq!(m.offset_pairs(), vec![("job".to_string(), 5)]);
        assert_eq!(m.image_bytes, source.used_bytes().unwrap());
        assert!(m.chunks.len() > 10, "{}: {} chunks", b.name, m.chunks.len());
        let r = sp.report();
        assert_eq!((r.phase, r.bytes_done, r.chunks_done), (Phase::Done, m.image_bytes, m.chunks.len() as u64));

        let listed = list_snapshots(&b.store, "docs", None).await.unwrap();
        assert_eq!(listed.len(), 1);
        assert_eq!(listed[0].manifest.as_ref().unwrap(), &m);
        assert!(list_snapshots(&b.store, "docs", Some(1)).await.unwrap().is_empty());

        for direct in [true, false] {
            let dest = tempfile::tempdir().unwrap();
            let staging = dest.path().join(".staging");
            let mut ropts = restore_options();
            // Direct writes, then through the page cache.
            ropts.direct_io = direct;
            ropts.transfer.range_threshold = 8 << 10;
            ropts.transfer.range_size = 16 << 10;
            let src = RestoreSource { collection: "docs".into(), shard: 2, id: m.id.clone() };
            let rp = progress(Operation::Restore);
            let restored = restore_to_staging(&b.store, &src, &staging, &ropts, Arc::clone(&rp)).await.unwrap();
            assert_eq!(restored, m);
            assert_eq!(rp.report().bytes_done, m.image_bytes);
            let final_dir = dest.path().join("2");
            swap_into_place(&staging, &final_dir).unwrap();
            assert!(!staging.exists());
            let copy = Index::open(&final_dir, engine_options()).unwrap();
            assert_eq!(copy.stats().unwrap().live, 3000);
            assert_eq!(copy.offsets().unwrap(), source.offsets().unwrap());
            for id in (0..3000).step_by(7) {
                assert_eq!(copy.get(id).unwrap().unwrap().vector, source.get(id).unwrap().unwrap().vector);
            }
            for q in &queries {
                let p = SearchParams::new(10, 64);
                assert_eq!(copy.search(q, p).unwrap(), source.search(q, p).unwrap(), "{}", b.name);
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ids_are_checked_and_never_reused() {
    let mut rng = rng("ids_are_checked_and_never_reused");
    let dir = tempfile::tempdir().unwrap();
    let index = index_with(&mut rng, dir.path(), 8, 200);
    for b in backends("ids_are_checked_and_never_reused") {
        let p = || progress(Operation::Snapshot);
        create_snapshot(&b.store, Arc::clone(&index), &target(Some("first")), &small_chunks(), p()).await.unwrap();
        let again = create_snapshot(&b.store, Arc::clone(&index), &target(Some("first")), &small_chunks(), p()).await;
        assert!(matches!(again, Err(SnapshotError::AlreadyExists { .. })), "{}: {again:?}", b.name);
        for bad in ["../x", "a/b", ""] {
            let r = create_snapshot(&b.store, Arc::clone(&index), &target(Some(bad)), &small_chunks(), p()).await;
            assert!(matches!(r, Err(SnapshotError::Invalid(_))), "{bad:?}: {r:?}");
        }
        let level = SnapshotOptions { zstd_level: 0, ..small_chunks() };
        let r = create_snapshot(&b.store, Arc::clone(&index), &target(None), &level, p()).await;
        assert!(matches!(r, Err(SnapshotError::Invalid(_))), "{r:?}");
        // Nothing half-made is listed.
        assert_eq!(list_snapshots(&b.store, "docs", None).await.unwrap().len(), 1);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_objects_go_up_in_parts_and_come_down_in_ranges() {
    let mut rng = rng("large_objects_go_up_in_parts_and_come_down_in_ranges");
    let mut data = vec![0u8; 11 << 20];
    rng.fill_bytes(&mut data);
    let data = Bytes::from(data);
    let t = TransferOptions { multipart_threshold: 6 << 20, part_size: 5 << 20, range_threshold: 1 << 20, range_size: 3 << 20 };
    for b in backends("large_objects_go_up_in_parts_and_come_down_in_ranges") {
        let objects = object_store(&b.store);
        let key = object_store::path::Path::from("blob/one");
        put_object(objects, &key, data.clone(), &t).await.unwrap();
        let got = get_object(objects, &key, data.len() as u64, &t).await.unwrap();
        assert!(got.as_ref().is_some_and(|g| g.as_ref().is_ok_and(|g| *g == data)), "{}: ranged read differs", b.name);
        let whole = TransferOptions { range_threshold: u64::MAX, ..t };
        assert_eq!(get_object(objects, &key, data.len() as u64, &whole).await.unwrap().unwrap().unwrap(), data);
        // A size other than the stored one is reported with the real size.
        for t in [t, whole] {
            assert_eq!(get_object(objects, &key, 12 << 20, &t).await.unwrap().unwrap().unwrap_err(), 11 << 20);
        }
        let missing = object_store::path::Path::from("blob/none");
        assert!(get_object(objects, &missing, 10, &t).await.unwrap().is_none());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_keeps_the_last_snapshots_and_every_chunk_they_name() {
    let mut rng = rng("prune_keeps_the_last_snapshots_and_every_chunk_they_name");
    let dir = tempfile::tempdir().unwrap();
    let index = index_with(&mut rng, dir.path(), 16, 2000);
    // A collection of one shard: every snapshot of it is complete (see
    // collections.rs for the incomplete ones).
    let one_shard = SnapshotTarget { collection: "docs".into(), shard: 0, shard_count: 1, id: None };
    for b in backends("prune_keeps_the_last_snapshots_and_every_chunk_they_name") {
        let mut manifests = Vec::new();
        for round in 0..3u64 {
            let (batch, _) = batch(&mut rng, 16, 10_000 + round * 50..10_050 + round * 50, 100 + round);
            index.apply(batch).unwrap();
            let m =
                create_snapshot(&b.store, Arc::clone(&index), &one_shard, &small_chunks(), progress(Operation::Snapshot)).await.unwrap();
            manifests.push(m);
        }
        // The snapshots share most chunks.
        let first: std::collections::HashSet<_> = manifests[0].chunks.iter().map(|c| &c.hash).collect();
        let shared = manifests[2].chunks.iter().filter(|c| first.contains(&c.hash)).count();
        assert!(shared > 0, "{}: no shared chunks", b.name);
        // Garbage of a crashed upload: a chunk no manifest names.
        let objects = object_store(&b.store);
        put_object(objects, &chunk_key(&"f".repeat(64)), Bytes::from_static(b"junk"), &TransferOptions::default()).await.unwrap();
        // Another collection's snapshot shares chunks too and must survive.
        let other = SnapshotTarget { collection: "other".into(), shard: 0, shard_count: 1, id: None };
        let kept_other =
            create_snapshot(&b.store, Arc::clone(&index), &other, &small_chunks(), progress(Operation::Snapshot)).await.unwrap();

        // A snapshot in progress (a fresh marker) defers the chunk pass.
        put_object(
            objects,
            &object_store::path::Path::from("inflight/docs.0.x.json"),
            Bytes::from_static(b"{}"),
            &TransferOptions::default(),
        )
        .await
        .unwrap();
        let report = prune(&b.store, "docs", None, 1, Duration::from_secs(3600)).await.unwrap();
        assert_eq!(report.deleted_snapshots.len(), 2, "{}: {report:?}", b.name);
        assert!(report.chunk_pass_skipped.as_deref().is_some_and(|r| r.contains("in progress")), "{report:?}");
        assert_eq!(report.deleted_chunks, 0);

        // With no grace the marker counts as stale and the chunk pass runs.
        let report = prune(&b.store, "docs", None, 1, Duration::ZERO).await.unwrap();
        assert_eq!(report.chunk_pass_skipped, None, "{report:?}");
        assert!(report.deleted_chunks >= 1, "{}: {report:?}", b.name);
        let only_old: usize = {
            let keep: std::collections::HashSet<_> = manifests[2].chunks.iter().chain(&kept_other.chunks).map(|c| c.hash.clone()).collect();
            let old: std::collections::HashSet<_> =
                manifests[..2].iter().flat_map(|m| &m.chunks).map(|c| c.hash.clone()).filter(|h| !keep.contains(h)).collect();
            old.len()
        };
        assert_eq!(report.deleted_chunks as usize, only_old + 1, "{}: {report:?}", b.name);
        let listed = list_snapshots(&b.store, "docs", None).await.unwrap();
        assert_eq!(listed.iter().map(|l| l.id.clone()).collect::<Vec<_>>(), vec![manifests[2].id.clone()]);

        // Both kept snapshots restore completely.
        for (collection, shard, id) in [("docs", 0, &manifests[2].id), ("other", 0, &kept_other.id)] {
            let dest = tempfile::tempdir().unwrap();
            let src = RestoreSource { collection: collection.into(), shard, id: id.clone() };
            restore_to_staging(&b.store, &src, &dest.path().join("s"), &restore_options(), progress(Operation::Restore)).await.unwrap();
        }
        let zero = prune(&b.store, "docs", None, 0, Duration::ZERO).await;
        assert!(matches!(zero, Err(SnapshotError::Invalid(_))), "{zero:?}");
    }
}
