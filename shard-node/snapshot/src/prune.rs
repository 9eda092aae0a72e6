//! Retention: delete collection snapshots that will never be complete,
//! keep the last N complete snapshots of each shard, then delete the
//! chunks no remaining manifest names.
//!
//! A collection snapshot is one manifest per shard under one id (see
//! [`CollectionSnapshot`]). One whose shard node died midway lacks a
//! manifest for good and cannot be restored as a collection; one being
//! taken right now lacks manifests too until its last shard publishes. The
//! manifests alone cannot tell them apart, so an incomplete snapshot is
//! deleted only once its newest manifest is older than the grace period
//! (the same grace as for chunks: it must exceed the time a collection
//! snapshot takes), and it never counts towards `keep_last`, so an
//! incomplete newest snapshot never pushes out a complete one.
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

use std::collections::{BTreeMap, HashSet};
use std::time::Duration;

use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectMeta, ObjectStore, ObjectStoreExt};

use crate::catalog::{CollectionSnapshot, list_snapshots, manifest_keys, summarize};
use crate::error::{Result, SnapshotError};
use crate::layout;
use crate::objects::read_manifest;
use crate::store_url::SnapshotStore;
use crate::upload::now_ms;

/// What a prune did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PruneReport {
    /// Manifests deleted, as (shard, id): those of `deleted_incomplete`
    /// first, then those past the retention.
    pub deleted_snapshots: Vec<(u32, String)>,
    /// Manifests kept in the pruned collection (of the pruned shard, if
    /// one was given), `young_incomplete` ones included.
    pub kept_snapshots: u64,
    /// Incomplete collection snapshots whose newest manifest was older
    /// than the grace period, as they were before this prune deleted their
    /// manifests (all of them; only the pruned shard's if one was given).
    pub deleted_incomplete: Vec<CollectionSnapshot>,
    /// Incomplete collection snapshots kept because their newest manifest
    /// is younger than the grace period: they may still be being taken.
    pub young_incomplete: Vec<CollectionSnapshot>,
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

/// Applies retention to `collection` (only to the manifests of `shard` if
/// given), then deletes unreferenced chunks older than `grace`:
///
/// 1. Incomplete collection snapshots (see [`CollectionSnapshot::complete`])
///    whose newest manifest was created more than `grace` ago lose their
///    manifests; they are listed in [`PruneReport::deleted_incomplete`].
///    Younger ones are kept and listed in [`PruneReport::young_incomplete`]:
///    a snapshot being taken is incomplete until its last shard publishes.
/// 2. Of each shard, the `keep_last` newest *complete* snapshots are kept
///    and older ones deleted. Young incomplete snapshots are kept and not
///    counted. A snapshot with an unreadable manifest (damaged, or of
///    another format version) is not judged incomplete by step 1, since a
///    newer build may read it whole; it is not counted either, and is
///    deleted once it is older than the `keep_last` newest complete
///    snapshots of the shard (so a damaged manifest does not block the
///    chunk pass for ever).
/// 3. The chunk pass (see the module documentation).
///
/// With `shard`, completeness is still judged over the whole collection
/// (the prune reads the collection's manifests, fewer than the chunk pass
/// reads anyway), but only that shard's manifests are deleted: of a stale
/// incomplete snapshot, its own manifest; the other shards keep theirs
/// until they or the collection are pruned. A complete snapshot whose
/// manifest such a prune retires is incomplete from then on, so the next
/// prune of the collection past the grace period deletes the rest of it.
pub async fn prune(store: &SnapshotStore, collection: &str, shard: Option<u32>, keep_last: usize, grace: Duration) -> Result<PruneReport> {
    layout::validate_collection(collection)?;
    if keep_last == 0 {
        return Err(SnapshotError::Invalid("keep_last must be at least 1 (drop the collection's snapshots by hand if you mean it)".into()));
    }
    let objects = store.store.as_ref();
    // The whole collection even for one shard: completeness needs all.
    let snapshots = summarize(&list_snapshots(store, collection, None).await?);
    let cutoff_ms = now_ms().saturating_sub(grace.as_millis() as u64);
    let plan = plan(&snapshots, shard, keep_last, cutoff_ms);
    let mut report = PruneReport { kept_snapshots: plan.kept, young_incomplete: plan.young, ..PruneReport::default() };
    let mut doomed: Vec<(u32, String)> = Vec::new();
    for (snap, shards) in plan.incomplete {
        doomed.extend(shards.into_iter().map(|s| (s, snap.id.clone())));
        report.deleted_incomplete.push(snap);
    }
    doomed.extend(plan.retired);
    for (s, id) in doomed {
        let key = layout::manifest_key(collection, s, &id);
        match objects.delete(&key).await {
            Ok(()) | Err(object_store::Error::NotFound { .. }) => report.deleted_snapshots.push((s, id)),
            Err(e) => return Err(SnapshotError::store("delete", &key, e)),
        }
    }
    collect_chunks(store, grace, &mut report).await?;
    Ok(report)
}

/// What a prune deletes and keeps.
#[derive(Debug, Default, PartialEq)]
struct Plan {
    /// Incomplete snapshots past the grace period, with the shards whose
    /// manifests go.
    incomplete: Vec<(CollectionSnapshot, Vec<u32>)>,
    /// Incomplete snapshots within the grace period (kept).
    young: Vec<CollectionSnapshot>,
    /// Manifests past the retention, as (shard, id), sorted.
    retired: Vec<(u32, String)>,
    /// Manifests kept.
    kept: u64,
}

/// How a snapshot that survives the incomplete pass counts for retention.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Standing {
    Complete,
    /// Incomplete, newest manifest within the grace period.
    Young,
    /// Some manifest unreadable: cannot be judged.
    Unreadable,
}

/// Decides a prune from the collection's snapshots (sorted by id, as
/// [`summarize`] returns them); `cutoff_ms`: manifests created at or
/// before it are past the grace period.
fn plan(snapshots: &[CollectionSnapshot], shard: Option<u32>, keep_last: usize, cutoff_ms: u64) -> Plan {
    let mut plan = Plan::default();
    let mut per_shard: BTreeMap<u32, Vec<(&str, Standing)>> = BTreeMap::new();
    for snap in snapshots {
        let shards: Vec<u32> = snap.manifest_shards().into_iter().filter(|&s| shard.is_none_or(|want| want == s)).collect();
        if shards.is_empty() {
            continue;
        }
        let standing = if snap.complete {
            Standing::Complete
        } else if !snap.unreadable.is_empty() {
            Standing::Unreadable
        } else if snap.newest_created_at_ms.is_some_and(|t| t > cutoff_ms) {
            plan.young.push(snap.clone());
            Standing::Young
        } else {
            plan.incomplete.push((snap.clone(), shards));
            continue;
        };
        for s in shards {
            per_shard.entry(s).or_default().push((&snap.id, standing));
        }
    }
    for (s, ids) in per_shard {
        // Newest first; past the keep_last-th complete one, only young
        // incomplete snapshots stay.
        let mut complete = 0;
        for (id, standing) in ids.into_iter().rev() {
            let keep = match standing {
                Standing::Complete => {
                    complete += 1;
                    complete <= keep_last
                }
                Standing::Young => true,
                Standing::Unreadable => complete < keep_last,
            };
            if keep {
                plan.kept += 1;
            } else {
                plan.retired.push((s, id.to_owned()));
            }
        }
    }
    plan.retired.sort();
    plan
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
    let chunks: Vec<ObjectMeta> = objects.list(Some(&prefix)).try_collect().await.map_err(|e| SnapshotError::store("list", &prefix, e))?;
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
    let markers: Vec<ObjectMeta> = objects.list(Some(&prefix)).try_collect().await.map_err(|e| SnapshotError::store("list", &prefix, e))?;
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::catalog::Listed;
    use crate::catalog::tests::{ok, unreadable};

    const NOW: u64 = 1_000_000;
    const OLD: u64 = NOW - 10_000;
    /// Manifests created at or before this are past the grace period.
    const CUTOFF: u64 = NOW - 5_000;

    /// A collection snapshot `id` of `count` shards with manifests for
    /// `shards`, created at `at`.
    fn snap(id: &str, count: u32, shards: &[u32], at: u64) -> Vec<Listed> {
        shards.iter().map(|&s| ok(id, s, count, at)).collect()
    }

    fn plan_of(listed: Vec<Vec<Listed>>, shard: Option<u32>, keep_last: usize) -> Plan {
        let listed: Vec<Listed> = listed.into_iter().flatten().collect();
        plan(&summarize(&listed), shard, keep_last, CUTOFF)
    }

    fn ids(snaps: &[CollectionSnapshot]) -> Vec<&str> {
        snaps.iter().map(|s| s.id.as_str()).collect()
    }

    fn pairs(v: &[(u32, &str)]) -> Vec<(u32, String)> {
        v.iter().map(|(s, id)| (*s, id.to_string())).collect()
    }

    #[test]
    fn complete_snapshots_keep_the_last_n_of_each_shard() {
        let p = plan_of(vec![snap("a", 2, &[0, 1], OLD), snap("b", 2, &[0, 1], OLD), snap("c", 2, &[0, 1], NOW)], None, 2);
        assert_eq!(p.retired, pairs(&[(0, "a"), (1, "a")]));
        assert_eq!((p.kept, p.incomplete.len(), p.young.len()), (4, 0, 0));
    }

    #[test]
    fn an_incomplete_newest_snapshot_never_pushes_out_a_complete_one() {
        let listed = || vec![snap("a", 3, &[0, 1, 2], OLD), snap("b", 3, &[0, 1, 2], OLD), snap("c", 3, &[0, 1], NOW)];
        // Young: kept, not counted.
        let p = plan_of(listed(), None, 1);
        assert_eq!(p.retired, pairs(&[(0, "a"), (1, "a"), (2, "a")]));
        assert_eq!((ids(&p.young), p.incomplete.len(), p.kept), (vec!["c"], 0, 5));
        // Past the grace: its manifests go, and still b is kept.
        let mut listed = listed();
        listed[2] = snap("c", 3, &[0, 1], CUTOFF);
        let p = plan_of(listed, None, 1);
        assert_eq!(p.incomplete.len(), 1);
        assert_eq!((p.incomplete[0].0.id.as_str(), &p.incomplete[0].1[..]), ("c", &[0, 1][..]));
        assert_eq!(p.incomplete[0].0.missing, [2]);
        assert_eq!(p.retired, pairs(&[(0, "a"), (1, "a"), (2, "a")]));
        assert_eq!((p.young.len(), p.kept), (0, 3));
    }

    #[test]
    fn young_incomplete_snapshots_stay_wherever_they_sort() {
        // An explicit id may sort before complete snapshots taken later.
        let p = plan_of(vec![snap("a", 2, &[1], NOW), snap("b", 2, &[0, 1], OLD), snap("c", 2, &[0, 1], OLD)], None, 1);
        assert_eq!(p.retired, pairs(&[(0, "b"), (1, "b")]));
        assert_eq!((ids(&p.young), p.kept), (vec!["a"], 3));
    }

    #[test]
    fn disagreeing_shard_counts_are_incomplete() {
        let listed = vec![ok("a", 0, 2, OLD), ok("a", 1, 3, OLD)];
        let p = plan_of(vec![listed, snap("b", 2, &[0, 1], OLD)], None, 1);
        assert_eq!(p.incomplete.len(), 1);
        assert_eq!((p.incomplete[0].0.id.as_str(), &p.incomplete[0].1[..]), ("a", &[0, 1][..]));
        assert_eq!((p.retired.len(), p.kept), (0, 2));
    }

    #[test]
    fn unreadable_manifests_are_not_judged_but_age_out_behind_complete_ones() {
        let damaged = |id: &str| vec![ok(id, 0, 2, OLD), unreadable(id, 1)];
        // Newer than the keep_last-th complete snapshot: kept, not counted.
        let p = plan_of(vec![snap("a", 2, &[0, 1], OLD), damaged("b")], None, 1);
        assert_eq!((p.retired.len(), p.incomplete.len(), p.young.len(), p.kept), (0, 0, 0, 4));
        // Older than it: deleted like any snapshot past the retention.
        let p = plan_of(vec![damaged("a"), snap("b", 2, &[0, 1], OLD), snap("c", 2, &[0, 1], OLD)], None, 1);
        assert_eq!(p.retired, pairs(&[(0, "a"), (0, "b"), (1, "a"), (1, "b")]));
        assert_eq!((p.incomplete.len(), p.kept), (0, 2));
        // No complete snapshot at all: nothing to measure against, all kept.
        let p = plan_of(vec![damaged("a"), damaged("b")], None, 1);
        assert_eq!((p.retired.len(), p.kept), (0, 4));
    }

    #[test]
    fn a_shard_prune_judges_the_collection_but_touches_only_its_shard() {
        let listed = || {
            vec![
                snap("a", 3, &[0, 1, 2], OLD),
                snap("b", 3, &[0, 1], OLD),
                snap("c", 3, &[0, 1, 2], OLD),
                snap("d", 3, &[1, 2], NOW),
                snap("e", 3, &[0], NOW),
            ]
        };
        let p = plan_of(listed(), Some(0), 1);
        assert_eq!(p.incomplete.len(), 1);
        assert_eq!((p.incomplete[0].0.id.as_str(), &p.incomplete[0].1[..]), ("b", &[0][..]));
        // d has no manifest of shard 0: not this prune's business.
        assert_eq!(ids(&p.young), ["e"]);
        assert_eq!(p.retired, pairs(&[(0, "a")]));
        assert_eq!(p.kept, 2, "c and e");
        let p = plan_of(listed(), Some(2), 1);
        assert_eq!((p.incomplete.len(), ids(&p.young), &p.retired[..], p.kept), (0, vec!["d"], &pairs(&[(2, "a")])[..], 2));
        let p = plan_of(listed(), Some(7), 1);
        assert_eq!(p, Plan::default());
    }
}
