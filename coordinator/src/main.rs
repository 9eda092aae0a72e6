//! `shoal-coordinator`: runs a coordinator until SIGINT/SIGTERM.

use clap::Parser;

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt().with_env_filter(tracing_subscriber::EnvFilter::from_default_env()).init();
    shoal_coordinator::cli::run(shoal_coordinator::cli::Cli::parse()).await
}
