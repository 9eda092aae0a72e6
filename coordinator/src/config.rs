//! Coordinator settings: defaults for one machine, then a TOML file
//! (`[coordinator]`), `SHOAL_COORD_*` environment variables, flags.

use std::net::SocketAddr;

use serde::{Deserialize, Serialize};

use shoal_control::ClusterConfig;
use shoal_server::{ListenerConfig, TelemetryConfig};

use crate::auth::AuthConfig;
use crate::client::PeerSettings;
use crate::validate::Limits;

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct CoordinatorConfig {
    pub listen: SocketAddr,
    /// This coordinator's name in status, logs and the controller
    /// election (default: `coordinator@<listen>`).
    pub id: Option<String>,
    /// Static membership: the shard nodes of the cluster (when no etcd is
    /// configured; with etcd, nodes register themselves).
    pub shard_nodes: Vec<ShardNodeEntry>,
    /// The control plane (etcd) holding membership and placement.
    pub cluster: ClusterConfig,
    /// Shards of a new collection when the request does not say.
    pub default_shards: u32,
    /// A search's deadline when neither the request nor the caller sets one.
    pub search_timeout_ms: u64,
    /// A write's (each ingest batch's) deadline, unless the caller's comes first.
    pub write_timeout_ms: u64,
    /// ClusterStatus and DescribeCollection: a node that does not answer
    /// within this is reported unavailable.
    pub status_timeout_ms: u64,
    /// Largest gRPC message accepted or sent, in bytes.
    pub max_message_bytes: usize,
    /// Connections of the gRPC listener.
    pub listener: ListenerConfig,
    /// Threads serving requests; 0: one per core. Lower it when several
    /// shoal processes share the machine's cores (`shoal_server::runtime`).
    pub worker_threads: usize,
    /// Channels to the shard nodes and their health probes.
    pub peers: PeerSettings,
    /// Traces and metrics.
    pub telemetry: TelemetryConfig,
    pub limits: Limits,
    /// The controller re-creates the copies of a node whose lease has been
    /// gone this long on other nodes (a node back sooner rejoins instead).
    pub repair_after_ms: u64,
    /// With etcd, the controller drops a shard copy that no placement names
    /// (a node back after its copies were repaired elsewhere, a drop that
    /// missed a node) once it has seen that copy orphaned this long
    /// (0: never). Without etcd nothing is reclaimed.
    pub reclaim_after_ms: u64,
    /// With etcd, when the only in-sync copy of a shard is damaged, the
    /// controller restores it from the shard's newest snapshot and logs
    /// each ingest source's offset in it (the points written after it are
    /// older or missing until the sources replay from there). Off: the
    /// shard answers DATA_LOSS until an operator restores it.
    pub restore_damaged: bool,
    /// A read of a replicated shard asks another replica as well when the
    /// first has not answered within its recent p95 (or `hedge_after_ms`).
    pub hedge_reads: bool,
    /// A fixed hedge delay instead of the replica's p95 (0: the p95).
    pub hedge_after_ms: u64,
    /// API keys for the public service; none: every call allowed.
    pub auth: AuthConfig,
}

#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ShardNodeEntry {
    pub id: String,
    /// `host:port` or `http://host:port`.
    pub address: String,
}

impl Default for CoordinatorConfig {
    fn default() -> Self {
        CoordinatorConfig {
            listen: "127.0.0.1:7700".parse().expect("literal address"),
            id: None,
            cluster: ClusterConfig::default(),
            shard_nodes: vec![ShardNodeEntry { id: "shard-0".into(), address: "127.0.0.1:7701".into() }],
            default_shards: 3,
            search_timeout_ms: 2_000,
            write_timeout_ms: 120_000,
            status_timeout_ms: 1_000,
            max_message_bytes: 64 << 20,
            listener: ListenerConfig::default(),
            worker_threads: 0,
            peers: PeerSettings::default(),
            telemetry: TelemetryConfig::default(),
            limits: Limits::default(),
            repair_after_ms: 300_000,
            reclaim_after_ms: 600_000,
            restore_damaged: true,
            hedge_reads: true,
            hedge_after_ms: 0,
            auth: AuthConfig::default(),
        }
    }
}

impl CoordinatorConfig {
    pub fn coordinator_id(&self, bound: SocketAddr) -> String {
        self.id.clone().unwrap_or_else(|| format!("coordinator@{bound}"))
    }
}

/// `host:port` → `http://host:port`; full URLs are kept.
pub fn url(address: &str) -> String {
    if address.contains("://") { address.to_owned() } else { format!("http://{address}") }
}
