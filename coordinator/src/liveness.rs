//! Which shard nodes answer. A prober asks every node's health service
//! every `probe_interval` and marks a node down when it does not answer
//! within `probe_timeout`; calls then treat it as gone at once instead of
//! waiting for their own deadlines: writes to it fail fast (before any part
//! is sent, so a batch does not half-apply), searches skip it, and calls in
//! flight to it end. A node that answers again is up at the next probe.
//!
//! A node stopped with SIGSTOP keeps its TCP connections open and answers
//! nothing, so only a deadline notices it; the probe's is short on purpose.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::RwLock;
use shoal_proto::NodeId;
use tokio::sync::watch;

use crate::client::ShardClient;
use crate::error::{Error, Result};

/// What the last probe of a node found.
#[derive(Clone, Debug)]
pub struct NodeHealth {
    /// It answered the last probe (true until the first probe says otherwise).
    pub up: bool,
    /// Since when it has been in this state.
    pub since: Instant,
    /// Why it is down.
    pub reason: String,
}

/// The health of every member, shared by all requests.
pub struct Liveness {
    nodes: RwLock<HashMap<NodeId, watch::Sender<NodeHealth>>>,
}

/// Every coordinator's liveness in this process, for the `shoal.node.up`
/// gauge (registered once per process).
static WATCHED: parking_lot::Mutex<Vec<std::sync::Weak<Liveness>>> = parking_lot::Mutex::new(Vec::new());

fn register_gauge() {
    let _ = opentelemetry::global::meter("shoal-coordinator")
        .u64_observable_gauge("shoal.node.up")
        .with_description("1 if the shard node answered its last health probe, 0 if it is marked down")
        .with_callback(|obs| {
            WATCHED.lock().retain(|w| match w.upgrade() {
                Some(l) => {
                    for (node, tx) in l.nodes.read().iter() {
                        obs.observe(u64::from(tx.borrow().up), &[opentelemetry::KeyValue::new("node", node.to_string())]);
                    }
                    true
                }
                None => false,
            });
        })
        .build();
}

impl Liveness {
    pub fn new(nodes: impl IntoIterator<Item = NodeId>) -> Self {
        let up = || NodeHealth { up: true, since: Instant::now(), reason: String::new() };
        Liveness { nodes: RwLock::new(nodes.into_iter().map(|n| (n, watch::Sender::new(up()))).collect()) }
    }

    /// Reports this liveness in the `shoal.node.up` gauge.
    pub fn export_gauge(self: &Arc<Self>) {
        static GAUGE: std::sync::OnceLock<()> = std::sync::OnceLock::new();
        WATCHED.lock().push(Arc::downgrade(self));
        GAUGE.get_or_init(register_gauge);
    }

    /// The node's state now (unknown nodes are up: nothing says otherwise).
    pub fn health(&self, node: &NodeId) -> NodeHealth {
        self.nodes
            .read()
            .get(node)
            .map_or_else(|| NodeHealth { up: true, since: Instant::now(), reason: String::new() }, |s| s.borrow().clone())
    }

    /// UNAVAILABLE if the node is marked down.
    pub fn check(&self, node: &NodeId) -> Result<()> {
        let h = self.health(node);
        if h.up {
            return Ok(());
        }
        Err(Error::NodeUnavailable {
            node: node.clone(),
            reason: format!("is down: its health check failed ({}), {:.1} s ago", h.reason, h.since.elapsed().as_secs_f64()),
        })
    }

    /// Resolves once the node is marked down (never, for an unknown node).
    pub async fn down(&self, node: &NodeId) -> Error {
        let rx = self.nodes.read().get(node).map(watch::Sender::subscribe);
        let Some(mut rx) = rx else { return std::future::pending().await };
        let _ = rx.wait_for(|h| !h.up).await;
        self.check(node).err().unwrap_or_else(|| Error::NodeUnavailable { node: node.clone(), reason: "went down".into() })
    }

    /// Marks `node` down as a failed probe would, until its next probe
    /// answers. A probe's verdict can be wrong (one that timed out on a
    /// busy node); tests use this to make that happen on demand.
    pub fn mark_down(&self, node: &NodeId, reason: impl Into<String>) {
        self.set(node, false, reason.into());
    }

    fn set(&self, node: &NodeId, up: bool, reason: String) {
        let nodes = self.nodes.read();
        let Some(tx) = nodes.get(node) else { return };
        tx.send_if_modified(|h| {
            if h.up == up {
                return false;
            }
            if up {
                tracing::info!(%node, down_for = ?h.since.elapsed(), "shard node answers again");
            } else {
                tracing::warn!(%node, %reason, "shard node does not answer; marked down");
            }
            *h = NodeHealth { up, since: Instant::now(), reason };
            true
        });
    }

    /// Starts following `node` (up until a probe says otherwise).
    pub fn track(&self, node: NodeId) {
        self.nodes
            .write()
            .entry(node)
            .or_insert_with(|| watch::Sender::new(NodeHealth { up: true, since: Instant::now(), reason: String::new() }));
    }

    /// Stops following `node` (it left the cluster).
    pub fn forget(&self, node: &NodeId) {
        self.nodes.write().remove(node);
    }

    /// Probes `node` through `client` on its own schedule, so that a silent
    /// node does not delay the others, until the task is aborted.
    pub fn spawn_prober(
        self: &Arc<Self>,
        node: NodeId,
        client: ShardClient,
        interval: Duration,
        timeout: Duration,
    ) -> tokio::task::JoinHandle<()> {
        self.track(node.clone());
        let me = Arc::clone(self);
        tokio::spawn(async move {
            let mut tick = tokio::time::interval(interval);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tick.tick().await;
                match client.ping(timeout).await {
                    Ok(()) => me.set(&node, true, String::new()),
                    Err(e) => me.set(&node, false, e.message),
                }
            }
        })
    }
}
