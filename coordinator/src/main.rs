//! `shoal-coordinator`: runs a coordinator until SIGINT/SIGTERM.

use clap::Parser;

fn main() -> anyhow::Result<()> {
    shoal_coordinator::cli::main(shoal_coordinator::cli::Cli::parse())
}
