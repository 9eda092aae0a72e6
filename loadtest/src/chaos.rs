//! `shoal-loadtest chaos`: the long chaos run against separate
//! processes from a directory of release binaries (the run itself lives in
//! `shoal_ops::chaos`, which a short test also drives). Prints the table
//! of figures and, with `--json`, writes the report.

use std::path::PathBuf;
use std::time::Duration;

use shoal_ops::chaos::{ChaosConfig, run as run_chaos};
use shoal_ops::procs::Launcher;

#[derive(clap::Args)]
pub(crate) struct Args {
    /// Where `shoal-shard-node` and `shoal-coordinator` are.
    #[arg(long, default_value = "target/release")]
    bin_dir: PathBuf,
    /// Data, logs and etcd (default: a temporary directory, removed after).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Seconds of faults (a fault starts every --fault-every seconds).
    #[arg(long, default_value_t = 600)]
    seconds: u64,
    /// Seconds of load without faults first: the figures faults are compared with.
    #[arg(long, default_value_t = 20)]
    quiet: u64,
    #[arg(long, default_value_t = 5)]
    fault_every: u64,
    /// Lease TTL of nodes and coordinators, seconds.
    #[arg(long, default_value_t = 4)]
    lease_ttl: u64,
    /// The coordinators' repair delay, seconds (every other node kill
    /// outlasts it, so that repair happens too).
    #[arg(long, default_value_t = 8)]
    repair_after: u64,
    #[arg(long, default_value_t = 8)]
    searchers: usize,
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Write the report as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub(crate) fn run(a: Args) -> anyhow::Result<()> {
    let tmp = tempfile::tempdir()?;
    let dir = a.dir.clone().unwrap_or_else(|| tmp.path().to_owned());
    let mut cfg = ChaosConfig::new(Launcher::Binaries(a.bin_dir.clone()), dir);
    cfg.seed = a.seed;
    cfg.quiet = Duration::from_secs(a.quiet);
    cfg.faults_for = Duration::from_secs(a.seconds);
    cfg.fault_every = Duration::from_secs(a.fault_every);
    cfg.lease_ttl = Duration::from_secs(a.lease_ttl);
    cfg.repair_after = Duration::from_secs(a.repair_after);
    cfg.searchers = a.searchers;
    let report = tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(run_chaos(cfg))?;
    println!("{}", report.table());
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_vec_pretty(&report)?)?;
    }
    let misses = report.misses();
    if misses.is_empty() {
        println!("every target met");
    } else {
        println!("missed:\n  {}", misses.join("\n  "));
    }
    anyhow::ensure!(report.losses().is_empty(), "the run lost or broke something (above)");
    Ok(())
}
