//! A killed node's way back, timed.

use std::collections::HashSet;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use shoal_proto::v1;

use super::clients::Clients;
use super::observe::{Busy, all_shards, blocking};
use super::report::Timeline;
use crate::procs::ProcessCluster;

/// When a killed node starts again.
#[derive(Clone, Copy, Debug)]
pub(super) enum Back {
    /// At once, as a service manager restarts a crashed process, and only
    /// once: its registration is still held by the lease of the process
    /// that died, which it must take over rather than exit.
    AtOnce,
    /// After a short pause; its copies rejoin.
    AfterPause(Duration),
    /// After its copies were made again on other nodes (past the lease
    /// and the repair delay): it returns to a cluster that no longer
    /// counts on it.
    AfterRepair,
}

/// A killed node's way back, timed.
pub(super) struct NodeReturn {
    pub(super) node: usize,
    /// The shards (`collection/shard`) that had a copy on it when killed.
    pub(super) held: HashSet<String>,
    pub(super) back: Back,
    pub(super) within: Duration,
    pub(super) rebalance_returned: bool,
    pub(super) factor: usize,
}

impl NodeReturn {
    pub(super) async fn run(
        self,
        cluster: Arc<Mutex<ProcessCluster>>,
        timeline: Arc<Mutex<Timeline>>,
        busy: Busy,
        admins: Clients,
    ) -> anyhow::Result<()> {
        let (node, id) = (self.node, format!("shard-{}", self.node));
        if let Back::AfterRepair = self.back {
            // Each shard it held: `factor` copies in sync, none on it.
            let repaired = self
                .each_shard(&admins, |s| s.replicas.len() == self.factor && s.replicas.iter().all(|r| r.state == "active" && r.node != id))
                .await;
            timeline.lock().repair_s.extend(repaired);
            blocking(&cluster, move |c| c.nodes[node].restart()).await?;
            // Back empty: its copies live elsewhere now. As an operator
            // would (docs/runbooks/replace-a-node.md), even the shards out
            // with a rebalance, so that it holds copies again and later
            // faults on it lose something.
            let back = Instant::now();
            if self.rebalance_returned && self.rebalance(&admins, &id).await {
                timeline.lock().rebalance_s.push(back.elapsed().as_secs_f64());
            }
        } else {
            if let Back::AfterPause(pause) = self.back {
                tokio::time::sleep(pause).await;
                blocking(&cluster, move |c| c.nodes[node].restart()).await?;
            } else {
                let once = blocking(&cluster, move |c| c.nodes[node].restart_once()).await;
                if let Err(e) = once {
                    // Counted as a loss; started again with retries so
                    // that the run goes on.
                    timeline.lock().refused_restarts.push(format!("shard-{node}: {e:#}"));
                    blocking(&cluster, move |c| c.nodes[node].restart()).await?;
                }
            }
            // Each of its copies in sync again, its node counted as up.
            // Only the written collection's: the other's copies miss no
            // write while the node is down, so they have nothing to rejoin.
            let back = self.back;
            let rejoined = NodeReturn { held: self.held.iter().filter(|k| k.starts_with("chaos/")).cloned().collect(), ..self }
                .each_shard(&admins, |s| s.replicas.iter().filter(|r| r.node == id).all(|r| r.state == "active" && !r.node_down))
                .await;
            let mut tl = timeline.lock();
            match back {
                Back::AtOnce => tl.quick_rejoin_s.extend(rejoined),
                Back::AfterPause(_) | Back::AfterRepair => tl.rejoin_s.extend(rejoined),
            }
        }
        busy.release(node);
        Ok(())
    }

    /// Asks for a rebalance (on the first coordinator that takes it, again
    /// every few seconds) until the node holds an active copy, within the
    /// bound.
    pub(super) async fn rebalance(&self, admins: &Clients, id: &str) -> bool {
        let started = Instant::now();
        let mut asked: Option<Instant> = None;
        while started.elapsed() < self.within {
            if let Ok(shards) = all_shards(admins).await {
                if shards.iter().any(|(_, s)| s.replicas.iter().any(|r| r.node == id && r.state == "active")) {
                    return true;
                }
                if asked.is_none_or(|at| at.elapsed() > Duration::from_secs(5)) {
                    for admin in &admins.clients {
                        if admin.clone().rebalance(v1::RebalanceRequest { dry_run: false, wait: false }).await.is_ok() {
                            asked = Some(Instant::now());
                            break;
                        }
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        false
    }

    /// Seconds until each shard it held satisfied `ok` (and did not move),
    /// for those that did within the bound: per replica, so that a shard
    /// slowed by another fault does not hide the others.
    pub(super) async fn each_shard(&self, admins: &Clients, ok: impl Fn(&v1::ShardInfo) -> bool) -> Vec<f64> {
        let started = Instant::now();
        let mut waiting = self.held.clone();
        let mut took = Vec::new();
        while !waiting.is_empty() && started.elapsed() < self.within {
            if let Ok(shards) = all_shards(admins).await {
                for (key, s) in &shards {
                    if waiting.contains(key) && s.moving.is_none() && ok(s) {
                        waiting.remove(key);
                        took.push(started.elapsed().as_secs_f64());
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        took
    }
}
