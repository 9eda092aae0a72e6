//! Bringing back the shards of a node that is gone. A move copies from a
//! live source; when the source is dead, the newest copy left is the
//! shard's last snapshot in the shared store. `RecoverShard` restores it on
//! a serving node and makes that node the owner in one conditional change
//! that bumps the epoch, so the dead node, should it come back, can never
//! be written to again (every write carries the new epoch). What the shard
//! took after the snapshot is replayed by the ingest jobs from
//! `GetOffsets`, which now answers with the snapshot's offsets.
//!
//! It runs on the coordinator that takes the request, not the controller:
//! it is one restore and one conditional change, and two recoveries of the
//! same shard cannot both win the change.

use std::time::Duration;

use shoal_control::metadata::place;
use shoal_control::model::ShardPlacement;
use shoal_proto::{CollectionName, NodeId, v1};

use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::moves::check_target;
use crate::snapshots::check_id;

/// A restore moves a whole shard; it gets hours, not a search's seconds.
const RESTORE_TIMEOUT: Duration = Duration::from_secs(6 * 3600);

impl Cluster {
    pub async fn recover_shard(&self, req: v1::RecoverShardRequest) -> Result<v1::RecoverShardResponse> {
        let v1::RecoverShardRequest { collection, shard, to_node, snapshot_id } = req;
        let name = CollectionName::parse(&collection)?;
        if !snapshot_id.is_empty() {
            check_id(&snapshot_id)?;
        }
        let (dead, placed_epoch, to) = self.recovery_plan(&name, shard, &to_node)?;
        let snapshot = self.snapshot_to_recover(&name, shard, &snapshot_id).await?;

        let id = Some(v1::ShardId { collection: name.to_string(), shard });
        let client = self.client(&to)?;
        let restore = v1::RestoreShardRequest { shard: id.clone(), snapshot_id: snapshot.id.clone(), replace: true };
        tracing::info!(collection = %name, shard, from = %dead, to = %to, snapshot = %snapshot.id, "shard recovery: restoring");
        let restored = self
            .on_node(&to, client.restore_shard(restore, RESTORE_TIMEOUT))
            .await
            .map_err(|e| e.context(format!("restoring snapshot {} of shard {shard} of {name} on {to}", snapshot.id)))?;
        // Above every epoch the shard had: a write stamped for the dead
        // node's copy, or the snapshot's, is refused by the new one.
        let epoch = placed_epoch.max(restored.epoch) + 1;
        let fenced = self
            .on_node(&to, client.fence_shard(v1::FenceShardRequest { shard: id.clone(), epoch }, Duration::from_secs(60)))
            .await
            .map_err(|e| e.context(format!("raising the epoch of the restored copy on {to}")));
        let switched = async {
            fenced.as_ref().map_err(Clone::clone)?;
            self.change_shard(&name, shard, |p, view| {
                if *p.node() != dead || p.moving.is_some() {
                    return Err(Error::Aborted(format!(
                        "shard {shard} of {name} was placed elsewhere while it was restored (now on {})",
                        p.node()
                    )));
                }
                if view.member(&dead).is_some() {
                    return Err(Error::Aborted(format!(
                        "node {dead} came back while shard {shard} of {name} was restored; it still holds the shard"
                    )));
                }
                Ok(Some(ShardPlacement::at(to.clone(), epoch)))
            })
            .await
        }
        .await;
        if let Err(e) = switched {
            // Drop the copy only if the store surely did not take the
            // switch: it refused it (the placement changed, or kept
            // changing), or it was never asked. Any other error may hide a
            // switch that was recorded although its answer was lost; the
            // copy is then the shard's, and an unnamed copy only takes disk.
            let refused = fenced.is_err() || matches!(e, Error::Aborted(_) | Error::Contended { .. });
            // Nor if another recovery to the same node won.
            let won = self.collection(name.as_str()).ok().and_then(|c| c.shards.get(shard as usize).map(|p| p.holds(&to)));
            if !refused {
                tracing::warn!(collection = %name, shard, node = %to, error = %e, "the switch to a restored copy may have been recorded; the copy is kept");
            } else if won != Some(true) {
                let drop = v1::DropShardRequest { shard: id, copy: restored.copy };
                if let Err(d) = self.on_node(&to, client.drop_shard(drop, Duration::from_secs(60))).await {
                    tracing::warn!(collection = %name, shard, node = %to, error = %d, "could not drop a restored copy no placement names");
                }
            }
            return Err(e);
        }
        tracing::info!(
            collection = %name, shard, from = %dead, to = %to, epoch, snapshot = %snapshot.id, points = restored.points,
            "shard recovered from its snapshot"
        );
        let info = self.describe(name.as_str(), None).await?;
        let shard_info = info.shards.into_iter().find(|s| s.shard == shard);
        Ok(v1::RecoverShardResponse { shard: shard_info, from_node: dead.to_string(), snapshot: Some(snapshot) })
    }

    /// Checks the request against the view: the shard's node must be gone
    /// and no move recorded; picks the target. Returns the dead node, the
    /// placement's epoch and the target.
    fn recovery_plan(&self, name: &CollectionName, shard: u32, to_node: &str) -> Result<(NodeId, u64, NodeId)> {
        let view = self.meta.view();
        let c = view.collection(name).ok_or_else(|| Error::CollectionNotFound(name.clone()))?;
        let p = c.value.shards.get(shard as usize).ok_or_else(|| Error::NoSuchShard {
            collection: name.clone(),
            shard,
            shards: c.value.shard_count(),
        })?;
        let dead = p.node().clone();
        if view.member(&dead).is_some() {
            return Err(Error::Precondition(format!(
                "node {dead}, which holds shard {shard} of {name}, is a member: recovering from a snapshot would lose what it took \
                 since; move the shard instead (`shoalctl shard move {name}/{shard}`), or, if the node died, wait until its \
                 lease ends and it leaves `shoalctl node list`"
            )));
        }
        if let Some(m) = &p.moving {
            return Err(Error::Precondition(format!(
                "a move of shard {shard} of {name} to {} is recorded; the controller rolls it back once it finds {dead} gone \
                 (see `shoalctl status`); recover it after that",
                m.to
            )));
        }
        let to = match to_node {
            "" => {
                let candidates = view.placeable().filter(|m| m.id != dead);
                place(1, candidates, view.collections.values().map(|v| &v.value))
                    .pop()
                    .ok_or_else(|| Error::Precondition(format!("no serving node can take shard {shard} of {name}; add or undrain one")))?
            }
            t => {
                let t = NodeId::parse(t)?;
                check_target(&view, &t)?;
                t
            }
        };
        Ok((dead, p.epoch, to))
    }

    /// The snapshot `id` of the shard, or its latest one that is whole.
    async fn snapshot_to_recover(&self, name: &CollectionName, shard: u32, id: &str) -> Result<v1::SnapshotInfo> {
        let listed = self.list_snapshots(v1::ListSnapshotsRequest { collection: name.to_string(), shard: Some(shard) }).await?;
        let mut usable = listed.snapshots.into_iter().filter(|s| s.shard == shard);
        let found = match id {
            "" => usable.filter(|s| s.error.is_empty()).max_by(|a, b| a.id.cmp(&b.id)),
            id => usable.find(|s| s.id == id),
        };
        match found {
            Some(s) if !s.error.is_empty() => {
                Err(Error::Invalid(format!("snapshot {} of shard {shard} of {name} cannot be restored: {}", s.id, s.error)))
            }
            Some(s) => Ok(s),
            None if id.is_empty() => Err(Error::Precondition(format!(
                "shard {shard} of {name} has no snapshot to recover from; its data is only on its node's disk: \
                 bring the node back (its shards serve again when it registers)"
            ))),
            None => Err(Error::NotFound(format!("shard {shard} of {name} has no snapshot {id}"))),
        }
    }
}
