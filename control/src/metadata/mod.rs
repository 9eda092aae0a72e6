//! What the coordinators agree on: the member nodes, the collections and
//! where each shard lives, and which coordinator is the controller.
//!
//! Behind [`MetadataStore`] so that the same coordinator code runs on one
//! machine without any service beside it ([`memory::InMemoryStore`]) and
//! on a cluster whose coordinators share etcd ([`etcd::EtcdStore`]). Both
//! pass the same [`conformance`] suite.
//!
//! The model: every coordinator serves from the last [`View`] it saw (a
//! cheap `Arc` read, no await on a request path), which the store keeps
//! current and announces through [`MetadataStore::watch`]. Changes go
//! through the store, and a change to an existing collection names the
//! revision it was based on ([`Versioned::revision`]): if anyone changed
//! the collection since, the change fails with [`MetaError::Conflict`] and
//! nothing is written, so two coordinators can never make conflicting
//! decisions. A write returns after the store's own view includes it.

#[doc(hidden)]
pub mod conformance;
pub mod etcd;
pub mod memory;
mod placement;

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use futures::future::BoxFuture;
use shoal_proto::{CollectionName, NodeId, ShoalError};
use tokio::sync::watch;

pub use crate::model::{Collection, Member};
pub use memory::InMemoryStore;
pub use placement::{PlannedMove, place, place_replicas, rebalance};

/// A point in the store's history: every change makes a higher one. For
/// etcd, its revision numbers (`mod_revision` of a key).
pub type Revision = i64;

/// A value and the revision of its last change.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Versioned<T> {
    pub value: T,
    pub revision: Revision,
}

/// Everything the store holds, as of `revision`.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct View {
    pub revision: Revision,
    /// Nodes whose registration is alive (or configured statically).
    pub members: BTreeMap<NodeId, Member>,
    pub collections: BTreeMap<CollectionName, Versioned<Collection>>,
    /// The coordinator that currently makes placement decisions.
    pub controller: Option<String>,
    /// Nodes an operator is draining: they get no new shards, and the
    /// controller moves theirs away. Kept until undrained, whether or not
    /// the node is alive.
    pub draining: BTreeSet<NodeId>,
}

impl View {
    pub fn collection(&self, name: &CollectionName) -> Option<&Versioned<Collection>> {
        self.collections.get(name)
    }

    pub fn member(&self, id: &NodeId) -> Option<&Member> {
        self.members.get(id)
    }

    /// Members that may receive shards: alive, serving by their own
    /// account, and not drained by an operator.
    pub fn placeable(&self) -> impl Iterator<Item = &Member> {
        self.members.values().filter(|m| m.state == crate::model::NodeState::Serving && !self.draining.contains(&m.id))
    }
}

/// Whether the store can be reached.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreHealth {
    Connected,
    /// Unreachable since then: the view is the last one seen, and changes
    /// are refused.
    Unreachable {
        since: SystemTime,
        error: String,
    },
}

/// Why a change was not made. Nothing is written when one is returned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MetaError {
    /// The value changed since the revision the change was based on.
    #[error("{what} changed since revision {expected} (now at {found}); re-read it and decide again")]
    Conflict { what: String, expected: Revision, found: Revision },
    #[error("{0} already exists")]
    AlreadyExists(String),
    #[error("{0} does not exist")]
    NotFound(String),
    /// The store cannot be reached (or did not answer in time).
    #[error("the metadata store is unavailable: {0}")]
    Unavailable(String),
    /// A stored value that does not decode or breaks an invariant.
    #[error("stored value {key} is corrupt: {reason}")]
    Corrupt { key: String, reason: String },
    /// A value that cannot be stored (e.g. a collection breaking an
    /// invariant of `Collection::check`).
    #[error("{0}")]
    Invalid(String),
}

impl From<MetaError> for ShoalError {
    fn from(e: MetaError) -> ShoalError {
        match e {
            MetaError::Conflict { .. } => ShoalError::unavailable(e.to_string(), Duration::from_millis(100)),
            MetaError::AlreadyExists(_) => ShoalError::already_exists(e.to_string()),
            MetaError::NotFound(_) => ShoalError::not_found(e.to_string()),
            MetaError::Unavailable(_) => ShoalError::unavailable(e.to_string(), Duration::from_secs(1)),
            MetaError::Corrupt { .. } => ShoalError::internal(e.to_string()),
            MetaError::Invalid(_) => ShoalError::invalid(e.to_string()),
        }
    }
}

/// A node's presence in the cluster: alive while this handle lives and its
/// lease is kept alive in the background. Dropping it stops the keep-alive
/// (the node disappears when the lease ends, as after a crash); `leave`
/// ends it at once.
pub struct Registration(Box<dyn LeaseHandle>);

impl Registration {
    pub fn new(handle: Box<dyn LeaseHandle>) -> Self {
        Registration(handle)
    }

    /// Replaces what the node says about itself (state, capacity, address).
    pub async fn update(&self, member: Member) -> Result<(), MetaError> {
        self.0.update(member).await
    }

    /// False once the lease is known to have ended (expired while the store
    /// was unreachable): the node must register again.
    pub fn is_alive(&self) -> bool {
        self.0.is_alive()
    }

    /// Removes the node now (revokes its lease).
    pub async fn leave(self) -> Result<(), MetaError> {
        self.0.leave().await
    }
}

impl fmt::Debug for Registration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Registration").field("alive", &self.is_alive()).finish()
    }
}

/// A store's implementation of [`Registration`].
pub trait LeaseHandle: Send + Sync {
    fn update(&self, member: Member) -> BoxFuture<'_, Result<(), MetaError>>;
    fn is_alive(&self) -> bool;
    fn leave(self: Box<Self>) -> BoxFuture<'static, Result<(), MetaError>>;
}

/// Being the controller: held until resigned, dropped, or lost (the lease
/// ended, e.g. while the store was unreachable). Whoever holds it must
/// still make every change conditional on revisions: leadership alone
/// never excludes a stale leader (Jepsen, etcd 3.4.3).
pub struct Leadership(Box<dyn LeaderHandle>);

impl Leadership {
    pub fn new(handle: Box<dyn LeaderHandle>) -> Self {
        Leadership(handle)
    }

    /// Resolves when leadership is lost.
    pub async fn lost(&self) {
        self.0.lost().await
    }

    pub fn is_leader(&self) -> bool {
        self.0.is_leader()
    }

    /// Hands leadership on now.
    pub async fn resign(self) -> Result<(), MetaError> {
        self.0.resign().await
    }
}

/// A store's implementation of [`Leadership`].
pub trait LeaderHandle: Send + Sync {
    fn lost(&self) -> BoxFuture<'_, ()>;
    fn is_leader(&self) -> bool;
    fn resign(self: Box<Self>) -> BoxFuture<'static, Result<(), MetaError>>;
}

/// Storage of the cluster's metadata; see the module documentation.
pub trait MetadataStore: Send + Sync {
    /// What keeps the metadata: "memory" or "etcd" (for status and logs).
    fn kind(&self) -> &'static str;

    /// The last view seen. Never waits.
    fn view(&self) -> Arc<View>;

    /// Announces every new view.
    fn watch(&self) -> watch::Receiver<Arc<View>>;

    fn health(&self) -> StoreHealth;

    /// Asks the store itself and returns a view at least as new as its
    /// current revision.
    fn sync(&self) -> BoxFuture<'_, Result<Arc<View>, MetaError>>;

    /// Adds a collection; `AlreadyExists` if one of that name exists.
    fn create_collection(&self, c: Collection) -> BoxFuture<'_, Result<Revision, MetaError>>;

    /// Replaces a collection (its placement, typically) if it is still at
    /// revision `expected`.
    fn update_collection(&self, c: Collection, expected: Revision) -> BoxFuture<'_, Result<Revision, MetaError>>;

    /// Removes a collection if it is still at revision `expected`.
    fn delete_collection(&self, name: CollectionName, expected: Revision) -> BoxFuture<'_, Result<(), MetaError>>;

    /// Marks a node as draining (or not any more). Idempotent.
    fn set_draining(&self, node: NodeId, draining: bool) -> BoxFuture<'_, Result<Revision, MetaError>>;

    /// Registers a node under a lease of `ttl`, kept alive in the
    /// background; `AlreadyExists` if a live registration has its id.
    fn register(&self, member: Member, ttl: Duration) -> BoxFuture<'_, Result<Registration, MetaError>>;

    /// Waits until `candidate` is the controller (one at a time, under a
    /// lease of `ttl`).
    fn campaign(&self, candidate: String, ttl: Duration) -> BoxFuture<'_, Result<Leadership, MetaError>>;
}

/// The store `cfg` names: etcd when it lists endpoints.
pub async fn open(cfg: &crate::ClusterConfig) -> Result<Arc<dyn MetadataStore>, MetaError> {
    if !cfg.uses_etcd() {
        return Err(MetaError::Invalid("no etcd endpoints are configured (cluster.etcd)".into()));
    }
    let options = etcd::EtcdOptions { call_timeout: cfg.call_timeout(), tls: cfg.tls.clone(), ..etcd::EtcdOptions::default() };
    let store = etcd::EtcdStore::connect(&cfg.etcd, &cfg.prefix, options).await?;
    Ok(Arc::new(store))
}
