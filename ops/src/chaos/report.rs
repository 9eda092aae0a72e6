//! What a chaos run found: the report, its targets and its table, and the
//! figures computed from the run's own records of searches, acknowledged
//! batches and faults.

use std::collections::BTreeMap;
use std::time::Duration;

/// What a run found.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct ChaosReport {
    pub faults: BTreeMap<String, u64>,
    /// Each fault: seconds into the run when it began, and what it was.
    pub fault_log: Vec<(f64, String)>,
    pub acked_batches: u64,
    pub acked_points: u64,
    pub missing: u64,
    /// Each acknowledged batch that lacks points, per shard: which stream
    /// and offset, when it was acknowledged, the shard and how many of
    /// its points there are missing (with the first few ids).
    pub lost: Vec<LostPart>,
    pub stale: u64,
    pub phantoms: i64,
    pub replicas_disagree: u64,
    pub searches: u64,
    pub failed_searches: u64,
    pub partial_searches: u64,
    /// Searches that reached a coordinator only after its peer refused the
    /// connection (the killed controller): counted, not failed.
    pub searches_redirected: u64,
    /// Failed searches by code and message (digits left out), most first.
    pub search_failures: Vec<(String, u64)>,
    /// The first failed searches: seconds into the run, code and message.
    pub first_failures: Vec<(f64, String)>,
    /// Searches under faults that answered whole but found fewer than half
    /// of the true top 10 (a copy that lacks points would show here).
    pub low_recall_searches: u64,
    pub quiet_recall: f64,
    pub fault_recall: f64,
    pub quiet_p99_ms: f64,
    pub fault_p99_ms: f64,
    /// Per node kill: seconds until every ingest stream had a batch sent
    /// after the kill acknowledged.
    pub ingest_resume_s: Vec<f64>,
    /// Per replica on a node killed briefly: seconds from the node's
    /// restart until that copy was in sync again.
    pub rejoin_s: Vec<f64>,
    /// Per replica on a node killed for long: seconds from the kill until
    /// its shard had all its copies in sync again on the other nodes.
    pub repair_s: Vec<f64>,
    /// Per long node kill: seconds from its return (empty) until a
    /// rebalance gave it copies again.
    pub rebalance_s: Vec<f64>,
    /// Per replica on a node SIGKILLed and started again at once (once,
    /// no retry): seconds from that start until the copy was in sync.
    pub quick_rejoin_s: Vec<f64>,
    /// Starts at once after a SIGKILL that the node refused (it exited):
    /// each is a node a service manager would have left down.
    pub refused_restarts: Vec<String>,
    /// Per flipped bit: seconds from the flip until the node listed the
    /// copy as damaged (when a poll saw it before the repair).
    pub flip_found_s: Vec<f64>,
    /// Per flipped bit: seconds from the flip until a new copy was in sync.
    pub flip_repaired_s: Vec<f64>,
    /// Seconds the cluster took to settle after the last fault.
    pub settle_s: f64,
    pub errors: Vec<String>,
}

impl ChaosReport {
    /// What the run lost or broke: points, agreement, searches, recall,
    /// and errors of the run itself (empty: nothing).
    pub fn losses(&self) -> Vec<String> {
        let mut out = self.errors.clone();
        let mut want = |ok: bool, what: String| {
            if !ok {
                out.push(what);
            }
        };
        want(self.missing == 0, format!("{} acknowledged points missing", self.missing));
        want(self.stale == 0, format!("{} points with a stale vector", self.stale));
        want(self.phantoms == 0, format!("{} points more than written (phantoms)", self.phantoms));
        want(self.replicas_disagree == 0, format!("{} shards whose replicas disagree", self.replicas_disagree));
        want(
            self.refused_restarts.is_empty(),
            format!("{} starts right after a SIGKILL refused: {:?}", self.refused_restarts.len(), self.refused_restarts),
        );
        want(self.failed_searches == 0, format!("{} failed searches", self.failed_searches));
        want(self.partial_searches == 0, format!("{} partial searches", self.partial_searches));
        want(
            self.fault_recall >= self.quiet_recall - 0.01,
            format!("recall {:.4} under faults, {:.4} quiet", self.fault_recall, self.quiet_recall),
        );
        out
    }

    /// [`ChaosReport::losses`] and the timing targets of issue 20 this run
    /// missed (empty: all met). Timings are for the long run on a quiet
    /// machine, not for a test.
    pub fn misses(&self) -> Vec<String> {
        let mut out = self.losses();
        let mut want = |ok: bool, what: String| {
            if !ok {
                out.push(what);
            }
        };
        want(
            self.fault_p99_ms <= 3.0 * self.quiet_p99_ms,
            format!("p99 {:.1} ms under faults, {:.1} ms quiet", self.fault_p99_ms, self.quiet_p99_ms),
        );
        let slowest = self.ingest_resume_s.iter().copied().fold(0.0, f64::max);
        want(slowest <= 1.0, format!("ingest resumed {slowest:.2} s after a SIGKILL (target 1 s)"));
        out
    }

    /// The table printed at the end of every run.
    pub fn table(&self) -> String {
        let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
        let median = |v: &[f64]| {
            let mut s = v.to_vec();
            s.sort_by(f64::total_cmp);
            s.get(s.len() / 2).copied().unwrap_or(0.0)
        };
        let faults: Vec<String> = self.faults.iter().map(|(k, n)| format!("{n} {k}")).collect();
        let rows = [
            ("faults", format!("{} ({})", self.faults.values().sum::<u64>(), faults.join(", ")), String::new()),
            ("acknowledged batches / points", format!("{} / {}", self.acked_batches, self.acked_points), String::new()),
            ("acknowledged points missing", self.missing.to_string(), "0".into()),
            ("stale vectors / phantoms", format!("{} / {}", self.stale, self.phantoms), "0 / 0".into()),
            ("shards whose replicas disagree", self.replicas_disagree.to_string(), "0".into()),
            ("searches (redirected to the other coordinator)", format!("{} ({})", self.searches, self.searches_redirected), String::new()),
            ("failed / partial searches", format!("{} / {}", self.failed_searches, self.partial_searches), "0 / 0".into()),
            ("recall@10 quiet → faults", format!("{:.4} → {:.4}", self.quiet_recall, self.fault_recall), "within 0.01".into()),
            ("search p99 quiet → faults", format!("{:.1} → {:.1} ms", self.quiet_p99_ms, self.fault_p99_ms), "≤ 3x".into()),
            (
                "ingest flowing again after a SIGKILL (median / max)",
                format!("{:.2} / {:.2} s over {}", median(&self.ingest_resume_s), max(&self.ingest_resume_s), self.ingest_resume_s.len()),
                "≤ 1 s".into(),
            ),
            (
                "a replica back in sync after its node's restart (median / max)",
                format!("{:.2} / {:.2} s over {}", median(&self.rejoin_s), max(&self.rejoin_s), self.rejoin_s.len()),
                String::new(),
            ),
            (
                "a replica repaired onto another node after a kill (median / max)",
                format!("{:.2} / {:.2} s over {}", median(&self.repair_s), max(&self.repair_s), self.repair_s.len()),
                String::new(),
            ),
            (
                "a repaired node holding copies again after a rebalance (median / max)",
                format!("{:.2} / {:.2} s over {}", median(&self.rebalance_s), max(&self.rebalance_s), self.rebalance_s.len()),
                String::new(),
            ),
            (
                "a replica back in sync after one start at once (median / max)",
                format!(
                    "{:.2} / {:.2} s over {}, {} starts refused",
                    median(&self.quick_rejoin_s),
                    max(&self.quick_rejoin_s),
                    self.quick_rejoin_s.len(),
                    self.refused_restarts.len()
                ),
                "0 refused".into(),
            ),
            (
                "a flipped bit found by the scrub / its copy made again (median / max)",
                format!(
                    "{:.2} / {:.2} s over {}; {:.2} / {:.2} s over {}",
                    median(&self.flip_found_s),
                    max(&self.flip_found_s),
                    self.flip_found_s.len(),
                    median(&self.flip_repaired_s),
                    max(&self.flip_repaired_s),
                    self.flip_repaired_s.len()
                ),
                String::new(),
            ),
            ("settled after the last fault", format!("{:.2} s", self.settle_s), String::new()),
        ];
        let mut out = String::from("| measured | figure | target |\n|---|---|---|\n");
        for (what, figure, target) in rows {
            out.push_str(&format!("| {what} | {figure} | {target} |\n"));
        }
        if self.low_recall_searches > 0 {
            out.push_str(&format!("\n{} searches under faults answered whole with recall below 0.5\n", self.low_recall_searches));
        }
        if !self.lost.is_empty() {
            out.push_str("\nacknowledged points missing, by batch and shard:\n");
            for l in &self.lost {
                out.push_str(&format!(
                    "  stream-{} offset {} (sent {:.2} s, acked {:.2} s): shard {}, {} of {} missing, first {:?}\n",
                    l.stream, l.offset, l.first_sent_s, l.acked_s, l.shard, l.missing, l.of, l.ids
                ));
            }
            out.push_str("the faults:\n");
            for (at, what) in &self.fault_log {
                out.push_str(&format!("  {at:>8.2} s  {what}\n"));
            }
        }
        if !self.search_failures.is_empty() {
            out.push_str("\nfailed searches by kind:\n");
            for (kind, n) in &self.search_failures {
                out.push_str(&format!("  {n:>9}  {kind}\n"));
            }
            out.push_str("the first:\n");
            for (at, e) in &self.first_failures {
                out.push_str(&format!("  {at:>8.2} s  {e}\n"));
            }
        }
        out
    }
}

/// The points of one acknowledged batch missing from one shard.
#[derive(Debug, Clone, serde::Serialize)]
pub struct LostPart {
    pub stream: usize,
    pub offset: u64,
    pub first_sent_s: f64,
    pub acked_s: f64,
    pub shard: u32,
    pub missing: u64,
    pub of: u64,
    pub ids: Vec<u64>,
}

/// One search's outcome, timed from the run's start.
pub(super) struct Searched {
    pub(super) at: Duration,
    pub(super) took: Duration,
    pub(super) ok: bool,
    pub(super) partial: bool,
    pub(super) redirected: bool,
    /// Of the collection whose recall is measured.
    pub(super) measured: bool,
    pub(super) recall: f64,
    /// A failed search's code and message, digits left out so that like
    /// failures count together.
    pub(super) error: Option<String>,
}

/// One stream's acknowledged batch.
pub(super) struct Acked {
    pub(super) stream: usize,
    pub(super) offset: u64,
    pub(super) first_sent: Duration,
    pub(super) acked: Duration,
    pub(super) ids: std::ops::Range<u64>,
    pub(super) seed: u64,
}

/// What happened when, for the figures.
#[derive(Default)]
pub(super) struct Timeline {
    /// When faults started (the quiet phase ends there).
    pub(super) faults_from: Option<Duration>,
    pub(super) node_kills: Vec<Duration>,
    pub(super) rejoin_s: Vec<f64>,
    pub(super) repair_s: Vec<f64>,
    pub(super) rebalance_s: Vec<f64>,
    pub(super) quick_rejoin_s: Vec<f64>,
    pub(super) refused_restarts: Vec<String>,
    pub(super) flip_found_s: Vec<f64>,
    pub(super) flip_repaired_s: Vec<f64>,
    pub(super) faults: BTreeMap<String, u64>,
    pub(super) log: Vec<(f64, String)>,
}

/// A failure's code and message with digits left out (ports, ids,
/// durations), so that failures of one kind count together.
pub(super) fn failure_kind(error: &str) -> String {
    error.chars().filter(|c| !c.is_ascii_digit()).take(160).collect()
}

pub(super) fn figures(r: &mut ChaosReport, tl: &Timeline, acked: &[Vec<Acked>], searched: &[Searched]) {
    r.faults = tl.faults.clone();
    r.fault_log = tl.log.clone();
    r.rejoin_s = tl.rejoin_s.clone();
    r.repair_s = tl.repair_s.clone();
    r.rebalance_s = tl.rebalance_s.clone();
    r.quick_rejoin_s = tl.quick_rejoin_s.clone();
    r.refused_restarts = tl.refused_restarts.clone();
    r.flip_found_s = tl.flip_found_s.clone();
    r.flip_repaired_s = tl.flip_repaired_s.clone();
    let from = tl.faults_from.unwrap_or_default();
    let (quiet, faulty): (Vec<&Searched>, Vec<&Searched>) = searched.iter().partition(|s| s.at < from);
    r.searches = searched.len() as u64;
    r.failed_searches = searched.iter().filter(|s| !s.ok).count() as u64;
    r.partial_searches = searched.iter().filter(|s| s.partial).count() as u64;
    r.searches_redirected = searched.iter().filter(|s| s.redirected).count() as u64;
    let mut failures: BTreeMap<String, u64> = BTreeMap::new();
    for e in searched.iter().filter_map(|s| s.error.as_ref()) {
        *failures.entry(failure_kind(e)).or_insert(0) += 1;
    }
    r.first_failures = searched.iter().filter_map(|s| Some((s.at.as_secs_f64(), s.error.clone()?))).take(10).collect();
    r.search_failures = failures.into_iter().collect();
    r.search_failures.sort_by_key(|f| std::cmp::Reverse(f.1));
    r.search_failures.truncate(10);
    r.low_recall_searches = faulty.iter().filter(|s| s.ok && s.measured && !s.partial && s.recall < 0.5).count() as u64;
    let recall = |v: &[&Searched]| {
        let answered = || v.iter().filter(|s| s.ok && s.measured);
        answered().map(|s| s.recall).sum::<f64>() / answered().count().max(1) as f64
    };
    let p99 = |v: &[&Searched]| {
        let mut t: Vec<f64> = v.iter().map(|s| s.took.as_secs_f64() * 1e3).collect();
        t.sort_by(f64::total_cmp);
        t.get((t.len() * 99 / 100).min(t.len().saturating_sub(1))).copied().unwrap_or(0.0)
    };
    r.quiet_recall = recall(&quiet);
    r.fault_recall = recall(&faulty);
    r.quiet_p99_ms = p99(&quiet);
    r.fault_p99_ms = p99(&faulty);
    // After each kill: when every stream had a batch sent after it acknowledged.
    for &k in &tl.node_kills {
        let resumed = acked.iter().filter_map(|stream| stream.iter().find(|a| a.first_sent >= k).map(|a| a.acked.saturating_sub(k))).max();
        if let Some(d) = resumed {
            r.ingest_resume_s.push(d.as_secs_f64());
        }
    }
    r.acked_batches = acked.iter().map(Vec::len).sum::<usize>() as u64;
    r.acked_points = acked.iter().flatten().map(|a| a.ids.end - a.ids.start).sum();
}
