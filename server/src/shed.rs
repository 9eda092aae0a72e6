//! Load shedding: a process serves at most so many requests at once and
//! answers the rest at once with RESOURCE_EXHAUSTED and a retry hint,
//! instead of queueing them until memory runs out (each may carry up to
//! `max_message_bytes`) or their deadlines pass in the queue.
//!
//! Health checks and `/metrics` are never shed: a coordinator that cannot
//! get a busy node's health would mark it down and move its work onto the
//! others, turning load into an outage.

use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use opentelemetry::metrics::Counter;
use tokio::sync::Semaphore;
use tower::{Layer, Service};

/// How long a shed caller is told to wait: long enough for a few requests
/// to finish, short enough not to idle a client.
const RETRY_AFTER: Duration = Duration::from_millis(50);

/// Wraps a server's services with [`Shed`].
#[derive(Clone)]
pub struct ShedLayer {
    permits: Arc<Semaphore>,
    limit: usize,
    shed: Counter<u64>,
}

impl ShedLayer {
    /// At most `limit` requests at once (0: no limit).
    pub fn new(limit: usize) -> Self {
        let limit = if limit == 0 { Semaphore::MAX_PERMITS } else { limit };
        let shed = opentelemetry::global::meter("shoal")
            .u64_counter("shoal.rpc.shed")
            .with_description("Requests answered RESOURCE_EXHAUSTED because the process served max_concurrent_requests already")
            .build();
        ShedLayer { permits: Arc::new(Semaphore::new(limit)), limit, shed }
    }
}

impl<S> Layer<S> for ShedLayer {
    type Service = Shed<S>;

    fn layer(&self, inner: S) -> Shed<S> {
        Shed { inner, layer: self.clone() }
    }
}

/// See the module.
#[derive(Clone)]
pub struct Shed<S> {
    inner: S,
    layer: ShedLayer,
}

type BoxFuture<T, E> = Pin<Box<dyn Future<Output = Result<T, E>> + Send>>;

impl<S, B, RB> Service<http::Request<B>> for Shed<S>
where
    S: Service<http::Request<B>, Response = http::Response<RB>> + Send + 'static,
    S::Future: Send + 'static,
    S::Error: Send + 'static,
    RB: Default + Send + 'static,
{
    type Response = S::Response;
    type Error = S::Error;
    type Future = BoxFuture<S::Response, S::Error>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx)
    }

    fn call(&mut self, req: http::Request<B>) -> Self::Future {
        let path = req.uri().path();
        if path.starts_with("/grpc.health.v1.Health/") || path == "/metrics" {
            return Box::pin(self.inner.call(req));
        }
        let Ok(permit) = Arc::clone(&self.layer.permits).try_acquire_owned() else {
            // No label: the path is the client's to choose.
            self.layer.shed.add(1, &[]);
            let mut status = tonic::Status::resource_exhausted(format!(
                "this process serves {} requests at once (max_concurrent_requests) and is at that limit: retry after {} ms",
                self.layer.limit,
                RETRY_AFTER.as_millis()
            ));
            if let Ok(v) = RETRY_AFTER.as_millis().to_string().parse() {
                status.metadata_mut().insert(shoal_proto::RETRY_AFTER_MS, v);
            }
            return Box::pin(std::future::ready(Ok(status.into_http())));
        };
        let call = self.inner.call(req);
        Box::pin(async move {
            let answer = call.await;
            drop(permit);
            answer
        })
    }
}

#[cfg(test)]
mod tests {
    use tower::ServiceExt;

    use super::*;

    #[tokio::test]
    async fn past_the_limit_requests_are_shed_with_a_hint_but_health_checks_are_not() {
        let (release, released) = tokio::sync::watch::channel(false);
        let inner = tower::service_fn(move |_: http::Request<()>| {
            let mut released = released.clone();
            async move {
                let _ = released.wait_for(|r| *r).await;
                Ok::<_, std::convert::Infallible>(http::Response::new(String::from("served")))
            }
        });
        let svc = ShedLayer::new(1).layer(inner);
        let req = |path: &str| http::Request::builder().uri(path).body(()).unwrap();
        let first = tokio::spawn(svc.clone().oneshot(req("/shoal.v1.Shoal/Search")));
        tokio::time::sleep(Duration::from_millis(50)).await;
        let shed = svc.clone().oneshot(req("/shoal.v1.Shoal/Search")).await.unwrap();
        assert_eq!(shed.headers().get("grpc-status").unwrap(), "8", "RESOURCE_EXHAUSTED");
        assert_eq!(shed.headers().get(shoal_proto::RETRY_AFTER_MS).unwrap(), "50");
        let health = tokio::spawn(svc.clone().oneshot(req("/grpc.health.v1.Health/Check")));
        release.send(true).unwrap();
        assert_eq!(health.await.unwrap().unwrap().into_body(), "served", "a health check was shed");
        assert_eq!(first.await.unwrap().unwrap().into_body(), "served");
        // The slot came back.
        assert_eq!(svc.oneshot(req("/shoal.v1.Shoal/Search")).await.unwrap().into_body(), "served");
    }
}
