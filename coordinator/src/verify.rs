//! `VerifyShard`: do the replicas of a shard hold the same points? Each
//! replica digests its points and offsets from one commit
//! (`DigestShard`); the active ones must agree. A replica out of sync may
//! differ, and is shown so an operator sees how far.

use std::time::Duration;

use shoal_control::model::ReplicaState;
use shoal_proto::{CollectionName, NodeId, v1};

use crate::cluster::Cluster;
use crate::error::{Error, Result};

/// A digest reads every point: minutes for millions on a network disk.
const DIGEST_TIMEOUT: Duration = Duration::from_secs(600);

impl Cluster {
    pub async fn verify_shard(&self, req: v1::VerifyShardRequest) -> Result<v1::VerifyShardResponse> {
        let c = self.collection(&req.collection)?;
        let p = c.shards.get(req.shard as usize).ok_or_else(|| Error::NoSuchShard {
            collection: c.name.clone(),
            shard: req.shard,
            shards: c.shard_count(),
        })?;
        let id = Some(v1::ShardId { collection: c.name.to_string(), shard: req.shard });
        let replicas = futures::future::join_all(p.replicas.iter().map(|r| {
            let id = id.clone();
            async move {
                let mut out = v1::ReplicaDigest { node: r.node.to_string(), state: r.state.as_str().to_owned(), ..Default::default() };
                let answer = match self.client(&r.node) {
                    Ok(client) => self.on_node(&r.node, client.digest_shard(v1::DigestShardRequest { shard: id }, DIGEST_TIMEOUT)).await,
                    Err(e) => Err(e),
                };
                match answer {
                    Ok(d) => {
                        out.points = d.points;
                        out.digest = d.digest;
                        out.offsets = d.offsets;
                        out.last_seq = d.last_seq;
                        out.index_mismatches = d.index_mismatches;
                    }
                    Err(e) => out.error = e.to_string(),
                }
                out
            }
        }))
        .await;
        Ok(v1::VerifyShardResponse { agree: active_agree(&replicas), replicas })
    }
}

impl Cluster {
    /// Marks one replica that is not the primary dead, so the controller
    /// re-seeds it from the primary (`repair.rs`, a rejoin).
    pub async fn resync_replica(&self, req: v1::ResyncReplicaRequest, caller: Option<Duration>) -> Result<v1::CollectionInfo> {
        let v1::ResyncReplicaRequest { collection, shard, node, wait } = req;
        let name = CollectionName::parse(&collection)?;
        let node = NodeId::parse(&node)?;
        self.change_shard(&name, shard, |p, _| {
            if p.moving.is_some() {
                return Err(Error::Precondition(format!("shard {shard} of {name} is moving; resync once the move ended")));
            }
            match p.replica(&node) {
                None => Err(Error::Invalid(format!("node {node} holds no copy of shard {shard} of {name}"))),
                Some(_) if p.node() == &node => Err(Error::Precondition(format!(
                    "{node} holds the primary of shard {shard} of {name}, which the others are copied from; \
                     resync the others, or move the primary away (shard move --from {node}) and resync it then"
                ))),
                Some(r) if r.state != ReplicaState::Active => Ok(None),
                Some(_) => {
                    let mut next = p.clone();
                    for r in next.replicas.iter_mut().filter(|r| r.node == node) {
                        r.state = ReplicaState::Dead;
                    }
                    Ok(Some(next))
                }
            }
        })
        .await?;
        tracing::warn!(collection = %name, shard, %node, "replica taken out of the in-sync set by request: it is seeded anew from the primary");
        if wait {
            let limit = caller.unwrap_or(Duration::from_secs(3600));
            let back = |view: &shoal_control::metadata::View| {
                view.collection(&name)
                    .and_then(|c| c.value.shards.get(shard as usize))
                    .is_none_or(|p| p.moving.is_none() && p.replica(&node).is_none_or(|r| r.state == ReplicaState::Active))
            };
            if self.wait_for_view(limit, back).await.is_err() {
                return Err(Error::Deadline(format!(
                    "the replica of shard {shard} of {name} on {node} is not in sync after {limit:?}; the controller goes on \
                     (see `shoalctl status`)"
                )));
            }
        }
        self.describe(name.as_str(), caller).await
    }
}

/// Every active replica answered, with one digest and one set of offsets,
/// and field indexes that agree with its payloads.
fn active_agree(replicas: &[v1::ReplicaDigest]) -> bool {
    let mut active = replicas.iter().filter(|r| r.state == "active");
    let Some(first) = active.next() else { return false };
    let healthy = |r: &v1::ReplicaDigest| r.error.is_empty() && r.index_mismatches == 0;
    healthy(first) && active.all(|r| healthy(r) && r.digest == first.digest && r.offsets == first.offsets)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn replica(state: &str, digest: &str, offset: u64, error: &str) -> v1::ReplicaDigest {
        v1::ReplicaDigest {
            state: state.into(),
            digest: digest.into(),
            offsets: vec![v1::SourceOffset { source: "job".into(), offset }],
            error: error.into(),
            ..Default::default()
        }
    }

    #[test]
    fn only_active_replicas_must_agree_and_all_must_answer() {
        assert!(active_agree(&[replica("active", "a", 1, ""), replica("active", "a", 1, "")]));
        assert!(active_agree(&[replica("active", "a", 1, ""), replica("dead", "b", 0, "")]));
        assert!(!active_agree(&[replica("active", "a", 1, ""), replica("active", "b", 1, "")]));
        assert!(!active_agree(&[replica("active", "a", 1, ""), replica("active", "a", 2, "")]));
        assert!(!active_agree(&[replica("active", "a", 1, ""), replica("active", "", 0, "node n1 went down")]));
        assert!(!active_agree(&[replica("dead", "a", 1, "")]));
        // Damaged field indexes fail the check even on one copy.
        let damaged = v1::ReplicaDigest { index_mismatches: 3, ..replica("active", "a", 1, "") };
        assert!(!active_agree(&[damaged]));
    }
}
