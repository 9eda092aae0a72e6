//! `shoal-coordinator`: runs a coordinator until SIGINT/SIGTERM.

use std::path::PathBuf;

use clap::Parser;
use figment::Figment;
use figment::providers::{Env, Format, Serialized, Toml};
use serde::Serialize;
use shoal_coordinator::config::ShardNodeEntry;
use shoal_coordinator::{CoordinatorConfig, RunningCoordinator};

/// Flags override the config file and the environment.
#[derive(Parser, Serialize)]
#[command(name = "shoal-coordinator", about = "Run a shoal coordinator")]
struct Cli {
    /// TOML config file (see ops/shoal.example.toml, section [coordinator]).
    #[arg(long)]
    #[serde(skip)]
    config: Option<PathBuf>,
    #[arg(long)]
    #[serde(skip_serializing_if = "Option::is_none")]
    listen: Option<String>,
    /// Shard node as ID=HOST:PORT; repeat for each node (replaces the list
    /// from the file).
    #[arg(long = "shard-node", value_parser = parse_node)]
    #[serde(skip_serializing_if = "Vec::is_empty")]
    shard_nodes: Vec<ShardNodeEntry>,
}

fn parse_node(s: &str) -> Result<ShardNodeEntry, String> {
    let (id, address) = s.split_once('=').ok_or_else(|| format!("expected ID=HOST:PORT, got {s:?}"))?;
    Ok(ShardNodeEntry { id: id.to_owned(), address: address.to_owned() })
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    let cli = Cli::parse();
    let mut fig = Figment::from(Serialized::defaults(CoordinatorConfig::default()));
    if let Some(path) = &cli.config {
        anyhow::ensure!(path.is_file(), "config file {} does not exist", path.display());
        fig = fig.merge(Figment::from(Toml::file(path)).focus("coordinator"));
    }
    let cfg: CoordinatorConfig = fig.merge(Env::prefixed("SHOAL_COORD_").split("__")).merge(Serialized::globals(&cli)).extract()?;
    let coord = RunningCoordinator::start(&cfg).await?;
    println!("coordinator listening on {} ({} shard nodes)", coord.addr, cfg.shard_nodes.len());
    shoal_proto::shutdown_signal().await;
    println!("shutting down: finishing in-flight requests");
    coord.shutdown().await
}

