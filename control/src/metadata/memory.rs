//! The store of one process: what `shoalctl demo`, `shoalctl dev` without
//! etcd and the tests use. Members are configured statically (plus any
//! that register here); everything is lost with the process, and the
//! coordinator rebuilds its collections from the shard nodes on start
//! (`Cluster::discover`).

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use futures::FutureExt;
use futures::future::BoxFuture;
use parking_lot::Mutex;
use shoal_proto::{CollectionName, NodeId};
use tokio::sync::watch;

use super::{
    Collection, LeaderHandle, Leadership, LeaseHandle, Member, MetaError, MetadataStore, Registration, Revision, StoreHealth, Versioned,
    View,
};

/// Metadata in memory; see the module documentation.
#[derive(Clone)]
pub struct InMemoryStore {
    inner: Arc<Inner>,
}

struct Inner {
    state: Mutex<State>,
    views: watch::Sender<Arc<View>>,
}

#[derive(Default)]
struct State {
    view: View,
    /// The lease of each registered member (static members have none).
    leases: HashMap<NodeId, u64>,
    next_lease: u64,
    /// The controller's lease, if one is elected.
    leader: Option<u64>,
}

impl State {
    /// Applies `change` to a copy of the view at the next revision.
    fn change(&mut self, change: impl FnOnce(&mut View, Revision)) -> Arc<View> {
        let revision = self.view.revision + 1;
        change(&mut self.view, revision);
        self.view.revision = revision;
        Arc::new(self.view.clone())
    }

    fn lease(&mut self) -> u64 {
        self.next_lease += 1;
        self.next_lease
    }
}

impl InMemoryStore {
    /// A store whose members are `members` for good.
    pub fn new(members: Vec<Member>) -> Self {
        let mut view = View::default();
        for m in members {
            view.members.insert(m.id.clone(), m);
        }
        let (views, _) = watch::channel(Arc::new(view.clone()));
        InMemoryStore { inner: Arc::new(Inner { state: Mutex::new(State { view, ..State::default() }), views }) }
    }

    /// Runs `change` under the lock and announces the new view; an error
    /// from `check` (run first, on the current view) changes nothing.
    fn apply<T>(
        &self,
        check: impl FnOnce(&State) -> Result<T, MetaError>,
        change: impl FnOnce(&mut View, Revision),
    ) -> Result<(T, Revision), MetaError> {
        let mut state = self.inner.state.lock();
        let out = check(&state)?;
        let view = state.change(change);
        let revision = view.revision;
        self.inner.views.send_replace(view);
        Ok((out, revision))
    }
}

fn collection_conflict(view: &View, name: &CollectionName, expected: Revision) -> Result<(), MetaError> {
    match view.collections.get(name) {
        None => Err(MetaError::NotFound(format!("collection {name}"))),
        Some(v) if v.revision != expected => Err(MetaError::Conflict { what: format!("collection {name}"), expected, found: v.revision }),
        Some(_) => Ok(()),
    }
}

impl MetadataStore for InMemoryStore {
    fn kind(&self) -> &'static str {
        "memory"
    }

    fn view(&self) -> Arc<View> {
        self.inner.views.borrow().clone()
    }

    fn watch(&self) -> watch::Receiver<Arc<View>> {
        self.inner.views.subscribe()
    }

    fn health(&self) -> StoreHealth {
        StoreHealth::Connected
    }

    fn sync(&self) -> BoxFuture<'_, Result<Arc<View>, MetaError>> {
        let view = self.view();
        async move { Ok(view) }.boxed()
    }

    fn create_collection(&self, c: Collection) -> BoxFuture<'_, Result<Revision, MetaError>> {
        let r = c.check().map_err(|e| MetaError::Invalid(format!("collection {}: {e}", c.name))).and_then(|()| {
            let name = c.name.clone();
            self.apply(
                |s| match s.view.collections.contains_key(&name) {
                    true => Err(MetaError::AlreadyExists(format!("collection {name}"))),
                    false => Ok(()),
                },
                |v, revision| {
                    v.collections.insert(c.name.clone(), Versioned { value: c, revision });
                },
            )
        });
        async move { r.map(|((), rev)| rev) }.boxed()
    }

    fn update_collection(&self, c: Collection, expected: Revision) -> BoxFuture<'_, Result<Revision, MetaError>> {
        let r = c.check().map_err(|e| MetaError::Invalid(format!("collection {}: {e}", c.name))).and_then(|()| {
            let name = c.name.clone();
            self.apply(
                |s| collection_conflict(&s.view, &name, expected),
                |v, revision| {
                    v.collections.insert(c.name.clone(), Versioned { value: c, revision });
                },
            )
        });
        async move { r.map(|((), rev)| rev) }.boxed()
    }

    fn delete_collection(&self, name: CollectionName, expected: Revision) -> BoxFuture<'_, Result<(), MetaError>> {
        let r = self.apply(
            |s| collection_conflict(&s.view, &name, expected),
            |v, _| {
                v.collections.remove(&name);
            },
        );
        async move { r.map(|_| ()) }.boxed()
    }

    fn set_draining(&self, node: NodeId, draining: bool) -> BoxFuture<'_, Result<Revision, MetaError>> {
        let r = self.apply(
            |_| Ok(()),
            |v, _| {
                if draining {
                    v.draining.insert(node);
                } else {
                    v.draining.remove(&node);
                }
            },
        );
        async move { r.map(|((), rev)| rev) }.boxed()
    }

    fn register(&self, member: Member, ttl: Duration) -> BoxFuture<'_, Result<Registration, MetaError>> {
        let r = {
            let mut state = self.inner.state.lock();
            let id = member.id.clone();
            if let Some(live) = state.view.members.get(&id).filter(|live| !member.succeeds(live)) {
                Err(MetaError::AlreadyExists(member.refused_by(live, ttl)))
            } else {
                let lease = state.lease();
                state.leases.insert(id.clone(), lease);
                let view = state.change(|v, _| {
                    v.members.insert(id.clone(), member);
                });
                self.inner.views.send_replace(view);
                Ok(Registration::new(Box::new(MemLease { store: self.clone(), id, lease, ttl, alive: AtomicBool::new(true), left: false })))
            }
        };
        async move { r }.boxed()
    }

    fn campaign(&self, candidate: String, _ttl: Duration) -> BoxFuture<'_, Result<Leadership, MetaError>> {
        let mut views = self.watch();
        async move {
            loop {
                let won = {
                    let mut state = self.inner.state.lock();
                    if state.leader.is_none() {
                        let lease = state.lease();
                        state.leader = Some(lease);
                        let view = state.change(|v, _| v.controller = Some(candidate.clone()));
                        self.inner.views.send_replace(view);
                        Some(lease)
                    } else {
                        None
                    }
                };
                if let Some(lease) = won {
                    return Ok(Leadership::new(Box::new(MemLeader { store: self.clone(), lease, resigned: false })));
                }
                if views.changed().await.is_err() {
                    return Err(MetaError::Unavailable("the store was dropped".into()));
                }
            }
        }
        .boxed()
    }
}

impl InMemoryStore {
    /// Removes the member if `lease` is still its registration.
    fn expire(&self, id: &NodeId, lease: u64) {
        let mut state = self.inner.state.lock();
        if state.leases.get(id) != Some(&lease) {
            return;
        }
        state.leases.remove(id);
        let view = state.change(|v, _| {
            v.members.remove(id);
        });
        self.inner.views.send_replace(view);
    }

    fn step_down(&self, lease: u64) {
        let mut state = self.inner.state.lock();
        if state.leader != Some(lease) {
            return;
        }
        state.leader = None;
        let view = state.change(|v, _| v.controller = None);
        self.inner.views.send_replace(view);
    }
}

struct MemLease {
    store: InMemoryStore,
    id: NodeId,
    lease: u64,
    ttl: Duration,
    alive: AtomicBool,
    left: bool,
}

impl LeaseHandle for MemLease {
    fn update(&self, member: Member) -> BoxFuture<'_, Result<(), MetaError>> {
        let r = if member.id != self.id {
            Err(MetaError::Invalid(format!("registration of node {} cannot speak for node {}", self.id, member.id)))
        } else {
            let (id, lease) = (self.id.clone(), self.lease);
            self.store
                .apply(
                    |s| match s.leases.get(&id) == Some(&lease) {
                        true => Ok(()),
                        false => Err(MetaError::NotFound(format!("registration of node {id} (its lease ended)"))),
                    },
                    |v, _| {
                        v.members.insert(member.id.clone(), member);
                    },
                )
                .map(|_| ())
        };
        if matches!(r, Err(MetaError::NotFound(_))) {
            self.alive.store(false, Ordering::Relaxed);
        }
        async move { r }.boxed()
    }

    fn is_alive(&self) -> bool {
        self.alive.load(Ordering::Relaxed) && self.store.inner.state.lock().leases.get(&self.id) == Some(&self.lease)
    }

    fn leave(mut self: Box<Self>) -> BoxFuture<'static, Result<(), MetaError>> {
        self.left = true;
        self.store.expire(&self.id, self.lease);
        async { Ok(()) }.boxed()
    }
}

impl Drop for MemLease {
    /// Like a process that stops keeping its lease alive: the member goes
    /// when the TTL has passed.
    fn drop(&mut self) {
        if self.left {
            return;
        }
        let (store, id, lease, ttl) = (self.store.clone(), self.id.clone(), self.lease, self.ttl);
        match tokio::runtime::Handle::try_current() {
            Ok(rt) => {
                rt.spawn(async move {
                    tokio::time::sleep(ttl).await;
                    store.expire(&id, lease);
                });
            }
            Err(_) => store.expire(&id, lease),
        }
    }
}

struct MemLeader {
    store: InMemoryStore,
    lease: u64,
    resigned: bool,
}

impl LeaderHandle for MemLeader {
    fn lost(&self) -> BoxFuture<'_, ()> {
        let mut views = self.store.watch();
        async move {
            while self.is_leader() {
                if views.changed().await.is_err() {
                    return;
                }
            }
        }
        .boxed()
    }

    fn is_leader(&self) -> bool {
        self.store.inner.state.lock().leader == Some(self.lease)
    }

    fn resign(mut self: Box<Self>) -> BoxFuture<'static, Result<(), MetaError>> {
        self.resigned = true;
        self.store.step_down(self.lease);
        async { Ok(()) }.boxed()
    }
}

impl Drop for MemLeader {
    fn drop(&mut self) {
        if !self.resigned {
            self.store.step_down(self.lease);
        }
    }
}
