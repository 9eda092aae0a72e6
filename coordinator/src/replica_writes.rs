//! Writing one shard's part to its replicas (docs/replication.md): the
//! primary (first active replica) commits the part and returns its batch
//! log entry; every other active replica applies that entry, in the
//! primary's order. A replica that cannot follow leaves the in-sync set in
//! one conditional change *before* the write is acknowledged.

use shoal_control::model::{ReplicaState, ShardPlacement};
use shoal_proto::{CollectionName, ErrorCode, NodeId, v1};
use tokio::time::Instant;

use crate::cluster::Cluster;
use crate::error::{Error, Result};

/// Why a follower did not take an entry.
enum Missed {
    /// It is at a newer epoch than the write: this coordinator's view of
    /// the placement is behind (a move). Not the replica's fault.
    Stale,
    /// It failed, timed out or fell behind the primary's log.
    Failed(Error),
    /// The primary failed while the follower caught up from its log: the
    /// follower is not at fault (and may be the only copy left that
    /// answers), the primary is.
    PrimaryFailed(Error),
}

/// Errors that are the batch's, not a replica's: every replica would
/// refuse the same part, so none is dropped for it.
fn batch_fault(e: &Error) -> bool {
    matches!(e.code(), ErrorCode::InvalidArgument | ErrorCode::ResourceExhausted)
}

impl Cluster {
    /// Applies one shard's part on every active replica of `placement`
    /// (following the shard to a newer placement if a replica refuses the
    /// write's epoch). Returns the primary's answer once every replica
    /// still in sync holds the part.
    pub(crate) async fn apply_replicated(
        &self,
        collection: &CollectionName,
        shard: u32,
        mut placement: ShardPlacement,
        mut req: v1::ApplyBatchRequest,
        min_in_sync: u32,
        deadline: Instant,
    ) -> Result<v1::ApplyBatchResponse> {
        // What the first round's primary did: a later round (after a move)
        // finds the part applied and skips it, but the caller's answer is
        // that this write applied it.
        let mut first_answer: Option<v1::ApplyBatchResponse> = None;
        loop {
            let (primary, answer) = self.apply_on_primary(collection, shard, &mut placement, &mut req, min_in_sync, deadline).await?;
            let first = first_answer.get_or_insert_with(|| answer.clone()).clone();
            let followers: Vec<NodeId> = placement.in_sync_nodes().filter(|n| **n != primary).cloned().collect();
            if followers.is_empty() {
                return Ok(first);
            }
            // Applied: the followers need its entry. Skipped (a replay):
            // they need whatever the primary holds, which includes it.
            let target = if answer.seq > 0 { answer.seq } else { answer.last_seq };
            let (entry, epoch) = (&answer.entry, placement.epoch);
            let results = futures::future::join_all(followers.iter().map(|f| {
                let primary = &primary;
                async move { (f, self.follow(collection, shard, primary, f, entry.clone(), target, epoch, deadline).await) }
            }))
            .await;
            let mut failed = Vec::new();
            let mut first_error = None;
            let mut stale = None;
            let mut primary_failed = None;
            for (node, r) in results {
                match r {
                    Ok(()) => {}
                    Err(Missed::Stale) => stale = Some(node.clone()),
                    Err(Missed::Failed(e)) => {
                        tracing::warn!(%collection, shard, %node, error = %e, "a replica missed a write; it leaves the in-sync set");
                        failed.push(node.clone());
                        first_error.get_or_insert(e);
                    }
                    Err(Missed::PrimaryFailed(e)) => {
                        primary_failed.get_or_insert(e);
                    }
                }
            }
            if let Some(e) = primary_failed {
                // The primary committed the part and then failed before
                // every follower held it. It leaves the in-sync set (with
                // any follower that failed on its own), and the part is
                // applied again from the start on the next in-sync
                // replica, which orders it from then on: exactly once by
                // its offset, and no acknowledged batch lies only on the
                // node that failed.
                tracing::warn!(%collection, shard, node = %primary, error = %e, "the shard's primary failed while its replicas caught up; the next replica takes over");
                failed.push(primary.clone());
                placement = self.leave_in_sync(collection, shard, &failed, &e).await?;
                // The new primary takes the raised epoch with the part
                // (`moves::successor_epoch`).
                req.epoch = placement.epoch;
                continue;
            }
            if let Some(node) = stale {
                // A follower fenced by a move: once the move switches, the
                // part goes to the replicas of the new placement (the
                // primary skips it by its offset, or applies an unsourced
                // part again, which changes nothing).
                placement = self.follow_the_shard(collection, shard, &node, &placement, deadline).await?;
                req.epoch = placement.epoch;
                continue;
            }
            if let Some(e) = first_error {
                let now = self.leave_in_sync(collection, shard, &failed, &e).await?;
                check_in_sync(collection, shard, now.in_sync().count(), min_in_sync)
                    .map_err(|e| e.context("the part is on the replicas still in sync; retry the write"))?;
            }
            return Ok(first);
        }
    }

    /// Applies the part on the shard's primary: the first active replica
    /// that commits it. A replica refusing the write's epoch means the
    /// shard moved (the placement follows); one that fails leaves the
    /// in-sync set and the next one is tried.
    async fn apply_on_primary(
        &self,
        collection: &CollectionName,
        shard: u32,
        placement: &mut ShardPlacement,
        req: &mut v1::ApplyBatchRequest,
        min_in_sync: u32,
        deadline: Instant,
    ) -> Result<(NodeId, v1::ApplyBatchResponse)> {
        loop {
            let in_sync: Vec<NodeId> = placement.in_sync_nodes().cloned().collect();
            check_in_sync(collection, shard, in_sync.len(), min_in_sync)?;
            let primary = in_sync[0].clone();
            req.return_entry = in_sync.len() > 1;
            match self.apply_on(shard, &primary, req.clone(), deadline).await {
                Ok(a) => return Ok((primary, a)),
                Err(e) if e.code() == ErrorCode::FailedPrecondition => {
                    *placement = self.follow_the_shard(collection, shard, &primary, placement, deadline).await?;
                    req.epoch = placement.epoch;
                }
                Err(e) if batch_fault(&e) || in_sync.len() == 1 => return Err(e),
                Err(e) => {
                    // Whether the primary committed is unknown: it leaves
                    // the in-sync set and the next active replica orders.
                    tracing::warn!(%collection, shard, node = %primary, error = %e, "the shard's primary failed a write; the next replica takes over");
                    *placement = self.leave_in_sync(collection, shard, &[primary], &e).await?;
                    req.epoch = placement.epoch;
                }
            }
        }
    }

    async fn apply_on(&self, shard: u32, node: &NodeId, req: v1::ApplyBatchRequest, deadline: Instant) -> Result<v1::ApplyBatchResponse> {
        let timeout = deadline.saturating_duration_since(Instant::now());
        let client = self.client(node).map_err(|e| e.context(format!("shard {shard}")))?;
        let _tracked = self.outstanding().track(node);
        self.on_node(node, client.apply_batch(req, timeout)).await.map_err(|e| e.context(format!("shard {shard} on node {node}")))
    }

    /// Waits for a placement newer than `placement` after `node` refused a
    /// write for its epoch (FAILED_PRECONDITION): this coordinator's view
    /// is behind a move, so the part goes where the newer placement says,
    /// within the write's deadline. A refused write changed nothing (the
    /// epoch is checked before anything is applied), so sending the part
    /// again cannot apply it twice; a sourced part is exactly-once by its
    /// offset anyway.
    async fn follow_the_shard(
        &self,
        collection: &CollectionName,
        shard: u32,
        node: &NodeId,
        placement: &ShardPlacement,
        deadline: Instant,
    ) -> Result<ShardPlacement> {
        tracing::info!(%collection, shard, %node, epoch = placement.epoch, "shard refused a write with an older epoch; waiting for its new placement");
        self.newer_placement(collection, shard, placement.epoch, deadline).await.map_err(|_| Error::ShardMoving {
            collection: collection.clone(),
            shard,
            node: node.clone(),
            epoch: placement.epoch,
        })
    }

    /// Brings `follower` up to entry `target` of the primary's log: the
    /// entry itself if the follower is right behind it, else what it lacks
    /// read from the primary's log (another coordinator's entry came first,
    /// or a replay found the batch applied on the primary only).
    #[allow(clippy::too_many_arguments)]
    async fn follow(
        &self,
        collection: &CollectionName,
        shard: u32,
        primary: &NodeId,
        follower: &NodeId,
        entry: Option<v1::LogEntry>,
        target: u64,
        epoch: u64,
        deadline: Instant,
    ) -> Result<(), Missed> {
        let id = Some(v1::ShardId { collection: collection.to_string(), shard });
        let failed = |e: Error| Missed::Failed(e.context(format!("replica on {follower}")));
        let to = self.client(follower).map_err(failed)?;
        let left = || deadline.saturating_duration_since(Instant::now());
        let _tracked = self.outstanding().track(follower);
        if let Some(entry) = entry {
            let req = v1::ApplyLogEntriesRequest { shard: id.clone(), epoch, entries: vec![entry] };
            match self.on_node(follower, to.apply_log_entries(req, left())).await {
                Ok(a) if a.last_seq >= target => return Ok(()),
                Ok(_) => {}
                // A gap or an epoch: the follower's stats say which.
                Err(e) if e.code() == ErrorCode::FailedPrecondition => {}
                Err(e) => return Err(failed(e)),
            }
        }
        let primary_failed = |e: Error| Missed::PrimaryFailed(e.context(format!("reading the batch log of the primary {primary}")));
        let from = self.client(primary).map_err(primary_failed)?;
        loop {
            let stats =
                self.on_node(follower, to.get_shard_stats(v1::ShardStatsRequest { shard: id.clone() }, left())).await.map_err(failed)?;
            if stats.epoch > epoch {
                tracing::info!(%collection, shard, %follower, at = stats.epoch, epoch, "a replica is at a newer epoch than the write");
                return Err(Missed::Stale);
            }
            if stats.last_seq >= target {
                return Ok(());
            }
            let read = v1::ReadBatchLogRequest { shard: id.clone(), from_seq: stats.last_seq + 1, max_bytes: 0 };
            // The primary's log no longer reaching back that far is the
            // follower's problem (it needs a new seed), so it fails it;
            // the primary not answering is the primary's.
            let read = match self.on_node(primary, from.read_batch_log(read, left())).await {
                Ok(read) => read,
                Err(e) if matches!(e.code(), ErrorCode::Unavailable | ErrorCode::DeadlineExceeded) => return Err(primary_failed(e)),
                Err(e) => return Err(failed(e)),
            };
            if read.entries.is_empty() {
                return Err(failed(Error::Internal(format!(
                    "the primary {primary} has no entries after {} though the write took {target}",
                    stats.last_seq
                ))));
            }
            let req = v1::ApplyLogEntriesRequest { shard: id.clone(), epoch, entries: read.entries };
            self.on_node(follower, to.apply_log_entries(req, left())).await.map_err(failed)?;
        }
    }

    /// Marks the replicas on `nodes` dead in one conditional change and
    /// returns the placement after it. Never drops the last active
    /// replica: then the write is refused instead.
    pub(crate) async fn leave_in_sync(
        &self,
        collection: &CollectionName,
        shard: u32,
        nodes: &[NodeId],
        why: &Error,
    ) -> Result<ShardPlacement> {
        let changed = self
            .change_shard(collection, shard, |p, _| {
                let mut next = p.clone();
                let mut changed = false;
                for r in next.replicas.iter_mut().filter(|r| nodes.contains(&r.node) && r.state == ReplicaState::Active) {
                    r.state = ReplicaState::Dead;
                    changed = true;
                }
                if next.in_sync().next().is_none() {
                    return Err(Error::TooFewInSync { collection: collection.clone(), shard, in_sync: 0, min: 1 });
                }
                Ok(changed.then_some(next))
            })
            .await
            .map_err(|e| {
                e.context(format!(
                    "shard {shard}: could not drop {} from the in-sync replicas after: {why}; the write is not acknowledged, retry it",
                    nodes.iter().map(NodeId::as_str).collect::<Vec<_>>().join(", ")
                ))
            })?;
        if let Some(p) = changed {
            tracing::warn!(%collection, shard, nodes = ?nodes.iter().map(NodeId::as_str).collect::<Vec<_>>(), "replicas left the in-sync set");
            return Ok(p);
        }
        // Someone else marked them already.
        let view = self.meta.view();
        view.collection(collection)
            .and_then(|c| c.value.shards.get(shard as usize).cloned())
            .ok_or_else(|| Error::CollectionNotFound(collection.clone()))
    }
}

fn check_in_sync(collection: &CollectionName, shard: u32, in_sync: usize, min: u32) -> Result<()> {
    if in_sync == 0 || (in_sync as u32) < min {
        return Err(Error::TooFewInSync { collection: collection.clone(), shard, in_sync: in_sync as u32, min });
    }
    Ok(())
}
