//! What the fault schedule reads of the cluster: its shards and copies,
//! which node can be lost, whether it has settled.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use rand::Rng;
use rand::rngs::StdRng;
use shoal_proto::v1;

use super::COLLECTIONS;
use super::clients::Clients;
use crate::procs::ProcessCluster;

/// A shard node (by index) that holds copies and whose loss leaves every
/// shard with an in-sync copy on a node that is up, picked at random among
/// those not in `busy`; `None` if there is none (or the status cannot be
/// read).
pub(super) async fn node_safe_to_lose(admin: &Clients, nodes: usize, busy: &HashSet<usize>, rng: &mut StdRng) -> Option<usize> {
    let shards: Vec<v1::ShardInfo> = all_shards(admin).await.ok()?.into_iter().map(|(_, s)| s).collect();
    let serving = |r: &v1::ReplicaInfo| r.state == "active" && !r.node_down;
    let safe: Vec<usize> = (0..nodes)
        .filter(|n| !busy.contains(n))
        .filter(|n| {
            let id = format!("shard-{n}");
            // A node without copies loses nothing when it fails.
            let holds = shards.iter().flat_map(|s| &s.replicas).any(|r| r.node == id);
            let up = shards.iter().flat_map(|s| &s.replicas).all(|r| r.node != id || !r.node_down);
            holds
                && up
                && shards.iter().all(|s| !s.replicas.iter().any(|r| r.node == id) || s.replicas.iter().any(|r| r.node != id && serving(r)))
        })
        .collect();
    (!safe.is_empty()).then(|| safe[rng.random_range(0..safe.len())])
}

/// Every shard of both collections, each with its key (`collection/shard`),
/// from the first coordinator that answers (one may be the controller
/// just killed).
pub(super) async fn all_shards(admins: &Clients) -> Result<Vec<(String, v1::ShardInfo)>, String> {
    let mut last = String::from("no coordinator");
    for admin in &admins.clients {
        let mut admin = admin.clone();
        let mut shards = Vec::new();
        let mut failed = None;
        for name in COLLECTIONS {
            match admin.describe_collection(v1::DescribeCollectionRequest { name: name.into() }).await {
                Ok(info) => shards.extend(info.into_inner().shards.into_iter().map(|s| (format!("{name}/{}", s.shard), s))),
                Err(e) => {
                    failed = Some(e.to_string());
                    break;
                }
            }
        }
        match failed {
            None => return Ok(shards),
            Some(e) => last = e,
        }
    }
    Err(last)
}

/// Nodes a fault still plays out on (killed and not yet back in sync, not
/// yet repaired elsewhere, holding a copy of a shard whose other copy is
/// damaged): no other node fault picks them meanwhile. Counted, because
/// two faults can hold one node.
#[derive(Clone, Default)]
pub(super) struct Busy(Arc<Mutex<HashMap<usize, usize>>>);

impl Busy {
    pub(super) fn hold(&self, node: usize) {
        *self.0.lock().entry(node).or_insert(0) += 1;
    }

    pub(super) fn release(&self, node: usize) {
        let mut held = self.0.lock();
        if let Some(n) = held.get_mut(&node) {
            *n -= 1;
            if *n == 0 {
                held.remove(&node);
            }
        }
    }

    pub(super) fn nodes(&self) -> HashSet<usize> {
        self.0.lock().keys().copied().collect()
    }
}

pub(super) async fn blocking(
    cluster: &Arc<Mutex<ProcessCluster>>,
    f: impl FnOnce(&mut ProcessCluster) -> anyhow::Result<()> + Send + 'static,
) -> anyhow::Result<()> {
    let cluster = Arc::clone(cluster);
    tokio::task::spawn_blocking(move || f(&mut cluster.lock())).await?
}

/// Waits until every shard of both collections holds `factor` active
/// copies and none moves.
pub(super) async fn settle(admins: &Clients, factor: usize, within: Duration) -> Result<(), String> {
    let started = Instant::now();
    let ok = |s: &v1::ShardInfo| s.moving.is_none() && s.replicas.len() == factor && s.replicas.iter().all(|r| r.state == "active");
    loop {
        let last = match all_shards(admins).await {
            Ok(shards) => shards.iter().find(|(_, s)| !ok(s)).map(|(key, s)| format!("{key}: {:?}", s.replicas)),
            Err(e) => Some(e),
        };
        let Some(last) = last else { return Ok(()) };
        if started.elapsed() >= within {
            return Err(format!("not every shard had {factor} copies in sync within {within:?}: {last}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
