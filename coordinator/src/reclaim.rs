//! Giving back the disk of shard copies that no placement names.
//!
//! Copies are left behind when a drop could not reach their node: a node
//! that was away while its copies were repaired on others comes back with
//! the old ones, a collection was dropped while one of its nodes was down,
//! a create or a restore died half-way. The controller lists every
//! member's shards now and then, and drops a copy once it has seen the
//! same copy (by its id, `ShardStats.copy`) orphaned for `reclaim_after`.
//!
//! Waiting out `reclaim_after` covers the operations that make a copy
//! before the store names it (a create records its collection last, a
//! recovery switches the placement after its restore); the copy id makes
//! the drop miss any copy made since the last look. Only a store that is
//! the record of the placement (etcd) allows this: without one, the
//! coordinator learns collections from the shards the nodes list, and a
//! copy it has not adopted is not garbage.
//!
//! The drops that placement changes decide (a move rolled back, a copy
//! out of sync or over the factor taken out) name the copy they read
//! before the change, for the same reason (`drop_copy`).
//!
//! The same look finds the copies a node no longer serves because they
//! are damaged (its scrub found a value that fails its checksum): a copy
//! the placement still counts in sync leaves the in-sync set, and the
//! repair then seeds it anew from the primary (`repair::Work::Rejoin`).

use std::collections::HashMap;
use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::metrics::Counter;

use shoal_control::metadata::View;
use shoal_control::model::ReplicaState;
use shoal_proto::{CollectionName, ErrorCode, NodeId, ShoalError, v1};
use tokio::time::Instant;

use crate::cluster::Cluster;
use crate::error::Error;

/// How long a call of the pass may take on one node.
const CALL_TIMEOUT: Duration = Duration::from_secs(10);

/// Whether the placement in `view` leaves the copy of `shard` of
/// `collection` on `node` without a use: no replica there, no move from
/// or to there, or no such collection or shard at all.
pub(crate) fn orphaned(view: &View, node: &NodeId, collection: &CollectionName, shard: u32) -> bool {
    let Some(c) = view.collection(collection) else { return true };
    let Some(p) = c.value.shards.get(shard as usize) else { return true };
    let moving_here = p.moving.as_ref().is_some_and(|m| &m.from == node || &m.to == node);
    !p.holds(node) && !moving_here
}

/// Orphaned copies seen so far: the copy id and when it was first seen.
#[derive(Debug, Default)]
pub(crate) struct Orphans {
    seen: HashMap<(NodeId, CollectionName, u32), (u64, Instant)>,
}

impl Orphans {
    /// Records what one look at `node` found orphaned (`found`: shard and
    /// copy id) and returns the copies seen orphaned, unchanged, for at
    /// least `after`. Copies of `node` not in `found` are forgotten.
    pub(crate) fn update(
        &mut self,
        node: &NodeId,
        found: &[(CollectionName, u32, u64)],
        now: Instant,
        after: Duration,
    ) -> Vec<(CollectionName, u32, u64)> {
        self.seen.retain(|(n, c, s), (copy, _)| n != node || found.iter().any(|f| (&f.0, f.1, f.2) == (c, *s, *copy)));
        let mut due = Vec::new();
        for (c, s, copy) in found {
            let key = (node.clone(), c.clone(), *s);
            let (_, since) = self.seen.entry(key).or_insert((*copy, now));
            if now.saturating_duration_since(*since) >= after {
                due.push((c.clone(), *s, *copy));
            }
        }
        due
    }

    pub(crate) fn forget_node(&mut self, node: &NodeId) {
        self.seen.retain(|(n, _, _), _| n != node);
    }
}

impl Cluster {
    /// Which copy of `shard` `node` holds, read before a change of the
    /// placement decides to drop it; `None` if the node does not answer or
    /// does not hold it.
    pub(crate) async fn copy_on(&self, node: &NodeId, name: &CollectionName, shard: u32) -> Option<u64> {
        let client = self.client(node).ok()?;
        let req = v1::ShardStatsRequest { shard: Some(v1::ShardId { collection: name.to_string(), shard }) };
        self.on_node(node, client.get_shard_stats(req, CALL_TIMEOUT)).await.ok().map(|s| s.copy)
    }

    /// Drops copy `copy` of `shard` on `node`, and no copy made there
    /// since. What cannot be dropped now is logged; the reclaim pass gives
    /// its disk back later. `what` says which copy it is, for the log.
    /// True if the copy was dropped.
    pub(crate) async fn drop_copy(&self, node: &NodeId, name: &CollectionName, shard: u32, copy: Option<u64>, what: &str) -> bool {
        let Some(copy) = copy else {
            tracing::info!(collection = %name, shard, %node, "{what}: the node did not say which copy it holds; the reclaim pass drops it later if it is there");
            return false;
        };
        let client = match self.client(node) {
            Ok(c) => c,
            Err(e) => {
                tracing::warn!(collection = %name, shard, %node, error = %e, "{what}: the node is gone; the reclaim pass drops the copy once it is back");
                return false;
            }
        };
        let req = v1::DropShardRequest { shard: Some(v1::ShardId { collection: name.to_string(), shard }), copy };
        match self.on_node(node, client.drop_shard(req, Duration::from_secs(30))).await {
            Ok(_) => true,
            Err(e) if e.code() == ErrorCode::NotFound => false,
            Err(e) if e.code() == ErrorCode::FailedPrecondition => {
                tracing::info!(collection = %name, shard, %node, error = %e, "{what}: a newer copy is there now and is kept");
                false
            }
            Err(e) => {
                tracing::warn!(collection = %name, shard, %node, error = %e, "{what}: could not drop it; the reclaim pass tries again later");
                false
            }
        }
    }

    /// One look at every member: records the orphaned copies each holds
    /// and drops those orphaned for `after`. Returns how many it dropped.
    pub(crate) async fn reclaim_pass(&self, orphans: &mut Orphans, after: Duration) -> usize {
        let view = self.meta.view();
        let mut dropped = 0;
        for node in view.members.keys() {
            let listed = match self.client(node) {
                Ok(client) => self.on_node(node, client.list_shards(v1::ListShardsRequest {}, CALL_TIMEOUT)).await,
                Err(e) => Err(e),
            };
            let Ok(listed) = listed else {
                // Unknown is not orphaned: start again when it answers.
                orphans.forget_node(node);
                continue;
            };
            for d in &listed.damaged {
                self.leave_damaged(&view, node, d).await;
            }
            let found: Vec<(CollectionName, u32, u64)> = listed
                .shards
                .iter()
                .filter_map(|s| {
                    let id = s.shard.as_ref()?;
                    let name = CollectionName::parse(&id.collection).ok()?;
                    orphaned(&view, node, &name, id.shard).then_some((name, id.shard, s.copy))
                })
                .collect();
            for (name, shard, copy) in orphans.update(node, &found, Instant::now(), after) {
                // The view of the pass may be old by now: ask the newest.
                if !orphaned(&self.meta.view(), node, &name, shard) {
                    continue;
                }
                let bytes = listed.shards.iter().find(|s| s.copy == copy).map_or(0, |s| s.disk_bytes);
                tracing::info!(collection = %name, shard, %node, copy = %format!("{copy:016x}"), bytes, "reclaiming a copy no placement names");
                if self.drop_copy(node, &name, shard, Some(copy), "reclaiming a copy no placement names").await {
                    reclaimed().add(1, &[KeyValue::new("node", node.to_string())]);
                    reclaimed_bytes().add(bytes, &[KeyValue::new("node", node.to_string())]);
                    dropped += 1;
                }
            }
        }
        dropped
    }
}

impl Cluster {
    /// Takes the damaged copy `d` on `node` out of the in-sync set if the
    /// placement in `view` still counts it there. The last in-sync copy
    /// stays: it is restored from the shard's newest snapshot
    /// (`restore_damaged`), or by hand (`snapshot restore`) when that is off.
    async fn leave_damaged(&self, view: &View, node: &NodeId, d: &v1::DamagedShard) {
        let Some((name, shard)) = d.shard.as_ref().and_then(|id| Some((CollectionName::parse(&id.collection).ok()?, id.shard))) else {
            return;
        };
        let placement = view.collection(&name).and_then(|c| c.value.shards.get(shard as usize));
        let in_sync = placement.and_then(|p| p.replica(node)).map(|r| r.state == ReplicaState::Active);
        if in_sync != Some(true) {
            return;
        }
        // The only copy in sync: nothing to seed it from, and taking it out
        // of the set is refused (a shard keeps one).
        if self.options().restore_damaged && placement.is_some_and(|p| p.in_sync().count() == 1) {
            tracing::warn!(collection = %name, shard, %node, reason = %d.reason, "the only in-sync copy of a shard is damaged");
            self.restore_damaged(&name, shard, node).await;
            return;
        }
        let why = Error::Remote(ShoalError::new(ErrorCode::DataLoss, format!("the copy on {node} is damaged: {}", d.reason)));
        match self.leave_in_sync(&name, shard, std::slice::from_ref(node), &why).await {
            Ok(_) => {
                damaged_left().add(1, &[KeyValue::new("node", node.to_string())]);
                tracing::warn!(collection = %name, shard, %node, reason = %d.reason, "a damaged copy left the in-sync set; repair seeds it anew from the primary");
            }
            Err(e) => tracing::error!(
                collection = %name, shard, %node, reason = %d.reason, error = %e,
                "the only in-sync copy of a shard is damaged: restore it from a snapshot (docs/runbooks/a-copy-is-damaged.md)"
            ),
        }
    }
}

fn damaged_left() -> &'static Counter<u64> {
    static C: OnceLock<Counter<u64>> = OnceLock::new();
    C.get_or_init(|| {
        opentelemetry::global::meter("shoal")
            .u64_counter("shoal.damaged.copies")
            .with_description("Damaged shard copies the controller took out of the in-sync set to be seeded anew, by node")
            .build()
    })
}

fn reclaimed() -> &'static Counter<u64> {
    static C: OnceLock<Counter<u64>> = OnceLock::new();
    C.get_or_init(|| {
        opentelemetry::global::meter("shoal")
            .u64_counter("shoal.reclaimed.copies")
            .with_description("Shard copies no placement named, dropped by the controller, by node")
            .build()
    })
}

fn reclaimed_bytes() -> &'static Counter<u64> {
    static C: OnceLock<Counter<u64>> = OnceLock::new();
    C.get_or_init(|| {
        opentelemetry::global::meter("shoal")
            .u64_counter("shoal.reclaimed.bytes")
            .with_description("Disk bytes of the shard copies the controller reclaimed, by node")
            .build()
    })
}

/// The controller's reclaim loop, while it leads: a pass every quarter of
/// `after`, between 1 and 10 s (damaged copies are found by the same
/// pass, and should not wait long).
pub(crate) async fn run(cluster: std::sync::Arc<Cluster>) {
    let Some(after) = cluster.options().reclaim_after else {
        return std::future::pending().await;
    };
    let every = (after / 4).clamp(Duration::from_secs(1), Duration::from_secs(10));
    let mut orphans = Orphans::default();
    // The first pass soon after the lead is won: a damaged copy found
    // while the controller changed must not wait a whole interval again
    // (a chaos run, killing the controller every few seconds, left one
    // unrepaired for minutes). Early is safe: a pass only notes orphans,
    // and drops one only once it has seen it so for `after`.
    let mut wait = every.min(Duration::from_secs(1));
    loop {
        tokio::time::sleep(wait).await;
        cluster.reclaim_pass(&mut orphans, after).await;
        wait = every;
    }
}

#[cfg(test)]
mod tests {
    use shoal_control::metadata::Versioned;
    use shoal_control::model::{Collection, CollectionSpec, Metric, MoveKind, MovePhase, ShardMove, ShardPlacement};

    use super::*;

    fn node(n: &str) -> NodeId {
        NodeId::parse(n).unwrap()
    }

    fn name(n: &str) -> CollectionName {
        CollectionName::parse(n).unwrap()
    }

    fn view(shards: Vec<ShardPlacement>) -> View {
        let spec = CollectionSpec { dimension: 4, metric: Metric::Dot, index: Default::default(), shard_count: shards.len() as u32 };
        let c = Collection { name: name("docs"), spec, replication: Default::default(), shards, fields: Vec::new() };
        let mut v = View::default();
        v.collections.insert(name("docs"), Versioned { value: c, revision: 1 });
        v
    }

    #[test]
    fn a_copy_is_orphaned_only_where_no_replica_and_no_move_needs_it() {
        let mut moving = ShardPlacement::at(node("a"), 1);
        moving.moving = Some(ShardMove { from: node("a"), to: node("b"), phase: MovePhase::Copying, attempt: 1, kind: MoveKind::Move });
        let v = view(vec![ShardPlacement::on_all(vec![node("a"), node("b")], 1), moving]);
        let docs = name("docs");
        assert!(!orphaned(&v, &node("a"), &docs, 0));
        assert!(!orphaned(&v, &node("b"), &docs, 0));
        assert!(orphaned(&v, &node("c"), &docs, 0), "no replica on c");
        assert!(!orphaned(&v, &node("b"), &docs, 1), "the target of a move");
        assert!(orphaned(&v, &node("c"), &docs, 1));
        assert!(orphaned(&v, &node("a"), &docs, 2), "no such shard");
        assert!(orphaned(&v, &node("a"), &name("gone"), 0), "no such collection");
    }

    #[test]
    fn only_the_same_copy_seen_orphaned_for_long_enough_is_due() {
        let (n, docs, after) = (node("a"), name("docs"), Duration::from_secs(10));
        let t0 = Instant::now();
        let mut o = Orphans::default();
        assert!(o.update(&n, &[(docs.clone(), 0, 7)], t0, after).is_empty(), "first seen");
        assert!(o.update(&n, &[(docs.clone(), 0, 7)], t0 + Duration::from_secs(5), after).is_empty());
        assert_eq!(o.update(&n, &[(docs.clone(), 0, 7)], t0 + after, after), vec![(docs.clone(), 0, 7)]);
        // Another copy of the same shard starts the wait again.
        assert!(o.update(&n, &[(docs.clone(), 0, 8)], t0 + after, after).is_empty());
        assert!(o.update(&n, &[(docs.clone(), 0, 8)], t0 + after + Duration::from_secs(9), after).is_empty());
        // Named again in between (not found orphaned): forgotten.
        assert!(o.update(&n, &[], t0 + after * 2, after).is_empty());
        assert!(o.update(&n, &[(docs.clone(), 0, 8)], t0 + after * 3, after).is_empty(), "seen anew");
        // Other nodes are apart.
        assert!(o.update(&node("b"), &[(docs.clone(), 0, 8)], t0 + after * 4, after).is_empty());
        assert_eq!(o.update(&n, &[(docs.clone(), 0, 8)], t0 + after * 4, after), vec![(docs, 0, 8)]);
    }
}
