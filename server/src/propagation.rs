//! W3C trace context across gRPC calls: a server span per request that
//! continues the caller's trace (`traceparent`), and the current span's
//! context put into every outgoing call. Both are no-ops while no
//! OpenTelemetry layer is installed (nothing exported).

use opentelemetry::propagation::{Extractor, Injector};
use tonic::metadata::{MetadataKey, MetadataMap, MetadataValue};
use tracing_opentelemetry::OpenTelemetrySpanExt;

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
    let cx = tracing::Span::current().context();
    opentelemetry::global::get_text_map_propagator(|p| p.inject_context(&cx, &mut MetadataInjector(metadata)));
}

/// The span a server wraps a request in: named after the RPC, a child of
/// the caller's span when the request carries a trace context.
pub fn request_span(req: &http::Request<()>) -> tracing::Span {
    let method = req.uri().path();
    let span = tracing::info_span!("rpc", otel.name = %method, otel.kind = "server", rpc.system = "grpc", rpc.method = %method);
    let parent = opentelemetry::global::get_text_map_propagator(|p| p.extract(&HeaderExtractor(req.headers())));
    // Fails only when no OpenTelemetry layer records spans: nothing to join.
    let _ = span.set_parent(parent);
    span
}
