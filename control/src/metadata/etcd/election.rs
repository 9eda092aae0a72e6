//! Electing the controller: whoever creates the `controller` key under its
//! lease holds it until the key goes (resigned, revoked, or the lease ran
//! out). One transaction on `create_revision == 0`, so at most one holder;
//! candidates that lose wait for the key to go.

use std::sync::Arc;
use std::time::{Duration, Instant};

use etcd_client::{Compare, CompareOp, PutOptions, Txn, TxnOp};
use futures::FutureExt;
use futures::future::BoxFuture;

use super::codec;
use super::lease::{KeepAlive, LeaseStatus};
use super::shared::{Shared, header_revision};
use crate::metadata::{LeaderHandle, Leadership, MetaError};

pub(super) async fn campaign(shared: Arc<Shared>, candidate: String, ttl: Duration) -> Result<Leadership, MetaError> {
    let key = shared.keys.controller();
    let value = codec::encode_controller(&candidate)?;
    let mut views = shared.views.subscribe();
    // One lease for the whole campaign, kept alive while waiting, so that
    // waiting costs no lease per attempt; dropping the campaign drops it.
    let mut lease: Option<KeepAlive> = None;
    loop {
        let held = match lease.take() {
            Some(l) if l.status() != LeaseStatus::Gone => l,
            _ => KeepAlive::grant(&shared, ttl).await?,
        };
        let txn = Txn::new().when([Compare::create_revision(key.clone(), CompareOp::Equal, 0)]).and_then([TxnOp::put(
            key.clone(),
            value.clone(),
            Some(PutOptions::new().with_lease(held.id())),
        )]);
        let resp = shared.call(&format!("campaign for controller as {candidate}"), shared.client.kv_client().txn(txn)).await?;
        if resp.succeeded() {
            shared.catch_up(header_revision(resp.header())?).await;
            tracing::info!(%candidate, "etcd: elected controller");
            return Ok(Leadership::new(Box::new(EtcdLeader { shared, lease: held })));
        }
        lease = Some(held);
        // Wait until the view shows the key gone; ask etcd again now and
        // then anyway, in case the view is behind.
        let recheck = shared.options.campaign_recheck;
        let _ = tokio::time::timeout(recheck, async {
            loop {
                views.borrow_and_update();
                if shared.mirror.lock().controller_lease().is_none() || views.changed().await.is_err() {
                    return;
                }
            }
        })
        .await;
    }
}

struct EtcdLeader {
    shared: Arc<Shared>,
    lease: KeepAlive,
}

impl EtcdLeader {
    /// The key is still ours in the view, and the lease cannot have ended:
    /// a leader that cannot reach etcd gives up when its last confirmed
    /// keep-alive runs out, not when etcd says so.
    fn holds(&self) -> bool {
        let alive = match self.lease.status() {
            LeaseStatus::Alive { until } => until > Instant::now(),
            LeaseStatus::Gone => false,
        };
        alive && self.shared.mirror.lock().controller_lease() == Some(self.lease.id())
    }
}

impl LeaderHandle for EtcdLeader {
    fn lost(&self) -> BoxFuture<'_, ()> {
        async move {
            let mut views = self.shared.views.subscribe();
            let mut status = self.lease.subscribe();
            loop {
                views.borrow_and_update();
                let until = match *status.borrow_and_update() {
                    LeaseStatus::Alive { until } => until,
                    LeaseStatus::Gone => return,
                };
                if !self.holds() {
                    return;
                }
                tokio::select! {
                    changed = views.changed() => if changed.is_err() { return },
                    changed = status.changed() => if changed.is_err() { return },
                    () = tokio::time::sleep_until(until.into()) => {}
                }
            }
        }
        .boxed()
    }

    fn is_leader(&self) -> bool {
        self.holds()
    }

    fn resign(self: Box<Self>) -> BoxFuture<'static, Result<(), MetaError>> {
        async move {
            let EtcdLeader { shared, lease } = *self;
            lease.revoke(&shared).await
        }
        .boxed()
    }
}
