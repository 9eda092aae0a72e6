//! Logs, traces and metrics of one process, set up in one place.
//!
//! - Logs: `tracing`'s formatter on stderr, filtered by `RUST_LOG`
//!   (default: `telemetry.log`, `info`).
//! - Traces: `tracing` spans exported through OpenTelemetry over OTLP/gRPC,
//!   only when `telemetry.otlp_endpoint` or the standard
//!   `OTEL_EXPORTER_OTLP_ENDPOINT` / `OTEL_EXPORTER_OTLP_TRACES_ENDPOINT`
//!   variables name a collector. Otherwise no OpenTelemetry layer exists at
//!   all: nothing is exported, nothing is slowed. Export runs in the
//!   background (a batch processor with a short timeout), so a collector that
//!   is down costs dropped spans, never a stalled request.
//! - Metrics: an OpenTelemetry meter provider read by a Prometheus registry
//!   (served at `/metrics`, see `grpc`), and pushed over OTLP as well when a
//!   collector is named.
//! - W3C trace context (`traceparent`) is the propagator, so a caller's trace
//!   continues through the coordinator to every shard node.

use std::sync::OnceLock;
use std::time::Duration;

use opentelemetry::KeyValue;
use opentelemetry::trace::TracerProvider as _;
use opentelemetry_otlp::WithExportConfig;
use opentelemetry_sdk::Resource;
use opentelemetry_sdk::metrics::SdkMeterProvider;
use opentelemetry_sdk::propagation::TraceContextPropagator;
use opentelemetry_sdk::trace::{Sampler, SdkTracerProvider};
use serde::{Deserialize, Serialize};
use tracing_subscriber::filter::FilterExt;
use tracing_subscriber::layer::SubscriberExt;
use tracing_subscriber::util::SubscriberInitExt;
use tracing_subscriber::{EnvFilter, Layer};

/// Telemetry settings (`[coordinator.telemetry]`, `[shard_node.telemetry]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct TelemetryConfig {
    /// OTLP/gRPC collector for traces and metrics, e.g.
    /// `http://127.0.0.1:4317`. Empty: the standard `OTEL_EXPORTER_OTLP_*`
    /// variables decide; if they name none either, nothing is exported.
    pub otlp_endpoint: String,
    /// Fraction of new traces sampled, decided when a trace's first span is
    /// made (`sampling`): the spans of other traces are never built.
    /// Parent-based: a caller that sent a sampled `traceparent` is always
    /// followed, an unsampled one never.
    pub sampling_ratio: f64,
    /// Serve Prometheus metrics at `/metrics` on the gRPC port (HTTP/1.1).
    /// Off and not exporting over OTLP: metrics are not recorded at all.
    pub metrics: bool,
    /// How often metrics are pushed over OTLP, when they are.
    pub metrics_export_interval_ms: u64,
    /// Which logs go to stderr when `RUST_LOG` does not say (its syntax).
    pub log: String,
}

impl Default for TelemetryConfig {
    fn default() -> Self {
        TelemetryConfig {
            otlp_endpoint: String::new(),
            sampling_ratio: 1.0,
            metrics: true,
            metrics_export_interval_ms: 15_000,
            log: "info".into(),
        }
    }
}

impl TelemetryConfig {
    /// The collector to export to, from the config or the environment.
    fn endpoint(&self) -> Option<String> {
        if !self.otlp_endpoint.is_empty() {
            return Some(self.otlp_endpoint.clone());
        }
        ["OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT"]
            .iter()
            .find_map(|v| std::env::var(v).ok().filter(|e| !e.is_empty()))
    }
}

/// The process's telemetry, set up once.
pub struct Telemetry {
    registry: prometheus::Registry,
    tracer: Option<SdkTracerProvider>,
    sampling_ratio: f64,
    meter: SdkMeterProvider,
    exporting: Option<String>,
}

static TELEMETRY: OnceLock<Telemetry> = OnceLock::new();

/// Sets up logs, traces and metrics for this process; later calls return
/// the first setup (an embedded cluster runs several servers in one
/// process). Call it from inside the tokio runtime: the OTLP exporter's
/// channel lives on it. `service` is `service.name`, `instance`
/// `service.instance.id`.
pub fn init(service: &str, instance: &str, cfg: &TelemetryConfig) -> &'static Telemetry {
    TELEMETRY.get_or_init(|| setup(service, instance, cfg))
}

/// The process's telemetry if set up.
pub fn get() -> Option<&'static Telemetry> {
    TELEMETRY.get()
}

/// Whether this process exports traces (an OTLP collector is named).
pub fn exports_traces() -> bool {
    TELEMETRY.get().is_some_and(|t| t.tracer.is_some())
}

/// The ratio of new traces kept, if this process exports traces.
pub fn trace_sampling_ratio() -> Option<f64> {
    TELEMETRY.get().filter(|t| t.tracer.is_some()).map(|t| t.sampling_ratio)
}

/// Whether the standard `OTEL_METRICS_EXPORTER` / `OTEL_TRACES_EXPORTER`
/// variable `var` leaves OTLP export on: unset or `otlp` yes, `none` no
/// (e.g. metrics scraped from `/metrics` only, traces still exported).
/// Other exporters are not built in: named in `problems`, OTLP stays.
fn exporter_wanted(var: &str, problems: &mut Vec<String>) -> bool {
    match std::env::var(var).ok().as_deref().map(str::trim) {
        None | Some("" | "otlp") => true,
        Some("none") => false,
        Some(other) => {
            problems.push(format!("{var}={other} is not supported (only otlp and none); exporting over OTLP"));
            true
        }
    }
}

fn setup(service: &str, instance: &str, cfg: &TelemetryConfig) -> Telemetry {
    opentelemetry::global::set_text_map_propagator(TraceContextPropagator::new());
    let resource = Resource::builder()
        .with_service_name(service.to_owned())
        .with_attributes([
            KeyValue::new("service.instance.id", instance.to_owned()),
            KeyValue::new("service.version", env!("CARGO_PKG_VERSION")),
        ])
        .build();
    let endpoint = cfg.endpoint();
    let mut problems = Vec::new();

    let registry = prometheus::Registry::new();
    let mut meters = SdkMeterProvider::builder().with_resource(resource.clone());
    if cfg.metrics {
        match opentelemetry_prometheus::exporter().with_registry(registry.clone()).build() {
            Ok(reader) => meters = meters.with_reader(reader),
            Err(e) => problems.push(format!("no Prometheus metrics: {e}")),
        }
    }
    let mut tracer = None;
    let export_metrics = exporter_wanted("OTEL_METRICS_EXPORTER", &mut problems);
    let export_traces = exporter_wanted("OTEL_TRACES_EXPORTER", &mut problems);
    if let Some(ep) = endpoint.as_ref().filter(|_| export_metrics) {
        let metrics = opentelemetry_otlp::MetricExporter::builder()
            .with_tonic()
            .with_endpoint(ep.clone())
            .with_timeout(Duration::from_secs(3))
            .build();
        match metrics {
            Ok(m) => {
                let interval = Duration::from_millis(cfg.metrics_export_interval_ms.max(100));
                meters = meters.with_reader(opentelemetry_sdk::metrics::PeriodicReader::builder(m).with_interval(interval).build());
            }
            Err(e) => problems.push(format!("no OTLP metrics to {ep}: {e}")),
        }
    }
    if let Some(ep) = endpoint.as_ref().filter(|_| export_traces) {
        let spans =
            opentelemetry_otlp::SpanExporter::builder().with_tonic().with_endpoint(ep.clone()).with_timeout(Duration::from_secs(3)).build();
        match spans {
            Ok(exporter) => {
                // Sampling is decided before a span reaches the SDK
                // (`sampling::HeadSampled`): what arrives is kept.
                tracer = Some(
                    SdkTracerProvider::builder()
                        .with_resource(resource.clone())
                        .with_sampler(Sampler::ParentBased(Box::new(Sampler::AlwaysOn)))
                        .with_batch_exporter(exporter)
                        .build(),
                );
            }
            Err(e) => problems.push(format!("no OTLP traces to {ep}: {e}")),
        }
    }
    let meter = meters.build();
    // With nothing to read them (no /metrics, no OTLP) the instruments stay
    // the global no-ops: recording costs nothing.
    if cfg.metrics || (endpoint.is_some() && export_metrics) {
        opentelemetry::global::set_meter_provider(meter.clone());
        crate::process_metrics::register(&opentelemetry::global::meter("shoal"));
    }

    // Events only: were the request spans enabled for the log layer, every
    // request would pay for formatting their fields, exported or not. Log
    // lines carry their own fields; a request's context is in its trace.
    let level = EnvFilter::try_from_default_env().unwrap_or_else(|_| EnvFilter::new(&cfg.log));
    let logs = tracing_subscriber::fmt::layer()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_filter(level.and(tracing_subscriber::filter::filter_fn(|m| m.is_event())));
    // Another subscriber may be installed already (a test's): keep it.
    // Without a tracer no span layer is added at all, not even an empty
    // `Option`: tracing-subscriber treats a `None` layer as interested in
    // everything, and every request's spans would be built for nobody.
    let _ = match &tracer {
        Some(provider) => {
            // The engine's spans of a batch's phases are at debug level:
            // they are what an operator opens a slow batch's trace for.
            let otel = tracing_opentelemetry::layer().with_tracer(provider.tracer(service.to_owned()));
            let spans = crate::sampling::HeadSampled::new(otel)
                .with_filter(EnvFilter::new("info,shoal_engine=debug").and(crate::sampling::only_in_kept_traces()));
            tracing_subscriber::registry().with(logs).with(spans).try_init()
        }
        None => tracing_subscriber::registry().with(logs).try_init(),
    };
    for p in problems {
        tracing::warn!("telemetry: {p}");
    }
    if let Some(ep) = &endpoint {
        tracing::info!(endpoint = %ep, sampling = cfg.sampling_ratio, traces = export_traces, metrics = export_metrics, "exporting over OTLP");
    }
    Telemetry { registry, tracer, sampling_ratio: cfg.sampling_ratio.clamp(0.0, 1.0), meter, exporting: endpoint }
}

impl Telemetry {
    /// The Prometheus text exposition of every metric of the process.
    pub fn prometheus_text(&self) -> String {
        use prometheus::Encoder;
        let mut out = Vec::new();
        if let Err(e) = prometheus::TextEncoder::new().encode(&self.registry.gather(), &mut out) {
            tracing::warn!(error = %e, "encoding metrics");
        }
        String::from_utf8(out).unwrap_or_default()
    }

    /// The collector traces and metrics go to, if any.
    pub fn exporting(&self) -> Option<&str> {
        self.exporting.as_deref()
    }

    /// Sends what is buffered (spans, metrics) before the process exits,
    /// waiting at most a few seconds.
    pub fn flush(&self) {
        if let Some(t) = &self.tracer {
            let _ = t.force_flush();
        }
        if self.exporting.is_some() {
            let _ = self.meter.force_flush();
        }
    }
}
