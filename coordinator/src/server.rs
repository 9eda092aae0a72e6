//! Running a coordinator: build the cluster view, serve its gRPC service
//! through `shoal_server` (health, reflection, telemetry, connection
//! limits), shut down gracefully.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use shoal_proto::NodeId;
use shoal_proto::v1::shoal_server::ShoalServer;
use tokio::net::TcpListener;

use crate::auth::Auth;
use crate::cluster::{Cluster, ClusterOptions, Hedge};
use crate::config::{CoordinatorConfig, url};
use crate::controller::Controller;
use crate::metadata::{InMemoryStore, MetadataStore};
use crate::pool::GrpcConnector;
use crate::service::ShoalService;
use shoal_control::model::Member;

/// A coordinator that is serving.
pub struct RunningCoordinator {
    pub addr: SocketAddr,
    pub cluster: Arc<Cluster>,
    controller: Option<Controller>,
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    /// Reads the API keys file again when it changes.
    auth_watch: Option<tokio::task::JoinHandle<()>>,
    task: tokio::task::JoinHandle<anyhow::Result<()>>,
}

/// The metadata store the configuration names: etcd, or memory with the
/// configured shard nodes.
pub async fn store_from_config(cfg: &CoordinatorConfig) -> anyhow::Result<Arc<dyn MetadataStore>> {
    if cfg.cluster.uses_etcd() {
        return Ok(shoal_control::metadata::open(&cfg.cluster).await?);
    }
    let mut members = Vec::new();
    for n in &cfg.shard_nodes {
        members.push(Member::configured(NodeId::parse(&n.id)?, url(&n.address)));
    }
    anyhow::ensure!(!members.is_empty(), "the coordinator needs at least one shard node (shard_nodes), or etcd (cluster.etcd)");
    Ok(Arc::new(InMemoryStore::new(members)))
}

/// The cluster view over `meta`, with gRPC clients.
pub fn cluster_from_config(cfg: &CoordinatorConfig, meta: Arc<dyn MetadataStore>, bound: SocketAddr) -> Cluster {
    let opts = ClusterOptions {
        coordinator_id: cfg.coordinator_id(bound),
        default_shards: cfg.default_shards.max(1),
        search_timeout: Duration::from_millis(cfg.search_timeout_ms),
        write_timeout: Duration::from_millis(cfg.write_timeout_ms),
        status_timeout: Duration::from_millis(cfg.status_timeout_ms),
        limits: cfg.limits.clone(),
        peers: cfg.peers.clone(),
        repair_after: Duration::from_millis(cfg.repair_after_ms),
        reclaim_after: (cfg.cluster.uses_etcd() && cfg.reclaim_after_ms > 0).then(|| Duration::from_millis(cfg.reclaim_after_ms)),
        restore_damaged: cfg.restore_damaged,
        hedge: match (cfg.hedge_reads, cfg.hedge_after_ms) {
            (false, _) => Hedge::Off,
            (true, 0) => Hedge::RecentP95,
            (true, ms) => Hedge::After(Duration::from_millis(ms)),
        },
    };
    let connector = GrpcConnector { max_message_bytes: cfg.max_message_bytes, peers: cfg.peers.clone() };
    Cluster::new(meta, Box::new(connector), opts)
}

impl RunningCoordinator {
    pub async fn start(cfg: &CoordinatorConfig) -> anyhow::Result<RunningCoordinator> {
        let listener = TcpListener::bind(cfg.listen).await?;
        Self::start_on(cfg, listener).await
    }

    pub async fn start_on(cfg: &CoordinatorConfig, listener: TcpListener) -> anyhow::Result<RunningCoordinator> {
        let addr = listener.local_addr()?;
        cfg.listener.check(addr)?;
        // Everything read from files is read now, so a bad path or key
        // stops the start instead of the first call that needs it.
        let auth = Auth::from_config(&cfg.auth)?;
        if let Some(tls) = &cfg.peers.tls {
            tls.load().map_err(|e| anyhow::anyhow!("coordinator.peers.tls: {e:#}"))?;
        }
        if !cfg.auth.enabled() && !addr.ip().is_loopback() {
            tracing::warn!(%addr, "no API keys configured (coordinator.auth): anyone who reaches this address may drop collections");
        }
        let meta = store_from_config(cfg).await?;
        let cluster = Arc::new(cluster_from_config(cfg, Arc::clone(&meta), addr));
        // Without etcd the shard nodes hold the only record of the
        // collections; with it, etcd does (and a shard left on a node by a
        // failed drop must not bring its collection back).
        if !cfg.cluster.uses_etcd() {
            for (node, e) in cluster.discover().await {
                tracing::warn!(%node, error = %e, "shard node not reachable at start; its collections are not served yet");
            }
        }
        let controller = Some(Controller::spawn(Arc::clone(&cluster), cfg.coordinator_id(addr), cfg.cluster.lease_ttl()));
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let svc = ShoalServer::new(ShoalService::new(Arc::clone(&cluster), cfg.max_message_bytes).with_auth(Arc::clone(&auth)))
            .max_decoding_message_size(cfg.max_message_bytes)
            .max_encoding_message_size(cfg.max_message_bytes);
        let (listener_cfg, metrics) = (cfg.listener.clone(), cfg.telemetry.metrics);
        let server = async move {
            let routes = tonic::service::Routes::new(svc);
            shoal_server::grpc::serve(routes, &["shoal.v1.Shoal"], listener, &listener_cfg, metrics, async {
                let _ = stopped.await;
            })
            .await
        };
        let task = tokio::spawn(server);
        let auth_watch = auth.watch();
        tracing::info!(%addr, "coordinator serving");
        Ok(RunningCoordinator { addr, cluster, controller, stop: Some(stop), auth_watch, task })
    }

    /// Stops accepting and waits for in-flight requests (and the writes
    /// they started) to finish.
    pub async fn shutdown(mut self) -> anyhow::Result<()> {
        // Hand the controller role on at once instead of after the TTL.
        if let Some(c) = self.controller.take() {
            c.stop().await;
        }
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        if let Some(w) = self.auth_watch.take() {
            w.abort();
        }
        (&mut self.task).await??;
        Ok(())
    }
}
