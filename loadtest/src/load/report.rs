//! The run's report: a JSON file of a stable shape (`schema`, `command`,
//! `config`, `target`, `preload`, `phases`, `timeline`, `faults`, `errors`,
//! `collection`), an SVG chart beside it, and a summary on stdout.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::Serialize;

use super::faults::FaultEvent;
use super::stats::{Counts, LatencySummary, PhaseStats, RecallSummary, Second, summarize};
use super::target::ProcSample;

/// Names the shape of the JSON; a change of shape changes it.
pub(crate) const SCHEMA: &str = "shoal-loadtest/1";

/// Where the report goes.
#[derive(clap::Args, Debug, Clone, Serialize)]
pub(crate) struct OutputArgs {
    /// Write the report as JSON.
    #[arg(long, value_name = "FILE")]
    pub(crate) json: Option<PathBuf>,
    /// Draw throughput and p99 over time (faults marked) and, for an ef
    /// sweep, recall against QPS, as SVG.
    #[arg(long, value_name = "FILE")]
    pub(crate) svg: Option<PathBuf>,
    /// No progress bar (it is drawn only on a terminal anyway).
    #[arg(long)]
    pub(crate) no_progress: bool,
}

/// The whole report.
#[derive(Serialize, Clone, Debug)]
pub(crate) struct Report {
    pub(crate) schema: &'static str,
    pub(crate) command: &'static str,
    /// Every flag as given or defaulted.
    pub(crate) config: serde_json::Value,
    pub(crate) target: TargetInfo,
    pub(crate) started_unix_s: u64,
    /// Seconds of the measured run (after any preload).
    pub(crate) duration_s: f64,
    pub(crate) preload: Option<Preload>,
    pub(crate) phases: Vec<PhaseSummary>,
    /// One row per second of the run, by when requests finished.
    pub(crate) timeline: Vec<TimelineRow>,
    pub(crate) faults: Vec<FaultEvent>,
    /// Errors of the whole run: series → gRPC code → count.
    pub(crate) errors: BTreeMap<String, BTreeMap<String, u64>>,
    pub(crate) collection: CollectionAfter,
}

#[derive(Serialize, Clone, Debug)]
pub(crate) struct TargetInfo {
    /// coordinators, embedded or processes.
    pub(crate) kind: &'static str,
    pub(crate) coordinators: Vec<String>,
    pub(crate) collection: String,
    pub(crate) created: bool,
}

/// Vectors loaded before the measured run (not in its phases).
#[derive(Serialize, Clone, Debug)]
pub(crate) struct Preload {
    pub(crate) vectors_acked: u64,
    pub(crate) batches_failed: u64,
    pub(crate) seconds: f64,
}

/// The collection when the run ended.
#[derive(Serialize, Clone, Debug)]
pub(crate) struct CollectionAfter {
    pub(crate) points: Option<u64>,
    pub(crate) error: Option<String>,
}

/// One phase of one series: an ef of a sweep, the ingest, the queries of a
/// mixed run.
#[derive(Serialize, Clone, Debug)]
pub(crate) struct PhaseSummary {
    pub(crate) name: String,
    /// ingest, query, upsert or delete.
    pub(crate) series: &'static str,
    /// What this phase ran with (mode, rate, clients, k, ef, ...).
    pub(crate) params: serde_json::Value,
    pub(crate) start_s: f64,
    pub(crate) end_s: f64,
    pub(crate) counts: Counts,
    /// Answered requests (acked batches) per second of the phase.
    pub(crate) ok_per_s: f64,
    /// Items per second: vectors acked for ingest, else as ok_per_s.
    pub(crate) items_per_s: f64,
    /// Answered requests, from their intended send time (open loop, ingest
    /// at a rate) or their send (closed loop, ingest flat out).
    pub(crate) latency_ms: LatencySummary,
    pub(crate) error_latency_ms: LatencySummary,
    /// How late requests went out after their intended time.
    pub(crate) send_lag_ms: LatencySummary,
    pub(crate) errors: BTreeMap<String, u64>,
    pub(crate) recall: Option<RecallSummary>,
}

impl PhaseSummary {
    pub(crate) fn new(
        name: String,
        series: &'static str,
        params: serde_json::Value,
        start_s: f64,
        end_s: f64,
        p: &PhaseStats,
    ) -> PhaseSummary {
        let secs = (end_s - start_s).max(1e-9);
        PhaseSummary {
            name,
            series,
            params,
            start_s: round3(start_s),
            end_s: round3(end_s),
            counts: p.counts.clone(),
            ok_per_s: round3(p.counts.ok as f64 / secs),
            items_per_s: round3(p.counts.items as f64 / secs),
            latency_ms: summarize(&p.latency),
            error_latency_ms: summarize(&p.error_latency),
            send_lag_ms: summarize(&p.send_lag),
            errors: p.errors.clone(),
            recall: p.recall(),
        }
    }
}

/// One second of the run: each series, and each started process.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub(crate) struct TimelineRow {
    /// Seconds since the start of the run: this row covers [t, t+1).
    pub(crate) t: u64,
    pub(crate) series: BTreeMap<String, Second>,
    #[serde(skip_serializing_if = "BTreeMap::is_empty")]
    pub(crate) processes: BTreeMap<String, ProcSample>,
}

pub(crate) fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

/// Rows by second from each series' seconds and the process samples.
pub(crate) fn merge_timeline(
    series: Vec<(&'static str, Vec<Second>)>,
    processes: BTreeMap<u64, BTreeMap<String, ProcSample>>,
) -> Vec<TimelineRow> {
    let len = series.iter().map(|(_, s)| s.len() as u64).chain(processes.keys().map(|t| t + 1)).max().unwrap_or(0);
    (0..len)
        .map(|t| TimelineRow {
            t,
            series: series.iter().map(|(name, s)| ((*name).to_owned(), s.get(t as usize).cloned().unwrap_or_default())).collect(),
            processes: processes.get(&t).cloned().unwrap_or_default(),
        })
        .collect()
}

/// The summary a person reads on stdout.
pub(crate) fn text(r: &Report) -> String {
    let mut s = String::new();
    let codes = |e: &BTreeMap<String, u64>| e.iter().map(|(c, n)| format!("{c}: {n}")).collect::<Vec<_>>().join(", ");
    for p in &r.phases {
        let c = &p.counts;
        let l = &p.latency_ms;
        s += &format!("{} [{}] {:.1}-{:.1}s: sent {} ok {} errors {}", p.name, p.series, p.start_s, p.end_s, c.sent, c.ok, c.errors);
        if !p.errors.is_empty() {
            s += &format!(" ({})", codes(&p.errors));
        }
        s += &format!(" late {} dropped {}", c.late, c.dropped);
        if c.partial > 0 {
            s += &format!(" partial {}", c.partial);
        }
        s += "\n";
        let rate = if p.series == "ingest" {
            format!("{:.0} vectors/s ({} acked)", p.items_per_s, c.items)
        } else {
            format!("{:.1} ok/s", p.ok_per_s)
        };
        s += &format!(
            "  {rate}; latency ms p50 {:.2} p90 {:.2} p99 {:.2} p99.9 {:.2} max {:.2}",
            l.p50_ms, l.p90_ms, l.p99_ms, l.p999_ms, l.max_ms
        );
        if let Some(rc) = &p.recall {
            s += &format!("; recall {:.4} over {}", rc.mean, rc.queries);
        }
        s += "\n";
    }
    for f in &r.faults {
        s += &format!("fault {} at {}: {}\n", f.label, f.fired_s.map_or("-".to_owned(), |t| format!("{t:.2}s")), f.outcome);
    }
    if let Some(n) = r.collection.points {
        s += &format!("collection {:?}: {n} points\n", r.target.collection);
    }
    s
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::load::stats::{Outcome, Recorder};
    use std::time::Duration;
    use tokio::time::Instant;

    /// A small report with two ef phases, a fault, errors and a process.
    pub(crate) fn sample() -> Report {
        let start = Instant::now();
        let rec = Recorder::new("query", start);
        let mut phases = Vec::new();
        for (i, ef) in [16u32, 64].into_iter().enumerate() {
            for j in 0..50u64 {
                let t = start + Duration::from_millis(i as u64 * 2000 + j * 30);
                rec.scheduled();
                rec.sent(Duration::ZERO);
                let outcome = if j == 7 {
                    Outcome::Err("UNAVAILABLE".into())
                } else {
                    Outcome::Ok { items: 1, partial: false, skipped: false, recall: Some(0.8 + 0.1 * i as f64) }
                };
                rec.finish(t, t + Duration::from_millis(2 + j % 5 + 10 * i as u64), outcome);
            }
            let p = rec.take_phase();
            phases.push(PhaseSummary::new(
                format!("ef={ef}"),
                "query",
                serde_json::json!({"ef": ef, "k": 10}),
                i as f64 * 2.0,
                i as f64 * 2.0 + 1.5,
                &p,
            ));
        }
        let mut procs = BTreeMap::new();
        procs.insert(1, BTreeMap::from([("shard-0".to_owned(), ProcSample { cpu_pct: 50.0, rss_mib: 100.0 })]));
        Report {
            schema: SCHEMA,
            command: "query",
            config: serde_json::json!({"k": 10}),
            target: TargetInfo {
                kind: "processes",
                coordinators: vec!["http://127.0.0.1:1".into()],
                collection: "c".into(),
                created: true,
            },
            started_unix_s: 1,
            duration_s: 3.5,
            preload: Some(Preload { vectors_acked: 100, batches_failed: 0, seconds: 0.5 }),
            phases,
            timeline: merge_timeline(vec![("query", rec.timeline(4))], procs),
            faults: vec![FaultEvent {
                at_s: 1.0,
                fired_s: Some(1.002),
                done_s: Some(1.01),
                label: "kill shard-1".into(),
                ok: true,
                outcome: "SIGKILL".into(),
            }],
            errors: BTreeMap::from([("query".to_owned(), BTreeMap::from([("UNAVAILABLE".to_owned(), 2)]))]),
            collection: CollectionAfter { points: Some(100), error: None },
        }
    }

    fn keys(v: &serde_json::Value) -> Vec<&str> {
        v.as_object().unwrap().keys().map(String::as_str).collect()
    }

    #[test]
    fn the_json_has_its_documented_shape() {
        let v = serde_json::to_value(sample()).unwrap();
        let mut top = keys(&v);
        top.sort_unstable();
        assert_eq!(
            top,
            [
                "collection",
                "command",
                "config",
                "duration_s",
                "errors",
                "faults",
                "phases",
                "preload",
                "schema",
                "started_unix_s",
                "target",
                "timeline"
            ]
        );
        assert_eq!(v["schema"], SCHEMA);
        let p = &v["phases"][1];
        let mut pk = keys(p);
        pk.sort_unstable();
        assert_eq!(
            pk,
            [
                "counts",
                "end_s",
                "error_latency_ms",
                "errors",
                "items_per_s",
                "latency_ms",
                "name",
                "ok_per_s",
                "params",
                "recall",
                "send_lag_ms",
                "series",
                "start_s"
            ]
        );
        let mut ck = keys(&p["counts"]);
        ck.sort_unstable();
        assert_eq!(ck, ["dropped", "errors", "items", "late", "ok", "partial", "scheduled", "sent", "skipped"]);
        let mut lk = keys(&p["latency_ms"]);
        lk.sort_unstable();
        assert_eq!(lk, ["count", "max_ms", "mean_ms", "p50_ms", "p90_ms", "p999_ms", "p99_ms"]);
        assert_eq!(p["name"], "ef=64");
        assert_eq!(p["counts"]["sent"], 50);
        assert_eq!(p["counts"]["ok"], 49);
        assert_eq!(p["errors"]["UNAVAILABLE"], 1);
        assert!((p["recall"]["mean"].as_f64().unwrap() - 0.9).abs() < 1e-9);
        assert!(p["latency_ms"]["max_ms"].as_f64().unwrap() >= 16.0);
        let row = &v["timeline"][1];
        assert_eq!(row["t"], 1);
        let mut sk = keys(&row["series"]["query"]);
        sk.sort_unstable();
        assert_eq!(sk, ["errors", "items", "max_ms", "ok", "p50_ms", "p99_ms"]);
        assert_eq!(row["processes"]["shard-0"]["cpu_pct"], 50.0);
        // Rows without process samples leave the key out.
        assert!(v["timeline"][0].get("processes").is_none());
        let mut fk = keys(&v["faults"][0]);
        fk.sort_unstable();
        assert_eq!(fk, ["at_s", "done_s", "fired_s", "label", "ok", "outcome"]);
        assert_eq!(v["errors"]["query"]["UNAVAILABLE"], 2);
        // Seconds 0..=3 of query; every second has a row.
        assert_eq!(v["timeline"].as_array().unwrap().len(), 4);
        let oks: u64 = v["timeline"].as_array().unwrap().iter().map(|r| r["series"]["query"]["ok"].as_u64().unwrap()).sum();
        assert_eq!(oks, 98);
    }

    #[test]
    fn the_text_summary_names_codes_and_recall() {
        let t = text(&sample());
        assert!(t.contains("ef=16 [query]") && t.contains("UNAVAILABLE: 1") && t.contains("recall 0.9000 over 49"), "{t}");
        assert!(t.contains("fault kill shard-1 at 1.00s: SIGKILL"), "{t}");
    }
}
