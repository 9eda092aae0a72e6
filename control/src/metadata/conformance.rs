//! The behaviour every [`MetadataStore`] must show, as one suite that runs
//! against each backend (the in-memory store here, etcd in
//! `tests/etcd_metadata.rs`), as object_store tests its backends.
//!
//! Each function takes a [`StoreFactory`] that opens stores on one fresh
//! cluster: stores opened from the same factory share their data, like two
//! coordinators. Waits are real time, bounded, and fail with what was
//! awaited.

use std::future::Future;
use std::sync::Arc;
use std::time::{Duration, Instant};

use shoal_proto::{CollectionName, NodeId};

use super::{Collection, InMemoryStore, Leadership, Member, MetaError, MetadataStore, Versioned, View};
use crate::model::{Capacity, CollectionSpec, Metric, NodeState, ShardPlacement};

/// Leases in the suite: etcd's shortest (it raises shorter ones to 2 s).
pub const TTL: Duration = Duration::from_secs(2);

/// What a lease may take past its TTL to end (etcd checks expiry twice a
/// second; a loaded test machine adds more).
const TTL_MARGIN: Duration = Duration::from_secs(3);

/// What a change made elsewhere may take to reach a store's view.
const PROPAGATION: Duration = Duration::from_secs(5);

/// Opens stores on one cluster.
pub trait StoreFactory: Send + Sync {
    /// A store on this factory's cluster (a new coordinator of it).
    fn open(&self) -> impl Future<Output = Arc<dyn MetadataStore>> + Send;

    /// Ends the controller's term from outside its holder (what an operator
    /// deleting the key or an expired lease does). False where the backend
    /// has no such thing; the suite then skips that check.
    fn end_controller_term(&self) -> impl Future<Output = bool> + Send {
        async { false }
    }
}

/// Stores sharing one [`InMemoryStore`].
#[derive(Clone)]
pub struct MemoryFactory(pub InMemoryStore);

impl MemoryFactory {
    pub fn new() -> Self {
        MemoryFactory(InMemoryStore::new(Vec::new()))
    }
}

impl Default for MemoryFactory {
    fn default() -> Self {
        MemoryFactory::new()
    }
}

impl StoreFactory for MemoryFactory {
    fn open(&self) -> impl Future<Output = Arc<dyn MetadataStore>> + Send {
        let store = self.0.clone();
        async move { Arc::new(store) as Arc<dyn MetadataStore> }
    }
}

fn name(s: &str) -> CollectionName {
    CollectionName::parse(s).unwrap()
}

fn node(s: &str) -> NodeId {
    NodeId::parse(s).unwrap()
}

/// A collection with one shard per node in `nodes`.
pub fn collection(n: &str, nodes: &[&str]) -> Collection {
    Collection {
        name: name(n),
        spec: CollectionSpec { dimension: 8, metric: Metric::Cosine, index: Default::default(), shard_count: nodes.len() as u32 },
        replication: Default::default(),
        shards: nodes.iter().map(|id| ShardPlacement::on(node(id))).collect(),
        fields: Vec::new(),
    }
}

/// `c` with shard `shard` moved to `to` (a new epoch).
fn moved(c: &Collection, shard: usize, to: &str) -> Collection {
    let mut c = c.clone();
    let epoch = c.shards[shard].epoch + 1;
    c.shards[shard] = ShardPlacement::at(node(to), epoch);
    c
}

fn member(id: &str, port: u16) -> Member {
    Member {
        id: node(id),
        address: format!("http://127.0.0.1:{port}"),
        state: NodeState::Serving,
        capacity: Capacity { disk_free_bytes: 1 << 30, shards: 0 },
        incarnation: String::new(),
    }
}

/// `fut`'s output; panics naming `what` if it takes longer than `limit`.
pub async fn within<T>(what: &str, limit: Duration, fut: impl Future<Output = T>) -> T {
    match tokio::time::timeout(limit, fut).await {
        Ok(v) => v,
        Err(_) => panic!("{what}: not within {limit:?}"),
    }
}

/// Waits until `store`'s view satisfies `ok`.
pub async fn view_where(store: &dyn MetadataStore, what: &str, limit: Duration, ok: impl Fn(&View) -> bool) -> Arc<View> {
    let mut views = store.watch();
    within(what, limit, async {
        loop {
            let view = views.borrow_and_update().clone();
            if ok(&view) {
                return view;
            }
            if views.changed().await.is_err() {
                panic!("{what}: the store stopped announcing views");
            }
        }
    })
    .await
}

fn assert_conflict<T: std::fmt::Debug>(r: Result<T, MetaError>, expected: i64, found: i64) {
    match r {
        Err(MetaError::Conflict { expected: e, found: f, .. }) if e == expected && f == found => {}
        other => panic!("expected a conflict (based on {expected}, now at {found}), got {other:?}"),
    }
}

/// Create, read, update, delete; every change has a higher revision than
/// the one before, and the view shows it when the call returns.
pub async fn collections_change_with_rising_revisions(f: &impl StoreFactory) {
    let s = f.open().await;
    let docs = collection("docs", &["n0", "n1"]);
    let start = s.view().revision;
    let r1 = s.create_collection(docs.clone()).await.expect("create");
    assert!(r1 > start, "create at {r1}, view was at {start}");
    let view = s.view();
    assert!(view.revision >= r1);
    assert_eq!(view.collection(&docs.name), Some(&Versioned { value: docs.clone(), revision: r1 }));

    let docs2 = moved(&docs, 1, "n2");
    let r2 = s.update_collection(docs2.clone(), r1).await.expect("update");
    assert!(r2 > r1, "update at {r2} after create at {r1}");
    assert_eq!(s.view().collection(&docs.name), Some(&Versioned { value: docs2.clone(), revision: r2 }));

    // Read-your-writes, many times over: a store whose view lagged its
    // writes would show an older revision at least once.
    let mut current = Versioned { value: docs2.clone(), revision: r2 };
    for i in 0..30 {
        let next = moved(&current.value, 0, &format!("m{i}"));
        let revision = s.update_collection(next.clone(), current.revision).await.expect("update");
        assert!(revision > current.revision);
        current = Versioned { value: next, revision };
        assert_eq!(s.view().collection(&docs.name), Some(&current), "the view right after update {i}");
    }
    let r2 = current.revision;

    let r3 = s.create_collection(collection("other", &["n0"])).await.expect("create another");
    assert!(r3 > r2);

    s.delete_collection(docs.name.clone(), r2).await.expect("delete");
    let view = s.view();
    assert!(view.collection(&docs.name).is_none() && view.revision > r3, "{view:?}");
    assert!(view.collection(&name("other")).is_some());
    assert!(matches!(s.delete_collection(docs.name.clone(), r2).await, Err(MetaError::NotFound(_))));
    assert!(matches!(s.update_collection(current.value, r2).await, Err(MetaError::NotFound(_))));
    // "Based on revision 0" must not create what does not exist.
    assert!(matches!(s.update_collection(collection("ghost", &["n0"]), 0).await, Err(MetaError::NotFound(_))));
    assert!(s.view().collection(&name("ghost")).is_none());
}

/// A change based on an old revision fails with `Conflict` and writes
/// nothing; so does a create of a name that exists.
pub async fn stale_changes_conflict_and_write_nothing(f: &impl StoreFactory) {
    let s = f.open().await;
    let docs = collection("docs", &["n0", "n1"]);
    let r1 = s.create_collection(docs.clone()).await.expect("create");
    let docs2 = moved(&docs, 0, "n2");
    let r2 = s.update_collection(docs2.clone(), r1).await.expect("update");

    assert_conflict(s.update_collection(moved(&docs, 1, "n3"), r1).await, r1, r2);
    assert_conflict(s.delete_collection(docs.name.clone(), r1).await, r1, r2);
    match s.create_collection(collection("docs", &["n9"])).await {
        Err(MetaError::AlreadyExists(_)) => {}
        other => panic!("create of an existing name: {other:?}"),
    }
    let after = s.sync().await.expect("sync");
    assert_eq!(after.collection(&docs.name), Some(&Versioned { value: docs2, revision: r2 }));
}

/// Collections breaking `Collection::check` are refused as `Invalid`.
pub async fn invalid_collections_are_refused(f: &impl StoreFactory) {
    let s = f.open().await;
    let mut short = collection("short", &["n0", "n1"]);
    short.shards.pop();
    assert!(matches!(s.create_collection(short).await, Err(MetaError::Invalid(_))));
    let mut empty = collection("empty", &["n0"]);
    empty.shards[0].replicas.clear();
    assert!(matches!(s.create_collection(empty).await, Err(MetaError::Invalid(_))));

    let docs = collection("docs", &["n0"]);
    let r1 = s.create_collection(docs.clone()).await.expect("create");
    let mut epoch0 = docs.clone();
    epoch0.shards[0].epoch = 0;
    assert!(matches!(s.update_collection(epoch0, r1).await, Err(MetaError::Invalid(_))));
    let mut twice = docs.clone();
    twice.shards[0] = ShardPlacement::on_all(vec![node("n0"), node("n0")], 1);
    assert!(matches!(s.update_collection(twice, r1).await, Err(MetaError::Invalid(_))));
    let mut none_in_sync = docs.clone();
    none_in_sync.shards[0].replicas[0].state = crate::model::ReplicaState::Dead;
    assert!(matches!(s.update_collection(none_in_sync, r1).await, Err(MetaError::Invalid(_))));
    let mut unreachable_minimum = docs.clone();
    unreachable_minimum.replication = crate::model::Replication { factor: 2, min_in_sync: 3 };
    assert!(matches!(s.update_collection(unreachable_minimum, r1).await, Err(MetaError::Invalid(_))));

    let view = s.sync().await.expect("sync");
    assert!(view.collection(&name("short")).is_none() && view.collection(&name("empty")).is_none());
    assert_eq!(view.collection(&docs.name), Some(&Versioned { value: docs, revision: r1 }));
}

/// `watch()` announces changes, including those made through another
/// store of the cluster.
pub async fn watch_announces_changes(f: &impl StoreFactory) {
    let (a, b) = (f.open().await, f.open().await);
    let mut views = a.watch();
    views.borrow_and_update();
    let r1 = b.create_collection(collection("docs", &["n0"])).await.expect("create");
    within("a view announced after a create elsewhere", PROPAGATION, views.changed()).await.expect("announce");
    let view = view_where(a.as_ref(), "the create reaching the other store", PROPAGATION, |v| v.revision >= r1).await;
    assert_eq!(view.collection(&name("docs")).map(|c| c.revision), Some(r1));

    views.borrow_and_update();
    b.delete_collection(name("docs"), r1).await.expect("delete");
    within("a view announced after a delete", PROPAGATION, views.changed()).await.expect("announce");
    view_where(a.as_ref(), "the delete reaching the other store", PROPAGATION, |v| v.collection(&name("docs")).is_none()).await;
}

/// What one store writes, another reads after `sync()`, and can change on
/// the revision it read.
pub async fn changes_reach_other_stores(f: &impl StoreFactory) {
    let (a, b) = (f.open().await, f.open().await);
    let docs = collection("docs", &["n0", "n1"]);
    let r1 = a.create_collection(docs.clone()).await.expect("create on a");
    let seen = b.sync().await.expect("sync b");
    assert!(seen.revision >= r1);
    assert_eq!(seen.collection(&docs.name), Some(&Versioned { value: docs.clone(), revision: r1 }));

    let docs2 = moved(&docs, 1, "n2");
    let r2 = b.update_collection(docs2.clone(), r1).await.expect("update on b, based on what b read");
    let view = view_where(a.as_ref(), "b's update reaching a", PROPAGATION, |v| v.revision >= r2).await;
    assert_eq!(view.collection(&docs.name), Some(&Versioned { value: docs2, revision: r2 }));
}

/// Drain marks reach every store, are idempotent, and outlive nothing but
/// an unmark; a recorded move round-trips with its placement.
pub async fn drain_marks_and_moves_are_shared(f: &impl StoreFactory) {
    let (a, b) = (f.open().await, f.open().await);
    let n1 = node("n1");
    let r1 = a.set_draining(n1.clone(), true).await.expect("mark n1 draining");
    assert!(a.view().draining.contains(&n1), "a reads its own mark");
    let r2 = a.set_draining(n1.clone(), true).await.expect("marking twice is fine");
    assert!(r2 >= r1);
    view_where(b.as_ref(), "the drain mark reaching b", PROPAGATION, |v| v.draining.contains(&n1)).await;
    b.set_draining(n1.clone(), false).await.expect("unmark on b");
    b.set_draining(n1.clone(), false).await.expect("unmarking twice is fine");
    view_where(a.as_ref(), "the unmark reaching a", PROPAGATION, |v| v.draining.is_empty()).await;

    let docs = collection("docs", &["n0", "n1"]);
    let r = a.create_collection(docs.clone()).await.expect("create");
    let mut moving = docs.clone();
    moving.shards[1].moving = Some(crate::model::ShardMove {
        from: node("n1"),
        to: node("n2"),
        phase: crate::model::MovePhase::Copying,
        attempt: 3,
        kind: crate::model::MoveKind::Copy,
    });
    let r = a.update_collection(moving.clone(), r).await.expect("record a move");
    let view = view_where(b.as_ref(), "the move reaching b", PROPAGATION, |v| v.revision >= r).await;
    assert_eq!(view.collection(&docs.name), Some(&Versioned { value: moving.clone(), revision: r }));

    // A move that does not match its placement is refused.
    let mut bad = moving.clone();
    bad.shards[1].moving.as_mut().unwrap().phase = crate::model::MovePhase::Switched;
    assert!(matches!(a.update_collection(bad, r).await, Err(MetaError::Invalid(_))));
}

/// Two stores changing the same collection on the same revision at once:
/// exactly one wins, the other gets `Conflict` naming the winner's
/// revision, and both end up seeing the winner's value.
pub async fn concurrent_changes_on_one_revision_let_one_win(f: &impl StoreFactory) {
    let (a, b) = (f.open().await, f.open().await);
    let mut revision = a.create_collection(collection("docs", &["n0", "n1"])).await.expect("create");
    for round in 0..5 {
        let base = b.sync().await.expect("sync").collection(&name("docs")).cloned().expect("docs on b");
        assert_eq!(base.revision, revision, "round {round}");
        let (to_a, to_b) = (moved(&base.value, 0, &format!("a{round}")), moved(&base.value, 0, &format!("b{round}")));
        let (ra, rb) = futures::join!(a.update_collection(to_a.clone(), revision), b.update_collection(to_b.clone(), revision));
        let (winner, value, loser) = match (ra, rb) {
            (Ok(r), loser) => (r, to_a, loser),
            (loser, Ok(r)) => (r, to_b, loser),
            (ra, rb) => panic!("round {round}: neither update won: {ra:?}, {rb:?}"),
        };
        assert_conflict(loser, revision, winner);
        for s in [&a, &b] {
            let view = s.sync().await.expect("sync");
            assert_eq!(view.collection(&name("docs")), Some(&Versioned { value: value.clone(), revision: winner }), "round {round}");
        }
        revision = winner;
    }
}

/// A registration shows the member in every store's view; a second one of
/// the same id is refused; `update` replaces what it says; `leave`
/// removes it at once.
pub async fn registrations_show_members_until_they_leave(f: &impl StoreFactory) {
    let (a, b) = (f.open().await, f.open().await);
    let m = member("node-a", 7701);
    let reg = a.register(m.clone(), TTL).await.expect("register");
    assert!(reg.is_alive());
    assert_eq!(a.view().member(&m.id), Some(&m));
    assert_eq!(b.sync().await.expect("sync").member(&m.id), Some(&m));
    match b.register(member("node-a", 7799), TTL).await {
        Err(MetaError::AlreadyExists(_)) => {}
        other => panic!("a second registration of node-a: {other:?}"),
    }

    let mut m2 = m.clone();
    m2.state = NodeState::Draining;
    m2.capacity = Capacity { disk_free_bytes: 12345, shards: 7 };
    reg.update(m2.clone()).await.expect("update");
    assert_eq!(a.view().member(&m.id), Some(&m2));
    view_where(b.as_ref(), "the update reaching b", PROPAGATION, |v| v.member(&m.id) == Some(&m2)).await;
    assert!(matches!(reg.update(member("node-b", 1)).await, Err(MetaError::Invalid(_))));

    reg.leave().await.expect("leave");
    assert!(a.view().member(&m.id).is_none(), "leave returned but the member is still in the view");
    view_where(b.as_ref(), "the leave reaching b", PROPAGATION, |v| v.member(&m.id).is_none()).await;
    let again = b.register(m.clone(), TTL).await.expect("register again after leaving");
    again.leave().await.expect("leave again");
}

/// A dropped registration (a crashed node) stays until about its TTL has
/// passed, then disappears from every view; the id can register again.
pub async fn dropped_registrations_end_after_their_ttl(f: &impl StoreFactory) {
    let (a, b) = (f.open().await, f.open().await);
    let m = member("node-crash", 7702);
    let reg = a.register(m.clone(), TTL).await.expect("register");
    let dropped = Instant::now();
    drop(reg);
    assert!(b.sync().await.expect("sync").member(&m.id).is_some(), "a dropped registration must last until its TTL");
    view_where(b.as_ref(), "the dropped registration ending", TTL + TTL_MARGIN, |v| v.member(&m.id).is_none()).await;
    let took = dropped.elapsed();
    // The last keep-alive may have been up to a third of the TTL before the drop.
    assert!(took >= TTL / 2, "the member went {took:?} after its registration was dropped, TTL {TTL:?}");
    let again = a.register(m, TTL).await.expect("register again after the TTL");
    assert!(again.is_alive());
    again.leave().await.expect("leave");
}

/// A node restarted on the same data (the same incarnation) takes over a
/// registration whose lease has not ended, at once, and keeps it past the
/// old lease's TTL; one of another incarnation, or of none, is refused
/// with a message naming who holds the id.
pub async fn a_restart_on_the_same_data_takes_its_registration_over(f: &impl StoreFactory) {
    let (a, b) = (f.open().await, f.open().await);
    let m = Member { incarnation: "0123abcd".into(), ..member("node-again", 7703) };
    let crashed = a.register(m.clone(), TTL).await.expect("register");
    drop(crashed);
    let restarted = Member { address: "http://127.0.0.1:7704".into(), ..m.clone() };
    let reg = within("a takeover", PROPAGATION, b.register(restarted.clone(), TTL)).await.expect("the same incarnation takes over");
    assert!(reg.is_alive());
    view_where(a.as_ref(), "the takeover reaching a", PROPAGATION, |v| v.member(&m.id) == Some(&restarted)).await;
    for other in [Member { incarnation: "ffff0000".into(), ..m.clone() }, Member { incarnation: String::new(), ..m.clone() }] {
        match a.register(other.clone(), TTL).await {
            Err(MetaError::AlreadyExists(e)) => {
                assert!(e.contains("node-again") && e.contains("127.0.0.1:7704") && e.contains("stop that process"), "{e}")
            }
            r => panic!("incarnation {:?} registered over a live one: {:?}", other.incarnation, r.map(|_| ())),
        }
    }
    // The crashed run's lease ends; the registration it lost stays.
    tokio::time::sleep(TTL + TTL_MARGIN).await;
    assert_eq!(b.sync().await.expect("sync").member(&m.id), Some(&restarted), "the old lease's end took the new registration");
    assert!(reg.is_alive());
    reg.leave().await.expect("leave");
}

async fn elect(s: &Arc<dyn MetadataStore>, candidate: &str) -> Leadership {
    within(&format!("{candidate} elected with no one else campaigning"), PROPAGATION, s.campaign(candidate.into(), TTL))
        .await
        .unwrap_or_else(|e| panic!("campaign of {candidate}: {e}"))
}

/// Starts a campaign in the background.
fn campaign(s: &Arc<dyn MetadataStore>, candidate: &str) -> tokio::task::JoinHandle<Result<Leadership, MetaError>> {
    let (s, candidate) = (s.clone(), candidate.to_owned());
    tokio::spawn(async move { s.campaign(candidate, TTL).await })
}

async fn won(what: &str, limit: Duration, c: tokio::task::JoinHandle<Result<Leadership, MetaError>>) -> Leadership {
    within(what, limit, c).await.expect("the campaign task panicked").unwrap_or_else(|e| panic!("{what}: {e}"))
}

/// One controller at a time: a second candidate waits until the first
/// resigns, then wins at once; every view names the holder.
pub async fn second_candidate_wins_when_the_first_resigns(f: &impl StoreFactory) {
    let (a, b) = (f.open().await, f.open().await);
    let first = elect(&a, "coord-a").await;
    assert!(first.is_leader());
    assert_eq!(a.view().controller.as_deref(), Some("coord-a"));
    assert_eq!(b.sync().await.expect("sync").controller.as_deref(), Some("coord-a"));

    let second = campaign(&b, "coord-b");
    tokio::time::sleep(Duration::from_millis(1500)).await;
    assert!(!second.is_finished(), "coord-b was elected while coord-a held the controller");
    assert!(tokio::time::timeout(Duration::from_millis(200), first.lost()).await.is_err(), "lost() resolved for a holder");
    assert!(first.is_leader());

    first.resign().await.expect("resign");
    let second = won("coord-b elected after coord-a resigned", PROPAGATION, second).await;
    assert!(second.is_leader());
    assert_eq!(b.view().controller.as_deref(), Some("coord-b"));
    view_where(a.as_ref(), "coord-b named as controller on a", PROPAGATION, |v| v.controller.as_deref() == Some("coord-b")).await;
    second.resign().await.expect("resign");
    view_where(a.as_ref(), "no controller after both resigned", PROPAGATION, |v| v.controller.is_none()).await;
}

/// A controller that stops (its handle dropped without resigning) is
/// followed by a waiting candidate within the TTL.
pub async fn a_dropped_leadership_passes_on_within_the_ttl(f: &impl StoreFactory) {
    let (a, b) = (f.open().await, f.open().await);
    let first = elect(&a, "coord-a").await;
    let second = campaign(&b, "coord-b");
    tokio::time::sleep(Duration::from_millis(500)).await;
    assert!(!second.is_finished(), "coord-b was elected while coord-a held the controller");
    drop(first);
    let second = won("coord-b elected after coord-a stopped", TTL + TTL_MARGIN, second).await;
    assert!(second.is_leader());
    view_where(a.as_ref(), "coord-b named as controller on a", PROPAGATION, |v| v.controller.as_deref() == Some("coord-b")).await;
    second.resign().await.expect("resign");
}

/// When the term ends under the holder (where the backend can do that),
/// `lost()` resolves and `is_leader()` turns false, and a new campaign can
/// win.
pub async fn leadership_is_lost_when_the_term_ends(f: &impl StoreFactory) {
    let a = f.open().await;
    let leader = elect(&a, "coord-a").await;
    if !f.end_controller_term().await {
        leader.resign().await.expect("resign");
        return;
    }
    within("lost() after the term ended", TTL + TTL_MARGIN, leader.lost()).await;
    assert!(!leader.is_leader());
    view_where(a.as_ref(), "no controller in the view", PROPAGATION, |v| v.controller.is_none()).await;
    let next = elect(&a, "coord-next").await;
    assert!(next.is_leader() && !leader.is_leader());
    next.resign().await.expect("resign");
}

#[cfg(test)]
mod tests {
    use super::*;

    macro_rules! memory_suite {
        ($($test:ident),* $(,)?) => {$(
            #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
            async fn $test() {
                super::$test(&MemoryFactory::new()).await;
            }
        )*};
    }

    memory_suite!(
        collections_change_with_rising_revisions,
        stale_changes_conflict_and_write_nothing,
        drain_marks_and_moves_are_shared,
        invalid_collections_are_refused,
        watch_announces_changes,
        changes_reach_other_stores,
        concurrent_changes_on_one_revision_let_one_win,
        registrations_show_members_until_they_leave,
        dropped_registrations_end_after_their_ttl,
        a_restart_on_the_same_data_takes_its_registration_over,
        second_candidate_wins_when_the_first_resigns,
        a_dropped_leadership_passes_on_within_the_ttl,
        leadership_is_lost_when_the_term_ends,
    );
}
