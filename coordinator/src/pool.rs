//! The shard clients of the cluster's current members. The pool follows
//! the metadata store's view: a node that registers gets a client and a
//! health prober, a node whose registration ends (or whose address
//! changes) loses them, so a shard placed on a node that is no longer a
//! member fails at once with UNAVAILABLE instead of waiting on a dead
//! address.
//!
//! How a member becomes a client is the [`Connector`]'s business: over
//! gRPC for separate processes, in process for the embedded cluster.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use parking_lot::RwLock;
use shoal_proto::NodeId;
use shoal_proto::v1::shard_node_server::ShardNode;
use tokio::sync::watch;

use crate::client::{PeerSettings, ShardClient};
use crate::error::{Error, Result};
use crate::liveness::Liveness;
use shoal_control::metadata::View;
use shoal_control::model::Member;

/// Makes the client of a member.
pub trait Connector: Send + Sync {
    fn connect(&self, member: &Member) -> Result<ShardClient>;
}

/// Shard nodes in other processes, over gRPC (connecting lazily, so a node
/// that is down makes calls fail instead of the coordinator).
pub struct GrpcConnector {
    pub max_message_bytes: usize,
    pub peers: PeerSettings,
}

impl Connector for GrpcConnector {
    fn connect(&self, member: &Member) -> Result<ShardClient> {
        Ok(ShardClient::connect_lazy(&member.address, self.max_message_bytes, &self.peers)?)
    }
}

/// Shard nodes in this process, by id.
pub struct LocalConnector(pub HashMap<NodeId, Arc<dyn ShardNode>>);

impl Connector for LocalConnector {
    fn connect(&self, member: &Member) -> Result<ShardClient> {
        self.0
            .get(&member.id)
            .map(|s| ShardClient::Local(Arc::clone(s)))
            .ok_or_else(|| Error::Internal(format!("node {} is not in this process", member.id)))
    }
}

struct Entry {
    address: String,
    client: ShardClient,
    prober: tokio::task::JoinHandle<()>,
}

/// See the module documentation.
pub struct ShardPool {
    connector: Box<dyn Connector>,
    nodes: RwLock<HashMap<NodeId, Entry>>,
    liveness: Arc<Liveness>,
    probe_interval: Duration,
    probe_timeout: Duration,
}

impl Drop for ShardPool {
    fn drop(&mut self) {
        for e in self.nodes.get_mut().values() {
            e.prober.abort();
        }
    }
}

impl ShardPool {
    pub fn new(connector: Box<dyn Connector>, peers: &PeerSettings) -> Self {
        let liveness = Arc::new(Liveness::new([]));
        liveness.export_gauge();
        ShardPool {
            connector,
            nodes: RwLock::new(HashMap::new()),
            liveness,
            probe_interval: Duration::from_millis(peers.probe_interval_ms.max(1)),
            probe_timeout: Duration::from_millis(peers.probe_timeout_ms.max(1)),
        }
    }

    pub fn liveness(&self) -> &Liveness {
        &self.liveness
    }

    /// The client of `node`, or UNAVAILABLE if it is not a member now.
    pub fn get(&self, node: &NodeId) -> Result<ShardClient> {
        self.nodes.read().get(node).map(|e| e.client.clone()).ok_or_else(|| Error::NodeUnavailable {
            node: node.clone(),
            reason: "is not a member of the cluster (it left, or its lease ended): its shards are unavailable".into(),
        })
    }

    /// Makes the pool hold exactly the clients of `members`. Must run inside
    /// a tokio runtime (probers are tasks).
    pub fn sync(&self, members: &BTreeMap<NodeId, Member>) {
        let mut nodes = self.nodes.write();
        nodes.retain(|id, e| {
            let keep = members.get(id).is_some_and(|m| m.address == e.address);
            if !keep {
                e.prober.abort();
                self.liveness.forget(id);
                tracing::info!(node = %id, "shard node left the pool");
            }
            keep
        });
        for (id, m) in members {
            if nodes.contains_key(id) {
                continue;
            }
            match self.connector.connect(m) {
                Ok(client) => {
                    let prober = self.liveness.spawn_prober(id.clone(), client.clone(), self.probe_interval, self.probe_timeout);
                    nodes.insert(id.clone(), Entry { address: m.address.clone(), client, prober });
                    tracing::info!(node = %id, address = %m.address, "shard node joined the pool");
                }
                Err(e) => tracing::warn!(node = %id, address = %m.address, error = %e, "cannot make a client for a member"),
            }
        }
    }

    /// Follows every view `views` announces until the pool is dropped.
    pub fn follow(self: &Arc<Self>, mut views: watch::Receiver<Arc<View>>) -> tokio::task::JoinHandle<()> {
        let pool = Arc::downgrade(self);
        let first = views.borrow_and_update().clone();
        self.sync(&first.members);
        tokio::spawn(async move {
            while views.changed().await.is_ok() {
                let view = views.borrow_and_update().clone();
                let Some(pool) = pool.upgrade() else { return };
                pool.sync(&view.members);
            }
        })
    }
}
