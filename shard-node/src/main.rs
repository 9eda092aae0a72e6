//! `shoal-shard-node`: runs one shard node until SIGINT/SIGTERM.

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    shoal_shard_node::cli::run(shoal_shard_node::cli::Cli::parse()).await
}
