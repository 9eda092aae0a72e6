//! Serving a process's gRPC services with what every shoal server has: the
//! accept loop and its limits, HTTP/2 keep-alive, the standard health and
//! reflection services, a span per request continuing the caller's trace,
//! request metrics per RPC and status, and Prometheus metrics at `/metrics`
//! (HTTP/1.1 on the same port, which the gRPC clients never use).

use std::future::Future;

use tokio::net::TcpListener;
use tonic::service::Routes;
use tonic_health::ServingStatus;

use crate::accept::accept;
use crate::listener::ListenerConfig;
use crate::propagation::request_span;
use crate::rpc_metrics::RpcMetricsLayer;
use crate::shed::ShedLayer;
use crate::telemetry;

/// Serves `routes` (the process's own services, whose names `served` lists
/// for health checks and reflection) on `listener` until `shutdown`.
pub async fn serve(
    routes: Routes,
    served: &[&'static str],
    listener: TcpListener,
    cfg: &ListenerConfig,
    metrics: bool,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> anyhow::Result<()> {
    let (health, health_service) = tonic_health::server::health_reporter();
    let mut reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(shoal_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        // Only what this server serves: the descriptor set describes the
        // other side's service too.
        .with_service_name("grpc.health.v1.Health");
    for name in served {
        health.set_service_status(*name, ServingStatus::Serving).await;
        reflection = reflection.with_service_name(*name);
    }
    let mut router = routes.add_service(health_service).add_service(reflection.build_v1()?).into_axum_router();
    if metrics {
        router = router.route("/metrics", axum::routing::get(prometheus_text));
    }
    let addr = listener.local_addr()?;
    // Told when shutdown begins, so the drain below can be bounded.
    let (began, mut shutting_down) = tokio::sync::oneshot::channel::<()>();
    let shutdown = async move {
        shutdown.await;
        let _ = began.send(());
    };
    let served = cfg
        .server(addr)?
        .accept_http1(true)
        .trace_fn(request_span)
        // Outermost: a shed request costs no span, no metric by RPC and no
        // decoding.
        .layer(ShedLayer::new(cfg.max_concurrent_requests))
        .layer(RpcMetricsLayer::new())
        .layer(tower::util::MapResponseLayer::new(shoal_proto::oversized_is_resource_exhausted))
        .layer(tower::util::MapResponseLayer::new(shoal_proto::undecodable_is_invalid_argument))
        .add_routes(Routes::from(router))
        .serve_with_incoming_shutdown(accept(listener, cfg.limits()), shutdown);
    tokio::pin!(served);
    tokio::select! {
        r = &mut served => return Ok(r?),
        Ok(()) = &mut shutting_down => {}
    }
    let grace = std::time::Duration::from_millis(cfg.shutdown_grace_ms);
    match tokio::time::timeout(grace, &mut served).await {
        Ok(r) => Ok(r?),
        // Dropping the server closes what is left.
        Err(_) => {
            tracing::warn!(%addr, ?grace, "calls still open after the shutdown grace (a client that stopped reading?); closing their connections");
            Ok(())
        }
    }
}

async fn prometheus_text() -> ([(http::HeaderName, &'static str); 1], String) {
    // Collecting runs the gauges' callbacks, which read every shard: not on
    // a runtime thread.
    let text = tokio::task::spawn_blocking(|| telemetry::get().map(telemetry::Telemetry::prometheus_text).unwrap_or_default())
        .await
        .unwrap_or_default();
    ([(http::header::CONTENT_TYPE, "text/plain; version=0.0.4; charset=utf-8")], text)
}
