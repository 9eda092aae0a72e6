//! What the store, its watcher and its lease handles share: the client, the
//! mirror of the keys and the health, and the one way to call etcd (bounded
//! in time, errors turned into [`MetaError`]s).

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use etcd_client::{Client, GetOptions, KeyValue, ResponseHeader};
use parking_lot::Mutex;
use tokio::sync::watch;

use super::EtcdOptions;
use super::keys::Keys;
use super::mirror::{Change, Entry, Mirror};
use crate::metadata::{MetaError, Revision, StoreHealth, View};

/// How long a write waits for its change to come back through the watch
/// before it lists the keys instead (the watch may be reconnecting).
const WATCH_GRACE: Duration = Duration::from_millis(500);

pub(super) struct Shared {
    pub(super) keys: Keys,
    pub(super) client: Client,
    pub(super) options: EtcdOptions,
    pub(super) mirror: Mutex<Mirror>,
    /// Sent under the `mirror` lock, so views go out in revision order.
    pub(super) views: watch::Sender<Arc<View>>,
    health: Mutex<StoreHealth>,
}

impl Shared {
    pub(super) fn new(keys: Keys, client: Client, options: EtcdOptions) -> Shared {
        let (views, _) = watch::channel(Arc::new(View::default()));
        Shared { keys, client, options, mirror: Mutex::new(Mirror::default()), views, health: Mutex::new(StoreHealth::Connected) }
    }

    /// Runs one etcd call under the call timeout; the outer error is the
    /// timeout, the inner one etcd's (for callers that look at it).
    pub(super) async fn call_raw<T>(
        &self,
        what: &str,
        call: impl Future<Output = Result<T, etcd_client::Error>>,
    ) -> Result<Result<T, etcd_client::Error>, MetaError> {
        let limit = self.options.call_timeout;
        tokio::time::timeout(limit, call)
            .await
            .map_err(|_| MetaError::Unavailable(format!("etcd did not answer within {limit:?} (to {what})")))
    }

    pub(super) async fn call<T>(&self, what: &str, call: impl Future<Output = Result<T, etcd_client::Error>>) -> Result<T, MetaError> {
        self.call_raw(what, call).await?.map_err(|e| etcd_error(what, e))
    }

    /// Every key of the cluster, read at etcd's current revision
    /// (linearizable: no older than any write that finished before).
    pub(super) async fn list(&self) -> Result<Mirror, MetaError> {
        let options = GetOptions::new().with_prefix();
        let resp = self.call("list the cluster's keys", self.client.kv_client().get(self.keys.root(), Some(options))).await?;
        let revision = header_revision(resp.header())?;
        Ok(Mirror::from_listing(&self.keys, revision, resp.kvs().iter().map(entry)))
    }

    /// Takes a listing's state if it is newer than the view's.
    pub(super) fn install(&self, listed: Mirror) {
        let mut mirror = self.mirror.lock();
        if listed.revision() > mirror.revision() {
            *mirror = listed;
            self.views.send_replace(mirror.view());
        }
    }

    /// Lists the keys and takes what is newer than the view.
    pub(super) async fn refresh(&self) -> Result<Arc<View>, MetaError> {
        let listed = self.list().await?;
        self.install(listed);
        Ok(self.views.borrow().clone())
    }

    pub(super) fn apply<'a>(&self, changes: impl IntoIterator<Item = Change<'a>>) {
        let mut mirror = self.mirror.lock();
        if mirror.apply(&self.keys, changes) {
            self.views.send_replace(mirror.view());
        }
    }

    /// Waits until the view includes `revision` (a change this store just
    /// made), listing the keys if the watch does not bring it soon.
    ///
    /// Gives up after the view timeout with a warning but no error: the
    /// change is made, and an error would say it was not. A decision taken
    /// on the older view still cannot win, since every change names the
    /// revision it was based on.
    pub(super) async fn catch_up(&self, revision: Revision) {
        let deadline = Instant::now() + self.options.view_timeout;
        let mut views = self.views.subscribe();
        let grace = WATCH_GRACE.min(self.options.view_timeout);
        if let Ok(Ok(_)) = tokio::time::timeout(grace, views.wait_for(|v| v.revision >= revision)).await {
            return;
        }
        loop {
            if let Ok(listed) = self.list().await {
                self.install(listed);
            }
            let now = self.mirror.lock().revision();
            if now >= revision {
                return;
            }
            if Instant::now() >= deadline {
                tracing::warn!(revision, view = now, "etcd: a change was made but this coordinator's view has not caught up with it yet");
                return;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    pub(super) fn health(&self) -> StoreHealth {
        self.health.lock().clone()
    }

    /// Records that etcd cannot be reached; logs only the first time.
    pub(super) fn set_unreachable(&self, error: String) {
        let mut health = self.health.lock();
        let since = match &*health {
            StoreHealth::Connected => {
                let revision = self.mirror.lock().revision();
                tracing::warn!(%error, revision, "etcd unreachable: serving the last view; changes are refused until it is back");
                SystemTime::now()
            }
            StoreHealth::Unreachable { since, .. } => *since,
        };
        *health = StoreHealth::Unreachable { since, error };
    }

    pub(super) fn set_connected(&self) {
        let mut health = self.health.lock();
        if let StoreHealth::Unreachable { since, .. } = &*health {
            let down = since.elapsed().unwrap_or_default();
            tracing::info!(?down, "etcd reachable again");
            *health = StoreHealth::Connected;
        }
    }
}

pub(super) fn entry(kv: &KeyValue) -> Entry<'_> {
    Entry { key: kv.key(), value: kv.value(), mod_revision: kv.mod_revision(), lease: kv.lease() }
}

/// The revision etcd was at when it answered.
pub(super) fn header_revision(header: Option<&ResponseHeader>) -> Result<Revision, MetaError> {
    header.map(ResponseHeader::revision).ok_or_else(|| MetaError::Unavailable("etcd answered without a response header".into()))
}

/// A failed call as the caller can act on it: a request etcd refuses as
/// malformed is `Invalid`; everything else (unreachable, no leader, a
/// dropped stream, ...) is worth retrying: `Unavailable`.
pub(super) fn etcd_error(what: &str, e: etcd_client::Error) -> MetaError {
    if let etcd_client::Error::GRpcStatus(s) = &e
        && s.code() == tonic::Code::InvalidArgument
    {
        return MetaError::Invalid(format!("etcd refused to {what}: {}", s.message()));
    }
    if matches!(e, etcd_client::Error::InvalidArgs(_) | etcd_client::Error::InvalidUri(_)) {
        return MetaError::Invalid(format!("cannot {what}: {e}"));
    }
    MetaError::Unavailable(format!("etcd could not {what}: {}", describe(&e)))
}

/// `e` with what caused it: etcd-client's errors do not chain their
/// sources, and tonic's transport errors say only "transport error", so
/// a certificate that does not verify or an alert from etcd would not
/// show.
pub(super) fn describe(e: &etcd_client::Error) -> String {
    use std::error::Error;
    if let etcd_client::Error::TransportError(t) = e {
        return super::tls::causes(t.to_string(), t.source());
    }
    if let etcd_client::Error::GRpcStatus(s) = e {
        return super::tls::causes(format!("{:?}: {}", s.code(), s.message()), s.source());
    }
    e.to_string()
}

/// etcd says the lease does not exist (it expired or was revoked).
pub(super) fn lease_not_found(e: &etcd_client::Error) -> bool {
    if let etcd_client::Error::GRpcStatus(s) = e {
        return s.code() == tonic::Code::NotFound || s.message().contains("lease not found");
    }
    if let etcd_client::Error::LeaseKeepAliveError(m) = e {
        return m.contains("lease not found");
    }
    false
}
