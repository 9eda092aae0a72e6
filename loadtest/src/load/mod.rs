//! The load generator: `ingest`, `query` and `mixed` against coordinators by
//! URL, an embedded cluster or separate processes; open or closed loop;
//! fault hooks; a JSON report and an SVG chart (docs/loadtest.md).
//!
//! A run: load or generate the data, start or reach the target, create the
//! collection, preload it if the command wants points to query, then the
//! measured run (its clock starts here: faults, timeline and phases count
//! from it), then the report.

mod chart;
mod data;
mod faults;
pub(crate) mod ingest;
pub(crate) mod mixed;
use shoal_ops::vectors::npy;
mod progress;
pub(crate) mod query;
mod recall;
mod report;
mod schedule;
mod stats;
mod target;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context, Result};
use parking_lot::Mutex;
use serde::Serialize;
use tokio::time::Instant;

use self::data::{Data, DataArgs};
use self::faults::{Fault, FaultRunner, parse_fault};
use self::progress::Progress;
use self::report::{CollectionAfter, OutputArgs, PhaseSummary, Preload, Report, TargetInfo};
use self::stats::Recorder;
use self::target::{Clients, Target, TargetArgs};

/// Flags every load command takes.
#[derive(clap::Args, Debug, Clone, Serialize)]
pub(crate) struct Common {
    #[command(flatten)]
    pub(crate) target: TargetArgs,
    #[command(flatten)]
    pub(crate) data: DataArgs,
    /// AT:ACTION:ARG, repeatable: at AT into the run, kill, stop, cont or
    /// restart a started process (30s:kill:shard-1, 50s:cont:shard-2,
    /// 45s:restart:coordinator; --processes only), or run a shell command
    /// (20s:run:COMMAND).
    #[arg(long = "fault", value_name = "AT:ACTION:ARG", value_parser = parse_fault)]
    pub(crate) faults: Vec<Fault>,
    #[command(flatten)]
    pub(crate) out: OutputArgs,
}

/// Serializes a duration (or an optional one) as seconds.
pub(crate) fn ser_secs<T: AsSecs, S: serde::Serializer>(d: &T, s: S) -> Result<S::Ok, S::Error> {
    d.secs().serialize(s)
}

pub(crate) trait AsSecs {
    fn secs(&self) -> Option<f64>;
}

impl AsSecs for Duration {
    fn secs(&self) -> Option<f64> {
        Some(self.as_secs_f64())
    }
}

impl AsSecs for Option<Duration> {
    fn secs(&self) -> Option<f64> {
        self.map(|d| d.as_secs_f64())
    }
}

pub(crate) fn block_on<F: Future>(f: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread().enable_all().build().expect("a tokio runtime").block_on(f)
}

/// Which base vectors go in before the measured run.
pub(crate) enum PreloadRule {
    None,
    /// `explicit`, else this fraction of the base if the run created the
    /// collection, else none.
    IfCreated {
        explicit: Option<usize>,
        fraction: f64,
    },
}

/// What a command asks of [`execute`].
pub(crate) struct Run {
    pub(crate) command: &'static str,
    pub(crate) config: serde_json::Value,
    pub(crate) needs_queries: bool,
    /// k of recall (for the exact ground truth).
    pub(crate) k: usize,
    /// How long the measured run should take, if known (progress, faults).
    pub(crate) planned: Option<Duration>,
    pub(crate) preload: PreloadRule,
}

/// What a workload runs with.
pub(crate) struct Ctx {
    pub(crate) clients: Clients,
    pub(crate) collection: String,
    pub(crate) data: Arc<Data>,
    /// The measured run's start.
    pub(crate) start: Instant,
    /// Base rows 0..preloaded went in before the start.
    pub(crate) preloaded: u64,
    pub(crate) seed: u64,
    pub(crate) progress: Progress,
    recorders: Arc<Mutex<Vec<Arc<Recorder>>>>,
}

impl Ctx {
    /// The recorder of a series (one per series for the whole run).
    pub(crate) fn recorder(&self, series: &'static str) -> Arc<Recorder> {
        let mut all = self.recorders.lock();
        if let Some(r) = all.iter().find(|r| r.series == series) {
            return r.clone();
        }
        let r = Recorder::new(series, self.start);
        all.push(r.clone());
        r
    }

    /// Seconds since the start.
    pub(crate) fn secs(&self, t: Instant) -> f64 {
        t.saturating_duration_since(self.start).as_secs_f64()
    }
}

/// Streams and batch of the preload.
const PRELOAD_STREAMS: usize = 3;
const PRELOAD_BATCH: usize = 1000;

/// Runs a command: data, target, collection, preload, the workload with its
/// faults, progress and samples, then the report (written and printed).
/// A cluster started here is stopped whatever happens.
pub(crate) async fn execute(
    common: &Common,
    faults: Vec<Fault>,
    run: Run,
    workload: impl AsyncFnOnce(&Ctx) -> Result<Vec<PhaseSummary>>,
) -> Result<Report> {
    if common.target.processes.is_none() {
        faults::check(&faults, None)?;
    }
    let metric = data::engine_metric(&common.target.metric)?;
    let (dargs, needs_queries, k) = (common.data.clone(), run.needs_queries, run.k);
    let data = tokio::task::spawn_blocking(move || Data::load(&dargs, needs_queries, metric, k)).await??;
    let target = Target::start(&common.target).await?;
    let result = measure(common, faults, run, &target, data, workload).await;
    let stopped = target.shutdown().await;
    let report = result?;
    stopped?;
    Ok(report)
}

async fn measure(
    common: &Common,
    faults: Vec<Fault>,
    run: Run,
    target: &Target,
    data: Arc<Data>,
    workload: impl AsyncFnOnce(&Ctx) -> Result<Vec<PhaseSummary>>,
) -> Result<Report> {
    let procs = target.processes();
    if let Some(p) = &procs {
        faults::check(&faults, Some(&target::process_ids(&p.lock())))?;
    }
    let collection = common.target.collection.clone();
    let created = target.prepare_collection(&common.target, data.base.dim()).await?;
    let n = data.base.len();
    let preload_rows = match run.preload {
        PreloadRule::None => 0,
        PreloadRule::IfCreated { explicit, fraction } => {
            explicit.unwrap_or(if created { (n as f64 * fraction) as usize } else { 0 }).min(n)
        }
    };
    let preload = if preload_rows > 0 {
        eprintln!("preloading {preload_rows} vectors ...");
        let t = Instant::now();
        let rec = Recorder::new("ingest", t);
        let flags = ingest::IngestFlags {
            streams: PRELOAD_STREAMS,
            batch: PRELOAD_BATCH,
            window: 2,
            rate: None,
            drain: Duration::from_secs(30),
            ack_timeout: Duration::from_secs(60),
            source_prefix: None,
        };
        let plan = ingest::Plan::new(&flags, 0..preload_rows as u64, None, format!("{}-preload", ingest::default_prefix()));
        ingest::ingest(&target.clients, &collection, &data, &plan, t, rec.clone()).await;
        let p = rec.take_phase();
        let secs = t.elapsed().as_secs_f64();
        eprintln!("preloaded {} vectors in {secs:.1}s ({} batches failed)", p.counts.items, p.counts.errors);
        Some(Preload { vectors_acked: p.counts.items, batches_failed: p.counts.errors, seconds: report::round3(secs) })
    } else {
        None
    };

    let start = Instant::now();
    let started_unix_s = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_secs());
    let recorders = Arc::new(Mutex::new(Vec::new()));
    let progress = Progress::start(!common.out.no_progress, run.planned, start, recorders.clone());
    let fault_runner = FaultRunner::start(faults, start, run.planned.map(|d| start + d), procs.clone());
    let samples: Arc<Mutex<BTreeMap<u64, BTreeMap<String, target::ProcSample>>>> = Arc::default();
    let sampler = procs.map(|p| {
        let samples = samples.clone();
        tokio::spawn(async move {
            let mut last = BTreeMap::new();
            let mut tick = tokio::time::interval_at(start, Duration::from_secs(1));
            loop {
                let at = tick.tick().await;
                let p = p.clone();
                let Ok((s, l)) = tokio::task::spawn_blocking(move || {
                    let s = target::sample(&p, &mut last);
                    (s, last)
                })
                .await
                else {
                    return;
                };
                last = l;
                // This sample covers the second before it.
                if let Some(t) = at.saturating_duration_since(start).as_secs().checked_sub(1)
                    && !s.is_empty()
                {
                    samples.lock().insert(t, s);
                }
            }
        })
    });
    let ctx = Ctx {
        clients: target.clients.clone(),
        collection: collection.clone(),
        data,
        start,
        preloaded: preload_rows as u64,
        seed: common.data.seed,
        progress,
        recorders,
    };
    let phases = workload(&ctx).await;
    let duration_s = ctx.secs(Instant::now());
    if let Some(s) = sampler {
        s.abort();
        let _ = s.await;
    }
    let fault_events = fault_runner.finish().await;
    let Ctx { progress, recorders, .. } = ctx;
    progress.finish();
    let phases = phases?;

    let until = duration_s.ceil() as u64;
    let series: Vec<(&'static str, Vec<stats::Second>)> = recorders.lock().iter().map(|r| (r.series, r.timeline(until))).collect();
    let timeline = report::merge_timeline(series, std::mem::take(&mut *samples.lock()));
    let mut errors: BTreeMap<String, BTreeMap<String, u64>> = BTreeMap::new();
    for p in &phases {
        for (code, n) in &p.errors {
            *errors.entry(p.series.to_owned()).or_default().entry(code.clone()).or_default() += n;
        }
    }
    let points = tokio::time::timeout(Duration::from_secs(10), target.collection_points(&collection)).await;
    let collection_after = match points {
        Ok(Ok(n)) => CollectionAfter { points: Some(n), error: None },
        Ok(Err(e)) => CollectionAfter { points: None, error: Some(format!("{e:#}")) },
        Err(_) => CollectionAfter { points: None, error: Some("DescribeCollection took over 10 s".into()) },
    };
    let r = Report {
        schema: report::SCHEMA,
        command: run.command,
        config: run.config,
        target: TargetInfo { kind: target.kind, coordinators: target.urls.clone(), collection, created },
        started_unix_s,
        duration_s: report::round3(duration_s),
        preload,
        phases,
        timeline,
        faults: fault_events,
        errors,
        collection: collection_after,
    };
    write_report(&r, &common.out)?;
    print!("{}", report::text(&r));
    Ok(r)
}

/// Writes the JSON and the SVG where asked.
fn write_report(r: &Report, out: &OutputArgs) -> Result<()> {
    if let Some(p) = &out.json {
        std::fs::write(p, serde_json::to_vec_pretty(r)?).with_context(|| format!("writing {}", p.display()))?;
        eprintln!("report: {}", p.display());
    }
    if let Some(p) = &out.svg {
        std::fs::write(p, chart::render(r)?).with_context(|| format!("writing {}", p.display()))?;
        eprintln!("chart: {}", p.display());
    }
    Ok(())
}
