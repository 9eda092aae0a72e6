//! Collection snapshots: one manifest per shard under one id. One that a
//! node kill interrupted is listed as incomplete.

use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use object_store::ObjectStoreExt;
use rand::rngs::StdRng;
use shoal_engine::Index;
use shoal_snapshot::*;

use crate::common::*;

const SHARDS: u32 = 3;
const HOUR: Duration = Duration::from_secs(3600);

/// The shards of `docs`, each an index with its own points.
fn shard_indexes(rng: &mut StdRng, dir: &Path) -> Vec<Arc<Index>> {
    (0..SHARDS).map(|s| index_with(rng, &dir.join(s.to_string()), 8, 600)).collect()
}

/// Snapshots `shards` of `docs` under `id`, as each shard node does for a
/// collection snapshot; all of them for a complete one.
async fn snapshot(store: &SnapshotStore, indexes: &[Arc<Index>], id: &str, shards: &[u32]) -> Vec<Manifest> {
    let mut out = Vec::new();
    for &shard in shards {
        let target = SnapshotTarget { collection: "docs".into(), shard, shard_count: SHARDS, id: Some(id.into()) };
        let m = create_snapshot(store, Arc::clone(&indexes[shard as usize]), &target, &small_chunks(), progress(Operation::Snapshot))
            .await
            .unwrap();
        out.push(m);
    }
    out
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

fn ids(snaps: &[CollectionSnapshot]) -> Vec<&str> {
    snaps.iter().map(|s| s.id.as_str()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_collection_snapshot_is_listed_as_incomplete() {
    let mut rng = rng("an_interrupted_collection_snapshot_is_listed_as_incomplete");
    let dir = tempfile::tempdir().unwrap();
    let indexes = shard_indexes(&mut rng, dir.path());
    for b in backends("an_interrupted_collection_snapshot_is_listed_as_incomplete") {
        let before = now_ms();
        let complete = snapshot(&b.store, &indexes, "1-complete", &[0, 1, 2]).await;
        // The node of shard 2 was killed: shards 0 and 1 published.
        let interrupted = snapshot(&b.store, &indexes, "2-interrupted", &[0, 1]).await;
        // Shard 2 published something this build cannot read.
        snapshot(&b.store, &indexes, "3-damaged", &[0, 1]).await;
        let damaged = manifest_key("docs", 2, "3-damaged");
        object_store(&b.store).put(&damaged, Bytes::from_static(b"{\"format\":").into()).await.unwrap();
        let after = now_ms();

        let listed = list_collection_snapshots(&b.store, "docs").await.unwrap();
        assert_eq!(ids(&listed), ["1-complete", "2-interrupted", "3-damaged"], "{}", b.name);
        assert_eq!(listed, summarize(&list_snapshots(&b.store, "docs", None).await.unwrap()));
        // The per-shard listing is what it was: every manifest, one by one.
        assert_eq!(list_snapshots(&b.store, "docs", None).await.unwrap().len(), 8);

        let (c, i, d) = (&listed[0], &listed[1], &listed[2]);
        assert!(c.complete, "{}: {c:?}", b.name);
        assert_eq!((c.shard_count, &c.shards[..], c.missing.len(), c.unreadable.len()), (Some(3), &[0, 1, 2][..], 0, 0));
        assert_eq!(c.why_incomplete(), None);
        let times: Vec<u64> = complete.iter().map(|m| m.created_at_ms).collect();
        assert_eq!((c.oldest_created_at_ms, c.newest_created_at_ms), (times.iter().min().copied(), times.iter().max().copied()));
        assert!(c.oldest_created_at_ms.unwrap() >= before && c.newest_created_at_ms.unwrap() <= after, "{c:?}");

        assert!(!i.complete, "{}: {i:?}", b.name);
        assert_eq!((i.shard_count, &i.shards[..], &i.missing[..], i.unreadable.len()), (Some(3), &[0, 1][..], &[2][..], 0));
        assert_eq!(i.why_incomplete().as_deref(), Some("no manifest for shard 2 of 3"));
        assert_eq!(i.newest_created_at_ms, interrupted.iter().map(|m| m.created_at_ms).max());
        assert!(i.age(now_ms()).is_some_and(|a| a < HOUR), "{i:?}");

        assert!(!d.complete, "{}: {d:?}", b.name);
        assert_eq!((&d.shards[..], d.missing.len()), (&[0, 1][..], 0), "an unreadable manifest is there, not missing");
        assert_eq!(d.unreadable.len(), 1);
        assert_eq!(d.unreadable[0].0, 2);
        assert!(d.unreadable[0].1.contains("unreadable"), "{:?}", d.unreadable);
        assert!(d.why_incomplete().unwrap().starts_with("shard 2: manifest"), "{:?}", d.why_incomplete());

        assert!(list_collection_snapshots(&b.store, "none").await.unwrap().is_empty());
        assert!(matches!(list_collection_snapshots(&b.store, "../x").await, Err(SnapshotError::Invalid(_))));
    }
}
