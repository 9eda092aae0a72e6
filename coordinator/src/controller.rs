//! The controller: of all coordinators, the one elected through the
//! metadata store makes placement decisions. Every coordinator runs this
//! loop; one wins the campaign, the others wait in it and take over when
//! the leader's lease ends (a killed controller is replaced within one
//! lease TTL). Leadership is not trusted on its own: every decision the
//! controller writes is conditional on the revision it read, and shard
//! nodes check each write's epoch (docs/control-plane.md).

use std::sync::Arc;
use std::time::Duration;

use crate::cluster::Cluster;

/// The running election loop; stops (resigning if leader) when dropped or
/// on `stop`.
pub struct Controller {
    stop: Option<tokio::sync::oneshot::Sender<()>>,
    task: tokio::task::JoinHandle<()>,
}

impl Controller {
    /// Campaigns as `id` under a lease of `ttl`, for as long as it runs;
    /// while it leads, carries out the moves and drains recorded in
    /// `cluster`'s store (`mover.rs`).
    pub fn spawn(cluster: Arc<Cluster>, id: String, ttl: Duration) -> Controller {
        let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
        let meta = Arc::clone(&cluster.meta);
        let task = tokio::spawn(async move {
            loop {
                let won = tokio::select! {
                    _ = &mut stopped => return,
                    won = meta.campaign(id.clone(), ttl) => won,
                };
                let lead = match won {
                    Ok(lead) => lead,
                    Err(e) => {
                        tracing::warn!(coordinator = %id, error = %e, "controller campaign failed; retrying");
                        tokio::select! {
                            _ = &mut stopped => return,
                            _ = tokio::time::sleep(Duration::from_secs(1)) => continue,
                        }
                    }
                };
                tracing::info!(coordinator = %id, "this coordinator is the controller");
                // Dropped with the select when leadership ends: whatever it
                // was doing is recorded in the store for the next leader.
                let work = async {
                    tokio::join!(crate::mover::lead(Arc::clone(&cluster)), crate::reclaim::run(Arc::clone(&cluster)));
                };
                tokio::select! {
                    () = work => {}
                    _ = &mut stopped => {
                        if let Err(e) = lead.resign().await {
                            tracing::warn!(coordinator = %id, error = %e, "could not resign; the lease ends by itself");
                        }
                        return;
                    }
                    () = lead.lost() => tracing::warn!(coordinator = %id, "lost the controller lease; campaigning again"),
                }
            }
        });
        Controller { stop: Some(stop), task }
    }

    /// Resigns (if leader) and ends the loop.
    pub async fn stop(mut self) {
        if let Some(s) = self.stop.take() {
            let _ = s.send(());
        }
        let _ = tokio::time::timeout(Duration::from_secs(5), &mut self.task).await;
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use std::time::Instant;

    use std::collections::HashMap;

    use shoal_control::metadata::{InMemoryStore, MetadataStore};

    use super::*;
    use crate::cluster::ClusterOptions;
    use crate::pool::LocalConnector;

    fn cluster(meta: &Arc<dyn MetadataStore>) -> Arc<Cluster> {
        Arc::new(Cluster::new(Arc::clone(meta), Box::new(LocalConnector(HashMap::new())), ClusterOptions::default()))
    }

    async fn controller_becomes(meta: &Arc<dyn MetadataStore>, who: &str, within: Duration) -> Duration {
        let started = Instant::now();
        while meta.view().controller.as_deref() != Some(who) {
            assert!(started.elapsed() < within, "{who} is not the controller within {within:?}: {:?}", meta.view().controller);
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        started.elapsed()
    }

    #[tokio::test]
    async fn one_controller_at_a_time_and_a_successor_when_it_stops() {
        let meta: Arc<dyn MetadataStore> = Arc::new(InMemoryStore::new(Vec::new()));
        let ttl = Duration::from_secs(1);
        let a = Controller::spawn(cluster(&meta), "a".into(), ttl);
        controller_becomes(&meta, "a", Duration::from_secs(2)).await;
        let b = Controller::spawn(cluster(&meta), "b".into(), ttl);
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(meta.view().controller.as_deref(), Some("a"), "b must wait while a leads");
        a.stop().await;
        controller_becomes(&meta, "b", Duration::from_secs(2)).await;
        b.stop().await;
        assert_eq!(meta.view().controller, None);
    }
}
