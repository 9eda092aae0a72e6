//! Requests per RPC and status code, with their latency: a tower layer
//! under every gRPC server. A unary error's status is in the response
//! headers; otherwise it comes in the trailers at the end of the body, so
//! the body is watched until then (a streaming call is measured to its
//! end). Paths that name no RPC (they get UNIMPLEMENTED) are counted under
//! one label, so the metric's cardinality cannot grow with what clients
//! send.

use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll};
use std::time::Instant;

use http_body::{Body, Frame};
use opentelemetry::KeyValue;
use opentelemetry::metrics::Histogram;
use tower::{Layer, Service};

/// Seconds: from 0.1 ms (a cached status call) to a minute (a batch).
pub(crate) const LATENCY_BOUNDS: [f64; 17] =
    [0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 60.0];

/// Wraps a server's services with [`RpcMetrics`].
#[derive(Clone)]
pub struct RpcMetricsLayer {
    duration: Histogram<f64>,
}

impl RpcMetricsLayer {
    pub fn new() -> Self {
        let duration = opentelemetry::global::meter("shoal")
            .f64_histogram("rpc.server.call.duration")
            .with_unit("s")
            .with_description("Time from a request's arrival to its last byte, by RPC and gRPC status code")
            .with_boundaries(LATENCY_BOUNDS.to_vec())
            .build();
        RpcMetricsLayer { duration }
    }
}

impl Default for RpcMetricsLayer {
    fn default() -> Self {
        Self::new()
    }
}

impl<S> Layer<S> for RpcMetricsLayer {
    type Service = RpcMetrics<S>;

    fn layer(&self, inner: S) -> RpcMetrics<S> {
        RpcMetrics { inner, duration: self.duration.clone() }
    }
}

/// See the module.
#[derive(Clone)]
pub struct RpcMetrics<S> {
    inner: S,
    duration: Histogram<f64>,
}

/// What to record once the status is known.
struct Pending {
    method: String,
    started: Instant,
    duration: Histogram<f64>,
}

impl Pending {
    fn record(self, code: i64) {
        // UNIMPLEMENTED is what any path that names no RPC gets.
        let method = if code == 12 { "unknown".to_owned() } else { self.method };
        self.duration.record(
            self.started.elapsed().as_secs_f64(),
            &[KeyValue::new("rpc.method", method), KeyValue::new("rpc.grpc.status_code", code)],
        );
    }
}

fn status_of(headers: &http::HeaderMap) -> Option<i64> {
    headers.get("grpc-status")?.to_str().ok()?.parse().ok()
}

impl<S, B, RB> Service<http::Request<B>> for RpcMetrics<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>>,
{
    type Response = http::Response<MeteredBody<RB>>;
    type Error = S::Error;
    type Future = MeteredFuture<S::Future>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let grpc = req.headers().get(http::header::CONTENT_TYPE).is_some_and(|v| v.as_bytes().starts_with(b"application/grpc"));
        let pending =
            grpc.then(|| Pending { method: req.uri().path().to_owned(), started: Instant::now(), duration: self.duration.clone() });
        MeteredFuture { inner: self.inner.call(req), pending }
    }
}

pin_project_lite::pin_project! {
    /// The response future of [`RpcMetrics`].
    pub struct MeteredFuture<F> {
        #[pin]
        inner: F,
        pending: Option<Pending>,
    }
}

impl<F, RB, E> Future for MeteredFuture<F>
where
    F: Future<Output = Result<http::Response<RB>, E>>,
{
    type Output = Result<http::Response<MeteredBody<RB>>, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let this = self.project();
        let out = std::task::ready!(this.inner.poll(cx));
        let pending = this.pending.take();
        Poll::Ready(match out {
            Ok(resp) => {
                let pending = match (pending, status_of(resp.headers())) {
                    (Some(p), Some(code)) => {
                        p.record(code);
                        None
                    }
                    (p, _) => p,
                };
                Ok(resp.map(|body| MeteredBody { inner: body, pending }))
            }
            Err(e) => {
                if let Some(p) = pending {
                    p.record(2);
                }
                Err(e)
            }
        })
    }
}

pin_project_lite::pin_project! {
    /// A response body that records its call's status from the trailers.
    pub struct MeteredBody<B> {
        #[pin]
        inner: B,
        pending: Option<Pending>,
    }

    impl<B> PinnedDrop for MeteredBody<B> {
        fn drop(this: Pin<&mut Self>) {
            // Dropped before its end: the client went away.
            if let Some(p) = this.project().pending.take() {
                p.record(1);
            }
        }
    }
}

/// An empty body that records nothing: what a layer outside this one
/// (load shedding) answers with without calling it.
impl<B: Default> Default for MeteredBody<B> {
    fn default() -> Self {
        MeteredBody { inner: B::default(), pending: None }
    }
}

impl<B: Body> Body for MeteredBody<B> {
    type Data = B::Data;
    type Error = B::Error;

    fn poll_frame(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Result<Frame<Self::Data>, Self::Error>>> {
        let this = self.project();
        let frame = std::task::ready!(this.inner.poll_frame(cx));
        match &frame {
            Some(Ok(f)) => {
                if let Some(code) = f.trailers_ref().and_then(status_of)
                    && let Some(p) = this.pending.take()
                {
                    p.record(code);
                }
            }
            Some(Err(_)) => {
                if let Some(p) = this.pending.take() {
                    p.record(2);
                }
            }
            None => {
                if let Some(p) = this.pending.take() {
                    p.record(0);
                }
            }
        }
        Poll::Ready(frame)
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> http_body::SizeHint {
        self.inner.size_hint()
    }
}
