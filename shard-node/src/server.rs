//! Running a shard node: gRPC server with health and reflection, graceful
//! shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;

use shoal_proto::v1::shard_node_server::ShardNodeServer;
use tokio::net::TcpListener;

use crate::config::ShardNodeConfig;
use crate::host::ShardHost;
use crate::service::ShardNodeService;

/// A shard node that is serving.
pub struct RunningShardNode {
    pub addr: SocketAddr,
    pub host: Arc<ShardHost>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

impl RunningShardNode {
    /// Opens the shards and starts serving on `cfg.listen` (port 0 picks a
    /// free port; see `addr`).
    pub async fn start(cfg: &ShardNodeConfig) -> anyhow::Result<RunningShardNode> {
        let listener = TcpListener::bind(cfg.listen).await?;
        Self::start_on(cfg, listener).await
    }

    pub async fn start_on(cfg: &ShardNodeConfig, listener: TcpListener) -> anyhow::Result<RunningShardNode> {
        let addr = listener.local_addr()?;
        let host = ShardHost::open(cfg).await?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve(Arc::clone(&host), listener, cfg.clone(), async {
            let _ = stopped.await;
        }));
        tracing::info!(node = %cfg.node_id, %addr, data_dir = %cfg.data_dir.display(), "shard node serving");
        Ok(RunningShardNode { addr, host, stop: Some(stop), task })
    }

    /// Graceful shutdown: stop accepting, finish in-flight requests and
    /// queued batches, close the environments.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let served = (&mut self.task).await;
        self.host.shutdown().await;
        served??;
        Ok(())
    }
}

/// Serves `host` on `listener` until `shutdown` resolves.
pub async fn serve(
    host: Arc<ShardHost>,
    listener: TcpListener,
    cfg: ShardNodeConfig,
    shutdown: impl Future<Output = ()> + Send + 'static,
) -> Result<(), tonic::transport::Error> {
    let (health, health_service) = tonic_health::server::health_reporter();
    health.set_serving::<ShardNodeServer<ShardNodeService>>().await;
    let reflection = tonic_reflection::server::Builder::configure()
        .register_encoded_file_descriptor_set(shoal_proto::FILE_DESCRIPTOR_SET)
        .register_encoded_file_descriptor_set(tonic_health::pb::FILE_DESCRIPTOR_SET)
        // Advertise only what this server serves (the descriptor set also
        // describes the other side's service).
        .with_service_name("shoal.v1.ShardNode")
        .with_service_name("grpc.health.v1.Health")
        .build_v1()
        .expect("the descriptor set compiled into shoal-proto is valid");
    let svc = ShardNodeServer::new(ShardNodeService::new(host))
        .max_decoding_message_size(cfg.max_message_bytes)
        .max_encoding_message_size(cfg.max_message_bytes);
    cfg.listener
        .server()
        .layer(tower::util::MapResponseLayer::new(shoal_proto::oversized_is_resource_exhausted))
        .add_service(health_service)
        .add_service(reflection)
        .add_service(svc)
        .serve_with_incoming_shutdown(shoal_proto::accept(listener, cfg.listener.limits()), shutdown)
        .await
}
