//! `shoal-coordinator`: runs a coordinator until SIGINT/SIGTERM.

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    shoal_coordinator::cli::run(shoal_coordinator::cli::Cli::parse()).await
}
