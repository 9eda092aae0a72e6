//! Keeps the view current: watches the cluster's prefix from the revision
//! after the view's, and when the watch fails (etcd gone, no leader,
//! history compacted) lists the keys again and watches anew, with backoff.
//! Health turns `Unreachable` when a listing fails and `Connected` when a
//! watch is established again; the view stays as it was in between.

use std::sync::Arc;
use std::time::Duration;

use etcd_client::{Event, EventType, WatchOptions};

use super::mirror::Change;
use super::shared::{Shared, entry};

const FIRST_BACKOFF: Duration = Duration::from_millis(100);

/// Runs until the store is dropped (which aborts it). The view must
/// already hold a listing (the store's `connect` made it).
pub(super) async fn run(shared: Arc<Shared>) {
    let mut backoff = Backoff::new(shared.options.max_backoff);
    let mut listed = true;
    loop {
        if !listed {
            match shared.list().await {
                Ok(mirror) => shared.install(mirror),
                Err(e) => {
                    shared.set_unreachable(e.to_string());
                    backoff.wait().await;
                    continue;
                }
            }
        }
        listed = false;
        let from = shared.mirror.lock().revision() + 1;
        match watch(&shared, from, &mut backoff).await {
            Ended::Compacted(at) => {
                // Events we have not seen are gone from etcd's history: the
                // only complete picture now is a new listing.
                tracing::info!(from, compacted = at, "etcd: watch history compacted; listing the keys again");
            }
            Ended::Failed(error) => {
                tracing::debug!(%error, "etcd: watch ended; listing the keys again");
                backoff.wait().await;
            }
        }
    }
}

enum Ended {
    Compacted(i64),
    Failed(String),
}

async fn watch(shared: &Shared, from: i64, backoff: &mut Backoff) -> Ended {
    let options = WatchOptions::new().with_prefix().with_start_revision(from);
    let mut stream =
        match shared.call("watch the cluster's keys", shared.client.watch_client().watch(shared.keys.root(), Some(options))).await {
            Ok(stream) => stream,
            Err(e) => return Ended::Failed(e.to_string()),
        };
    // No timeout on messages: a quiet cluster sends none. A dead connection
    // ends the stream through HTTP/2 keep-alive, and with `require_leader`
    // etcd ends it when its member loses the cluster's leader.
    loop {
        match stream.message().await {
            Ok(Some(resp)) => {
                if resp.canceled() {
                    if resp.compact_revision() > 0 {
                        return Ended::Compacted(resp.compact_revision());
                    }
                    return Ended::Failed(format!("etcd cancelled the watch: {}", resp.cancel_reason()));
                }
                if resp.created() {
                    shared.set_connected();
                    backoff.reset();
                }
                shared.apply(resp.events().iter().filter_map(change));
            }
            Ok(None) => return Ended::Failed("etcd closed the watch stream".into()),
            Err(e) => return Ended::Failed(e.to_string()),
        }
    }
}

fn change(e: &Event) -> Option<Change<'_>> {
    let kv = e.kv()?;
    Some(match e.event_type() {
        EventType::Put => Change::Put(entry(kv)),
        EventType::Delete => Change::Delete { key: kv.key(), revision: kv.mod_revision() },
    })
}

/// Doubling pauses up to a bound, each shortened by a random part so that
/// many coordinators do not retry in step.
pub(super) struct Backoff {
    next: Duration,
    max: Duration,
}

impl Backoff {
    pub(super) fn new(max: Duration) -> Self {
        Backoff { next: FIRST_BACKOFF.min(max), max }
    }

    pub(super) fn reset(&mut self) {
        self.next = FIRST_BACKOFF.min(self.max);
    }

    pub(super) async fn wait(&mut self) {
        let pause = self.next.mul_f64(rand::random_range(0.5..=1.0));
        self.next = (self.next * 2).min(self.max);
        tokio::time::sleep(pause).await;
    }
}
