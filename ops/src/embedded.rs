//! A whole cluster in one process: shard nodes and a coordinator, talking
//! gRPC over loopback exactly as separate processes would. `shoalctl dev`,
//! `shoalctl demo`, the cluster tests and the cluster benchmark use it.

use std::net::SocketAddr;
use std::path::PathBuf;

use shoal_coordinator::config::ShardNodeEntry;
use shoal_coordinator::{CoordinatorConfig, RunningCoordinator};
use shoal_proto::v1::shoal_client::ShoalClient;
use shoal_server::TelemetryConfig;
use shoal_shard_node::config::{EngineConfig, ScrubConfig, SnapshotConfig};
use shoal_shard_node::{RunningShardNode, ShardNodeConfig};
use tonic::transport::Channel;

/// How to lay out the embedded cluster.
#[derive(Clone, Debug)]
pub struct EmbeddedConfig {
    /// Each node gets `<data_dir>/shard-<i>`.
    pub data_dir: PathBuf,
    pub shard_nodes: usize,
    /// Coordinator address; port 0 picks a free one.
    pub coordinator_listen: SocketAddr,
    /// Port of shard node 0 (node i gets this + i); 0 picks free ports.
    pub first_shard_port: u16,
    pub engine: EngineConfig,
    /// Every node uses the same store, so a shard snapshotted on one node
    /// restores on any other.
    pub snapshot: SnapshotConfig,
    /// Every node's background scrub.
    pub scrub: ScrubConfig,
    pub coordinator: CoordinatorConfig,
    /// TLS of every shard node's listener (the coordinator's own is in
    /// `coordinator.listener`, its channels to the nodes in
    /// `coordinator.peers`).
    pub node_tls: Option<shoal_server::ServerTls>,
    /// Logs, traces and metrics of the process (set up by the first
    /// cluster a process starts; every node serves the same `/metrics`).
    pub telemetry: TelemetryConfig,
}

impl EmbeddedConfig {
    /// Free loopback ports, `n` nodes, data under `data_dir`.
    /// Snapshots go to `<data_dir>/snapshots`.
    pub fn ephemeral(data_dir: impl Into<PathBuf>, shard_nodes: usize) -> Self {
        let data_dir: PathBuf = data_dir.into();
        let snapshot = SnapshotConfig { url: data_dir.join("snapshots").to_string_lossy().into_owned(), ..SnapshotConfig::default() };
        EmbeddedConfig {
            snapshot,
            data_dir,
            shard_nodes,
            coordinator_listen: "127.0.0.1:0".parse().expect("literal address"),
            first_shard_port: 0,
            engine: EngineConfig::default(),
            scrub: ScrubConfig::default(),
            coordinator: CoordinatorConfig::default(),
            node_tls: None,
            telemetry: TelemetryConfig { log: "warn".into(), ..TelemetryConfig::default() },
        }
    }

    /// TLS everywhere with the certificates `shoalctl tls init --out dir`
    /// made: nodes accept only the coordinator's certificate (mutual TLS),
    /// the coordinator serves its own to clients.
    pub fn use_tls(&mut self, dir: &std::path::Path) {
        use shoal_server::{ClientTls, ServerTls};
        self.node_tls = Some(ServerTls {
            cert_file: dir.join("node.pem"),
            key_file: dir.join("node-key.pem"),
            client_ca_file: Some(dir.join("ca.pem")),
        });
        self.coordinator.listener.tls =
            Some(ServerTls { cert_file: dir.join("coordinator.pem"), key_file: dir.join("coordinator-key.pem"), client_ca_file: None });
        self.coordinator.peers.tls = Some(ClientTls {
            ca_file: dir.join("ca.pem"),
            cert_file: Some(dir.join("coordinator.pem")),
            key_file: Some(dir.join("coordinator-key.pem")),
            domain_name: None,
        });
    }

    fn node_config(&self, i: usize) -> ShardNodeConfig {
        let port = if self.first_shard_port == 0 { 0 } else { self.first_shard_port + i as u16 };
        let mut listener = shoal_server::ListenerConfig::default();
        listener.tls.clone_from(&self.node_tls);
        ShardNodeConfig {
            listener,
            node_id: format!("shard-{i}"),
            listen: SocketAddr::from(([127, 0, 0, 1], port)),
            data_dir: self.data_dir.join(format!("shard-{i}")),
            engine: self.engine.clone(),
            snapshot: self.snapshot.clone(),
            scrub: self.scrub.clone(),
            telemetry: self.telemetry.clone(),
            ..ShardNodeConfig::default()
        }
    }
}

/// A running embedded cluster.
pub struct EmbeddedCluster {
    pub coordinator: RunningCoordinator,
    /// `None` while a node is stopped (see [`EmbeddedCluster::stop_node`]).
    pub nodes: Vec<Option<RunningShardNode>>,
    node_configs: Vec<ShardNodeConfig>,
}

impl EmbeddedCluster {
    pub async fn start(cfg: EmbeddedConfig) -> anyhow::Result<EmbeddedCluster> {
        anyhow::ensure!(cfg.shard_nodes > 0, "an embedded cluster needs at least one shard node");
        shoal_server::telemetry::init("shoal-embedded", "embedded", &cfg.telemetry);
        let mut nodes = Vec::new();
        let mut node_configs = Vec::new();
        for i in 0..cfg.shard_nodes {
            let mut ncfg = cfg.node_config(i);
            let node = RunningShardNode::start(&ncfg).await?;
            // Remember the port actually bound, so a restart comes back on it.
            ncfg.listen = node.addr;
            nodes.push(Some(node));
            node_configs.push(ncfg);
        }
        let mut ccfg = cfg.coordinator.clone();
        ccfg.listen = cfg.coordinator_listen;
        ccfg.telemetry = cfg.telemetry.clone();
        ccfg.shard_nodes = node_configs.iter().map(|n| ShardNodeEntry { id: n.node_id.clone(), address: n.listen.to_string() }).collect();
        let coordinator = RunningCoordinator::start(&ccfg).await?;
        Ok(EmbeddedCluster { coordinator, nodes, node_configs })
    }

    /// The coordinator's URL.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.coordinator.addr)
    }

    /// A client of the public API.
    pub async fn client(&self) -> anyhow::Result<ShoalClient<Channel>> {
        Ok(ShoalClient::connect(self.endpoint()).await?.max_decoding_message_size(64 << 20))
    }

    /// Addresses of the shard nodes.
    pub fn node_addrs(&self) -> Vec<SocketAddr> {
        self.node_configs.iter().map(|c| c.listen).collect()
    }

    /// Shuts node `i` down gracefully (its queued batches commit first).
    pub async fn stop_node(&mut self, i: usize) -> anyhow::Result<()> {
        if let Some(node) = self.nodes.get_mut(i).and_then(Option::take) {
            node.shutdown().await?;
        }
        Ok(())
    }

    /// Starts node `i` again on the same address and data directory.
    pub async fn restart_node(&mut self, i: usize) -> anyhow::Result<()> {
        self.stop_node(i).await?;
        let cfg = &self.node_configs[i];
        // The port was just released; retry briefly if the OS holds it.
        let mut last = None;
        for _ in 0..50 {
            match RunningShardNode::start(cfg).await {
                Ok(node) => {
                    self.nodes[i] = Some(node);
                    return Ok(());
                }
                Err(e) => {
                    last = Some(e);
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                }
            }
        }
        Err(last.unwrap_or_else(|| anyhow::anyhow!("node {i} did not restart")))
    }

    /// Graceful shutdown of everything: coordinator first, then the nodes.
    pub async fn shutdown(self) -> anyhow::Result<()> {
        self.coordinator.shutdown().await?;
        for node in self.nodes.into_iter().flatten() {
            node.shutdown().await?;
        }
        Ok(())
    }
}
