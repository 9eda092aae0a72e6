//! `otlp-sink`: an OTLP/gRPC collector that receives traces and metrics and
//! only counts them, so that the cost of exporting telemetry can be
//! measured without a real collector's own cost on the same cores.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::Result;
use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{MetricsService, MetricsServiceServer};
use opentelemetry_proto::tonic::collector::metrics::v1::{ExportMetricsServiceRequest, ExportMetricsServiceResponse};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};

#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Where to listen (point `OTEL_EXPORTER_OTLP_ENDPOINT` at it).
    #[arg(long, default_value = "127.0.0.1:4317")]
    listen: SocketAddr,
    /// Stop after this many seconds (0: until Ctrl-C).
    #[arg(long, default_value_t = 0)]
    seconds: u64,
}

#[derive(Default)]
struct Counts {
    spans: AtomicU64,
    span_requests: AtomicU64,
    metric_points: AtomicU64,
    metric_requests: AtomicU64,
}

#[derive(Clone, Default)]
struct Sink(Arc<Counts>);

#[tonic::async_trait]
impl TraceService for Sink {
    async fn export(
        &self,
        r: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let spans: usize = r.get_ref().resource_spans.iter().flat_map(|rs| &rs.scope_spans).map(|ss| ss.spans.len()).sum();
        self.0.spans.fetch_add(spans as u64, Ordering::Relaxed);
        self.0.span_requests.fetch_add(1, Ordering::Relaxed);
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
        let sink = Sink::default();
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
        Ok(())
    })
}
