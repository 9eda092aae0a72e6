//! `shoal-shard-node`: runs one shard node until SIGINT/SIGTERM.

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    shoal_shard_node::cli::run(shoal_shard_node::cli::Cli::parse()).await
}
