//! A damaged or missing snapshot gives a precise error, and the data that
//! was there before the restore stays as it was.

use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use object_store::ObjectStoreExt;
use shoal_engine::Index;
use shoal_snapshot::*;

use crate::common::*;

/// What a test does to the store before restoring.
#[derive(Clone, Copy, Debug)]
enum Damage {
    FlipByte,
    Truncate,
    DeleteChunk,
    DeleteManifest,
    FutureVersion,
    GarbageManifest,
}

async fn damage(store: &SnapshotStore, m: &Manifest, how: Damage) {
    let objects = object_store(store);
    // The largest stored chunk, so there is content to damage.
    let big = m.chunks.iter().max_by_key(|c| c.stored_len).unwrap();
    let chunk = chunk_key(&big.hash);
    let manifest = manifest_key(&m.collection, m.shard, &m.id);
    let read = |key: object_store::path::Path| async move { objects.get(&key).await.unwrap().bytes().await.unwrap().to_vec() };
    let put = |key: object_store::path::Path, data: Vec<u8>| async move {
        objects.put(&key, Bytes::from(data).into()).await.unwrap();
    };
    match how {
        Damage::FlipByte => {
            let mut b = read(chunk.clone()).await;
            let mid = b.len() / 2;
            b[mid] ^= 0x10;
            put(chunk, b).await;
        }
        Damage::Truncate => {
            let b = read(chunk.clone()).await;
            put(chunk, b[..b.len() - 100].to_vec()).await;
        }
        Damage::DeleteChunk => objects.delete(&chunk).await.unwrap(),
        Damage::DeleteManifest => objects.delete(&manifest).await.unwrap(),
        Damage::FutureVersion => {
            let mut v: serde_json::Value = serde_json::from_slice(&read(manifest.clone()).await).unwrap();
            v["format_version"] = 2.into();
            put(manifest, v.to_string().into_bytes()).await;
        }
        Damage::GarbageManifest => put(manifest, b"{\"format\":\"shoal-shard-snapshot\",\"format_version\":1,\"id\":3}".to_vec()).await,
    }
}

fn expected(how: Damage, e: &SnapshotError) -> bool {
    match how {
        Damage::FlipByte => matches!(e, SnapshotError::ChunkCorrupt { .. }),
        Damage::Truncate => matches!(e, SnapshotError::ChunkTruncated { expected, found, .. } if expected - found == 100),
        Damage::DeleteChunk => matches!(e, SnapshotError::ChunkMissing { .. }),
        Damage::DeleteManifest => matches!(e, SnapshotError::ManifestMissing { .. }),
        Damage::FutureVersion => matches!(e, SnapshotError::UnsupportedFormat { found: 2, supported: 1, .. }),
        Damage::GarbageManifest => matches!(e, SnapshotError::BadManifest { .. }),
    }
}

/// Entries of `dir` other than `keep`.
fn leftovers(dir: &Path, keep: &str) -> Vec<String> {
    std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().file_name().to_string_lossy().into_owned()).filter(|n| n != keep).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn damaged_snapshots_fail_precisely_and_change_nothing() {
    let mut rng = rng("damaged_snapshots_fail_precisely_and_change_nothing");
    let src_dir = tempfile::tempdir().unwrap();
    let source = index_with(&mut rng, src_dir.path(), 16, 1500);
    for how in
        [Damage::FlipByte, Damage::Truncate, Damage::DeleteChunk, Damage::DeleteManifest, Damage::FutureVersion, Damage::GarbageManifest]
    {
        for b in backends("damaged_snapshots_fail_precisely_and_change_nothing") {
            let target = SnapshotTarget { collection: "docs".into(), shard: 0, shard_count: 1, id: None };
            let m = create_snapshot(&b.store, Arc::clone(&source), &target, &small_chunks(), progress(Operation::Snapshot)).await.unwrap();
            damage(&b.store, &m, how).await;

            // A shard already lives where the restore would go.
            let node = tempfile::tempdir().unwrap();
            let existing = node.path().join("0");
            let before = index_with(&mut rng, &existing, 16, 300);
            drop(before);
            let staging = sibling(&existing, "restore");
            let src = RestoreSource { collection: "docs".into(), shard: 0, id: m.id.clone() };
            let err = restore_to_staging(&b.store, &src, &staging, &restore_options(), progress(Operation::Restore)).await.unwrap_err();
            eprintln!("{how:?} on {}: {err}", b.name);
            assert!(expected(how, &err), "{how:?} on {}: got {err:?}", b.name);
            let unusable = !matches!(how, Damage::DeleteManifest);
            assert_eq!(err.is_unusable_snapshot(), unusable, "{err}");
            assert!(leftovers(node.path(), "0").is_empty(), "staging left behind: {:?}", leftovers(node.path(), "0"));
            let still = Index::open(&existing, engine_options()).unwrap();
            assert_eq!(still.stats().unwrap().live, 300, "{how:?}: the existing shard changed");
        }
    }
}
