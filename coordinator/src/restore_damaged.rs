//! A shard whose only in-sync copy is damaged, with no replica to seed it
//! from: the controller restores it from the shard's newest snapshot, as
//! the runbook does (docs/runbooks/a-copy-is-damaged.md), and says which
//! points may be older. A snapshot is older than the copy it replaces, so
//! the points written to the shard after it are older or missing until
//! the ingest sources replay from the offsets the snapshot holds (their
//! per-source offsets make the replay exactly-once): the log names each.
//! Serving those points older is what a restore always means; serving
//! nothing (DATA_LOSS) until an operator acts is what `restore_damaged =
//! false` keeps.

use std::sync::OnceLock;

use opentelemetry::KeyValue;
use opentelemetry::metrics::Counter;
use shoal_proto::{CollectionName, NodeId, v1};

use crate::cluster::Cluster;

impl Cluster {
    /// Restores shard `shard` of `name`, whose only in-sync copy (on
    /// `node`) is damaged, from its newest readable snapshot. Failures are
    /// logged; the next reclaim pass finds the copy damaged again and
    /// tries again.
    pub(crate) async fn restore_damaged(&self, name: &CollectionName, shard: u32, node: &NodeId) {
        let listed = match self.list_snapshots(v1::ListSnapshotsRequest { collection: name.to_string(), shard: Some(shard) }).await {
            Ok(l) => l,
            Err(e) => {
                tracing::error!(collection = %name, shard, %node, error = %e, "cannot list the damaged shard's snapshots; trying again on the next pass");
                return;
            }
        };
        let newest = listed
            .snapshots
            .iter()
            .filter(|s| s.shard == shard && s.error.is_empty())
            .max_by(|a, b| a.created_at.cmp(&b.created_at).then_with(|| a.id.cmp(&b.id)));
        let Some(snapshot) = newest else {
            tracing::error!(
                collection = %name, shard, %node,
                "the only in-sync copy of a shard is damaged and it has no snapshot: it answers DATA_LOSS; \
                 re-ingest it, or drop the collection (docs/runbooks/a-copy-is-damaged.md)"
            );
            return;
        };
        let req = v1::RestoreSnapshotRequest {
            collection: name.to_string(),
            snapshot_id: snapshot.id.clone(),
            shard: Some(shard),
            replace: true,
        };
        match self.restore_snapshot(req).await {
            Ok(r) => {
                let offsets: Vec<String> = r
                    .restored
                    .iter()
                    .filter(|s| s.shard == shard)
                    .flat_map(|s| s.offsets.iter().map(|o| format!("{}@{}", o.source, o.offset)))
                    .collect();
                restored().add(1, &[KeyValue::new("node", node.to_string())]);
                tracing::warn!(
                    collection = %name, shard, %node, snapshot = %snapshot.id, taken_at = %snapshot.created_at,
                    offsets = %offsets.join(", "), points = snapshot.points,
                    "the only in-sync copy of a shard was damaged and is restored from its newest snapshot: points written \
                     to it after the snapshot are older or missing until each ingest source replays from its offset here"
                );
            }
            Err(e) => tracing::error!(
                collection = %name, shard, %node, snapshot = %snapshot.id, error = %e,
                "restoring a damaged shard from its snapshot failed; trying again on the next pass"
            ),
        }
    }
}

fn restored() -> &'static Counter<u64> {
    static C: OnceLock<Counter<u64>> = OnceLock::new();
    C.get_or_init(|| {
        opentelemetry::global::meter("shoal")
            .u64_counter("shoal.damaged.restored")
            .with_description("Shards whose only in-sync copy was damaged, restored by the controller from their newest snapshot, by node")
            .build()
    })
}
