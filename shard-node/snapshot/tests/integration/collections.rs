//! Collection snapshots: one manifest per shard under one id. One that a
//! node kill interrupted is listed as incomplete, and prune deletes it once
//! it is older than the grace period, without letting it count towards
//! `keep_last`.

use std::collections::HashSet;
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

/// New points in the given shards, so their next snapshot has chunks of
/// its own.
fn ingest(rng: &mut StdRng, indexes: &[Arc<Index>], shards: &[u32], round: u64) {
    for &s in shards {
        let start = 100_000 + round * 1000;
        indexes[s as usize].apply(batch(rng, 8, start..start + 200, 100 + round).0).unwrap();
    }
}

fn now_ms() -> u64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_millis() as u64
}

fn ids(snaps: &[CollectionSnapshot]) -> Vec<&str> {
    snaps.iter().map(|s| s.id.as_str()).collect()
}

fn pairs(v: &[(u32, &str)]) -> Vec<(u32, String)> {
    v.iter().map(|(s, id)| (*s, id.to_string())).collect()
}

fn chunks_of<'a>(manifests: impl IntoIterator<Item = &'a Manifest>) -> HashSet<String> {
    manifests.into_iter().flat_map(|m| &m.chunks).map(|c| c.hash.clone()).collect()
}

async fn chunk_exists(store: &SnapshotStore, hash: &str) -> bool {
    match object_store(store).head(&chunk_key(hash)).await {
        Ok(_) => true,
        Err(object_store::Error::NotFound { .. }) => false,
        Err(e) => panic!("head {hash}: {e}"),
    }
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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prune_deletes_interrupted_collection_snapshots_after_the_grace_period() {
    let mut rng = rng("prune_deletes_interrupted_collection_snapshots_after_the_grace_period");
    let dir = tempfile::tempdir().unwrap();
    let indexes = shard_indexes(&mut rng, dir.path());
    for (round, b) in backends("prune_deletes_interrupted_collection_snapshots_after_the_grace_period").into_iter().enumerate() {
        let round = round as u64 * 10;
        ingest(&mut rng, &indexes, &[0, 1, 2], round);
        let first = snapshot(&b.store, &indexes, "1-complete", &[0, 1, 2]).await;
        ingest(&mut rng, &indexes, &[0, 1, 2], round + 1);
        let second = snapshot(&b.store, &indexes, "2-complete", &[0, 1, 2]).await;
        // The newest is interrupted, and has chunks of its own.
        ingest(&mut rng, &indexes, &[0, 1], round + 2);
        let interrupted = snapshot(&b.store, &indexes, "3-interrupted", &[0, 1]).await;
        let only_interrupted: HashSet<String> = &chunks_of(&interrupted) - &chunks_of(first.iter().chain(&second));
        assert!(!only_interrupted.is_empty(), "{}: the interrupted snapshot has no chunk of its own", b.name);

        // Within the grace period it may still be being taken: kept, and
        // it does not count, so both complete snapshots stay.
        let r = prune(&b.store, "docs", None, 2, HOUR).await.unwrap();
        assert_eq!(r.deleted_snapshots, [], "{}: {r:?}", b.name);
        assert_eq!((ids(&r.young_incomplete), r.deleted_incomplete.len(), r.kept_snapshots), (vec!["3-interrupted"], 0, 8));
        assert_eq!(r.young_incomplete[0].missing, [2]);
        let listed = list_collection_snapshots(&b.store, "docs").await.unwrap();
        assert_eq!(ids(&listed), ["1-complete", "2-complete", "3-interrupted"]);

        // Past the grace period (none here): its manifests go first, its
        // own chunks with them; the complete ones and their chunks stay.
        let r = prune(&b.store, "docs", None, 2, Duration::ZERO).await.unwrap();
        assert_eq!(r.deleted_snapshots, pairs(&[(0, "3-interrupted"), (1, "3-interrupted")]), "{}: {r:?}", b.name);
        assert_eq!((ids(&r.deleted_incomplete), r.young_incomplete.len(), r.kept_snapshots), (vec!["3-interrupted"], 0, 6));
        assert_eq!((&r.deleted_incomplete[0].shards[..], &r.deleted_incomplete[0].missing[..]), (&[0, 1][..], &[2][..]));
        assert_eq!(r.chunk_pass_skipped, None, "{r:?}");
        assert!(r.deleted_chunks as usize >= only_interrupted.len(), "{}: {r:?}", b.name);
        for h in &only_interrupted {
            assert!(!chunk_exists(&b.store, h).await, "{}: chunk {h} of the deleted snapshot is still there", b.name);
        }
        for h in chunks_of(first.iter().chain(&second)) {
            assert!(chunk_exists(&b.store, &h).await, "{}: chunk {h} of a kept snapshot is gone", b.name);
        }
        let listed = list_collection_snapshots(&b.store, "docs").await.unwrap();
        assert_eq!(ids(&listed), ["1-complete", "2-complete"], "{}", b.name);
        assert!(listed.iter().all(|s| s.complete), "{listed:?}");

        // keep_last counts complete snapshots, per shard.
        let r = prune(&b.store, "docs", None, 1, Duration::ZERO).await.unwrap();
        assert_eq!(r.deleted_snapshots, pairs(&[(0, "1-complete"), (1, "1-complete"), (2, "1-complete")]), "{r:?}");
        assert_eq!((r.deleted_incomplete.len(), r.kept_snapshots), (0, 3));
        let listed = list_collection_snapshots(&b.store, "docs").await.unwrap();
        assert_eq!(ids(&listed), ["2-complete"]);
        assert!(listed[0].complete);
        for h in chunks_of(&second) {
            assert!(chunk_exists(&b.store, &h).await, "{}: chunk {h} of the kept snapshot is gone", b.name);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_prune_judges_the_collection_and_deletes_only_its_shard() {
    let mut rng = rng("a_shard_prune_judges_the_collection_and_deletes_only_its_shard");
    let dir = tempfile::tempdir().unwrap();
    let indexes = shard_indexes(&mut rng, dir.path());
    for b in backends("a_shard_prune_judges_the_collection_and_deletes_only_its_shard") {
        snapshot(&b.store, &indexes, "1-complete", &[0, 1, 2]).await;
        snapshot(&b.store, &indexes, "2-complete", &[0, 1, 2]).await;
        snapshot(&b.store, &indexes, "3-interrupted", &[0, 1]).await;

        // The interrupted newest does not push 2-complete out of shard 0.
        let r = prune(&b.store, "docs", Some(0), 1, HOUR).await.unwrap();
        assert_eq!(r.deleted_snapshots, pairs(&[(0, "1-complete")]), "{}: {r:?}", b.name);
        assert_eq!((ids(&r.young_incomplete), r.deleted_incomplete.len(), r.kept_snapshots), (vec!["3-interrupted"], 0, 2));

        // Past the grace period, only shard 0's manifest of it goes.
        let r = prune(&b.store, "docs", Some(0), 1, Duration::ZERO).await.unwrap();
        assert_eq!(r.deleted_snapshots, pairs(&[(0, "3-interrupted")]), "{}: {r:?}", b.name);
        assert_eq!((ids(&r.deleted_incomplete), r.kept_snapshots), (vec!["3-interrupted"], 1));
        let listed = list_collection_snapshots(&b.store, "docs").await.unwrap();
        let shape: Vec<_> = listed.iter().map(|s| (s.id.as_str(), s.shards.clone(), s.missing.clone(), s.complete)).collect();
        assert_eq!(
            shape,
            [
                ("1-complete", vec![1, 2], vec![0], false),
                ("2-complete", vec![0, 1, 2], vec![], true),
                ("3-interrupted", vec![1], vec![0, 2], false),
            ],
            "{}",
            b.name
        );

        // The collection's prune then removes what is left of both.
        let r = prune(&b.store, "docs", None, 1, Duration::ZERO).await.unwrap();
        assert_eq!(r.deleted_snapshots, pairs(&[(1, "1-complete"), (2, "1-complete"), (1, "3-interrupted")]), "{r:?}");
        assert_eq!((ids(&r.deleted_incomplete), r.kept_snapshots), (vec!["1-complete", "3-interrupted"], 3));
        assert_eq!(ids(&list_collection_snapshots(&b.store, "docs").await.unwrap()), ["2-complete"]);
    }
}
