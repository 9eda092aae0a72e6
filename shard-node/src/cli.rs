//! The `shoal-shard-node` command line: defaults, then the TOML file's
//! `[shard_node]` section, then `SHOAL_SHARD_*` variables, then flags.

use std::path::PathBuf;

use clap::Parser;
use serde::Serialize;

use crate::{RunningShardNode, ShardNodeConfig};

/// Flags override the config file and the environment.
#[derive(Parser, Serialize, Debug)]
#[command(name = "shoal-shard-node", about = "Run a shoal shard node")]
pub struct Cli {
    /// TOML config file (see `ops/shoal.example.toml`, section `[shard_node]`).
    #[arg(long)]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node_id: Option<String>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub data_dir: Option<PathBuf>,
    /// Address coordinators reach this node on (default: --listen).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub advertise: Option<String>,
    /// Serve plain text on a non-loopback address (listener.insecure):
    /// only on a network no one else reaches. Without it, such a listener
    /// needs TLS (docs/security.md).
    #[arg(long)]
    #[serde(skip)]
    pub insecure: bool,
    /// Threads serving requests (worker_threads; default one per core):
    /// with several shoal processes on one machine, its cores divided
    /// among them.
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub worker_threads: Option<usize>,
    /// With etcd, shard nodes register there and coordinators read
    /// membership and placement from it.
    #[command(flatten)]
    #[serde(skip)]
    pub etcd: shoal_control::config::EtcdFlags,
}

impl Cli {
    /// The configuration these flags, the file and the environment give.
    pub fn config(&self) -> anyhow::Result<ShardNodeConfig> {
        let mut cfg: ShardNodeConfig = shoal_server::config::load(self.config.as_deref(), "shard_node", "SHOAL_SHARD_", self)?;
        self.etcd.apply(&mut cfg.cluster);
        cfg.listener.insecure |= self.insecure;
        Ok(cfg)
    }
}

/// The binary: its configuration first, then the runtime that asks for,
/// then [`serve`] on it.
pub fn main(cli: Cli) -> anyhow::Result<()> {
    let cfg = cli.config()?;
    shoal_server::runtime::build(cfg.worker_threads)?.block_on(serve(cfg))
}

/// What the binary does: serve until SIGINT/SIGTERM, then shut down
/// gracefully. Prints `shard node <id> listening on <addr>` once serving.
pub async fn serve(cfg: ShardNodeConfig) -> anyhow::Result<()> {
    let telemetry = shoal_server::telemetry::init("shoal-shard-node", &cfg.node_id, &cfg.telemetry);
    // Starting waits for etcd if it is down; a signal meanwhile stops it.
    let node = tokio::select! {
        node = RunningShardNode::start(&cfg) => node?,
        () = shoal_server::shutdown_signal() => {
            println!("stopped before joining the cluster");
            telemetry.flush();
            return Ok(());
        }
    };
    println!("shard node {} listening on {}", cfg.node_id, node.addr);
    shoal_server::shutdown_signal().await;
    println!("shutting down: finishing queued batches");
    let stopped = node.shutdown().await;
    telemetry.flush();
    stopped
}
