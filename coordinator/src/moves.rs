//! What an operator asks of the control plane: move a shard, drain a node,
//! even out the load. Any coordinator takes these requests, checks them
//! against the view, and records them in the metadata store with a
//! conditional change; the controller carries them out (`mover.rs`), and
//! a controller that takes over finishes what is recorded. A request that
//! asks to wait watches the view until the record is gone.

use std::time::Duration;

use shoal_control::metadata::{MetaError, PlannedMove, View, place, rebalance};
use shoal_control::model::{Collection, MoveKind, MovePhase, ReplicaState, ShardMove, ShardPlacement};
use shoal_proto::{CollectionName, NodeId, v1};

use crate::cluster::Cluster;
use crate::error::{Error, Result};

/// How long a request that waits may wait when its caller set no deadline.
const LONGEST_WAIT: Duration = Duration::from_secs(3600);

/// How many times a conditional change is tried again after someone else
/// changed the collection first.
pub(crate) const CONFLICT_RETRIES: usize = 20;

/// A shard's move on the wire.
pub(crate) fn move_info(c: &CollectionName, shard: u32, m: &ShardMove, phase: &str) -> v1::ShardMove {
    v1::ShardMove {
        collection: c.to_string(),
        shard,
        from_node: m.from.to_string(),
        to_node: m.to.to_string(),
        phase: phase.into(),
        kind: m.kind.as_str().into(),
    }
}

fn planned_info(m: &PlannedMove, phase: &str) -> v1::ShardMove {
    move_info(
        &m.collection,
        m.shard,
        &ShardMove { from: m.from.clone(), to: m.to.clone(), phase: MovePhase::Copying, attempt: 0, kind: MoveKind::Move },
        phase,
    )
}

/// The epoch of `next` after `current`: one above `current`'s when the
/// primary changes. The new primary numbers its entries on from its own
/// log, and the old one may have numbered the same entries differently
/// (it committed a write and failed before shipping it): a write under
/// the old epoch that reaches the new primary then would pass for an
/// entry it holds, and be acknowledged while only the failed copy has it.
/// The new primary's first write raises its own epoch, so every write
/// ordered by the old one is refused there as stale and its coordinator
/// sends it to the new primary (docs/replication.md, "Why one primary per
/// shard").
pub(crate) fn successor_epoch(current: &ShardPlacement, next: &ShardPlacement) -> u64 {
    if next.node() != current.node() { next.epoch.max(current.epoch + 1) } else { next.epoch }
}

impl Cluster {
    /// Changes one shard's placement with a conditional write, re-reading
    /// and deciding again when someone else changed the collection first.
    /// `decide` sees the current placement and returns the new one, or
    /// `None` when there is nothing to change (then nothing is written).
    ///
    /// A change of primary raises the epoch (`successor_epoch`), whoever
    /// decided it.
    pub(crate) async fn change_shard(
        &self,
        name: &CollectionName,
        shard: u32,
        decide: impl Fn(&ShardPlacement, &View) -> Result<Option<ShardPlacement>>,
    ) -> Result<Option<ShardPlacement>> {
        for _ in 0..CONFLICT_RETRIES {
            let view = self.meta.view();
            let v = view.collection(name).ok_or_else(|| Error::CollectionNotFound(name.clone()))?;
            let current = v.value.shards.get(shard as usize).ok_or_else(|| Error::NoSuchShard {
                collection: name.clone(),
                shard,
                shards: v.value.shard_count(),
            })?;
            let Some(mut next) = decide(current, &view)? else { return Ok(None) };
            next.epoch = successor_epoch(current, &next);
            let mut c: Collection = v.value.clone();
            c.shards[shard as usize] = next.clone();
            match self.meta.update_collection(c, v.revision).await {
                Ok(_) => return Ok(Some(next)),
                Err(MetaError::Conflict { .. }) => {
                    // The view may lag the store: read it before deciding again.
                    let _ = self.meta.sync().await;
                }
                Err(e) => return Err(Error::from(e).context(format!("shard {shard} of {name}"))),
            }
        }
        Err(Error::Contended { collection: name.clone(), shard, attempts: CONFLICT_RETRIES })
    }

    /// Records a move of shard `shard` of `name` from the copy on `from`
    /// (default: the primary) to `to` (default: the serving node holding
    /// the fewest shards). Asking again for a move that is already recorded
    /// returns it.
    pub(crate) async fn record_move(
        &self,
        name: &CollectionName,
        shard: u32,
        from: Option<&NodeId>,
        to: Option<&NodeId>,
    ) -> Result<ShardMove> {
        let recorded = self
            .change_shard(name, shard, |p, view| {
                if let Some(m) = &p.moving {
                    if to.is_none_or(|t| *t == m.to) {
                        return Ok(None);
                    }
                    return Err(Error::Precondition(format!(
                        "shard {shard} of {name} is already moving from {} to {}; wait for that move to end",
                        m.from, m.to
                    )));
                }
                let from = from.unwrap_or(p.node()).clone();
                match p.replica(&from) {
                    None => return Err(Error::Invalid(format!("node {from} holds no copy of shard {shard} of {name}"))),
                    // Its copy may lack acknowledged batches: copying it
                    // would spread that.
                    Some(r) if r.state != ReplicaState::Active => {
                        return Err(Error::Precondition(format!(
                            "the copy of shard {shard} of {name} on {from} is {}, not in sync: it is not moved",
                            r.state.as_str()
                        )));
                    }
                    Some(_) => {}
                }
                if view.member(&from).is_none() {
                    return Err(Error::Precondition(format!(
                        "node {from}, which holds shard {shard} of {name}, is not a member (down or gone): a move copies from it; \
                         restore the shard from a snapshot instead"
                    )));
                }
                let to = match to {
                    Some(t) => {
                        check_target(view, t)?;
                        if p.holds(t) {
                            return Err(Error::Invalid(format!("node {t} already holds shard {shard} of {name}")));
                        }
                        t.clone()
                    }
                    None => {
                        let candidates = view.placeable().filter(|m| !p.holds(&m.id));
                        place(1, candidates, view.collections.values().map(|v| &v.value)).pop().ok_or_else(|| {
                            Error::Precondition(format!(
                                "no serving node other than {from} can take shard {shard} of {name}; add or undrain one"
                            ))
                        })?
                    }
                };
                let mut next = p.clone();
                next.moving = Some(ShardMove { from, to, phase: MovePhase::Copying, attempt: 0, kind: MoveKind::Move });
                Ok(Some(next))
            })
            .await?;
        match recorded.and_then(|p| p.moving) {
            Some(m) => {
                tracing::info!(collection = %name, shard, from = %m.from, to = %m.to, "shard move recorded");
                Ok(m)
            }
            None => {
                // Already recorded: report the move as it stands.
                let c = self.collection(name.as_str())?;
                c.shards[shard as usize].moving.clone().ok_or_else(|| Error::Internal("the move ended while it was recorded".into()))
            }
        }
    }

    /// Takes the copy of `shard` on `node` out of the placement if it is
    /// out of sync (dead or recovering) and the shard is not moving; drops
    /// its files if the node answers. True if it was taken out.
    pub(crate) async fn drop_out_of_sync_copy(&self, name: &CollectionName, shard: u32, node: &NodeId) -> Result<bool> {
        let copy = self.copy_on(node, name, shard).await;
        let changed = self
            .change_shard(name, shard, |p, _| match p.replica(node) {
                Some(r) if r.state != ReplicaState::Active && p.moving.is_none() => {
                    let mut next = p.clone();
                    next.replicas.retain(|r| &r.node != node);
                    Ok(Some(next))
                }
                _ => Ok(None),
            })
            .await?;
        if changed.is_none() {
            return Ok(false);
        }
        tracing::info!(collection = %name, shard, %node, "an out-of-sync copy left the placement");
        self.drop_copy(node, name, shard, copy, "an out-of-sync copy").await;
        Ok(true)
    }

    pub async fn move_shard(&self, req: v1::MoveShardRequest, caller: Option<Duration>) -> Result<v1::MoveShardResponse> {
        let v1::MoveShardRequest { collection, shard, to_node, wait, from_node } = req;
        let name = CollectionName::parse(&collection)?;
        let to = match to_node.as_str() {
            "" => None,
            t => Some(NodeId::parse(t)?),
        };
        let from = match from_node.as_str() {
            "" => None,
            f => Some(NodeId::parse(f)?),
        };
        let m = self.record_move(&name, shard, from.as_ref(), to.as_ref()).await?;
        if !wait {
            return Ok(v1::MoveShardResponse { r#move: Some(move_info(&name, shard, &m, m.phase.as_str())) });
        }
        let done = self.wait_for_moves(&[(name.clone(), shard, m.clone())], caller).await?;
        Ok(v1::MoveShardResponse { r#move: done.into_iter().next() })
    }

    /// Waits until none of `moves` is recorded any more; each one is
    /// "done" if its target holds the shard, else an error says it was
    /// rolled back.
    async fn wait_for_moves(&self, moves: &[(CollectionName, u32, ShardMove)], caller: Option<Duration>) -> Result<Vec<v1::ShardMove>> {
        let limit = caller.unwrap_or(LONGEST_WAIT);
        let ended = |view: &View| {
            moves.iter().all(|(name, shard, m)| {
                view.collection(name)
                    .and_then(|c| c.value.shards.get(*shard as usize))
                    .is_none_or(|p| p.moving.as_ref().is_none_or(|now| now.to != m.to))
            })
        };
        let view = self.wait_for_view(limit, ended).await.map_err(|view| {
            let running: Vec<String> = moves
                .iter()
                .filter_map(|(name, shard, _)| {
                    let p = view.collection(name)?.value.shards.get(*shard as usize)?;
                    p.moving.as_ref().map(|m| format!("shard {shard} of {name} to {} ({})", m.to, m.phase.as_str()))
                })
                .collect();
            Error::Deadline(format!("still moving after {limit:?}: {}; the controller goes on (see `shoalctl status`)", running.join(", ")))
        })?;
        let mut out = Vec::with_capacity(moves.len());
        for (name, shard, m) in moves {
            let p = view.collection(name).and_then(|c| c.value.shards.get(*shard as usize));
            match p {
                Some(p) if p.holds(&m.to) => out.push(move_info(name, *shard, m, "done")),
                Some(_) => {
                    return Err(Error::Aborted(format!(
                        "the move of shard {shard} of {name} from {} to {} was rolled back (the controller {} logs why); \
                         the shard stays on {}",
                        m.from,
                        m.to,
                        view.controller.as_deref().unwrap_or("?"),
                        m.from
                    )));
                }
                None => return Err(Error::NotFound(format!("collection {name} was dropped while its shard {shard} moved"))),
            }
        }
        Ok(out)
    }

    /// Waits until the view satisfies `ok`, at most `limit`; on timeout,
    /// returns the last view seen.
    pub(crate) async fn wait_for_view(
        &self,
        limit: Duration,
        ok: impl Fn(&View) -> bool,
    ) -> Result<std::sync::Arc<View>, std::sync::Arc<View>> {
        let mut views = self.meta.watch();
        let deadline = tokio::time::Instant::now() + limit;
        loop {
            let view = views.borrow_and_update().clone();
            if ok(&view) {
                return Ok(view);
            }
            match tokio::time::timeout_at(deadline, views.changed()).await {
                Ok(Ok(())) => {}
                _ => return Err(view),
            }
        }
    }

    pub async fn drain_node(&self, req: v1::DrainNodeRequest, caller: Option<Duration>) -> Result<v1::DrainNodeResponse> {
        let v1::DrainNodeRequest { node, undrain, wait } = req;
        let node = NodeId::parse(&node)?;
        if undrain {
            self.meta.set_draining(node.clone(), false).await?;
            tracing::info!(%node, "node no longer draining");
            return Ok(draining_state(&self.meta.view(), &node));
        }
        let view = self.meta.view();
        let holds = holdings(&view, &node);
        if view.member(&node).is_none() && holds.is_empty() {
            return Err(Error::NotFound(format!("node {node} is not a member and holds no shard")));
        }
        if !holds.is_empty() && !view.placeable().any(|m| m.id != node) {
            return Err(Error::Precondition(format!(
                "no serving node other than {node} can take its {} shards; add or undrain one first",
                holds.len()
            )));
        }
        self.meta.set_draining(node.clone(), true).await?;
        tracing::info!(%node, shards = holds.len(), "node draining");
        if wait {
            let limit = caller.unwrap_or(LONGEST_WAIT);
            let emptied = self.wait_for_view(limit, |v| holdings(v, &node).is_empty()).await;
            if let Err(view) = emptied {
                let left = holdings(&view, &node);
                return Err(Error::Deadline(format!(
                    "node {node} still holds {} shards after {limit:?}; the drain goes on (see `shoalctl node list`)",
                    left.len()
                )));
            }
        }
        Ok(draining_state(&self.meta.view(), &node))
    }

    pub async fn rebalance(&self, req: v1::RebalanceRequest, caller: Option<Duration>) -> Result<v1::RebalanceResponse> {
        let view = self.meta.view();
        let collections: Vec<&Collection> = view.collections.values().map(|v| &v.value).collect();
        let plan = rebalance(view.placeable(), &collections);
        if req.dry_run {
            return Ok(v1::RebalanceResponse { moves: plan.iter().map(|m| planned_info(m, "planned")).collect() });
        }
        let mut recorded = Vec::with_capacity(plan.len());
        for m in &plan {
            let r = self.record_move(&m.collection, m.shard, Some(&m.from), Some(&m.to)).await?;
            recorded.push((m.collection.clone(), m.shard, r));
        }
        tracing::info!(moves = recorded.len(), "rebalance recorded");
        let moves = if req.wait {
            self.wait_for_moves(&recorded, caller).await?
        } else {
            recorded.iter().map(|(name, shard, m)| move_info(name, *shard, m, m.phase.as_str())).collect()
        };
        Ok(v1::RebalanceResponse { moves })
    }
}

/// A move's target must be alive, serving and not drained.
pub(crate) fn check_target(view: &View, to: &NodeId) -> Result<()> {
    let Some(m) = view.member(to) else {
        let known: Vec<&str> = view.members.keys().map(NodeId::as_str).collect();
        return Err(Error::NotFound(format!("node {to} is not a member (members: {})", known.join(", "))));
    };
    if view.draining.contains(to) {
        return Err(Error::Precondition(format!("node {to} is draining; undrain it to move shards to it")));
    }
    if !view.placeable().any(|p| p.id == m.id) {
        return Err(Error::Precondition(format!("node {to} is {}, not serving", m.state.as_str())));
    }
    Ok(())
}

/// The shards `node` holds or is giving away, by collection and index.
pub(crate) fn holdings(view: &View, node: &NodeId) -> Vec<(CollectionName, u32)> {
    let mut out = Vec::new();
    for (name, c) in &view.collections {
        for (i, p) in c.value.shards.iter().enumerate() {
            let leaving = p.moving.as_ref().is_some_and(|m| m.from == *node && m.kind == MoveKind::Move);
            if p.holds(node) || leaving {
                out.push((name.clone(), i as u32));
            }
        }
    }
    out
}

fn draining_state(view: &View, node: &NodeId) -> v1::DrainNodeResponse {
    let held = holdings(view, node);
    let moves = held
        .iter()
        .map(|(name, shard)| {
            let p = &view.collections[name].value.shards[*shard as usize];
            match &p.moving {
                Some(m) => move_info(name, *shard, m, m.phase.as_str()),
                None => v1::ShardMove {
                    collection: name.to_string(),
                    shard: *shard,
                    from_node: node.to_string(),
                    to_node: String::new(),
                    phase: "waiting".into(),
                    kind: MoveKind::Move.as_str().into(),
                },
            }
        })
        .collect();
    v1::DrainNodeResponse { moves, removable: held.is_empty() }
}
