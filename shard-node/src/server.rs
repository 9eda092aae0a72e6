//! Running a shard node: its gRPC service through `shoal_server` (which
//! adds health, reflection, telemetry and the connection limits), graceful
//! shutdown.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use shoal_control::metadata::MetaError;
use shoal_proto::v1::shard_node_server::ShardNodeServer;
use tokio::net::TcpListener;

use crate::config::ShardNodeConfig;
use crate::data_dir::DataDir;
use crate::host::ShardHost;
use crate::registration::Presence;
use crate::service::ShardNodeService;

/// A shard node that is serving.
pub struct RunningShardNode {
    pub addr: SocketAddr,
    pub host: Arc<ShardHost>,
    presence: Option<Presence>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
    scrub: Option<tokio::task::JoinHandle<()>>,
    /// Held (locked) for as long as the node runs.
    data_dir: DataDir,
}

/// Waits between tries to reach the metadata store when starting.
const JOIN_BACKOFF_FIRST: Duration = Duration::from_millis(100);
const JOIN_BACKOFF_MAX: Duration = Duration::from_secs(5);

impl RunningShardNode {
    /// Opens the shards and starts serving on `cfg.listen` (port 0 picks a
    /// free port; see `addr`).
    pub async fn start(cfg: &ShardNodeConfig) -> anyhow::Result<RunningShardNode> {
        let listener = TcpListener::bind(cfg.listen).await?;
        Self::start_on(cfg, listener).await
    }

    pub async fn start_on(cfg: &ShardNodeConfig, listener: TcpListener) -> anyhow::Result<RunningShardNode> {
        let addr = listener.local_addr()?;
        cfg.listener.check(addr)?;
        let data_dir = DataDir::claim(&cfg.data_dir)?;
        let host = ShardHost::open(cfg).await?;
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let task = tokio::spawn(serve(Arc::clone(&host), listener, cfg.clone(), async {
            let _ = stopped.await;
        }));
        tracing::info!(node = %cfg.node_id, %addr, data_dir = %cfg.data_dir.display(), "shard node serving");
        let scrub = crate::scrub::spawn(&host, &cfg.scrub);
        let mut node = RunningShardNode { addr, host, presence: None, stop: Some(stop), task, scrub, data_dir };
        if cfg.cluster.uses_etcd() {
            // Serving first: a coordinator that sees the registration can
            // reach the node at once.
            match node.join(cfg, addr).await {
                Ok(p) => node.presence = Some(p),
                Err(e) => {
                    let _ = node.shutdown().await;
                    return Err(e.context("registering in the cluster"));
                }
            }
        }
        Ok(node)
    }

    /// Registers in the cluster, waiting for etcd as long as it takes (with
    /// backoff): a node started before etcd, or while it is down, joins
    /// when it can. Fails at once on what waiting cannot mend (another
    /// process holds the id, a bad setting).
    async fn join(&self, cfg: &ShardNodeConfig, addr: SocketAddr) -> anyhow::Result<Presence> {
        let id = shoal_proto::NodeId::parse(&cfg.node_id)?;
        let address = cfg.advertised_url(addr)?;
        let mut wait = JOIN_BACKOFF_FIRST;
        let mut tries = 0u32;
        loop {
            let joined = async {
                let store = shoal_control::metadata::open(&cfg.cluster).await?;
                let incarnation = self.data_dir.incarnation().to_owned();
                Presence::join(
                    store,
                    id.clone(),
                    address.clone(),
                    incarnation,
                    Arc::clone(&self.host),
                    cfg.data_dir.clone(),
                    cfg.cluster.lease_ttl(),
                )
                .await
            };
            match joined.await {
                Ok(p) => {
                    if tries > 0 {
                        tracing::info!(node = %id, tries = tries + 1, "registered once the metadata store answered");
                    }
                    return Ok(p);
                }
                Err(MetaError::Unavailable(e)) => {
                    tries += 1;
                    tracing::warn!(node = %id, error = %e, retry_in = ?wait, "the metadata store cannot be reached; not serving the cluster until registered");
                    tokio::time::sleep(wait).await;
                    wait = (wait * 2).min(JOIN_BACKOFF_MAX);
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Graceful shutdown: stop accepting, finish in-flight requests and
    /// queued batches, close the environments.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        // Leave first, so coordinators stop sending before the node stops
        // answering.
        if let Some(p) = self.presence.take() {
            p.leave().await;
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        let served = (&mut self.task).await;
        if let Some(scrub) = self.scrub.take() {
            scrub.abort();
        }
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
) -> anyhow::Result<()> {
    let svc = ShardNodeServer::new(ShardNodeService::new(host))
        .max_decoding_message_size(cfg.max_message_bytes)
        .max_encoding_message_size(cfg.max_message_bytes);
    let routes = tonic::service::Routes::new(svc);
    shoal_server::grpc::serve(routes, &["shoal.v1.ShardNode"], listener, &cfg.listener, cfg.telemetry.metrics, shutdown).await
}
