//! Leases kept alive in the background, and node registrations on them.

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Client, Compare, CompareOp, PutOptions, Txn, TxnOp};
use futures::FutureExt;
use futures::future::BoxFuture;
use shoal_proto::NodeId;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use super::codec;
use super::shared::{Shared, etcd_error, header_revision, lease_not_found};
use crate::metadata::{LeaseHandle, Member, MetaError, Registration, Revision};

/// What is known of a lease.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum LeaseStatus {
    /// etcd confirmed it; it cannot end before `until` (counted from when
    /// the confirmed keep-alive was sent, so never later than etcd's own).
    Alive { until: Instant },
    /// etcd said it does not exist any more (expired or revoked).
    Gone,
}

/// A lease and the task that keeps it alive until this is dropped (then
/// etcd ends it when its TTL runs out, as after a crash).
pub(super) struct KeepAlive {
    id: i64,
    status: Arc<watch::Sender<LeaseStatus>>,
    task: JoinHandle<()>,
}

impl KeepAlive {
    /// Grants a lease of `ttl`, rounded up to whole seconds (etcd raises it
    /// to its minimum, about 2 s with default settings).
    pub(super) async fn grant(shared: &Shared, ttl: Duration) -> Result<KeepAlive, MetaError> {
        let seconds = ttl.as_secs() + u64::from(ttl.subsec_nanos() > 0);
        let seconds = i64::try_from(seconds.max(1)).map_err(|_| MetaError::Invalid(format!("lease TTL {ttl:?} is too long")))?;
        let sent = Instant::now();
        let resp = shared.call("grant a lease", shared.client.lease_client().grant(seconds, None)).await?;
        let granted = Duration::from_secs(resp.ttl().max(1).unsigned_abs());
        let status = Arc::new(watch::Sender::new(LeaseStatus::Alive { until: sent + granted }));
        let task = tokio::spawn(keep_alive(shared.client.clone(), resp.id(), granted, shared.options.call_timeout, status.clone()));
        Ok(KeepAlive { id: resp.id(), status, task })
    }

    pub(super) fn id(&self) -> i64 {
        self.id
    }

    pub(super) fn status(&self) -> LeaseStatus {
        *self.status.borrow()
    }

    pub(super) fn subscribe(&self) -> watch::Receiver<LeaseStatus> {
        self.status.subscribe()
    }

    /// What an answer from etcd showed: the lease's key is gone.
    pub(super) fn mark_gone(&self) {
        self.status.send_replace(LeaseStatus::Gone);
    }

    /// Revokes the lease now (etcd deletes its keys) and waits until the
    /// view shows it.
    pub(super) async fn revoke(self, shared: &Shared) -> Result<(), MetaError> {
        self.task.abort();
        match shared.call_raw("revoke a lease", shared.client.lease_client().revoke(self.id)).await? {
            Ok(resp) => shared.catch_up(header_revision(resp.header())?).await,
            // Ended already: its keys went with it.
            Err(e) if lease_not_found(&e) => {
                shared.refresh().await?;
            }
            Err(e) => return Err(etcd_error("revoke a lease", e)),
        }
        self.mark_gone();
        Ok(())
    }

    /// Revokes a lease nothing uses, without waiting on the view; if etcd
    /// cannot be reached, the TTL ends it anyway.
    pub(super) async fn abandon(self, shared: &Shared) {
        self.task.abort();
        let _ = shared.call("revoke a lease", shared.client.lease_client().revoke(self.id)).await;
    }
}

impl Drop for KeepAlive {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Sends a keep-alive every third of the TTL on one stream, opening a new
/// stream when one fails, until etcd says the lease is gone.
async fn keep_alive(client: Client, id: i64, ttl: Duration, call_timeout: Duration, status: Arc<watch::Sender<LeaseStatus>>) {
    let interval = ttl / 3;
    let confirm = |sent: Instant, ttl: Duration| {
        status.send_if_modified(|s| match s {
            LeaseStatus::Alive { until } => {
                *until = (*until).max(sent + ttl);
                true
            }
            LeaseStatus::Gone => false,
        });
    };
    loop {
        let sent = Instant::now();
        match tokio::time::timeout(call_timeout, client.lease_client().keep_alive(id)).await {
            // Opening the stream sent a first keep-alive and checked its answer.
            Ok(Ok((mut keeper, mut stream))) => {
                confirm(sent, ttl);
                loop {
                    tokio::time::sleep(interval).await;
                    let sent = Instant::now();
                    if keeper.keep_alive().await.is_err() {
                        break;
                    }
                    match tokio::time::timeout(call_timeout, stream.message()).await {
                        Ok(Ok(Some(resp))) if resp.ttl() > 0 => confirm(sent, Duration::from_secs(resp.ttl().unsigned_abs())),
                        Ok(Ok(Some(_))) => {
                            status.send_replace(LeaseStatus::Gone);
                            return;
                        }
                        Ok(Ok(None) | Err(_)) | Err(_) => break,
                    }
                }
            }
            Ok(Err(e)) if lease_not_found(&e) => {
                status.send_replace(LeaseStatus::Gone);
                return;
            }
            Ok(Err(_)) | Err(_) => {}
        }
        // etcd did not answer: try again soon, the lease may still be saved.
        tokio::time::sleep(interval.min(Duration::from_millis(500))).await;
    }
}

/// Registers `member` under a new lease. If its key exists, a member of
/// the same incarnation takes it over (the key moves to the new lease; the
/// old one ends by itself); anyone else gets `AlreadyExists`.
pub(super) async fn register(shared: Arc<Shared>, member: Member, ttl: Duration) -> Result<Registration, MetaError> {
    let key = shared.keys.node(&member.id);
    let value = codec::encode_member(&member)?;
    let lease = KeepAlive::grant(&shared, ttl).await?;
    match claim(&shared, &member, &key, &value, lease.id(), ttl).await {
        Ok(revision) => {
            shared.catch_up(revision).await;
            Ok(Registration::new(Box::new(EtcdLease { shared, id: member.id, key, lease })))
        }
        Err(e) => {
            lease.abandon(&shared).await;
            Err(e)
        }
    }
}

/// Puts `member`'s key under `lease` if the key is free or held by the
/// member's own incarnation; the revision of the put.
async fn claim(shared: &Shared, member: &Member, key: &str, value: &[u8], lease: i64, ttl: Duration) -> Result<Revision, MetaError> {
    let put = || TxnOp::put(key, value.to_vec(), Some(PutOptions::new().with_lease(lease)));
    // A takeover races only with another registration of the same id: a
    // few rounds settle it (each round is one etcd call or two).
    for _ in 0..3 {
        let txn = Txn::new().when([Compare::create_revision(key, CompareOp::Equal, 0)]).and_then([put()]).or_else([TxnOp::get(key, None)]);
        let resp = shared.call(&format!("register node {}", member.id), shared.client.kv_client().txn(txn)).await?;
        if resp.succeeded() {
            return header_revision(resp.header());
        }
        let Some((live, revision)) = existing(&resp, key, member)? else { continue };
        if !member.succeeds(&live) {
            return Err(MetaError::AlreadyExists(member.refused_by(&live, ttl)));
        }
        let txn = Txn::new().when([Compare::mod_revision(key, CompareOp::Equal, revision)]).and_then([put()]);
        let resp = shared.call(&format!("take over node {}", member.id), shared.client.kv_client().txn(txn)).await?;
        if resp.succeeded() {
            tracing::info!(node = %member.id, "took over the registration of this node's previous run (its lease had not ended)");
            return header_revision(resp.header());
        }
    }
    Err(MetaError::Unavailable(format!("registering node {}: its key kept changing; try again", member.id)))
}

/// The live member a failed registration found, and its key's revision.
fn existing(resp: &etcd_client::TxnResponse, key: &str, member: &Member) -> Result<Option<(Member, i64)>, MetaError> {
    let kv = resp.op_responses().into_iter().find_map(|r| match r {
        etcd_client::TxnOpResponse::Get(get) => get.kvs().first().map(|kv| (kv.value().to_vec(), kv.mod_revision())),
        etcd_client::TxnOpResponse::Put(_) | etcd_client::TxnOpResponse::Delete(_) | etcd_client::TxnOpResponse::Txn(_) => None,
    });
    let Some((bytes, revision)) = kv else { return Ok(None) };
    Ok(Some((codec::decode_member(key, member.id.clone(), &bytes)?, revision)))
}

struct EtcdLease {
    shared: Arc<Shared>,
    id: NodeId,
    key: String,
    lease: KeepAlive,
}

impl LeaseHandle for EtcdLease {
    fn update(&self, member: Member) -> BoxFuture<'_, Result<(), MetaError>> {
        async move {
            if member.id != self.id {
                return Err(MetaError::Invalid(format!("registration of node {} cannot speak for node {}", self.id, member.id)));
            }
            let value = codec::encode_member(&member)?;
            // Only while the key is still this registration's: after the
            // lease ended, a put would bring the node back without a lease.
            let txn = Txn::new().when([Compare::lease(self.key.clone(), CompareOp::Equal, self.lease.id())]).and_then([TxnOp::put(
                self.key.clone(),
                value,
                Some(PutOptions::new().with_lease(self.lease.id())),
            )]);
            let resp = self.shared.call(&format!("update node {}", self.id), self.shared.client.kv_client().txn(txn)).await?;
            if !resp.succeeded() {
                self.lease.mark_gone();
                return Err(MetaError::NotFound(format!("registration of node {} (its lease ended)", self.id)));
            }
            self.shared.catch_up(header_revision(resp.header())?).await;
            Ok(())
        }
        .boxed()
    }

    fn is_alive(&self) -> bool {
        self.lease.status() != LeaseStatus::Gone
    }

    fn leave(self: Box<Self>) -> BoxFuture<'static, Result<(), MetaError>> {
        async move {
            let EtcdLease { shared, lease, .. } = *self;
            lease.revoke(&shared).await
        }
        .boxed()
    }
}
