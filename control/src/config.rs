//! Where the control plane lives, as coordinators and shard nodes are told
//! (`[coordinator.cluster]`, `[shard_node.cluster]`).

use std::time::Duration;

use serde::{Deserialize, Serialize};

/// The etcd cluster that holds membership and placement. With no
/// endpoints, the process runs without one: a coordinator keeps metadata in
/// memory with the shard nodes of its configuration, a shard node does not
/// register.
#[derive(Clone, Debug, Serialize, Deserialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct ClusterConfig {
    /// etcd client URLs, e.g. `["http://10.0.0.5:2379"]`.
    pub etcd: Vec<String>,
    /// Every key of this cluster lives under it, so several clusters (or
    /// tests) can share one etcd.
    pub prefix: String,
    /// A node (or the controller) that stops renewing its lease disappears
    /// this long after its last renewal.
    pub lease_ttl_ms: u64,
    /// Longest wait for one etcd call; an unreachable etcd fails calls
    /// after this instead of hanging them.
    pub call_timeout_ms: u64,
}

impl Default for ClusterConfig {
    fn default() -> Self {
        ClusterConfig { etcd: Vec::new(), prefix: "/shoal/default".into(), lease_ttl_ms: 10_000, call_timeout_ms: 2_000 }
    }
}

impl ClusterConfig {
    pub fn uses_etcd(&self) -> bool {
        !self.etcd.is_empty()
    }

    pub fn lease_ttl(&self) -> Duration {
        Duration::from_millis(self.lease_ttl_ms.max(1_000))
    }

    pub fn call_timeout(&self) -> Duration {
        Duration::from_millis(self.call_timeout_ms.max(1))
    }
}

/// The `--etcd` and `--etcd-prefix` flags of both binaries. They are
/// nested keys of the configuration, which figment cannot merge from a
/// flat flag struct, so they are applied after it.
#[derive(clap::Args, Clone, Debug, Default, PartialEq, Eq)]
pub struct EtcdFlags {
    /// etcd endpoints holding membership and placement (comma separated).
    #[arg(long, value_delimiter = ',')]
    pub etcd: Vec<String>,
    /// Key prefix of the cluster in etcd.
    #[arg(long)]
    pub etcd_prefix: Option<String>,
}

impl EtcdFlags {
    /// Overrides what the file and the environment said with the flags given.
    pub fn apply(&self, cfg: &mut ClusterConfig) {
        if !self.etcd.is_empty() {
            cfg.etcd = self.etcd.clone();
        }
        if let Some(p) = &self.etcd_prefix {
            cfg.prefix = p.clone();
        }
    }
}
