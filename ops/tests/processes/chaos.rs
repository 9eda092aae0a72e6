//! A short, bounded chaos run (`shoal_ops::chaos`): etcd, 2 coordinators,
//! 4 shard nodes, 6 shards with 2 copies, 3 ingest streams and 4 search
//! clients, and about a dozen faults in rotation (a node SIGKILLed and
//! back soon, SIGSTOPped, the controller SIGKILLed, a node SIGKILLed and
//! started once at once, a bit flipped in a stored vector, etcd
//! restarted, a node gone long enough to be repaired, then rebalanced
//! back: shard moves under faults). Nothing acknowledged may be lost, no
//! point may be stale or a phantom, the replicas must agree, no search may
//! fail or be partial, no start at once may be refused, every flipped bit
//! must be found and its copy made again, and recall must hold. The timings are printed,
//! not asserted: `shoal-loadtest chaos` measures them on a long run.

use std::time::Duration;

use shoal_ops::chaos::{ChaosConfig, run};
use shoal_ops::procs::Launcher;

use crate::common::block_on;

pub(crate) fn etcd_chaos_a_short_run_loses_nothing() -> anyhow::Result<()> {
    if std::env::var("SHOAL_TEST_ETCD_ENDPOINT").map_or(true, |e| e.is_empty()) {
        eprintln!(
            "SKIPPED etcd_chaos_a_short_run_loses_nothing: SHOAL_TEST_ETCD_ENDPOINT is not set (the run starts an etcd of its own from PATH)"
        );
        return Ok(());
    }
    let dir = tempfile::tempdir()?;
    let mut cfg = ChaosConfig::new(Launcher::Roles(std::env::current_exe()?), dir.path().to_owned());
    cfg.seed = std::env::var("SHOAL_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random::<u64>);
    eprintln!("etcd_chaos_a_short_run_loses_nothing: seed {} (SHOAL_TEST_SEED replays the schedule)", cfg.seed);
    cfg.quiet = Duration::from_secs(6);
    cfg.faults_for = Duration::from_secs(36);
    cfg.fault_every = Duration::from_secs(3);
    cfg.searchers = 4;
    cfg.dim = 16;
    cfg.base_points = 2_000;
    cfg.lease_ttl = Duration::from_secs(2);
    cfg.repair_after = Duration::from_secs(3);
    let report = block_on(run(cfg))?;
    eprintln!("{}", report.table());
    let losses = report.losses();
    anyhow::ensure!(losses.is_empty(), "the chaos run lost or broke something:\n{}", losses.join("\n"));
    anyhow::ensure!(report.faults.values().sum::<u64>() >= 8, "too few faults ran: {:?}", report.faults);
    // Each kind ran: the rotation reaches every one within the run.
    for kind in ["node SIGKILL and one start again at once", "a bit flipped in a stored vector"] {
        anyhow::ensure!(report.faults.contains_key(kind), "no {kind:?} ran: {:?}", report.faults);
    }
    anyhow::ensure!(
        report.flip_repaired_s.len() as u64 == report.faults["a bit flipped in a stored vector"],
        "every flipped copy is made again: {:?}",
        report.flip_repaired_s
    );
    Ok(())
}
