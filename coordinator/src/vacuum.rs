//! `VacuumShard`: every copy of a shard vacuums its own tombstones (each
//! copy's graph and slots are its own), one node at a time so that a
//! shard's copies do not all spend their disk on it at once.

use std::time::Duration;

use shoal_proto::v1;

use crate::cluster::Cluster;
use crate::error::{Error, Result};

/// A vacuum of millions of tombstones runs for minutes.
const VACUUM_TIMEOUT: Duration = Duration::from_secs(3600);

impl Cluster {
    pub async fn vacuum_shard(&self, req: v1::VacuumShardRequest) -> Result<v1::VacuumShardResponse> {
        let c = self.collection(&req.collection)?;
        let p = c.shards.get(req.shard as usize).ok_or_else(|| Error::NoSuchShard {
            collection: c.name.clone(),
            shard: req.shard,
            shards: c.shard_count(),
        })?;
        let id = Some(v1::ShardId { collection: c.name.to_string(), shard: req.shard });
        let mut replicas = Vec::with_capacity(p.replicas.len());
        for r in &p.replicas {
            let mut out = v1::ReplicaVacuum { node: r.node.to_string(), ..Default::default() };
            let req = v1::VacuumShardStepsRequest { shard: id.clone(), max_tombstones: 0 };
            let answer = match self.client(&r.node) {
                Ok(client) => self.on_node(&r.node, client.vacuum_shard(req, VACUUM_TIMEOUT)).await,
                Err(e) => Err(e),
            };
            match answer {
                Ok(v) => {
                    out.vacuumed = v.vacuumed;
                    out.steps = v.steps;
                    out.pending = v.pending;
                    out.points = v.points;
                    out.tombstones = v.tombstones;
                    out.disk_bytes = v.disk_bytes;
                    out.reclaimed_bytes = v.reclaimed_bytes;
                }
                Err(e) => out.error = e.to_string(),
            }
            replicas.push(out);
        }
        Ok(v1::VacuumShardResponse { replicas })
    }
}
