//! Being a member of the cluster: with a control plane configured, the node
//! registers itself in the metadata store under a lease (kept alive in the
//! background by the store), with the address coordinators reach it on and
//! its capacity, and keeps that record current. If the lease ends anyway
//! (etcd was unreachable longer than the TTL), it registers again as soon
//! as it can: a live node never stays out of the cluster. On a graceful
//! shutdown it leaves at once, so its shards are known to be gone without
//! waiting out the TTL.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use shoal_control::metadata::{MetaError, MetadataStore};
use shoal_control::model::{Capacity, Member, NodeState};
use shoal_proto::NodeId;
use tokio::sync::oneshot;

use crate::host::ShardHost;

/// How often the node checks its capacity and its lease.
const REFRESH: Duration = Duration::from_secs(2);

/// The node's presence; [`Presence::leave`] ends it.
pub struct Presence {
    leave: Option<oneshot::Sender<oneshot::Sender<()>>>,
    task: tokio::task::JoinHandle<()>,
}

impl Presence {
    /// Registers `id` at `address` and keeps it registered until `leave`.
    /// Fails only if the first registration fails (another live process
    /// has this id, or the store cannot be reached): a node must not serve
    /// believing it is a member when it is not. `incarnation` is its data
    /// directory's: a registration of this node's previous run, left by a
    /// crash, is taken over at once.
    pub async fn join(
        store: Arc<dyn MetadataStore>,
        id: NodeId,
        address: String,
        incarnation: String,
        host: Arc<ShardHost>,
        data_dir: PathBuf,
        ttl: Duration,
    ) -> Result<Presence, MetaError> {
        let me = Me { id, address, incarnation, host, data_dir };
        let mut current = me.describe().await;
        let mut reg = store.register(current.clone(), ttl).await?;
        tracing::info!(node = %current.id, address = %current.address, ?ttl, "registered in the cluster");
        let (leave, mut left) = oneshot::channel::<oneshot::Sender<()>>();
        let task = tokio::spawn(async move {
            let mut tick = tokio::time::interval(REFRESH);
            tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                tokio::select! {
                    done = &mut left => {
                        match reg.leave().await {
                            Ok(()) => tracing::info!(node = %me.id, "left the cluster"),
                            Err(e) => tracing::warn!(node = %me.id, error = %e, "could not leave the cluster; its lease ends by itself"),
                        }
                        if let Ok(done) = done {
                            let _ = done.send(());
                        }
                        return;
                    }
                    _ = tick.tick() => {}
                }
                let now = me.describe().await;
                if !reg.is_alive() {
                    match store.register(now.clone(), ttl).await {
                        Ok(r) => {
                            tracing::warn!(node = %me.id, "the lease had ended; registered again");
                            reg = r;
                            current = now;
                        }
                        Err(e) => tracing::warn!(node = %me.id, error = %e, "the lease ended and registering again failed; retrying"),
                    }
                } else if worth_telling(&current, &now) {
                    match reg.update(now.clone()).await {
                        Ok(()) => current = now,
                        Err(e) => tracing::debug!(node = %me.id, error = %e, "could not update the registration; retrying"),
                    }
                }
            }
        });
        Ok(Presence { leave: Some(leave), task })
    }

    /// Leaves the cluster now and waits (briefly) until the store knows.
    pub async fn leave(mut self) {
        if let Some(leave) = self.leave.take() {
            let (done, wait) = oneshot::channel();
            if leave.send(done).is_ok() {
                let _ = tokio::time::timeout(Duration::from_secs(5), wait).await;
            }
        }
        let _ = (&mut self.task).await;
    }
}

impl Drop for Presence {
    /// Without `leave` (a crash, or a test dropping it) the keep-alive
    /// stops with the task and the lease ends by itself.
    fn drop(&mut self) {
        self.task.abort();
    }
}

struct Me {
    id: NodeId,
    address: String,
    incarnation: String,
    host: Arc<ShardHost>,
    data_dir: PathBuf,
}

impl Me {
    async fn describe(&self) -> Member {
        let shards = self.host.list().await.map_or(0, |l| l.shards.len() as u32);
        let disk_free_bytes = disk_free(&self.data_dir).unwrap_or(0);
        Member {
            id: self.id.clone(),
            address: self.address.clone(),
            state: NodeState::Serving,
            capacity: Capacity { disk_free_bytes, shards },
            incarnation: self.incarnation.clone(),
        }
    }
}

/// Capacity moves all the time; etcd hears of it when the shard count
/// changes or free space moved by more than 1% or 1 GiB, whichever is less.
fn worth_telling(before: &Member, now: &Member) -> bool {
    let (a, b) = (before.capacity.disk_free_bytes, now.capacity.disk_free_bytes);
    let moved = a.abs_diff(b);
    before.capacity.shards != now.capacity.shards || before.address != now.address || moved > (a / 100).min(1 << 30)
}

/// Bytes an unprivileged writer may still use on the file system of `dir`.
fn disk_free(dir: &Path) -> Option<u64> {
    use std::os::unix::ffi::OsStrExt;
    let path = std::ffi::CString::new(dir.as_os_str().as_bytes()).ok()?;
    let mut st = std::mem::MaybeUninit::<libc::statvfs>::uninit();
    // SAFETY: `path` is NUL-terminated and `st` is writable for one statvfs.
    let rc = unsafe { libc::statvfs(path.as_ptr(), st.as_mut_ptr()) };
    if rc != 0 {
        return None;
    }
    // SAFETY: statvfs returned 0, so it filled `st`.
    let st = unsafe { st.assume_init() };
    Some(st.f_bavail.saturating_mul(st.f_frsize))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(free: u64, shards: u32) -> Member {
        Member {
            id: NodeId::parse("n").unwrap(),
            address: "http://127.0.0.1:1".into(),
            state: NodeState::Serving,
            capacity: Capacity { disk_free_bytes: free, shards },
            incarnation: String::new(),
        }
    }

    #[test]
    fn small_moves_of_free_space_are_not_worth_an_etcd_write() {
        assert!(!worth_telling(&member(100 << 30, 3), &member((100 << 30) - (500 << 20), 3)));
        assert!(worth_telling(&member(100 << 30, 3), &member((100 << 30) - (2 << 30), 3)));
        assert!(worth_telling(&member(100 << 30, 3), &member(100 << 30, 4)));
        assert!(disk_free(Path::new("/")).is_some_and(|b| b > 0));
        assert!(disk_free(Path::new("/no/such/dir")).is_none());
    }
}
