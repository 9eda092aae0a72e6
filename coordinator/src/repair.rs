//! Keeping every shard at its replication factor (docs/replication.md,
//! "Rejoin and repair"): the controller's decisions, as a pure function of
//! the view so the rules are tested without a cluster, and the conditional
//! changes that record them. The copies themselves are `MoveKind::Copy`
//! moves, carried out by `mover.rs` like any move: seeded from a snapshot
//! of the primary, caught up from its batch log, and made active in the
//! conditional change that switches them in.

use std::collections::HashMap;
use std::time::Duration;

use shoal_control::metadata::{MetaError, View, place};
use shoal_control::model::{MoveKind, MovePhase, ReplicaState, Replication, ShardMove, ShardPlacement};
use shoal_proto::{CollectionName, NodeId, v1};
use tokio::time::Instant;

use crate::cluster::{Cluster, replication_of};
use crate::error::{Error, Result};
use crate::moves::CONFLICT_RETRIES;

/// One step towards every shard holding `factor` copies.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Work {
    /// A copy out of sync on a node that serves again: seed it anew from
    /// the primary and let it rejoin.
    Rejoin(CollectionName, u32, NodeId),
    /// A copy out of sync on a node gone longer than the repair delay:
    /// forget it, so that a new copy is made elsewhere.
    Forget(CollectionName, u32, NodeId),
    /// Fewer copies than the factor: copy the shard to another node.
    AddCopy(CollectionName, u32),
    /// More copies than the factor (it was lowered): remove one.
    Trim(CollectionName, u32),
}

impl Work {
    pub(crate) fn shard(&self) -> (&CollectionName, u32) {
        match self {
            Work::Rejoin(n, s, _) | Work::Forget(n, s, _) | Work::AddCopy(n, s) | Work::Trim(n, s) => (n, *s),
        }
    }
}

/// When each node named in a placement stopped being a member, as this
/// controller saw it. Starts afresh with every controller: a new one waits
/// the whole repair delay again, which errs on the side of not copying a
/// shard whose node is about to come back.
#[derive(Debug, Default)]
pub(crate) struct Absences {
    since: HashMap<NodeId, Instant>,
}

impl Absences {
    pub(crate) fn update(&mut self, view: &View, now: Instant) {
        let placed = view.collections.values().flat_map(|c| c.value.shards.iter().flat_map(ShardPlacement::nodes));
        let mut gone: HashMap<NodeId, Instant> = HashMap::new();
        for n in placed.filter(|n| view.member(n).is_none()) {
            let since = self.since.get(n).copied().unwrap_or(now);
            gone.insert(n.clone(), since);
        }
        self.since = gone;
    }

    pub(crate) fn gone_for(&self, node: &NodeId, now: Instant) -> Option<Duration> {
        self.since.get(node).map(|t| now.saturating_duration_since(*t))
    }
}

/// The next step for some shard not moving and not `skip`ped, if any.
/// `up` says whether a node answers its health probe: copies go only to
/// nodes that serve and answer. Cheap steps (trim, forget) and rejoins
/// come before new copies, shard by shard.
pub(crate) fn next_work(
    view: &View,
    gone_for: impl Fn(&NodeId) -> Option<Duration>,
    repair_after: Duration,
    up: impl Fn(&NodeId) -> bool,
    skip: impl Fn(&CollectionName, u32) -> bool,
) -> Option<Work> {
    let serving = |n: &NodeId| view.placeable().any(|m| &m.id == n) && up(n);
    let mut add = None;
    for (name, c) in &view.collections {
        let factor = c.value.replication.factor as usize;
        for (i, p) in c.value.shards.iter().enumerate() {
            let shard = i as u32;
            if p.moving.is_some() || skip(name, shard) {
                continue;
            }
            if p.replicas.len() > factor {
                return Some(Work::Trim(name.clone(), shard));
            }
            for r in p.replicas.iter().filter(|r| r.state != ReplicaState::Active) {
                if serving(&r.node) {
                    return Some(Work::Rejoin(name.clone(), shard, r.node.clone()));
                }
                if gone_for(&r.node).is_some_and(|d| d >= repair_after) {
                    return Some(Work::Forget(name.clone(), shard, r.node.clone()));
                }
            }
            // A copy still marked in sync on a node gone too long: no write
            // reached its shard since the node died (a write would have
            // marked it dead). It is forgotten all the same, but only while
            // another in-sync copy lives on a member: the last one holds the
            // only data (`shard recover` is for that).
            let gone_too_long = |n: &NodeId| gone_for(n).is_some_and(|d| d >= repair_after);
            if let Some(r) = forgettable_in_sync(p, |n| view.member(n).is_some(), gone_too_long) {
                return Some(Work::Forget(name.clone(), shard, r.clone()));
            }
            let has_target = || view.placeable().any(|m| !p.holds(&m.id) && up(&m.id));
            if p.replicas.len() < factor && add.is_none() && has_target() {
                add = Some(Work::AddCopy(name.clone(), shard));
            }
        }
    }
    add
}

/// An in-sync copy on a node gone too long, if another in-sync copy lives
/// on a member node.
fn forgettable_in_sync(p: &ShardPlacement, member: impl Fn(&NodeId) -> bool, gone_too_long: impl Fn(&NodeId) -> bool) -> Option<&NodeId> {
    let lives = p.in_sync().any(|r| member(&r.node));
    p.in_sync().map(|r| &r.node).find(|n| lives && !member(n) && gone_too_long(n))
}

/// The replica `Trim` removes: an out-of-sync one if any, else the last
/// active one, never the primary (the first active one).
fn trimmed(p: &ShardPlacement) -> Option<&NodeId> {
    let out_of_sync = p.replicas.iter().rev().find(|r| r.state != ReplicaState::Active);
    let extra_active = || p.in_sync().skip(1).last();
    out_of_sync.or_else(extra_active).map(|r| &r.node)
}

impl Cluster {
    /// Changes a collection's replication. A minimum in sync above what
    /// every shard holds now would refuse writes until the copies exist, so
    /// it is raised only after the factor's copies are made (with `wait`),
    /// and refused without it.
    pub async fn set_replication(&self, req: v1::SetReplicationRequest, caller: Option<Duration>) -> Result<v1::CollectionInfo> {
        let v1::SetReplicationRequest { collection, replication_factor, min_in_sync, wait } = req;
        let name = CollectionName::parse(&collection)?;
        let c = self.collection(name.as_str())?;
        let now = c.replication;
        let factor = if replication_factor == 0 { now.factor } else { replication_factor };
        let min = if min_in_sync == 0 { now.min_in_sync.min(factor) } else { min_in_sync };
        let wanted = replication_of(factor, min)?;
        let serving = self.meta.view().placeable().count();
        if wanted.factor > now.factor && wanted.factor as usize > serving {
            return Err(Error::Precondition(format!(
                "replication factor {} needs as many serving nodes; the cluster has {serving}",
                wanted.factor
            )));
        }
        let in_sync_everywhere = c.shards.iter().map(|p| p.in_sync().count()).min().unwrap_or(0) as u32;
        if wanted.min_in_sync > in_sync_everywhere.max(now.min_in_sync) {
            if !wait {
                return Err(Error::Precondition(format!(
                    "min_in_sync {} needs that many in-sync copies of every shard, and some shard of {name} has {in_sync_everywhere}: \
                     writes would be refused until the copies exist; ask with wait (the minimum is raised once they do)",
                    wanted.min_in_sync
                )));
            }
            self.store_replication(&name, Replication { factor: wanted.factor, min_in_sync: now.min_in_sync.min(wanted.factor) }).await?;
            self.wait_for_factor(&name, caller).await?;
        }
        self.store_replication(&name, wanted).await?;
        if wait {
            self.wait_for_factor(&name, caller).await?;
        }
        self.describe(name.as_str(), caller).await
    }

    async fn store_replication(&self, name: &CollectionName, replication: Replication) -> Result<()> {
        for _ in 0..CONFLICT_RETRIES {
            let view = self.meta.view();
            let v = view.collection(name).ok_or_else(|| Error::CollectionNotFound(name.clone()))?;
            if v.value.replication == replication {
                return Ok(());
            }
            let mut c = v.value.clone();
            c.replication = replication;
            match self.meta.update_collection(c, v.revision).await {
                Ok(_) => {
                    tracing::info!(collection = %name, factor = replication.factor, min_in_sync = replication.min_in_sync, "replication changed");
                    return Ok(());
                }
                Err(MetaError::Conflict { .. }) => {
                    let _ = self.meta.sync().await;
                }
                Err(e) => return Err(Error::from(e).context(format!("collection {name}"))),
            }
        }
        Err(Error::Contended { collection: name.clone(), shard: 0, attempts: CONFLICT_RETRIES })
    }

    /// Waits until every shard holds exactly the factor's copies, all in sync.
    async fn wait_for_factor(&self, name: &CollectionName, caller: Option<Duration>) -> Result<()> {
        let limit = caller.unwrap_or(Duration::from_secs(3600));
        let off = |p: &ShardPlacement, factor: usize| p.moving.is_some() || p.replicas.len() != factor || p.in_sync().count() != factor;
        let settled =
            |view: &View| view.collection(name).is_none_or(|c| c.value.shards.iter().all(|p| !off(p, c.value.replication.factor as usize)));
        if let Err(view) = self.wait_for_view(limit, settled).await {
            let short =
                view.collection(name).map_or(0, |c| c.value.shards.iter().filter(|p| off(p, c.value.replication.factor as usize)).count());
            return Err(Error::Deadline(format!(
                "{short} shards of {name} still differ from the replication factor after {limit:?}; the controller goes on \
                 (see `shoalctl status`)"
            )));
        }
        Ok(())
    }

    /// Carries out one step; returns once it is recorded (a copy is then
    /// carried out as a recorded move).
    pub(crate) async fn replicate(&self, work: &Work) -> Result<()> {
        match work {
            Work::Rejoin(name, shard, node) => self.record_copy(name, *shard, Some(node)).await,
            Work::AddCopy(name, shard) => self.record_copy(name, *shard, None).await,
            Work::Forget(name, shard, node) => {
                let forgotten = self
                    .change_shard(name, *shard, |p, view| {
                        let member = |n: &NodeId| view.member(n).is_some();
                        let forgettable = match p.replica(node) {
                            Some(r) if r.state != ReplicaState::Active => !member(node),
                            // The decision was made on the controller's
                            // clock; here only the rule that another
                            // in-sync copy lives is checked again.
                            Some(_) => forgettable_in_sync(p, member, |_| true) == Some(node),
                            None => false,
                        };
                        if !forgettable || p.moving.is_some() {
                            return Ok(None);
                        }
                        let mut next = p.clone();
                        next.replicas.retain(|r| &r.node != node);
                        Ok(Some(next))
                    })
                    .await?;
                if forgotten.is_some() {
                    tracing::warn!(collection = %name, shard, %node, "repair: the copy on a node gone too long is forgotten; a new one is made elsewhere");
                }
                Ok(())
            }
            Work::Trim(name, shard) => self.trim(name, *shard).await,
        }
    }

    /// Records a copy of the shard from its primary to `to` (a node
    /// holding an out-of-sync copy of it), or to the serving node holding
    /// the fewest shards that has none.
    async fn record_copy(&self, name: &CollectionName, shard: u32, to: Option<&NodeId>) -> Result<()> {
        let factor = self.collection(name.as_str())?.replication.factor as usize;
        let recorded = self
            .change_shard(name, shard, |p, view| {
                if p.moving.is_some() {
                    return Ok(None);
                }
                let to = match to {
                    Some(t) if p.replica(t).is_some_and(|r| r.state != ReplicaState::Active) => t.clone(),
                    Some(_) => return Ok(None),
                    None if p.replicas.len() >= factor => return Ok(None),
                    None => {
                        let candidates = view.placeable().filter(|m| !p.holds(&m.id) && self.node_up(&m.id));
                        match place(1, candidates, view.collections.values().map(|v| &v.value)).pop() {
                            Some(t) => t,
                            None => return Ok(None),
                        }
                    }
                };
                let mut next = p.clone();
                next.moving = Some(ShardMove { from: p.node().clone(), to, phase: MovePhase::Copying, attempt: 0, kind: MoveKind::Copy });
                Ok(Some(next))
            })
            .await?;
        if let Some(m) = recorded.and_then(|p| p.moving) {
            tracing::info!(collection = %name, shard, from = %m.from, to = %m.to, "repair: copy of a replica recorded");
        }
        Ok(())
    }

    /// Takes one replica out of a shard holding more than its factor, then
    /// drops its files once searches that may still read it have ended.
    async fn trim(&self, name: &CollectionName, shard: u32) -> Result<()> {
        let c = self.collection(name.as_str())?;
        let Some(node) = c.shards.get(shard as usize).and_then(trimmed).cloned() else { return Ok(()) };
        let factor = c.replication.factor as usize;
        let copy = self.copy_on(&node, name, shard).await;
        let changed = self
            .change_shard(name, shard, |p, _| {
                if p.moving.is_some() || p.replicas.len() <= factor || trimmed(p) != Some(&node) {
                    return Ok(None);
                }
                let mut next = p.clone();
                next.replicas.retain(|r| r.node != node);
                Ok(Some(next))
            })
            .await?;
        if changed.is_none() {
            return Ok(());
        }
        tracing::info!(collection = %name, shard, %node, "replication factor lowered: a replica left the placement");
        // Meanwhile a new copy may be made on that node: the drop names
        // the trimmed one.
        tokio::time::sleep(self.options().search_timeout + Duration::from_secs(1)).await;
        self.drop_copy(&node, name, shard, copy, "a trimmed replica").await;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use shoal_control::metadata::Versioned;
    use shoal_control::model::{Capacity, Collection, CollectionSpec, Member, Metric, NodeState, Replica, Replication};

    use super::*;

    fn node(n: &str) -> NodeId {
        NodeId::parse(n).unwrap()
    }

    fn view(factor: u32, shards: Vec<ShardPlacement>, members: &[&str]) -> View {
        let name = CollectionName::parse("docs").unwrap();
        let spec = CollectionSpec { dimension: 2, metric: Metric::Dot, index: Default::default(), shard_count: shards.len() as u32 };
        let replication = Replication { factor, min_in_sync: 1 };
        let mut v = View::default();
        v.collections
            .insert(name.clone(), Versioned { value: Collection { name, spec, replication, shards, fields: Vec::new() }, revision: 1 });
        for m in members {
            let mut member = Member::configured(node(m), format!("{m}:1"));
            member.state = NodeState::Serving;
            member.capacity = Capacity::default();
            v.members.insert(node(m), member);
        }
        v
    }

    fn placement(replicas: &[(&str, ReplicaState)]) -> ShardPlacement {
        let replicas = replicas.iter().map(|(n, state)| Replica { node: node(n), state: *state }).collect();
        ShardPlacement { replicas, epoch: 1, moving: None }
    }

    use ReplicaState::{Active, Dead};

    const FIVE_MIN: Duration = Duration::from_secs(300);

    fn work(v: &View, gone: Option<Duration>) -> Option<Work> {
        next_work(v, |_| gone, FIVE_MIN, |_| true, |_, _| false)
    }

    #[test]
    fn a_dead_copy_on_a_serving_node_rejoins_and_one_on_a_node_gone_too_long_is_forgotten() {
        let docs = CollectionName::parse("docs").unwrap();
        let v = view(2, vec![placement(&[("n0", Active), ("n1", Dead)])], &["n0", "n1", "n2"]);
        assert_eq!(work(&v, None), Some(Work::Rejoin(docs.clone(), 0, node("n1"))));
        assert_eq!(next_work(&v, |_| None, FIVE_MIN, |n| n.as_str() != "n1", |_, _| false), None, "not while it does not answer");

        let v = view(2, vec![placement(&[("n0", Active), ("n1", Dead)])], &["n0", "n2"]);
        assert_eq!(work(&v, Some(Duration::from_secs(10))), None, "gone briefly: wait for it");
        assert_eq!(work(&v, Some(FIVE_MIN)), Some(Work::Forget(docs.clone(), 0, node("n1"))));

        let v = view(2, vec![placement(&[("n0", Active)])], &["n0", "n2"]);
        assert_eq!(work(&v, None), Some(Work::AddCopy(docs.clone(), 0)));
        let v = view(2, vec![placement(&[("n0", Active)])], &["n0"]);
        assert_eq!(work(&v, None), None, "no node to copy to");
    }

    #[test]
    fn an_in_sync_copy_on_a_node_gone_too_long_is_forgotten_unless_it_is_the_last_live_one() {
        let docs = CollectionName::parse("docs").unwrap();
        // No write reached the shard since n1 died: its copy is still active.
        let v = view(2, vec![placement(&[("n0", Active), ("n1", Active)])], &["n0", "n2"]);
        assert_eq!(work(&v, Some(Duration::from_secs(10))), None, "gone briefly: wait for it");
        let gone = |n: &NodeId| (n.as_str() == "n1").then_some(FIVE_MIN);
        assert_eq!(next_work(&v, gone, FIVE_MIN, |_| true, |_, _| false), Some(Work::Forget(docs.clone(), 0, node("n1"))));
        // The primary's node is the one gone: forgotten too, n1 is primary then.
        let v = view(2, vec![placement(&[("n0", Active), ("n1", Active)])], &["n1", "n2"]);
        assert_eq!(work(&v, Some(FIVE_MIN)), Some(Work::Forget(docs.clone(), 0, node("n0"))));
        // Every in-sync copy is on a gone node: keep them (the data is there).
        let v = view(2, vec![placement(&[("n0", Active), ("n1", Active)])], &["n2"]);
        assert_eq!(work(&v, Some(FIVE_MIN)), None);
        let v = view(1, vec![placement(&[("n0", Active)])], &["n2"]);
        assert_eq!(work(&v, Some(FIVE_MIN)), None, "a single copy is recovered by an operator, not forgotten");
    }

    #[test]
    fn a_lowered_factor_trims_out_of_sync_copies_first_and_never_the_primary() {
        let docs = CollectionName::parse("docs").unwrap();
        let v = view(1, vec![placement(&[("n0", Active), ("n1", Active)])], &["n0", "n1"]);
        assert_eq!(work(&v, None), Some(Work::Trim(docs.clone(), 0)));
        assert_eq!(trimmed(&placement(&[("n0", Active), ("n1", Active), ("n2", Active)])), Some(&node("n2")));
        assert_eq!(trimmed(&placement(&[("n0", Dead), ("n1", Active), ("n2", Active)])), Some(&node("n0")));
        assert_eq!(trimmed(&placement(&[("n0", Active), ("n1", Active), ("n2", Dead)])), Some(&node("n2")));
        assert_eq!(trimmed(&placement(&[("n0", Active)])), None);
    }

    #[test]
    fn moving_or_backed_off_shards_wait_and_absences_are_timed_from_the_first_sight() {
        let mut p = placement(&[("n0", Active)]);
        p.moving = Some(ShardMove { from: node("n0"), to: node("n1"), phase: MovePhase::Copying, attempt: 0, kind: MoveKind::Copy });
        let v = view(2, vec![p], &["n0", "n1"]);
        assert_eq!(work(&v, None), None);
        let v = view(2, vec![placement(&[("n0", Active)])], &["n0", "n1"]);
        assert_eq!(next_work(&v, |_| None, FIVE_MIN, |_| true, |_, _| true), None);

        let v = view(2, vec![placement(&[("n0", Active), ("n1", Dead)])], &["n0"]);
        let mut a = Absences::default();
        let t0 = Instant::now();
        a.update(&v, t0);
        a.update(&v, t0 + Duration::from_secs(60));
        assert_eq!(a.gone_for(&node("n1"), t0 + Duration::from_secs(90)), Some(Duration::from_secs(90)));
        assert_eq!(a.gone_for(&node("n0"), t0), None);
        let back = view(2, vec![placement(&[("n0", Active), ("n1", Dead)])], &["n0", "n1"]);
        a.update(&back, t0 + Duration::from_secs(100));
        assert_eq!(a.gone_for(&node("n1"), t0 + Duration::from_secs(100)), None, "back: the clock starts again");
    }
}
