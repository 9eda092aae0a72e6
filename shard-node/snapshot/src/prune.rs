//! Retention: keep the last N snapshots of each shard, then delete the
//! chunks no remaining manifest names.
//!
//! Chunks are shared by every snapshot in the store, so the chunk pass
//! reads *every* manifest in the store, not just the pruned collection's;
//! if any manifest cannot be read it deletes no chunk at all (a chunk it
//! cannot see referenced might be).
//!
//! A snapshot uploads chunks before its manifest exists, so its chunks look
//! unreferenced while it runs. Two rules keep them:
//! - while any in-flight marker younger than the grace period exists, the
//!   chunk pass is deferred (markers older than that are from crashed
//!   snapshots and are removed);
//! - only chunks last written more than the grace period ago are deleted.
//!
//! A snapshot re-checks the chunks it reused just before it publishes, so
//! the remaining window (a snapshot starting between this pass's last
//! marker check and its delete) makes that snapshot fail with
//! `ChunkVanished`, never publish a manifest with a hole.

use std::collections::HashSet;
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};

use crate::catalog::manifest_keys;
use crate::error::{Result, SnapshotError};
use crate::layout;
use crate::objects::read_manifest;
use crate::store_url::SnapshotStore;
use crate::upload::now_ms;

/// What a prune did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PruneReport {
    /// Manifests deleted, as (shard, id).
    pub deleted_snapshots: Vec<(u32, String)>,
    /// Snapshots kept in the pruned collection.
    pub kept_snapshots: u64,
    /// Chunks deleted.
    pub deleted_chunks: u64,
    /// Their stored bytes.
    pub deleted_bytes: u64,
    /// Chunks some manifest names.
    pub referenced_chunks: u64,
    /// Unreferenced chunks kept because they are younger than the grace
    /// period (maybe part of a snapshot being written).
    pub young_unreferenced_chunks: u64,
    /// Why the chunk pass did not run, if it did not.
    pub chunk_pass_skipped: Option<String>,
}

/// Deletes all but the `keep_last` newest snapshots of each shard of
/// `collection` (only `shard` if given), then unreferenced chunks older
/// than `grace`.
pub async fn prune(
    store: &SnapshotStore,
    collection: &str,
    shard: Option<u32>,
    keep_last: usize,
    grace: Duration,
) -> Result<PruneReport> {
    layout::validate_collection(collection)?;
    if keep_last == 0 {
        return Err(SnapshotError::Invalid("keep_last must be at least 1 (drop the collection's snapshots by hand if you mean it)".into()));
    }
    let objects = store.store.as_ref();
    let mut report = PruneReport::default();
    let keys = manifest_keys(objects, &layout::collection_prefix(collection)).await?;
    let mut per_shard: std::collections::BTreeMap<u32, Vec<String>> = Default::default();
    for (_, s, id) in keys {
        if shard.is_none_or(|want| want == s) {
            per_shard.entry(s).or_default().push(id);
        }
    }
    for (s, ids) in per_shard {
        let cut = ids.len().saturating_sub(keep_last);
        report.kept_snapshots += (ids.len() - cut) as u64;
        for id in &ids[..cut] {
            let key = layout::manifest_key(collection, s, id);
            match objects.delete(&key).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => report.deleted_snapshots.push((s, id.clone())),
                Err(e) => return Err(SnapshotError::store("delete", &key, e)),
            }
        }
    }
    collect_chunks(store, grace, &mut report).await?;
    Ok(report)
}

async fn collect_chunks(store: &SnapshotStore, grace: Duration, report: &mut PruneReport) -> Result<()> {
    let objects = store.store.as_ref();
    if let Some(reason) = snapshots_in_flight(objects, grace).await? {
        report.chunk_pass_skipped = Some(reason);
        return Ok(());
    }
    // Every manifest of the store, every collection.
    let all = manifest_keys(objects, &Path::from(layout::SNAPSHOTS)).await?;
    let manifests: Vec<_> = futures::stream::iter(all)
        .map(|(c, s, id)| async move { read_manifest(&store.store, &c, s, &id).await })
        .buffered(16)
        .collect()
        .await;
    let mut referenced = HashSet::new();
    for m in manifests {
        match m {
            Ok(m) => referenced.extend(m.chunks.into_iter().map(|c| c.hash)),
            // Deleted meanwhile (another prune): it references nothing now.
            Err(SnapshotError::ManifestMissing { .. }) => {}
            Err(e) => {
                report.chunk_pass_skipped = Some(format!("no chunk deleted: {e}"));
                return Ok(());
            }
        }
    }
    report.referenced_chunks = referenced.len() as u64;
    let prefix = Path::from(layout::CHUNKS);
    let chunks: Vec<ObjectMeta> =
        objects.list(Some(&prefix)).try_collect().await.map_err(|e| SnapshotError::store("list", &prefix, e))?;
    let cutoff = now_ms().saturating_sub(grace.as_millis() as u64) as i64;
    let mut doomed = Vec::new();
    for c in chunks {
        let Some(name) = c.location.filename() else { continue };
        if referenced.contains(name) {
            continue;
        }
        if c.last_modified.timestamp_millis() > cutoff {
            report.young_unreferenced_chunks += 1;
        } else {
            doomed.push(c);
        }
    }
    // Last look before deleting: a snapshot that started since the first
    // check may be about to reuse one of these.
    if let Some(reason) = snapshots_in_flight(objects, grace).await? {
        report.chunk_pass_skipped = Some(reason);
        return Ok(());
    }
    for c in doomed {
        match objects.delete(&c.location).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => {
                report.deleted_chunks += 1;
                report.deleted_bytes += c.size;
            }
            Err(e) => return Err(SnapshotError::store("delete", &c.location, e)),
        }
    }
    Ok(())
}

/// Some(reason) if a snapshot is being uploaded; removes markers of
/// snapshots that died (older than `grace`).
async fn snapshots_in_flight(objects: &dyn ObjectStore, grace: Duration) -> Result<Option<String>> {
    let prefix = Path::from(layout::INFLIGHT);
    let markers: Vec<ObjectMeta> =
        objects.list(Some(&prefix)).try_collect().await.map_err(|e| SnapshotError::store("list", &prefix, e))?;
    let cutoff = now_ms().saturating_sub(grace.as_millis() as u64) as i64;
    let mut live = Vec::new();
    for m in markers {
        if m.last_modified.timestamp_millis() > cutoff {
            live.push(m.location.filename().unwrap_or_default().trim_end_matches(".json").to_owned());
        } else if let Err(e) = objects.delete(&m.location).await {
            tracing::warn!(key = %m.location, error = %e, "could not remove a stale in-flight marker");
        }
    }
    Ok((!live.is_empty()).then(|| format!("chunk collection deferred: snapshot in progress ({})", live.join(", "))))
}
