//! Ingest load: `streams` concurrent `Ingest` streams, each its own source
//! with offsets from 0, taking batches of rows from a shared counter (so a
//! faster stream takes more), with up to `window` batches awaiting their
//! acks. At a `rate` (vectors/s across streams) batch b is due at
//! start + b·batch/rate and its ack latency runs from then; flat out it
//! runs from the send. A stream that fails is replaced by a new one on the
//! same source (the failed batches are counted, not retried).

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Result;
use parking_lot::Mutex;
use serde::Serialize;
use serde_json::json;
use shoal_proto::v1;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};
use tokio::time::Instant;

use super::data::Data;
use super::faults::Fault;
use super::report::{PhaseSummary, Report};
use super::schedule::{Schedule, parse_duration};
use super::stats::{Outcome, Recorder, code_name};
use super::target::Clients;
use super::{Common, Run, ser_secs};

/// Flags of `ingest`.
#[derive(clap::Args, Debug, Clone, Serialize)]
pub(crate) struct Args {
    #[command(flatten)]
    pub(crate) common: Common,
    #[command(flatten)]
    pub(crate) ingest: IngestFlags,
    /// Stop sending after this long (default: when the data is all sent).
    #[arg(long, value_parser = parse_duration)]
    #[serde(serialize_with = "ser_secs")]
    pub(crate) duration: Option<Duration>,
}

/// How ingest streams are driven (shared by `ingest` and `mixed`).
#[derive(clap::Args, Debug, Clone, Serialize)]
pub(crate) struct IngestFlags {
    /// Concurrent Ingest streams, each its own source (offsets from 0).
    #[arg(long, default_value_t = 1)]
    pub(crate) streams: usize,
    /// Points per batch.
    #[arg(long, default_value_t = 1000)]
    pub(crate) batch: usize,
    /// Batches a stream sends ahead of their acks.
    #[arg(long, default_value_t = 2)]
    pub(crate) window: usize,
    /// Target vectors per second across the streams (default: as fast as
    /// the acks come back).
    #[arg(long = "rate", value_name = "VECTORS_PER_S")]
    pub(crate) rate: Option<f64>,
    /// How long to wait for outstanding acks after the end.
    #[arg(long, default_value = "30s", value_parser = parse_duration)]
    #[serde(serialize_with = "ser_secs")]
    pub(crate) drain: Duration,
    /// No ack for this long fails the stream.
    #[arg(long, default_value = "60s", value_parser = parse_duration)]
    #[serde(serialize_with = "ser_secs")]
    pub(crate) ack_timeout: Duration,
    /// Sources are named PREFIX-0, PREFIX-1, ... (default: `lt-<unix time>`).
    #[arg(long)]
    pub(crate) source_prefix: Option<String>,
}

/// One ingest job.
#[derive(Clone)]
pub(crate) struct Plan {
    pub(crate) rows: Range<u64>,
    pub(crate) streams: usize,
    pub(crate) batch: usize,
    pub(crate) window: usize,
    pub(crate) rate: Option<f64>,
    /// No batch is taken after this.
    pub(crate) end: Option<Instant>,
    pub(crate) drain: Duration,
    pub(crate) ack_timeout: Duration,
    pub(crate) source_prefix: String,
}

impl Plan {
    pub(crate) fn new(f: &IngestFlags, rows: Range<u64>, end: Option<Instant>, prefix: String) -> Plan {
        Plan {
            rows,
            streams: f.streams.max(1),
            batch: f.batch.max(1),
            window: f.window.max(1),
            rate: f.rate.filter(|r| *r > 0.0),
            end,
            drain: f.drain,
            ack_timeout: f.ack_timeout,
            source_prefix: prefix,
        }
    }

    pub(crate) fn params(&self) -> serde_json::Value {
        json!({"streams": self.streams, "batch": self.batch, "window": self.window, "rate": self.rate, "rows": [self.rows.start, self.rows.end], "sources": format!("{}-N", self.source_prefix)})
    }
}

pub(crate) fn default_prefix() -> String {
    format!("lt-{}", std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs()))
}

pub(crate) fn run(a: Args) -> Result<()> {
    super::block_on(run_report(a)).map(|_| ())
}

pub(crate) async fn run_report(a: Args) -> Result<Report> {
    let config = serde_json::to_value(&a)?;
    let faults: Vec<Fault> = a.common.faults.clone();
    let run = Run { command: "ingest", config, needs_queries: false, k: 0, planned: a.duration, preload: super::PreloadRule::None };
    super::execute(&a.common, faults, run, async |ctx: &super::Ctx| {
        let rec = ctx.recorder("ingest");
        let plan = Plan::new(
            &a.ingest,
            0..ctx.data.base.len() as u64,
            a.duration.map(|d| ctx.start + d),
            a.ingest.source_prefix.clone().unwrap_or_else(default_prefix),
        );
        let t0 = ctx.secs(Instant::now());
        ctx.progress.set_phase("ingest");
        ingest(&ctx.clients, &ctx.collection, &ctx.data, &plan, ctx.start, rec.clone()).await;
        let t1 = ctx.secs(Instant::now());
        Ok(vec![PhaseSummary::new("ingest".into(), "ingest", plan.params(), t0, t1, &rec.take_phase())])
    })
    .await
}

struct Shared {
    next_batch: AtomicU64,
    sched: Option<Schedule>,
}

/// Runs the plan to its end (data or time) and the drain.
pub(crate) async fn ingest(clients: &Clients, collection: &str, data: &Arc<Data>, plan: &Plan, start: Instant, rec: Arc<Recorder>) {
    let shared =
        Arc::new(Shared { next_batch: AtomicU64::new(0), sched: plan.rate.map(|r| Schedule { start, rate: r / plan.batch as f64 }) });
    let tasks: Vec<_> = (0..plan.streams)
        .map(|s| {
            let (clients, collection, data, plan, rec, shared) =
                (clients.clone(), collection.to_owned(), data.clone(), plan.clone(), rec.clone(), shared.clone());
            tokio::spawn(async move { stream(s, clients, collection, data, plan, rec, shared).await })
        })
        .collect();
    for t in tasks {
        if let Err(e) = t.await {
            std::panic::resume_unwind(e.into_panic());
        }
    }
}

/// A batch sent and not yet acknowledged.
struct Pending {
    offset: u64,
    intended: Instant,
    _slot: OwnedSemaphorePermit,
}

/// One source: streams one after the other (a new one after a failure).
async fn stream(s: usize, clients: Clients, collection: String, data: Arc<Data>, plan: Plan, rec: Arc<Recorder>, shared: Arc<Shared>) {
    let source = format!("{}-{s}", plan.source_prefix);
    let offset = Arc::new(AtomicU64::new(0));
    // Set when the sender stops for good: the data is all taken or time is up.
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    loop {
        if done.load(Ordering::Relaxed) || plan.end.is_some_and(|e| Instant::now() >= e) {
            return;
        }
        let pending: Arc<Mutex<VecDeque<Pending>>> = Arc::new(Mutex::new(VecDeque::new()));
        let (tx, rx) = tokio::sync::mpsc::channel::<v1::IngestRequest>(plan.window);
        let slots = Arc::new(Semaphore::new(plan.window));
        // Told to stop when the stream ends: a batch it holds but has not
        // sent yet is counted dropped, one it sent fails with the stream.
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let sender = {
            let (data, plan, rec, shared, pending, source, collection, offset, done) = (
                data.clone(),
                plan.clone(),
                rec.clone(),
                shared.clone(),
                pending.clone(),
                source.clone(),
                collection.clone(),
                offset.clone(),
                done.clone(),
            );
            tokio::spawn(async move {
                loop {
                    let slot = tokio::select! {
                        s = slots.clone().acquire_owned() => match s {
                            Ok(s) => s,
                            Err(_) => return,
                        },
                        _ = stopped.changed() => return,
                    };
                    let b = shared.next_batch.fetch_add(1, Ordering::Relaxed);
                    let lo = plan.rows.start + b * plan.batch as u64;
                    if lo >= plan.rows.end {
                        done.store(true, Ordering::Relaxed);
                        return;
                    }
                    let hi = (lo + plan.batch as u64).min(plan.rows.end);
                    let now = Instant::now();
                    let intended = match shared.sched {
                        Some(sch) => {
                            let due = sch.intended(b);
                            if plan.end.is_some_and(|e| due >= e) {
                                done.store(true, Ordering::Relaxed);
                                return;
                            }
                            if now > due {
                                rec.late();
                            }
                            tokio::select! {
                                _ = tokio::time::sleep_until(due) => {}
                                _ = stopped.changed() => {
                                    rec.scheduled();
                                    rec.dropped();
                                    return;
                                }
                            }
                            due
                        }
                        None if plan.end.is_some_and(|e| now >= e) => {
                            done.store(true, Ordering::Relaxed);
                            return;
                        }
                        None => now,
                    };
                    rec.scheduled();
                    let points = (lo..hi)
                        .map(|id| v1::Point {
                            id,
                            vector: data.base.row(id as usize).expect("row within the data"),
                            payload: data.payload(id as usize),
                        })
                        .collect();
                    let off = offset.fetch_add(1, Ordering::Relaxed);
                    let req = v1::IngestRequest {
                        collection: collection.clone(),
                        source: source.clone(),
                        offset: off,
                        points,
                        ..Default::default()
                    };
                    pending.lock().push_back(Pending { offset: off, intended, _slot: slot });
                    rec.sent(Instant::now().saturating_duration_since(intended));
                    tokio::select! {
                        r = tx.send(req) => if r.is_err() {
                            // The stream is gone; what is pending fails with it.
                            return;
                        },
                        _ = stopped.changed() => return,
                    }
                }
            })
        };
        let failure = receive(clients.next(), rx, &pending, &plan, &rec).await;
        let _ = stop.send(true);
        if let Err(e) = sender.await {
            std::panic::resume_unwind(e.into_panic());
        }
        // Whatever is still pending failed with the stream.
        let code = failure.as_ref().map_or("CLIENT_STREAM_ENDED_EARLY".to_owned(), |(c, _)| c.clone());
        let now = Instant::now();
        for p in pending.lock().drain(..) {
            rec.finish(p.intended, now, Outcome::Err(code.clone()));
        }
        match failure {
            // The sender finished (data or time) and every ack came.
            None if done.load(Ordering::Relaxed) => return,
            None => tokio::time::sleep(Duration::from_millis(200)).await,
            Some((_, retry_after)) => {
                let wait = retry_after.unwrap_or(Duration::from_millis(200)).min(Duration::from_secs(5));
                tokio::time::sleep(wait).await;
            }
        }
    }
}

/// Reads the acks of one stream until it ends. `None` if it ended cleanly;
/// else the failure's code and retry hint.
async fn receive(
    mut client: shoal_proto::auth::KeyedClient,
    rx: tokio::sync::mpsc::Receiver<v1::IngestRequest>,
    pending: &Mutex<VecDeque<Pending>>,
    plan: &Plan,
    rec: &Recorder,
) -> Option<(String, Option<Duration>)> {
    let deadline = |now: Instant| {
        let d = now + plan.ack_timeout;
        plan.end.map_or(d, |e| d.min((e + plan.drain).max(now)))
    };
    let call = tokio::time::timeout_at(deadline(Instant::now()), client.ingest(tokio_stream::wrappers::ReceiverStream::new(rx))).await;
    let mut acks = match call {
        Err(_) => return Some(("CLIENT_ACK_TIMEOUT".into(), None)),
        Ok(Err(s)) => return Some((code_name(s.code()).into(), retry_hint(&s))),
        Ok(Ok(r)) => r.into_inner(),
    };
    loop {
        match tokio::time::timeout_at(deadline(Instant::now()), acks.message()).await {
            Err(_) => return Some(("CLIENT_ACK_TIMEOUT".into(), None)),
            Ok(Err(s)) => return Some((code_name(s.code()).into(), retry_hint(&s))),
            Ok(Ok(None)) => return None,
            Ok(Ok(Some(ack))) => {
                let now = Instant::now();
                let Some(p) = pending.lock().pop_front() else {
                    return Some(("CLIENT_UNEXPECTED_ACK".into(), None));
                };
                if p.offset != ack.offset {
                    rec.finish(p.intended, now, Outcome::Err("CLIENT_ACK_OUT_OF_ORDER".into()));
                    continue;
                }
                let skipped = ack.status == v1::BatchStatus::Skipped as i32;
                rec.finish(p.intended, now, Outcome::Ok { items: u64::from(ack.upserted), partial: false, skipped, recall: None });
            }
        }
    }
}

fn retry_hint(s: &tonic::Status) -> Option<Duration> {
    let v = s.metadata().get("retry-after-ms")?.to_str().ok()?.parse().ok()?;
    Some(Duration::from_millis(v))
}
