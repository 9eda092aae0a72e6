//! `shoal-shard-node`: runs one shard node until SIGINT/SIGTERM.

use clap::Parser;

fn main() -> anyhow::Result<()> {
    shoal_shard_node::cli::main(shoal_shard_node::cli::Cli::parse())
}
