//! Mixed load: ingest and queries at once, each at its own rate, with
//! optional upserts and deletes of random existing points (one id a
//! request). Upserts rewrite even ids of the preloaded points with their own
//! vectors; deletes remove odd ones, each at most once, so the collection
//! ends with preloaded + ingested − deleted points.

use std::sync::Arc;
use std::time::Duration;

use anyhow::{Result, ensure};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use serde_json::json;
use shoal_proto::v1;
use tokio::time::Instant;

use super::ingest::{self, IngestFlags};
use super::query::{self, phase_name};
use super::report::{PhaseSummary, Report};
use super::schedule::{Bound, Schedule, open_loop, parse_duration};
use super::stats::{Outcome, Recorder};
use super::{Common, Ctx, PreloadRule, Run, ser_secs};

/// Flags of `mixed`.
#[derive(clap::Args, Debug, Clone, Serialize)]
pub(crate) struct Args {
    #[command(flatten)]
    pub(crate) common: Common,
    /// How long the mixed load runs.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    #[serde(serialize_with = "ser_secs")]
    pub(crate) duration: Duration,
    /// Ingest: concurrent streams (0: no ingest).
    #[arg(long, default_value_t = 1)]
    pub(crate) streams: usize,
    /// Ingest: points per batch.
    #[arg(long, default_value_t = 500)]
    pub(crate) batch: usize,
    /// Ingest: batches a stream sends ahead of their acks.
    #[arg(long, default_value_t = 2)]
    pub(crate) window: usize,
    /// Ingest: vectors per second across the streams (default: flat out).
    #[arg(long, value_name = "VECTORS_PER_S")]
    pub(crate) ingest_rate: Option<f64>,
    /// Ingest sources are PREFIX-0, ... (default: `lt-<unix time>`).
    #[arg(long)]
    pub(crate) source_prefix: Option<String>,
    /// Queries: open loop at this rate (0: no queries).
    #[arg(long, value_name = "QPS")]
    pub(crate) query_rate: Option<f64>,
    /// Queries: closed loop with this many clients (without --query-rate)
    /// [default: 1].
    #[arg(long, conflicts_with = "query_rate")]
    pub(crate) clients: Option<usize>,
    /// Open loops: most requests in flight, per kind.
    #[arg(long, default_value_t = 256)]
    pub(crate) max_in_flight: usize,
    #[arg(long, default_value_t = 10)]
    pub(crate) k: u32,
    /// Candidate list per shard (0: the server's default).
    #[arg(long, default_value_t = 0)]
    pub(crate) ef: u32,
    /// Deadline of each query (0: the server's, 2 s).
    #[arg(long, default_value_t = 0)]
    pub(crate) timeout_ms: u32,
    #[arg(long)]
    pub(crate) allow_partial: bool,
    /// Upserts of one random existing point per request, per second.
    #[arg(long, value_name = "PER_S")]
    pub(crate) upsert_rate: Option<f64>,
    /// Deletes of one random existing point per request, per second.
    #[arg(long, value_name = "PER_S")]
    pub(crate) delete_rate: Option<f64>,
    /// The client gives up on an upsert or delete after this long.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    #[serde(serialize_with = "ser_secs")]
    pub(crate) write_timeout: Duration,
    /// Base vectors loaded first (the rest are ingested during the run)
    /// [default: half of them if this run created the collection, else none].
    #[arg(long)]
    pub(crate) preload: Option<usize>,
}

pub(crate) fn run(a: Args) -> Result<()> {
    super::block_on(run_report(a)).map(|_| ())
}

pub(crate) async fn run_report(a: Args) -> Result<Report> {
    let queries_on = a.query_rate != Some(0.0) && a.clients != Some(0);
    ensure!(a.query_rate.is_none_or(|r| r >= 0.0), "--query-rate must not be negative");
    let config = serde_json::to_value(&a)?;
    let run = Run {
        command: "mixed",
        config,
        needs_queries: queries_on,
        k: a.k as usize,
        planned: Some(a.duration),
        preload: PreloadRule::IfCreated { explicit: a.preload, fraction: 0.5 },
    };
    super::execute(&a.common, a.common.faults.clone(), run, async |ctx: &Ctx| {
        let start = ctx.start;
        let end = start + a.duration;
        let loaded = ctx.preloaded;
        ensure!(
            loaded > 0 || (a.upsert_rate.is_none() && a.delete_rate.is_none()),
            "upserts and deletes pick among preloaded points: --preload must be above 0"
        );
        ctx.progress.set_phase("mixed");
        let mut phases = Vec::new();

        let ingest_flags = IngestFlags {
            streams: a.streams,
            batch: a.batch,
            window: a.window,
            rate: a.ingest_rate,
            drain: Duration::from_secs(10),
            ack_timeout: Duration::from_secs(60),
            source_prefix: a.source_prefix.clone(),
        };
        let n = ctx.data.base.len() as u64;
        let plan = ingest::Plan::new(&ingest_flags, loaded..n, Some(end), a.source_prefix.clone().unwrap_or_else(ingest::default_prefix));
        let ingest_on = a.streams > 0 && loaded < n;
        let ingest_rec = ingest_on.then(|| ctx.recorder("ingest"));
        let ingest_fut = async {
            if let Some(r) = &ingest_rec {
                ingest::ingest(&ctx.clients, &ctx.collection, &ctx.data, &plan, start, r.clone()).await;
            }
            Instant::now()
        };

        let qplan = query::Plan {
            rate: a.query_rate,
            clients: a.clients.unwrap_or(1),
            max_in_flight: a.max_in_flight,
            k: a.k,
            ef: a.ef,
            timeout_ms: a.timeout_ms,
            allow_partial: a.allow_partial,
            bound: Bound { end: Some(end), count: None },
        };
        let query_rec = queries_on.then(|| ctx.recorder("query"));
        let query_fut = async {
            if let Some(r) = &query_rec {
                query::queries(ctx, &qplan, start, r.clone()).await;
            }
            Instant::now()
        };

        let upsert_rec = a.upsert_rate.filter(|r| *r > 0.0).map(|r| (r, ctx.recorder("upsert")));
        let upsert_fut = async {
            if let Some((rate, rec)) = &upsert_rec {
                upserts(ctx, *rate, end, loaded, a.max_in_flight, a.write_timeout, rec.clone()).await;
            }
            Instant::now()
        };
        let delete_rec = a.delete_rate.filter(|r| *r > 0.0).map(|r| (r, ctx.recorder("delete")));
        let delete_fut = async {
            if let Some((rate, rec)) = &delete_rec {
                deletes(ctx, *rate, end, loaded, a.max_in_flight, a.write_timeout, rec.clone()).await;
            }
            Instant::now()
        };
        // Each kind's phase ends when it did (ingest may run out of data).
        let (ti, tq, tu, td) = tokio::join!(ingest_fut, query_fut, upsert_fut, delete_fut);
        if let Some(r) = &ingest_rec {
            phases.push(PhaseSummary::new("ingest".into(), "ingest", plan.params(), 0.0, ctx.secs(ti), &r.take_phase()));
        }
        if let Some(r) = &query_rec {
            phases.push(PhaseSummary::new(phase_name(a.ef), "query", qplan.params(), 0.0, ctx.secs(tq), &r.take_phase()));
        }
        for (rate, r, t) in [(&upsert_rec, tu), (&delete_rec, td)].into_iter().filter_map(|(x, t)| x.as_ref().map(|(rate, r)| (rate, r, t)))
        {
            phases.push(PhaseSummary::new(
                r.series.into(),
                r.series,
                json!({"mode": "open", "rate": rate, "ids": [0, loaded]}),
                0.0,
                ctx.secs(t),
                &r.take_phase(),
            ));
        }
        Ok(phases)
    })
    .await
}

async fn upserts(ctx: &Ctx, rate: f64, end: Instant, loaded: u64, max_in_flight: usize, limit: Duration, rec: Arc<Recorder>) {
    let (clients, data, collection, seed) = (ctx.clients.clone(), ctx.data.clone(), ctx.collection.clone(), ctx.seed);
    let evens = loaded.div_ceil(2);
    let op = move |i: u64| {
        let mut rng = StdRng::seed_from_u64(seed ^ 0x5550_5345_5254 ^ i.wrapping_mul(0x9e37_79b9_7f4a_7c15));
        let id = 2 * rng.random_range(0..evens);
        let point = v1::Point { id, vector: data.base.row(id as usize).expect("a preloaded row"), payload: data.payload(id as usize) };
        let req = v1::UpsertRequest { collection: collection.clone(), points: vec![point] };
        let mut c = clients.next();
        async move {
            match tokio::time::timeout(limit, c.upsert(req)).await {
                Err(_) => Outcome::Err("CLIENT_TIMEOUT".into()),
                Ok(Err(s)) => Outcome::status(&s),
                Ok(Ok(r)) => Outcome::ok(u64::from(r.into_inner().upserted)),
            }
        }
    };
    open_loop(Schedule { start: ctx.start, rate }, Bound { end: Some(end), count: None }, max_in_flight, limit, rec, op).await;
}

async fn deletes(ctx: &Ctx, rate: f64, end: Instant, loaded: u64, max_in_flight: usize, limit: Duration, rec: Arc<Recorder>) {
    let (clients, collection) = (ctx.clients.clone(), ctx.collection.clone());
    let mut ids: Vec<u64> = (0..loaded).filter(|i| i % 2 == 1).collect();
    ids.shuffle(&mut StdRng::seed_from_u64(ctx.seed ^ 0x44454c));
    let ids = Arc::new(ids);
    let bound = Bound { end: Some(end), count: Some(ids.len() as u64) };
    let op = move |i: u64| {
        let req = v1::DeleteRequest { collection: collection.clone(), ids: vec![ids[i as usize]], ..Default::default() };
        let mut c = clients.next();
        async move {
            match tokio::time::timeout(limit, c.delete(req)).await {
                Err(_) => Outcome::Err("CLIENT_TIMEOUT".into()),
                Ok(Err(s)) => Outcome::status(&s),
                Ok(Ok(r)) => Outcome::ok(u64::from(r.into_inner().deleted)),
            }
        }
    };
    open_loop(Schedule { start: ctx.start, rate }, bound, max_in_flight, limit, rec, op).await;
}
