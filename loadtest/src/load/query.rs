//! Query load: `Search` open loop at a rate (each request at its intended
//! time, latency from then, in-flight bounded) or closed loop with N
//! clients; an ef list runs one phase per ef (a sweep); recall@k against
//! the ground truth.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, ensure};
use serde::Serialize;
use serde_json::json;
use shoal_proto::v1;
use tokio::time::Instant;

use super::recall::recall_at_k;
use super::report::{PhaseSummary, Report};
use super::schedule::{Bound, Schedule, closed_loop, open_loop, parse_duration};
use super::stats::{Outcome, Recorder};
use super::{Common, Ctx, PreloadRule, Run, ser_secs};

/// Flags of `query`.
#[derive(clap::Args, Debug, Clone, Serialize)]
pub(crate) struct Args {
    #[command(flatten)]
    pub(crate) common: Common,
    /// Open loop: queries per second, each sent at its intended time
    /// whatever the answers do; latency counts from that time.
    #[arg(long, value_name = "QPS")]
    pub(crate) rate: Option<f64>,
    /// Closed loop (without --rate): clients each sending its next query
    /// when the last is answered [default: 1].
    #[arg(long, conflicts_with = "rate")]
    pub(crate) clients: Option<usize>,
    /// Open loop: most queries in flight. A query that finds them all busy
    /// is counted late and waits; dropped if still waiting at its deadline.
    #[arg(long, default_value_t = 256)]
    pub(crate) max_in_flight: usize,
    #[arg(long, default_value_t = 10)]
    pub(crate) k: u32,
    /// Candidate list per shard (0: the server's default). A comma list runs
    /// one phase per value: an ef sweep.
    #[arg(long, value_delimiter = ',', default_value = "0")]
    pub(crate) ef: Vec<u32>,
    /// Deadline of each query (0: the server's, 2 s).
    #[arg(long, default_value_t = 0)]
    pub(crate) timeout_ms: u32,
    /// Accept answers from the shards that answered (marked partial).
    #[arg(long)]
    pub(crate) allow_partial: bool,
    /// How long each phase runs [default: 10s, unless --count].
    #[arg(long, value_parser = parse_duration)]
    #[serde(serialize_with = "ser_secs")]
    pub(crate) duration: Option<Duration>,
    /// Queries per phase.
    #[arg(long)]
    pub(crate) count: Option<u64>,
    /// Base vectors loaded before the measured phases [default: all of
    /// them if this run created the collection, else none].
    #[arg(long)]
    pub(crate) preload: Option<usize>,
}

/// How one phase of queries runs.
#[derive(Clone, Debug)]
pub(crate) struct Plan {
    pub(crate) rate: Option<f64>,
    pub(crate) clients: usize,
    pub(crate) max_in_flight: usize,
    pub(crate) k: u32,
    pub(crate) ef: u32,
    pub(crate) timeout_ms: u32,
    pub(crate) allow_partial: bool,
    pub(crate) bound: Bound,
}

/// The server's deadline when a query sets none (docs/limits.md).
const SERVER_DEFAULT_TIMEOUT: Duration = Duration::from_secs(2);
/// The client gives up this long after the server should have.
const CLIENT_MARGIN: Duration = Duration::from_secs(2);

impl Plan {
    fn deadline(&self) -> Duration {
        if self.timeout_ms == 0 { SERVER_DEFAULT_TIMEOUT } else { Duration::from_millis(u64::from(self.timeout_ms)) }
    }

    pub(crate) fn params(&self) -> serde_json::Value {
        let mode = match self.rate {
            Some(r) => json!({"mode": "open", "rate": r, "max_in_flight": self.max_in_flight}),
            None => json!({"mode": "closed", "clients": self.clients}),
        };
        let mut v = json!({"k": self.k, "ef": self.ef, "timeout_ms": self.timeout_ms, "allow_partial": self.allow_partial});
        v.as_object_mut().expect("object").extend(mode.as_object().expect("object").clone());
        v
    }
}

pub(crate) fn phase_name(ef: u32) -> String {
    if ef == 0 { "ef=default".into() } else { format!("ef={ef}") }
}

/// Runs one phase of queries from `start` to its bound.
pub(crate) async fn queries(ctx: &Ctx, plan: &Plan, start: Instant, rec: Arc<Recorder>) {
    let (clients, data, collection) = (ctx.clients.clone(), ctx.data.clone(), ctx.collection.clone());
    let p = plan.clone();
    let limit = plan.deadline() + CLIENT_MARGIN;
    let op = move |i: u64| {
        let qi = (i % data.queries.len() as u64) as usize;
        let req = v1::SearchRequest {
            collection: collection.clone(),
            vector: data.queries[qi].clone(),
            k: p.k,
            ef: p.ef,
            with_payload: false,
            allow_partial: p.allow_partial,
            timeout_ms: p.timeout_ms,
            ..Default::default()
        };
        let mut c = clients.next();
        let (data, k) = (data.clone(), p.k as usize);
        async move {
            match tokio::time::timeout(limit, c.search(req)).await {
                Err(_) => Outcome::Err("CLIENT_TIMEOUT".into()),
                Ok(Err(s)) => Outcome::status(&s),
                Ok(Ok(r)) => {
                    let r = r.into_inner();
                    let recall = data.truth_of(qi).map(|t| {
                        let ids: Vec<u64> = r.hits.iter().map(|h| h.id).collect();
                        recall_at_k(&ids, t, k)
                    });
                    Outcome::Ok { items: 1, partial: r.partial, skipped: false, recall }
                }
            }
        }
    };
    match plan.rate {
        Some(rate) => open_loop(Schedule { start, rate }, plan.bound, plan.max_in_flight, plan.deadline(), rec, op).await,
        None => closed_loop(plan.clients, plan.bound, rec, op).await,
    }
}

pub(crate) fn run(a: Args) -> Result<()> {
    super::block_on(run_report(a)).map(|_| ())
}

pub(crate) async fn run_report(a: Args) -> Result<Report> {
    ensure!(a.rate.is_none_or(|r| r > 0.0), "--rate must be above 0");
    ensure!(a.k > 0, "--k must be at least 1");
    let duration = match (a.duration, a.count) {
        (None, None) => Some(Duration::from_secs(10)),
        (d, _) => d,
    };
    let config = serde_json::to_value(&a)?;
    let run = Run {
        command: "query",
        config,
        needs_queries: true,
        k: a.k as usize,
        planned: duration.map(|d| d * a.ef.len() as u32),
        preload: PreloadRule::IfCreated { explicit: a.preload, fraction: 1.0 },
    };
    super::execute(&a.common, a.common.faults.clone(), run, async |ctx: &Ctx| {
        let rec = ctx.recorder("query");
        let mut phases = Vec::new();
        for &ef in &a.ef {
            let start = Instant::now();
            let plan = Plan {
                rate: a.rate,
                clients: a.clients.unwrap_or(1),
                max_in_flight: a.max_in_flight,
                k: a.k,
                ef,
                timeout_ms: a.timeout_ms,
                allow_partial: a.allow_partial,
                bound: Bound { end: duration.map(|d| start + d), count: a.count },
            };
            ctx.progress.set_phase(&phase_name(ef));
            queries(ctx, &plan, start, rec.clone()).await;
            let stats = rec.take_phase();
            phases.push(PhaseSummary::new(phase_name(ef), "query", plan.params(), ctx.secs(start), ctx.secs(Instant::now()), &stats));
        }
        Ok(phases)
    })
    .await
}
