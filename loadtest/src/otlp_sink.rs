//! `otlp-sink`: an OTLP/gRPC collector that receives traces and metrics and
//! only counts them, so that the cost of exporting telemetry can be
//! measured without a real collector's own cost on the same cores. With
//! `--report` it also keeps the spans (up to a bound) and, when it stops,
//! writes where the slow traces' time went (`trace_breakdown`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Result;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{MetricsService, MetricsServiceServer};
use opentelemetry_proto::tonic::collector::metrics::v1::{ExportMetricsServiceRequest, ExportMetricsServiceResponse};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value;
use opentelemetry_proto::tonic::resource::v1::Resource;

use crate::host_noise;
use crate::trace_breakdown::{SpanRec, Wanted, breakdown, near_host};

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Where to listen (point `OTEL_EXPORTER_OTLP_ENDPOINT` at it).
    #[arg(long, default_value = "127.0.0.1:4317")]
    listen: SocketAddr,
    /// Stop after this many seconds (0: until Ctrl-C).
    #[arg(long, default_value_t = 0)]
    seconds: u64,
    /// Keep the spans and write this JSON report of where the traces'
    /// time went when stopping (docs/loadtest.md, "Which hop holds the
    /// tail").
    #[arg(long)]
    report: Option<PathBuf>,
    /// A trace whose root takes this long or longer is slow.
    #[arg(long, default_value_t = 10.0)]
    slow_ms: f64,
    /// Spans kept at most; later ones are counted, not kept.
    #[arg(long, default_value_t = 2_000_000)]
    keep_spans: usize,
    /// Only traces whose root span's name contains this (the RPC's path:
    /// `Search` for searches through a coordinator).
    #[arg(long, default_value = "")]
    root_contains: String,
    /// Slow traces written whole into the report, slowest first.
    #[arg(long, default_value_t = 20)]
    examples: usize,
    /// A `host-noise --json` file of the same run: the report says how
    /// the slow traces lie against the host's slow episodes.
    #[arg(long)]
    host_noise: Option<PathBuf>,
}

#[derive(Default)]
struct Counts {
    spans: AtomicU64,
    span_requests: AtomicU64,
    metric_points: AtomicU64,
    metric_requests: AtomicU64,
}

#[derive(Clone, Default)]
struct Sink(Arc<Counts>, Option<Arc<Kept>>);

/// The spans kept for `--report`.
#[derive(Default)]
struct Kept {
    spans: parking_lot::Mutex<Vec<SpanRec>>,
    limit: usize,
    dropped: AtomicU64,
}

impl Kept {
    fn keep(&self, r: &ExportTraceServiceRequest) {
        let mut spans = self.spans.lock();
        for rs in &r.resource_spans {
            let service: Arc<str> = service_name(rs.resource.as_ref()).into();
            for span in rs.scope_spans.iter().flat_map(|ss| &ss.spans) {
                if spans.len() >= self.limit {
                    self.dropped.fetch_add(1, Ordering::Relaxed);
                    continue;
                }
                // Malformed ids (not 16 and 8 bytes) are not a trace's.
                let (Ok(trace), Ok(id)) = (span.trace_id.as_slice().try_into(), span.span_id.as_slice().try_into()) else {
                    continue;
                };
                spans.push(SpanRec {
                    trace,
                    id,
                    parent: span.parent_span_id.as_slice().try_into().unwrap_or([0; 8]),
                    name: span.name.clone(),
                    service: Arc::clone(&service),
                    start_ns: span.start_time_unix_nano,
                    end_ns: span.end_time_unix_nano,
                });
            }
        }
    }
}

/// A resource's `service.name`, or "?".
fn service_name(resource: Option<&Resource>) -> String {
    resource
        .into_iter()
        .flat_map(|r| &r.attributes)
        .find(|kv| kv.key == "service.name")
        // A service name is a string by the semantic conventions.
        .and_then(|kv| if let any_value::Value::StringValue(s) = kv.value.as_ref()?.value.as_ref()? { Some(s.clone()) } else { None })
        .unwrap_or_else(|| "?".to_owned())
}

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        r: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let spans: usize = r.get_ref().resource_spans.iter().flat_map(|rs| &rs.scope_spans).map(|ss| ss.spans.len()).sum();
        self.0.spans.fetch_add(spans as u64, Ordering::Relaxed);
        self.0.span_requests.fetch_add(1, Ordering::Relaxed);
        if let Some(kept) = &self.1 {
            kept.keep(r.get_ref());
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

#[tonic::async_trait]
impl MetricsService for Sink {
    async fn export(
        &self,
        r: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        let metrics: usize = r.get_ref().resource_metrics.iter().flat_map(|rm| &rm.scope_metrics).map(|sm| sm.metrics.len()).sum();
        self.0.metric_points.fetch_add(metrics as u64, Ordering::Relaxed);
        self.0.metric_requests.fetch_add(1, Ordering::Relaxed);
        Ok(tonic::Response::new(ExportMetricsServiceResponse { partial_success: None }))
    }
}

pub(crate) fn run(a: Args) -> Result<()> {
    tokio::runtime::Builder::new_current_thread().enable_all().build()?.block_on(async {
        let kept = a.report.as_ref().map(|_| Arc::new(Kept { limit: a.keep_spans, ..Kept::default() }));
        let sink = Sink(Arc::default(), kept.clone());
        let server = tonic::transport::Server::builder()
            .add_service(TraceServiceServer::new(sink.clone()))
            .add_service(MetricsServiceServer::new(sink.clone()))
            .serve(a.listen);
        println!("otlp-sink listening on {}", a.listen);
        let report = |c: &Counts| {
            println!(
                "spans {} in {} requests; metrics {} in {} requests",
                c.spans.load(Ordering::Relaxed),
                c.span_requests.load(Ordering::Relaxed),
                c.metric_points.load(Ordering::Relaxed),
                c.metric_requests.load(Ordering::Relaxed)
            );
        };
        let stop = async {
            if a.seconds == 0 {
                let _ = tokio::signal::ctrl_c().await;
            } else {
                tokio::time::sleep(Duration::from_secs(a.seconds)).await;
            }
        };
        tokio::select! {
            served = server => served?,
            () = stop => {}
        }
        report(&sink.0);
        if let (Some(path), Some(kept)) = (&a.report, kept) {
            let spans = std::mem::take(&mut *kept.spans.lock());
            let mut r = breakdown(&spans, &Wanted { root_contains: &a.root_contains, slow_ms: a.slow_ms, examples: a.examples });
            if let Some(noise) = &a.host_noise {
                let n: host_noise::Report = serde_json::from_slice(&std::fs::read(noise)?)
                    .map_err(|e| anyhow::anyhow!("{}: not a host-noise report: {e}", noise.display()))?;
                let ns = |at_s: f64| n.started_unix_ms * 1_000_000 + (at_s * 1e9) as u64;
                let episodes: Vec<(u64, u64)> = n.episodes.iter().map(|e| (ns(e.at_s), ns(e.at_s + e.ms / 1000.0))).collect();
                let h = near_host(&r, &episodes, 20.0, 20.0);
                println!(
                    "host episodes >= 20 ms: {}, {:.1}% of the time within 20 ms of one; slow traces there: {:.1}%, all traces: {:.1}%; root p99 {:.2} ms, away from them {:.2} ms",
                    h.episodes,
                    h.time_share * 100.0,
                    h.slow_share * 100.0,
                    h.all_share * 100.0,
                    h.p99_all_ms,
                    h.p99_away_ms
                );
                r.host = Some(h);
            }
            println!(
                "traces {} ({} slow, >= {} ms; {} skipped; {} spans not kept); slow traces' largest part: {:?}",
                r.all.traces,
                r.slow.traces,
                a.slow_ms,
                r.skipped,
                kept.dropped.load(Ordering::Relaxed),
                r.slow.largest
            );
            println!("mean parts, all: {:?}\nmean parts, slow: {:?}", r.all.mean_parts, r.slow.mean_parts);
            println!(
                "overlapping other roots ({} of them): {} of all, {} of slow traces",
                r.background.len(),
                r.overlapping.all,
                r.overlapping.slow
            );
            std::fs::write(path, serde_json::to_vec_pretty(&r)?)?;
        }
        Ok(())
    })
}
