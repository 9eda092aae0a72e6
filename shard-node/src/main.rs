//! `shoal-shard-node`: runs one shard node until SIGINT/SIGTERM.

use std::path::PathBuf;

use clap::Parser;
use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::Serialize;
use shoal_shard_node::{RunningShardNode, ShardNodeConfig};

/// Flags override the config file and the environment.
#[derive(Parser, Serialize)]
#[command(name = "shoal-shard-node", about = "Run a shoal shard node")]
struct Cli {
    /// TOML config file (see ops/shoal.example.toml, section [shard_node]).
    #[arg(long)]
    #[serde(skip)]
    config: Option<PathBuf>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    node_id: Option<String>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    listen: Option<String>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    data_dir: Option<PathBuf>,
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    let cli = Cli::parse();
    let mut fig = Figment::from(Serialized::defaults(ShardNodeConfig::default()));
    if let Some(path) = &cli.config {
        anyhow::ensure!(path.is_file(), "config file {} does not exist", path.display());
        fig = fig.merge(Figment::from(Toml::file(path)).focus("shard_node"));
    }
    let cfg: ShardNodeConfig = fig.merge(Env::prefixed("SHOAL_SHARD_").split("__")).merge(Serialized::globals(&cli)).extract()?;
    let node = RunningShardNode::start(&cfg).await?;
    println!("shard node {} listening on {}", cfg.node_id, node.addr);
    shoal_proto::shutdown_signal().await;
    println!("shutting down: finishing queued batches");
    node.shutdown().await
}

