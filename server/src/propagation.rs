//! W3C trace context across gRPC calls: a server span per request that
//! continues the caller's trace (`traceparent`), and the current span's
//! context put into every outgoing call (an unsampled one when the current
//! trace is not kept). Both are no-ops while no OpenTelemetry layer is
//! installed (nothing exported).

use opentelemetry::propagation::{Extractor, Injector};
use opentelemetry::trace::TraceContextExt;
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

/// The `traceparent` a call carries when the caller's trace is not kept
/// (W3C flags `00`). One constant for all of them: nothing records an
/// unsampled trace, so its ids name nothing, and a constant value is
/// indexed by HPACK after the first call on a connection (two bytes a call
/// instead of 55 Huffman-coded ones to encode and decode), and the callee
/// recognises it without parsing it ([`request_span`]).
pub const NOT_KEPT: &str = "00-5b0a15ce5b0a15ce5b0a15ce5b0a15ce-5b0a15ce5b0a15ce-00";

/// Puts the current span's trace context into an outgoing call's metadata.
pub fn inject(metadata: &mut MetadataMap) {
    let cx = tracing::Span::current().context();
    if !cx.span().span_context().is_valid() {
        // The current trace is not kept (`sampling`), or there is none:
        // the callee is told so, or it would start a trace of its own at
        // its ratio, cut off from this one.
        if crate::telemetry::exports_traces() {
            metadata.insert(TRACEPARENT, MetadataValue::from_static(NOT_KEPT));
        }
        return;
    }
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&cx, &mut MetadataInjector(metadata)));
}

const TRACEPARENT: &str = "traceparent";

/// The span a server wraps a request in: named after the RPC, a child of
/// the caller's span when the request carries a trace context. Whether the
/// trace is kept is decided here (`sampling`): as the caller's
/// `traceparent` says, else with the configured ratio. A request whose
/// trace is not kept gets no span at all (`Span::none()`), nor do the
/// spans made under it: it costs nothing but this decision.
pub fn request_span(req: &http::Request<()>) -> tracing::Span {
    let Some(ratio) = crate::telemetry::trace_sampling_ratio() else { return tracing::Span::none() };
    if req.headers().get(TRACEPARENT).is_some_and(|v| v.as_bytes() == NOT_KEPT.as_bytes()) {
        return tracing::Span::none();
    }
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

#[cfg(test)]
mod tests {
    use opentelemetry::propagation::TextMapPropagator;
    use opentelemetry_sdk::propagation::TraceContextPropagator;

    use super::*;

    /// Other W3C implementations read the constant as what it says: a
    /// valid remote parent whose trace is not sampled.
    #[test]
    fn the_not_kept_traceparent_is_a_valid_unsampled_w3c_context() {
        let mut headers = http::HeaderMap::new();
        headers.insert(TRACEPARENT, http::HeaderValue::from_static(NOT_KEPT));
        let cx = TraceContextPropagator::new().extract(&HeaderExtractor(&headers));
        let sc = cx.span().span_context().clone();
        assert!(sc.is_valid() && sc.is_remote() && !sc.is_sampled(), "{sc:?}");
    }
}
