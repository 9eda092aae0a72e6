//! W3C trace context across gRPC calls: a server span per request that
//! continues the caller's trace (`traceparent`), and the current span's
//! context put into every outgoing call (an unsampled one when the current
//! trace is not kept). Both are no-ops while no OpenTelemetry layer is
//! installed (nothing exported).

use opentelemetry::Context;
use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::{SpanContext, SpanId, TraceContextExt, TraceFlags, TraceId, TraceState};
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tracing_opentelemetry::OpenTelemetrySpanExt;

use crate::sampling::KEPT;

struct MetadataInjector<'a>(&'a mut MetadataMap);

impl Injector for MetadataInjector<'_> {
    fn set(&mut self, key: &str, value: String) {
        if let (Ok(k), Ok(v)) = (MetadataKey::from_bytes(key.as_bytes()), MetadataValue::try_from(&value)) {
            self.0.insert(k, v);
        }
    }
}

struct HeaderExtractor<'a>(&'a http::HeaderMap);

impl Extractor for HeaderExtractor<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(http::HeaderName::as_str).collect()
    }
}

/// Puts the current span's trace context into an outgoing call's metadata.
pub fn inject(metadata: &mut MetadataMap) {
    let mut cx = tracing::Span::current().context();
    if !cx.span().span_context().is_valid() && crate::telemetry::exports_traces() {
        // The current trace is not kept (`sampling`), or there is none:
        // the callee is told so, or it would start a trace of its own at
        // its ratio, cut off from this one.
        cx = not_kept();
    }
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&cx, &mut MetadataInjector(metadata)));
}

/// A remote parent whose trace is not sampled (W3C flags `00`).
fn not_kept() -> Context {
    let trace = TraceId::from(rand::random::<u128>() | 1);
    let span = SpanId::from(rand::random::<u64>() | 1);
    Context::new().with_remote_span_context(SpanContext::new(trace, span, TraceFlags::default(), true, TraceState::default()))
}

/// The span a server wraps a request in: named after the RPC, a child of
/// the caller's span when the request carries a trace context. Whether the
/// trace is kept is decided here (`sampling`): as the caller's
/// `traceparent` says, else with the configured ratio. A request whose
/// trace is not kept gets no span at all (`Span::none()`), nor do the
/// spans made under it: it costs nothing but this decision.
pub fn request_span(req: &http::Request<()>) -> tracing::Span {
    let Some(ratio) = crate::telemetry::trace_sampling_ratio() else { return tracing::Span::none() };
    let parent = opentelemetry::global::get_text_map_propagator(|p| p.extract(&HeaderExtractor(req.headers())));
    let remote = parent.span().span_context().clone();
    let keep = if remote.is_valid() { remote.is_sampled() } else { ratio >= 1.0 || rand::random::<f64>() < ratio };
    if !keep {
        return tracing::Span::none();
    }
    let method = req.uri().path();
    let span =
        tracing::info_span!(target: KEPT, "rpc", otel.name = %method, otel.kind = "server", rpc.system = "grpc", rpc.method = %method);
    if remote.is_valid() {
        // Fails only when no OpenTelemetry layer records spans: nothing to join.
        let _ = span.set_parent(parent);
    }
    span
}
