//! The controller's work: carrying out the moves recorded in the placement
//! (docs/control-plane.md, "How a shard moves") and recording the moves a
//! drain needs. Runs only while this coordinator is the controller; every
//! step it takes is either idempotent on the shard nodes or a conditional
//! change in the store, so a controller that dies at any point leaves a
//! record the next one finishes (after the switch) or rolls back (before).
//!
//! One copy at a time: a move's snapshot and restore are disk- and
//! network-bound, and the write pause at its fence is shortest when
//! nothing else competes. The end of a switched move (a grace for
//! searches, then dropping the old copy) runs beside the next copy.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;
use std::time::Duration;

use shoal_control::model::{MoveKind, MovePhase, Replica, ReplicaState, ShardMove, ShardPlacement};
use shoal_proto::{CollectionName, ErrorCode, NodeId, v1};
use tokio::task::JoinSet;
use tokio::time::Instant;

use crate::client::ShardClient;
use crate::cluster::Cluster;
use crate::error::{Error, Result};
use crate::moves::holdings;
use crate::repair::{Absences, Work, next_work};

/// A snapshot, a restore or a catch-up step of a large shard may take long.
const STEP_TIMEOUT: Duration = Duration::from_secs(1800);

/// Catch-up rounds while writes still flow to the source, before fencing.
const CATCH_UP_ROUNDS: usize = 50;

/// Fence once the target is this few batches behind: what is left is
/// copied while writes to the shard wait.
const FENCE_LAG: u64 = 8;

/// Messages of log entries one catch-up round reads at most.
const ROUND_MESSAGES: usize = 64;

/// After a move of a shard fails, the controller leaves that shard alone
/// this long (a drain would otherwise retry it in a tight loop).
const BACKOFF: Duration = Duration::from_secs(10);

/// The same for a copy that adds a replica (a rejoin, a repair): the
/// common failure is a node that died a moment ago and is restarting, and
/// the shard has one copy fewer until the copy is made.
const COPY_BACKOFF: Duration = Duration::from_secs(2);

/// What the controller does next.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Task {
    /// Carry out (or finish) the move recorded for this shard.
    Move(CollectionName, u32),
    /// Record a move of this shard's copy on a draining node.
    Drain(CollectionName, u32, NodeId),
    /// A step towards the shard's replication factor (`repair.rs`).
    Replicate(Work),
}

impl Task {
    fn shard(&self) -> (&CollectionName, u32) {
        match self {
            Task::Move(name, shard) | Task::Drain(name, shard, _) => (name, *shard),
            Task::Replicate(w) => w.shard(),
        }
    }
}

/// The controller's loop; runs until dropped (leadership lost or the
/// coordinator stops). Copies run one at a time; the end of a switched
/// move (the grace for searches, dropping the old copy, clearing the
/// record) runs in the background so the next copy need not wait for it.
/// Dropping the loop aborts those: the records stay `switched`, and the
/// next controller finishes them.
pub(crate) async fn lead(cluster: Arc<Cluster>) {
    let mut views = cluster.meta.watch();
    let mut failed: HashMap<(CollectionName, u32), Instant> = HashMap::new();
    let mut finishing: JoinSet<((CollectionName, u32), Result<()>)> = JoinSet::new();
    let mut finishing_keys: HashSet<(CollectionName, u32)> = HashSet::new();
    let mut absences = Absences::default();
    loop {
        while let Some(done) = finishing.try_join_next() {
            if let Ok((key, result)) = done {
                finishing_keys.remove(&key);
                if let Err(e) = result {
                    tracing::warn!(collection = %key.0, shard = key.1, error = %e, "controller: finishing a shard move failed; retrying in {BACKOFF:?}");
                    failed.insert(key, Instant::now() + BACKOFF);
                }
            }
        }
        failed.retain(|_, until| *until > Instant::now());
        let view = views.borrow_and_update().clone();
        let skip = |name: &CollectionName, shard: u32| {
            let key = (name.clone(), shard);
            failed.contains_key(&key) || finishing_keys.contains(&key)
        };
        let now = Instant::now();
        absences.update(&view, now);
        let replication = |v: &shoal_control::metadata::View| {
            let gone_for = |n: &NodeId| absences.gone_for(n, now);
            next_work(v, gone_for, cluster.options().repair_after, |n| cluster.node_up(n), skip)
        };
        let Some(task) = next_task(&view, skip).or_else(|| replication(&view).map(Task::Replicate)) else {
            // Nothing to do: wait for a change, a finish, or a backed-off retry.
            tokio::select! {
                _ = views.changed() => {}
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            continue;
        };
        let is_copy = match &task {
            Task::Move(name, shard) => view
                .collection(name)
                .and_then(|c| c.value.shards.get(*shard as usize)?.moving.as_ref())
                .is_some_and(|m| m.kind == MoveKind::Copy),
            Task::Replicate(_) => true,
            Task::Drain(..) => false,
        };
        let result = match &task {
            Task::Move(name, shard) => match cluster.carry_out(name, *shard).await {
                Ok(Some(switched)) => {
                    let key = (name.clone(), *shard);
                    finishing_keys.insert(key.clone());
                    let cluster = Arc::clone(&cluster);
                    finishing.spawn(async move {
                        let r = cluster.finish_move(&key.0, key.1, &switched).await;
                        (key, r)
                    });
                    Ok(())
                }
                Ok(None) => Ok(()),
                Err(e) => Err(e),
            },
            // A copy out of sync is never read or written: it leaves the
            // placement rather than being copied (it could spread what it
            // lacks), and a drain is not held up by it.
            Task::Drain(name, shard, from) => match cluster.drop_out_of_sync_copy(name, *shard, from).await {
                Ok(true) => Ok(()),
                Ok(false) => cluster.record_move(name, *shard, Some(from), None).await.map(|_| ()),
                Err(e) => Err(e),
            },
            // A trim waits out the searches still reading the copy before
            // dropping it: beside the next task, like the end of a move.
            Task::Replicate(work @ Work::Trim(name, shard)) => {
                let key = (name.clone(), *shard);
                finishing_keys.insert(key.clone());
                let (cluster, work) = (Arc::clone(&cluster), work.clone());
                finishing.spawn(async move { (key, cluster.replicate(&work).await) });
                Ok(())
            }
            Task::Replicate(work) => cluster.replicate(work).await,
        };
        if let Err(e) = result {
            let (name, shard) = task.shard();
            let (name, shard) = (name.clone(), shard);
            let backoff = if is_copy { COPY_BACKOFF } else { BACKOFF };
            tracing::warn!(collection = %name, shard, error = %e, "controller: shard move failed; retrying in {backoff:?} if still wanted");
            failed.insert((name, shard), Instant::now() + backoff);
        }
    }
}

/// Moves already recorded come first (finishing one that switched before
/// starting a copy), then shards of draining nodes.
fn next_task(view: &shoal_control::metadata::View, backed_off: impl Fn(&CollectionName, u32) -> bool) -> Option<Task> {
    let mut copying = None;
    for (name, c) in &view.collections {
        for (i, p) in c.value.shards.iter().enumerate() {
            let Some(m) = &p.moving else { continue };
            if backed_off(name, i as u32) {
                continue;
            }
            match m.phase {
                MovePhase::Switched => return Some(Task::Move(name.clone(), i as u32)),
                MovePhase::Copying => {
                    copying.get_or_insert_with(|| Task::Move(name.clone(), i as u32));
                }
            }
        }
    }
    if copying.is_some() {
        return copying;
    }
    for node in &view.draining {
        for (name, shard) in holdings(view, node) {
            let moving = view.collections[&name].value.shards[shard as usize].moving.is_some();
            if !moving && !backed_off(&name, shard) {
                return Some(Task::Drain(name, shard, node.clone()));
            }
        }
    }
    None
}

/// Where a catch-up stands.
#[derive(Debug, Clone, Copy)]
struct Progress {
    /// The target's last batch.
    target: u64,
    /// The source's last batch, as of the last read.
    source: u64,
}

impl Cluster {
    /// Carries out the move recorded for shard `shard` of `name`, from
    /// wherever it stands, up to the switch: returns the switched move,
    /// whose end (`finish_move`) is left to the caller, or `None` if there
    /// was nothing to carry out.
    async fn carry_out(&self, name: &CollectionName, shard: u32) -> Result<Option<ShardMove>> {
        let c = self.collection(name.as_str())?;
        let Some(m) = c.shards.get(shard as usize).and_then(|p| p.moving.clone()) else { return Ok(None) };
        if m.phase == MovePhase::Switched {
            return Ok(Some(m));
        }
        let (m, attempt) = match self.claim(name, shard, &m).await {
            Ok(claimed) => claimed,
            // A move's source whose copy is damaged, or out of the in-sync
            // set, can never be switched from: retrying would hold the
            // shard's repair back for good. The move is given up (with any
            // copy an earlier attempt left on the target) and the repair
            // makes the source's copy again; a rebalance may plan it anew.
            Err(e) if m.kind == MoveKind::Move && self.source_lost(name, shard, &m.from, &e) => {
                self.roll_back(name, shard, &m, m.attempt, &e).await;
                return Err(e);
            }
            Err(e) => return Err(e),
        };
        let started = std::time::Instant::now();
        tracing::info!(collection = %name, shard, from = %m.from, to = %m.to, attempt, "shard move: copying");
        match self.copy_and_switch(name, shard, &m, attempt).await {
            Ok(()) if m.kind == MoveKind::Copy => {
                tracing::info!(collection = %name, shard, from = %m.from, to = %m.to, ms = started.elapsed().as_millis() as u64, "replica copied: in sync");
                Ok(None)
            }
            Ok(()) => {
                tracing::info!(collection = %name, shard, from = %m.from, to = %m.to, ms = started.elapsed().as_millis() as u64, "shard move: switched");
                Ok(Some(ShardMove { phase: MovePhase::Switched, attempt, ..m }))
            }
            Err(e) => {
                self.roll_back(name, shard, &m, attempt, &e).await;
                Err(e)
            }
        }
    }

    /// Makes this attempt the move's own: bumps `attempt` (a stale
    /// controller still working on the move then cannot switch it), and
    /// raises the placement's epoch to the source's if an earlier attempt
    /// fenced the source and died before switching, so writes flow again.
    /// A copy is made from the shard's primary as it is now (the one
    /// recorded may have died since): returns the move as claimed.
    async fn claim(&self, name: &CollectionName, shard: u32, m: &ShardMove) -> Result<(ShardMove, u64)> {
        let mut m = m.clone();
        if m.kind == MoveKind::Copy {
            m.from = self.collection(name.as_str())?.shards[shard as usize].node().clone();
        }
        let source_epoch = self.shard_stats_on(&m.from, name, shard).await?.epoch;
        let attempt = m.attempt + 1;
        let from = m.from.clone();
        self.change_shard(name, shard, |p, _| {
            let Some(now) = p.moving.as_ref().filter(|now| now.to == m.to && now.phase == MovePhase::Copying) else {
                return Err(aborted(name, shard, "the move was changed or cancelled meanwhile"));
            };
            if now.kind == MoveKind::Copy && p.replica(&from).is_none_or(|r| r.state != ReplicaState::Active) {
                return Err(aborted(name, shard, "the primary changed meanwhile"));
            }
            let mut next = p.clone();
            next.epoch = p.epoch.max(source_epoch);
            next.moving = Some(ShardMove { attempt: now.attempt.max(attempt), from: from.clone(), ..now.clone() });
            Ok(Some(next))
        })
        .await?;
        Ok((ShardMove { attempt, ..m }, attempt))
    }

    /// Seeds the target from a snapshot, catches it up from the source's
    /// batch log, fences the source, catches up the rest and switches the
    /// placement.
    async fn copy_and_switch(&self, name: &CollectionName, shard: u32, m: &ShardMove, attempt: u64) -> Result<()> {
        let id = Some(v1::ShardId { collection: name.to_string(), shard });
        let (from, to) = (self.client(&m.from)?, self.client(&m.to)?);

        // Seed: a snapshot of the source, restored on the target.
        let snap = self
            .on_node(&m.from, from.snapshot_shard(v1::SnapshotShardRequest { shard: id.clone(), ..Default::default() }, STEP_TIMEOUT))
            .await
            .map_err(|e| e.context(format!("snapshot of shard {shard} of {name} on {}", m.from)))?;
        let restore = v1::RestoreShardRequest { shard: id.clone(), snapshot_id: snap.id.clone(), replace: true };
        let restored = self.on_node(&m.to, to.restore_shard(restore, STEP_TIMEOUT)).await.map_err(|e| {
            let hint = if e.code() == ErrorCode::NotFound {
                " (a move needs the source and the target to share a snapshot store: [shard_node.snapshot] url)"
            } else {
                ""
            };
            e.context(format!("restore of snapshot {} on {}{hint}", snap.id, m.to))
        })?;
        tracing::info!(collection = %name, shard, snapshot = %snap.id, last_seq = restored.last_seq, "shard move: target seeded");

        // Catch up while writes still go to the source.
        let mut at = Progress { target: restored.last_seq, source: restored.last_seq };
        for _ in 0..CATCH_UP_ROUNDS {
            at = self.catch_up(&m.from, &from, &m.to, &to, &id, at.target, Some(ROUND_MESSAGES)).await?;
            if at.source.saturating_sub(at.target) <= FENCE_LAG {
                break;
            }
        }
        self.still_ours(name, shard, attempt)?;

        // Fence: the source refuses writes stamped with the placement's
        // epoch from now on; writers wait for the switch (within their
        // deadlines). Reads go on.
        let placement_epoch = self.collection(name.as_str())?.shards[shard as usize].epoch;
        let source_epoch = self.shard_stats_on(&m.from, name, shard).await?.epoch;
        let epoch = placement_epoch.max(source_epoch) + 1;
        let fenced_at = Instant::now();
        self.on_node(&m.from, from.fence_shard(v1::FenceShardRequest { shard: id.clone(), epoch }, STEP_TIMEOUT))
            .await
            .map_err(|e| e.context(format!("fencing shard {shard} of {name} on {}", m.from)))?;
        let at = self.catch_up(&m.from, &from, &m.to, &to, &id, at.target, None).await?;
        if at.target != at.source {
            return Err(Error::Internal(format!(
                "shard {shard} of {name}: the target is at batch {} after the final catch-up, the fenced source at {}",
                at.target, at.source
            )));
        }
        self.on_node(&m.to, to.fence_shard(v1::FenceShardRequest { shard: id.clone(), epoch }, STEP_TIMEOUT))
            .await
            .map_err(|e| e.context(format!("raising the epoch of the copy on {}", m.to)))?;

        // Switch: one conditional change makes the target the owner.
        self.change_shard(name, shard, |p, _| switched(name, shard, p, m, attempt, epoch).map(Some)).await?;
        tracing::info!(
            collection = %name, shard, epoch, last_seq = at.target,
            writes_paused_ms = fenced_at.elapsed().as_millis() as u64,
            "shard move: placement switched"
        );
        Ok(())
    }

    /// Copies batch log entries from the source to the target from
    /// `target + 1` on: `Some(n)` messages at most, or until the target
    /// holds everything the source has.
    #[allow(clippy::too_many_arguments)]
    async fn catch_up(
        &self,
        from_node: &NodeId,
        from: &ShardClient,
        to_node: &NodeId,
        to: &ShardClient,
        id: &Option<v1::ShardId>,
        mut target: u64,
        messages: Option<usize>,
    ) -> Result<Progress> {
        let mut read = 0usize;
        loop {
            let req = v1::ReadBatchLogRequest { shard: id.clone(), from_seq: target + 1, max_bytes: 0 };
            let log = self
                .on_node(from_node, from.read_batch_log(req, STEP_TIMEOUT))
                .await
                .map_err(|e| e.context(format!("reading the batch log on {from_node} from {}", target + 1)))?;
            if log.entries.is_empty() {
                return Ok(Progress { target, source: log.last_seq });
            }
            // Epoch 0: the copy is not the owner yet; its epoch is raised
            // explicitly once it has everything.
            let apply = v1::ApplyLogEntriesRequest { shard: id.clone(), epoch: 0, entries: log.entries };
            let applied = self
                .on_node(to_node, to.apply_log_entries(apply, STEP_TIMEOUT))
                .await
                .map_err(|e| e.context(format!("applying batch log entries on {to_node}")))?;
            target = applied.last_seq;
            read += 1;
            if messages.is_some_and(|n| read >= n) {
                return Ok(Progress { target, source: log.last_seq });
            }
        }
    }

    /// After the switch: the source's copy is dropped once searches that
    /// started before the switch had time to end, and the record goes.
    async fn finish_move(&self, name: &CollectionName, shard: u32, m: &ShardMove) -> Result<()> {
        tokio::time::sleep(self.options().search_timeout + Duration::from_secs(1)).await;
        let id = Some(v1::ShardId { collection: name.to_string(), shard });
        match self.client(&m.from) {
            // Any copy there: while the move is recorded no other can be
            // made on its source.
            Ok(from) => match self.on_node(&m.from, from.drop_shard(v1::DropShardRequest { shard: id, copy: 0 }, STEP_TIMEOUT)).await {
                Ok(_) => {}
                Err(e) if e.code() == ErrorCode::NotFound => {}
                Err(e) => {
                    // The copy is fenced and no placement names it: it
                    // takes disk, nothing else. Leaving it must not keep
                    // the move open.
                    tracing::warn!(collection = %name, shard, node = %m.from, error = %e, "could not drop the moved shard's old copy; drop it by hand");
                }
            },
            Err(e) => {
                tracing::warn!(collection = %name, shard, node = %m.from, error = %e, "the moved shard's old node is gone; its copy stays on its disk")
            }
        }
        self.change_shard(name, shard, |p, _| {
            Ok(p.moving.as_ref().filter(|now| now.phase == MovePhase::Switched && now.to == m.to).map(|_| {
                let mut next = p.clone();
                next.moving = None;
                next
            }))
        })
        .await?;
        tracing::info!(collection = %name, shard, from = %m.from, to = %m.to, "shard move: done");
        Ok(())
    }

    /// Before the switch, undoes a move: leaves the source the owner, at
    /// its (maybe fenced) epoch, then drops what was copied to the target.
    ///
    /// In that order, and the drop only once the store took the undo: a
    /// switch whose commit reached etcd although its answer did not (etcd
    /// restarting mid-request) made the target the owner, with writes
    /// acknowledged on it since. This coordinator's view may not show that
    /// yet; the store's conditional change does (the move is no longer
    /// `Copying`), so the undo changes nothing and the target's copy,
    /// maybe the only one holding those writes, is kept. Dropping first,
    /// on the view's word, lost acknowledged points in a chaos run.
    async fn roll_back(&self, name: &CollectionName, shard: u32, m: &ShardMove, attempt: u64, why: &Error) {
        if self.still_ours(name, shard, attempt).is_err() {
            return;
        }
        tracing::warn!(collection = %name, shard, from = %m.from, to = %m.to, error = %why, "shard move: rolling back");
        let source_epoch = self.shard_stats_on(&m.from, name, shard).await.map(|s| s.epoch).unwrap_or(0);
        // Read while the store still records this attempt, so no other
        // copy can be on the target yet: the drop below takes only this one.
        let copy = self.copy_on(&m.to, name, shard).await;
        let undone = self
            .change_shard(name, shard, |p, _| {
                if !p.moving.as_ref().is_some_and(|now| now.to == m.to && now.attempt == attempt && now.phase == MovePhase::Copying) {
                    return Ok(None);
                }
                let mut next = p.clone();
                next.moving = None;
                next.epoch = p.epoch.max(source_epoch);
                Ok(Some(next))
            })
            .await;
        match undone {
            Ok(Some(_)) => {}
            Ok(None) => {
                tracing::warn!(collection = %name, shard, node = %m.to, "shard move: the store no longer records this move as copying; the target's copy is kept");
                return;
            }
            Err(e) => {
                tracing::warn!(collection = %name, shard, error = %e, "could not clear the move record; the next controller rolls it back");
                return;
            }
        }
        self.drop_copy(&m.to, name, shard, copy, "the rolled-back move's copy").await;
    }

    /// Whether `from`'s copy of the shard is damaged (its node answers
    /// DATA_LOSS for it) or no longer an in-sync replica.
    fn source_lost(&self, name: &CollectionName, shard: u32, from: &NodeId, e: &Error) -> bool {
        if e.code() == ErrorCode::DataLoss {
            return true;
        }
        let Ok(c) = self.collection(name.as_str()) else { return false };
        c.shards.get(shard as usize).and_then(|p| p.replica(from)).is_some_and(|r| r.state != ReplicaState::Active)
    }

    fn still_ours(&self, name: &CollectionName, shard: u32, attempt: u64) -> Result<()> {
        let c = self.collection(name.as_str())?;
        match c.shards.get(shard as usize).and_then(|p| p.moving.as_ref()) {
            Some(m) if m.attempt == attempt && m.phase == MovePhase::Copying => Ok(()),
            _ => Err(aborted(name, shard, "another controller took the move over")),
        }
    }

    async fn shard_stats_on(&self, node: &NodeId, name: &CollectionName, shard: u32) -> Result<v1::ShardStats> {
        let req = v1::ShardStatsRequest { shard: Some(v1::ShardId { collection: name.to_string(), shard }) };
        let client = self.client(node)?;
        self.on_node(node, client.get_shard_stats(req, Duration::from_secs(10)))
            .await
            .map_err(|e| e.context(format!("stats of shard {shard} of {name} on {node}")))
    }
}

/// The placement a move's switch writes: the target takes the source's
/// place (a move) or joins the active replicas (a copy), at `epoch`.
///
/// Only while the store still records this attempt, and only while the
/// source's copy is in sync: a write that missed the source during the
/// copy (it timed out, its node stalled) took it out of the in-sync set
/// and was acknowledged without it, so the target, copied from it, lacks
/// that write. Switching anyway would mark the target in sync and lose
/// the write the moment it served reads or became the primary.
fn switched(name: &CollectionName, shard: u32, p: &ShardPlacement, m: &ShardMove, attempt: u64, epoch: u64) -> Result<ShardPlacement> {
    if !p.moving.as_ref().is_some_and(|now| now.to == m.to && now.attempt == attempt) {
        return Err(aborted(name, shard, "another controller took the move over"));
    }
    match p.replica(&m.from) {
        Some(r) if r.state == ReplicaState::Active => {}
        Some(r) => {
            let why = format!("the source's copy on {} left the in-sync set during the copy (now {})", m.from, r.state.as_str());
            return Err(aborted(name, shard, &why));
        }
        None => return Err(aborted(name, shard, &format!("the source's copy on {} left the placement during the copy", m.from))),
    }
    // A failover since the fence raised the placement to the fence's
    // epoch or past it: the source's successor may have taken writes
    // the catch-up did not see.
    if p.epoch >= epoch {
        return Err(aborted(name, shard, &format!("the placement's epoch rose to {} during the copy (a failover)", p.epoch)));
    }
    let mut replicas = p.replicas.clone();
    let moving = match m.kind {
        // The moved copy takes the source's place in the list (a moved
        // primary stays the primary); the other replicas stay as they are.
        MoveKind::Move => {
            for r in replicas.iter_mut().filter(|r| r.node == m.from) {
                *r = Replica::active(m.to.clone());
            }
            Some(ShardMove { phase: MovePhase::Switched, attempt, ..m.clone() })
        }
        // The copy joins the active replicas (in the place of its node's
        // dead one, if it had one); nothing is left to drop.
        MoveKind::Copy => {
            match replicas.iter_mut().find(|r| r.node == m.to) {
                Some(r) => *r = Replica::active(m.to.clone()),
                None => replicas.push(Replica::active(m.to.clone())),
            }
            None
        }
    };
    Ok(ShardPlacement { replicas, epoch, moving })
}

fn aborted(name: &CollectionName, shard: u32, why: &str) -> Error {
    Error::Aborted(format!("move of shard {shard} of {name}: {why}"))
}

#[cfg(test)]
mod tests {
    use shoal_control::metadata::{Versioned, View};
    use shoal_control::model::{Collection, CollectionSpec, Metric};

    use super::*;

    fn node(n: &str) -> NodeId {
        NodeId::parse(n).unwrap()
    }

    fn view(shards: Vec<ShardPlacement>, draining: &[&str]) -> View {
        let name = CollectionName::parse("docs").unwrap();
        let spec = CollectionSpec { dimension: 2, metric: Metric::Dot, index: Default::default(), shard_count: shards.len() as u32 };
        let mut v = View::default();
        v.collections.insert(
            name.clone(),
            Versioned { value: Collection { name, spec, replication: Default::default(), shards, fields: Vec::new() }, revision: 1 },
        );
        v.draining = draining.iter().map(|n| node(n)).collect();
        v
    }

    fn moving(from: &str, to: &str, phase: MovePhase) -> ShardPlacement {
        let owner = if phase == MovePhase::Copying { from } else { to };
        let mut p = ShardPlacement::on(node(owner));
        p.moving = Some(ShardMove { from: node(from), to: node(to), phase, attempt: 0, kind: MoveKind::Move });
        p
    }

    #[test]
    fn switched_moves_finish_first_then_copies_then_drains() {
        let docs = CollectionName::parse("docs").unwrap();
        let none = |_: &CollectionName, _: u32| false;
        let v = view(
            vec![ShardPlacement::on(node("n0")), moving("n1", "n2", MovePhase::Copying), moving("n0", "n3", MovePhase::Switched)],
            &["n0"],
        );
        assert_eq!(next_task(&v, none), Some(Task::Move(docs.clone(), 2)));
        let v = view(vec![ShardPlacement::on(node("n0")), moving("n1", "n2", MovePhase::Copying)], &["n0"]);
        assert_eq!(next_task(&v, none), Some(Task::Move(docs.clone(), 1)));
        let v = view(vec![ShardPlacement::on(node("n1")), ShardPlacement::on(node("n0"))], &["n0"]);
        assert_eq!(next_task(&v, none), Some(Task::Drain(docs.clone(), 1, node("n0"))));
        assert_eq!(next_task(&v, |_, s| s == 1), None, "a backed-off shard waits");
        assert_eq!(next_task(&view(vec![ShardPlacement::on(node("n1"))], &["n0"]), none), None);
    }

    #[test]
    fn a_switch_needs_the_attempt_and_a_source_still_in_sync() {
        let docs = CollectionName::parse("docs").unwrap();
        let with = |states: [ReplicaState; 2], kind: MoveKind| {
            let replicas = [("n0", states[0]), ("n1", states[1])].map(|(n, state)| Replica { node: node(n), state }).to_vec();
            let moving = Some(ShardMove { from: node("n1"), to: node("n2"), phase: MovePhase::Copying, attempt: 3, kind });
            ShardPlacement { replicas, epoch: 4, moving }
        };
        let m = |kind| ShardMove { from: node("n1"), to: node("n2"), phase: MovePhase::Copying, attempt: 3, kind };
        let (active, dead) = (ReplicaState::Active, ReplicaState::Dead);

        let p = with([active, active], MoveKind::Move);
        let next = switched(&docs, 0, &p, &m(MoveKind::Move), 3, 5).unwrap();
        let on: Vec<(&str, ReplicaState)> = next.replicas.iter().map(|r| (r.node.as_str(), r.state)).collect();
        assert_eq!(on, [("n0", active), ("n2", active)]);
        assert_eq!((next.epoch, next.moving.map(|m| m.phase)), (5, Some(MovePhase::Switched)));
        let copied = switched(&docs, 0, &with([active, active], MoveKind::Copy), &m(MoveKind::Copy), 3, 5).unwrap();
        assert_eq!(copied.in_sync_nodes().map(NodeId::as_str).collect::<Vec<_>>(), ["n0", "n1", "n2"]);
        assert_eq!(copied.moving, None);

        // A write that missed the source meanwhile was acknowledged without
        // it: the copy made from it must not count as in sync.
        for kind in [MoveKind::Move, MoveKind::Copy] {
            let e = switched(&docs, 0, &with([active, dead], kind), &m(kind), 3, 5).unwrap_err();
            assert!(e.to_string().contains("left the in-sync set during the copy (now dead)"), "{e}");
        }
        let mut gone = with([active, active], MoveKind::Move);
        gone.replicas.pop();
        assert!(switched(&docs, 0, &gone, &m(MoveKind::Move), 3, 5).unwrap_err().to_string().contains("left the placement"));
        let e = switched(&docs, 0, &p, &m(MoveKind::Move), 2, 5).unwrap_err();
        assert!(e.to_string().contains("another controller took the move over"), "{e}");
    }
}
