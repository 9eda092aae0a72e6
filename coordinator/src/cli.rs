//! The `shoal-coordinator` command line: defaults, then the TOML file's
//! `[coordinator]` section, then `SHOAL_COORD_*` variables, then flags.

use std::path::PathBuf;

use clap::Parser;
use serde::Serialize;

use crate::config::ShardNodeEntry;
use crate::{CoordinatorConfig, RunningCoordinator};

/// Flags override the config file and the environment.
#[derive(Parser, Serialize, Debug)]
#[command(name = "shoal-coordinator", about = "Run a shoal coordinator")]
pub struct Cli {
    /// TOML config file (see `ops/shoal.example.toml`, section `[coordinator]`).
    #[arg(long)]
    #[serde(skip)]
    pub config: Option<PathBuf>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub listen: Option<String>,
    /// Shard node as ID=HOST:PORT; repeat for each node (replaces the list
    /// from the file).
    #[arg(long = "shard-node", value_parser = parse_node)]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub shard_nodes: Vec<ShardNodeEntry>,
    /// This coordinator's name (default: coordinator@LISTEN).
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    pub id: Option<String>,
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

fn parse_node(s: &str) -> Result<ShardNodeEntry, String> {
    let (id, address) = s.split_once('=').ok_or_else(|| format!("expected ID=HOST:PORT, got {s:?}"))?;
    Ok(ShardNodeEntry { id: id.to_owned(), address: address.to_owned() })
}

impl Cli {
    /// The configuration these flags, the file and the environment give.
    pub fn config(&self) -> anyhow::Result<CoordinatorConfig> {
        let mut cfg: CoordinatorConfig = shoal_server::config::load(self.config.as_deref(), "coordinator", "SHOAL_COORD_", self)?;
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
/// gracefully. Prints `coordinator listening on <addr> (...)` once serving.
pub async fn serve(cfg: CoordinatorConfig) -> anyhow::Result<()> {
    let telemetry = shoal_server::telemetry::init("shoal-coordinator", &cfg.listen.to_string(), &cfg.telemetry);
    let coord = RunningCoordinator::start(&cfg).await?;
    if cfg.cluster.uses_etcd() {
        println!("coordinator listening on {} (cluster in etcd {}, prefix {})", coord.addr, cfg.cluster.etcd.join(","), cfg.cluster.prefix);
    } else {
        println!("coordinator listening on {} ({} shard nodes)", coord.addr, cfg.shard_nodes.len());
    }
    shoal_server::shutdown_signal().await;
    println!("shutting down: finishing in-flight requests");
    let stopped = coord.shutdown().await;
    telemetry.flush();
    stopped
}
