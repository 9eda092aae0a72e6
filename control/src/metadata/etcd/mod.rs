//! The metadata of a cluster whose coordinators share etcd (v3 API, 3.4 or
//! newer).
//!
//! # Key layout
//!
//! Everything lives under one prefix per cluster (e.g. `/shoal/prod`), so
//! `etcdctl get --prefix /shoal/prod/` shows all of it. Values are JSON.
//!
//! | key | value | written by |
//! | --- | --- | --- |
//! | `{prefix}/collections/{name}` | `{"spec":{"dimension":384,"metric":"cosine","m":0,"ef_construction":0,"shard_count":3},"shards":[{"replicas":["n0"],"epoch":1},…]}`: the spec and the placement of shard i at index i | the controller, in transactions on the key's `mod_revision` |
//! | `{prefix}/nodes/{id}` | `{"address":"http://10.0.0.5:7701","state":"serving","disk_free_bytes":…,"shards":…}` | the node itself, under its lease: gone when the lease ends |
//! | `{prefix}/controller` | `{"candidate":"coord-a"}` | the elected controller, under its lease |
//!
//! A collection is one key, so a placement change is one put with one
//! compare, and its [`Revision`] is the key's
//! `mod_revision`. Keys the store does not know under the prefix are
//! ignored; values that do not decode are logged and left out of the view
//! (see `mirror`). To take a node out by hand: `etcdctl del
//! {prefix}/nodes/{id}` (its registration then reports not alive on its
//! next update); to force a new controller election: `etcdctl del
//! {prefix}/controller`.
//!
//! # How it behaves
//!
//! [`EtcdStore::connect`] lists the prefix at etcd's current revision R
//! (the view's revision), then watches it from R+1. When the watch fails,
//! the store lists and watches again with backoff; while etcd cannot be
//! reached, [`MetadataStore::health`] is `Unreachable`, the view stays as
//! last seen and every change fails with `Unavailable` within
//! [`EtcdOptions::call_timeout`]. A change returns once this store's view
//! includes it.
//!
//! `https://` endpoints are dialled over TLS with [`EtcdOptions::tls`]'s
//! files, checked before the first connection (`tls`); when the first
//! call fails, a handshake of the store's own says why if TLS is the
//! reason (`probe`).

mod codec;
mod collections;
mod election;
mod keys;
mod lease;
mod mirror;
mod probe;
mod shared;
mod tls;
mod watcher;

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Client, ConnectOptions};
use futures::FutureExt;
use futures::future::BoxFuture;
use shoal_proto::{CollectionName, NodeId};
use tokio::sync::watch;
use tokio::task::JoinHandle;

use self::keys::Keys;
use self::shared::Shared;
use super::{Collection, Leadership, Member, MetaError, MetadataStore, Registration, Revision, StoreHealth, View};
use crate::config::EtcdTls;

/// How the store talks to etcd.
#[derive(Debug, Clone)]
pub struct EtcdOptions {
    /// The longest any one call to etcd may take (connecting included);
    /// past it the call fails with `Unavailable`.
    pub call_timeout: Duration,
    /// How long a change waits for this store's view to include it.
    pub view_timeout: Duration,
    /// The longest pause between attempts to reach etcd again.
    pub max_backoff: Duration,
    /// How often a waiting campaign asks etcd again whether the controller
    /// key is free, besides watching for it to go.
    pub campaign_recheck: Duration,
    /// TLS to `https://` endpoints (`cluster.tls`).
    pub tls: EtcdTls,
}

impl Default for EtcdOptions {
    fn default() -> Self {
        EtcdOptions {
            call_timeout: Duration::from_secs(2),
            view_timeout: Duration::from_secs(5),
            max_backoff: Duration::from_secs(2),
            campaign_recheck: Duration::from_secs(1),
            tls: EtcdTls::default(),
        }
    }
}

/// Metadata in etcd; see the module documentation.
pub struct EtcdStore {
    shared: Arc<Shared>,
    watcher: JoinHandle<()>,
}

impl EtcdStore {
    /// Connects to etcd at `endpoints` (`http://host:port`, or
    /// `https://host:port` with TLS as `options.tls` says) and reads the
    /// cluster under `prefix`. Fails with `Invalid` if the endpoints or the
    /// TLS files are wrong (named), and with `Unavailable` if etcd does not
    /// answer within the call timeout: without a first view there is
    /// nothing to serve.
    pub async fn connect(endpoints: &[String], prefix: &str, options: EtcdOptions) -> Result<EtcdStore, MetaError> {
        let keys = Keys::new(prefix)?;
        if endpoints.is_empty() {
            return Err(MetaError::Invalid("no etcd endpoint given".into()));
        }
        let (endpoints, tls) = tls::endpoints(endpoints, &options.tls, options.call_timeout)?;
        let mut connect = ConnectOptions::new()
            .with_connect_timeout(options.call_timeout)
            // Finds a dead connection that sends no reset (a lost machine, a
            // partition): the watch on it fails instead of waiting forever.
            .with_keep_alive(Duration::from_secs(1), options.call_timeout)
            .with_keep_alive_while_idle(true)
            // A member cut off from the others ends its watches instead of
            // serving them stale.
            .with_require_leader(true);
        if let Some(tls) = tls {
            connect = connect.with_tls(tls);
        }
        let started = std::time::Instant::now();
        let first = async {
            let client = tokio::time::timeout(options.call_timeout, Client::connect(&endpoints, Some(connect)))
                .await
                .map_err(|_| MetaError::Unavailable(format!("etcd at {endpoints:?} did not answer within {:?}", options.call_timeout)))?
                .map_err(|e| shared::etcd_error(&format!("connect to etcd at {endpoints:?}"), e))?;
            let shared = Arc::new(Shared::new(keys, client, options.clone()));
            let listed = shared.list().await?;
            Ok((shared, listed))
        };
        let (shared, listed) = match first.await {
            Ok(connected) => connected,
            Err(MetaError::Unavailable(error)) => {
                // Within the call timeout still: refusals come at once, and an
                // etcd that does not answer has nothing to explain.
                let left = options.call_timeout.saturating_sub(started.elapsed());
                return Err(MetaError::Unavailable(explain(&endpoints, &options.tls, left, error).await));
            }
            Err(e) => return Err(e),
        };
        shared.install(listed);
        let watcher = tokio::spawn(watcher::run(shared.clone()));
        Ok(EtcdStore { shared, watcher })
    }

    /// The prefix all of this cluster's keys start with (ends with `/`).
    pub fn prefix(&self) -> &str {
        self.shared.keys.root()
    }
}

/// `error` (etcd could not be reached), preceded by why when a handshake
/// of the store's own shows it: a refused or untrusted certificate, or a
/// plain-text endpoint that speaks TLS (see `probe`).
async fn explain(endpoints: &[String], tls: &EtcdTls, limit: Duration, error: String) -> String {
    if limit.is_zero() {
        return error;
    }
    let probes = endpoints.iter().map(|e| probe::diagnose(e, tls, limit));
    match futures::future::join_all(probes).await.into_iter().flatten().next() {
        Some(why) => format!("{why} [{error}]"),
        None => error,
    }
}

impl Drop for EtcdStore {
    /// Stops watching. Registrations and leaderships taken through this
    /// store keep their own keep-alive until they are dropped.
    fn drop(&mut self) {
        self.watcher.abort();
    }
}

impl MetadataStore for EtcdStore {
    fn kind(&self) -> &'static str {
        "etcd"
    }

    fn view(&self) -> Arc<View> {
        self.shared.views.borrow().clone()
    }

    fn watch(&self) -> watch::Receiver<Arc<View>> {
        self.shared.views.subscribe()
    }

    fn health(&self) -> StoreHealth {
        self.shared.health()
    }

    fn sync(&self) -> BoxFuture<'_, Result<Arc<View>, MetaError>> {
        // A listing is a linearizable read: the view it installs (if newer)
        // includes every change that finished before this call.
        self.shared.refresh().boxed()
    }

    fn create_collection(&self, c: Collection) -> BoxFuture<'_, Result<Revision, MetaError>> {
        collections::create(&self.shared, c).boxed()
    }

    fn update_collection(&self, c: Collection, expected: Revision) -> BoxFuture<'_, Result<Revision, MetaError>> {
        collections::update(&self.shared, c, expected).boxed()
    }

    fn delete_collection(&self, name: CollectionName, expected: Revision) -> BoxFuture<'_, Result<(), MetaError>> {
        collections::delete(&self.shared, name, expected).boxed()
    }

    fn set_draining(&self, node: NodeId, draining: bool) -> BoxFuture<'_, Result<Revision, MetaError>> {
        collections::set_draining(&self.shared, node, draining).boxed()
    }

    fn register(&self, member: Member, ttl: Duration) -> BoxFuture<'_, Result<Registration, MetaError>> {
        lease::register(self.shared.clone(), member, ttl).boxed()
    }

    fn campaign(&self, candidate: String, ttl: Duration) -> BoxFuture<'_, Result<Leadership, MetaError>> {
        election::campaign(self.shared.clone(), candidate, ttl).boxed()
    }
}
