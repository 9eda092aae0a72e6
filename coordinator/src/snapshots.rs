//! Snapshots of whole collections: the coordinator asks the nodes that hold
//! the shards to snapshot or restore them. The object store is shared by
//! the nodes, so listing and pruning can be asked of any one of them.

use std::collections::BTreeMap;
use std::time::Duration;

use futures::future::join_all;
use shoal_proto::{CollectionName, ErrorCode, NodeId, ShoalError, v1};

use crate::cluster::Cluster;
use crate::error::{Error, Result};
use shoal_control::metadata::{MetaError, place};
use shoal_control::model::{Collection, CollectionSpec, ShardPlacement};

/// Snapshots and restores move whole shards; they get a day, not the
/// seconds a search gets.
const LONG_CALL: Duration = Duration::from_secs(24 * 3600);

/// Same rules as the snapshot library (ids become object keys).
pub(crate) fn check_id(id: &str) -> Result<()> {
    let ok = !id.is_empty()
        && id.len() <= 64
        && !id.starts_with('.')
        && id.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(Error::Invalid(format!("snapshot id {id:?} must be 1 to 64 characters of A-Z a-z 0-9 . _ - and not start with a dot")))
    }
}

/// A new collection snapshot id: UTC time to the millisecond (so ids sort
/// by creation) and a random suffix.
fn new_id() -> String {
    let ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    let (secs, millis) = (ms / 1000, ms % 1000);
    let (days, rem) = (secs / 86_400, secs % 86_400);
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let (era, doe) = (z.div_euclid(146_097), z.rem_euclid(146_097));
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let m = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = if m <= 2 { era * 400 + yoe + 1 } else { era * 400 + yoe };
    format!("{y:04}{m:02}{d:02}T{:02}{:02}{:02}.{millis:03}Z-{:04x}", rem / 3600, rem % 3600 / 60, rem % 60, rand::random::<u16>())
}

impl Cluster {
    /// Snapshots every shard of a collection under one id, concurrently.
    pub async fn create_snapshot(&self, req: v1::CreateSnapshotRequest) -> Result<v1::CreateSnapshotResponse> {
        let v1::CreateSnapshotRequest { collection, snapshot_id, zstd_level } = req;
        let c = self.collection(&collection)?;
        let id = if snapshot_id.is_empty() { new_id() } else { snapshot_id };
        check_id(&id)?;
        let g = self
            .scatter(&c, LONG_CALL, |client, shard, timeout| {
                let snapshot_id = id.clone();
                async move { client.snapshot_shard(v1::SnapshotShardRequest { shard, snapshot_id, zstd_level }, timeout).await }
            })
            .await;
        if let Some((i, node, e)) = g.failures.into_iter().min_by_key(|f| f.0) {
            let published: Vec<String> = g.answers.iter().map(|(s, _)| s.to_string()).collect();
            return Err(e.context(format!(
                "snapshot {id} of {}: shard {i} on node {node} failed (shards published: [{}])",
                c.name,
                published.join(", ")
            )));
        }
        let mut shards: Vec<v1::SnapshotInfo> = g.answers.into_iter().map(|(_, s)| s).collect();
        shards.sort_by_key(|s| s.shard);
        Ok(v1::CreateSnapshotResponse { snapshot_id: id, shards })
    }

    /// Snapshots of a collection, from any node that answers (they share
    /// the store). Works for collections this cluster does not have.
    pub async fn list_snapshots(&self, req: v1::ListSnapshotsRequest) -> Result<v1::ListSnapshotsResponse> {
        CollectionName::parse(&req.collection)?;
        self.ask_any_node("listing snapshots", |client| {
            let req = req.clone();
            async move { client.list_snapshots(req, LONG_CALL).await }
        })
        .await
    }

    /// Applies retention, on any node that answers.
    pub async fn prune_snapshots(&self, req: v1::PruneSnapshotsRequest) -> Result<v1::PruneSnapshotsResponse> {
        CollectionName::parse(&req.collection)?;
        self.ask_any_node("pruning snapshots", |client| {
            let req = req.clone();
            async move { client.prune_snapshots(req, LONG_CALL).await }
        })
        .await
    }

    /// Restores a collection (or one shard of it) from a snapshot id.
    pub async fn restore_snapshot(&self, req: v1::RestoreSnapshotRequest) -> Result<v1::RestoreSnapshotResponse> {
        let v1::RestoreSnapshotRequest { collection, snapshot_id, shard, replace } = req;
        let name = CollectionName::parse(&collection)?;
        check_id(&snapshot_id)?;
        let listed = self.list_snapshots(v1::ListSnapshotsRequest { collection: collection.clone(), shard }).await?;
        // A whole collection restores only from a complete snapshot; the
        // node's summary says what is missing.
        if shard.is_none()
            && let Some(c) = listed.collection_snapshots.iter().find(|c| c.id == snapshot_id && !c.complete)
        {
            return Err(Error::NotFound(format!(
                "snapshot {snapshot_id} of {name} is incomplete ({}): it cannot restore the collection; \
                 `shoalctl snapshot list {name}` shows the complete ones",
                c.why_incomplete
            )));
        }
        let of_id: BTreeMap<u32, v1::SnapshotInfo> =
            listed.snapshots.into_iter().filter(|s| s.id == snapshot_id).map(|s| (s.shard, s)).collect();
        if let Some(bad) = of_id.values().find(|s| !s.error.is_empty()) {
            return Err(Error::Invalid(format!("snapshot {snapshot_id} of shard {}: {}", bad.shard, bad.error)));
        }
        let Some(first) = of_id.values().next() else {
            return Err(Error::NotFound(format!("collection {name} has no snapshot {snapshot_id}")));
        };
        let count = first.shard_count;
        let wanted: Vec<u32> = match shard {
            Some(s) => vec![s],
            None => (0..count).collect(),
        };
        if let Some(missing) = wanted.iter().find(|s| !of_id.contains_key(s)) {
            return Err(Error::NotFound(format!("snapshot {snapshot_id} of {name} has no manifest for shard {missing}")));
        }
        if of_id.values().any(|s| s.shard_count != count) {
            return Err(Error::Invalid(format!("the shards of snapshot {snapshot_id} disagree on the shard count")));
        }
        let view = self.meta.view();
        let existing = view.collection(&name).map(|v| &v.value);
        let placement: Vec<NodeId> = match existing {
            Some(c) if c.shard_count() != count => {
                return Err(Error::Invalid(format!(
                    "collection {name} has {} shards here, the snapshot {count}; drop the collection first to restore it",
                    c.shard_count()
                )));
            }
            Some(_) if !replace => {
                return Err(Error::RestoreOverExisting(name));
            }
            Some(c) if (c.spec.dimension, v1::Metric::from(c.spec.metric) as i32) != (first.dimension, first.metric) => {
                return Err(Error::Invalid(format!(
                    "collection {name} here has dimension {} and metric {}, the snapshot {} and {}; drop the collection first to restore it",
                    c.spec.dimension,
                    c.spec.metric,
                    first.dimension,
                    v1::Metric::try_from(first.metric).map_or("unknown", |m| m.as_str_name())
                )));
            }
            Some(c) => c.shards.iter().map(|s| s.node().clone()).collect(),
            None => {
                let placement = place(count, view.placeable(), view.collections.values().map(|v| &v.value));
                if placement.len() < count as usize {
                    return Err(Error::NoCapacity);
                }
                placement
            }
        };
        let existed = existing.is_some();
        let results = join_all(wanted.iter().map(|&s| {
            let node = placement[s as usize].clone();
            let req = v1::RestoreShardRequest {
                shard: Some(v1::ShardId { collection: collection.clone(), shard: s }),
                snapshot_id: snapshot_id.clone(),
                replace,
            };
            async move {
                let client = self.client(&node)?;
                let r = self.on_node(&node, client.restore_shard(req, LONG_CALL)).await;
                r.map_err(|e| e.context(format!("restoring shard {s} on node {node}")))
            }
        }))
        .await;
        let mut restored_stats = Vec::new();
        for r in results {
            restored_stats.push(r?);
        }
        if !existed {
            // Served once every shard is there (a single-shard restore of a
            // collection this cluster lacks waits for the others).
            let spec = restored_stats.iter().find_map(|s| s.spec);
            if let Some(spec) = spec
                && wanted.len() as u32 == count
            {
                let spec =
                    CollectionSpec::try_from(spec).map_err(|e| Error::Invalid(e.message).context(format!("snapshot {snapshot_id}")))?;
                // Each shard at the epoch its snapshot carries (writes
                // stamped lower would be refused).
                let shards = placement.into_iter().zip(&restored_stats).map(|(node, s)| ShardPlacement::at(node, s.epoch.max(1))).collect();
                // The indexes the snapshots carry (every shard's, in case
                // one was taken before an index was declared).
                let fields = shared_fields(&restored_stats);
                let c = Collection { name: name.clone(), spec, replication: Default::default(), shards, fields };
                match self.meta.create_collection(c).await {
                    Ok(_) | Err(MetaError::AlreadyExists(_)) => {}
                    Err(e) => return Err(Error::from(e).context(format!("restored {name}, but could not record it"))),
                }
            } else {
                self.discover().await;
            }
        }
        let restored = wanted.iter().filter_map(|s| of_id.get(s).cloned()).collect();
        let info = match self.describe(name.as_str(), None).await {
            Ok(info) => Some(info),
            Err(e) if e.code() == ErrorCode::NotFound => None,
            Err(e) => return Err(e),
        };
        Ok(v1::RestoreSnapshotResponse { collection: info, restored })
    }

    /// Snapshots and restores of a collection that are running.
    pub async fn snapshot_progress(&self, req: v1::GetSnapshotProgressRequest) -> Result<v1::SnapshotProgressResponse> {
        let name = CollectionName::parse(&req.collection)?;
        let view = self.meta.view();
        let replies = join_all(view.members.values().map(|m| async move {
            let client = self.client(&m.id)?;
            let r = self.on_node(&m.id, client.get_snapshot_progress(v1::SnapshotProgressRequest {}, Duration::from_secs(5))).await?;
            Ok::<_, Error>((m.id.clone(), r))
        }))
        .await;
        let mut running = Vec::new();
        for (id, r) in replies.into_iter().flatten() {
            running.extend(r.running.into_iter().filter(|p| p.collection == name.as_str()).map(|mut p| {
                p.node = id.to_string();
                p
            }));
        }
        running.sort_by_key(|p| p.shard);
        Ok(v1::SnapshotProgressResponse { running })
    }

    /// Calls `f` on members in order until one answers; errors that are the
    /// caller's (invalid, not found) come back at once.
    async fn ask_any_node<T, F, Fut>(&self, what: &str, f: F) -> Result<T>
    where
        F: Fn(crate::client::ShardClient) -> Fut,
        Fut: std::future::Future<Output = Result<T, ShoalError>>,
    {
        let mut last = None;
        for m in self.meta.view().members.values() {
            let client = self.client(&m.id)?;
            match self.on_node(&m.id, f(client)).await {
                Ok(v) => return Ok(v),
                Err(e) if matches!(e.code(), ErrorCode::InvalidArgument | ErrorCode::NotFound | ErrorCode::AlreadyExists) => {
                    return Err(e);
                }
                Err(e) => last = Some(e.context(format!("{what} on node {}", m.id))),
            }
        }
        Err(last.unwrap_or(Error::NoNodes))
    }
}

/// The field indexes every one of `stats` holds.
fn shared_fields(stats: &[v1::ShardStats]) -> Vec<shoal_control::model::FieldIndexSpec> {
    let of = |s: &v1::ShardStats| -> Vec<shoal_control::model::FieldIndexSpec> {
        s.field_indexes
            .iter()
            .filter_map(|f| {
                shoal_control::model::FieldIndexSpec::try_from(v1::FieldIndex { field: f.field.clone(), r#type: f.r#type }).ok()
            })
            .collect()
    };
    let mut fields = stats.first().map(of).unwrap_or_default();
    for s in stats.iter().skip(1) {
        let theirs = of(s);
        fields.retain(|f| theirs.contains(f));
    }
    fields
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn new_ids_are_valid_and_sort_by_time() {
        let a = new_id();
        check_id(&a).unwrap();
        assert_eq!(a.len(), "20261123T101010.000Z-00ff".len(), "{a}");
        assert!(a.starts_with("20"), "{a}");
        for bad in ["", "../x", "a/b", ".hidden"] {
            assert!(check_id(bad).is_err(), "{bad:?}");
        }
    }
}
