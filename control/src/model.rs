//! The coordinator's own view of the cluster, in its own types: what a
//! collection is, where its shards live, what a member node is. Wire types
//! (`v1::`) stop at the edges (`conversions.rs`, the shard clients), so the
//! control plane can change how placement is kept without touching the
//! protocol, and the protocol can grow without reshaping the control plane.

use std::fmt;

use shoal_proto::{CollectionName, NodeId, ShoalError};

/// How closeness is measured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Metric {
    Cosine,
    Dot,
    Euclidean,
}

impl Metric {
    pub fn as_str(self) -> &'static str {
        match self {
            Metric::Cosine => "cosine",
            Metric::Dot => "dot",
            Metric::Euclidean => "euclidean",
        }
    }

    pub fn parse(s: &str) -> Result<Metric, ShoalError> {
        match s.to_ascii_lowercase().as_str() {
            "cosine" => Ok(Metric::Cosine),
            "dot" => Ok(Metric::Dot),
            "euclidean" | "l2" => Ok(Metric::Euclidean),
            _ => Err(ShoalError::invalid(format!("metric {s:?} is not one of cosine, dot, euclidean"))),
        }
    }
}

impl fmt::Display for Metric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// HNSW parameters; 0 means the engine's default.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct IndexParams {
    pub m: u32,
    pub ef_construction: u32,
}

/// What every shard of a collection is made with. Fixed at creation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CollectionSpec {
    pub dimension: u32,
    pub metric: Metric,
    pub index: IndexParams,
    pub shard_count: u32,
}

/// What a copy of a shard may be used for (docs/replication.md).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ReplicaState {
    /// In sync: holds every acknowledged batch. Written to, read from, and
    /// a write is acknowledged only once every active replica committed it.
    Active,
    /// Being seeded or caught up; joins the active ones in one conditional
    /// change once it holds everything. Neither read nor counted for acks.
    Recovering,
    /// Left the in-sync set (a write to it failed or timed out, or its node
    /// died): may lack acknowledged batches, so it is neither read nor
    /// written until it has recovered.
    Dead,
}

impl ReplicaState {
    pub fn as_str(self) -> &'static str {
        match self {
            ReplicaState::Active => "active",
            ReplicaState::Recovering => "recovering",
            ReplicaState::Dead => "dead",
        }
    }

    pub fn parse(s: &str) -> Option<ReplicaState> {
        match s {
            "active" => Some(ReplicaState::Active),
            "recovering" => Some(ReplicaState::Recovering),
            "dead" => Some(ReplicaState::Dead),
            _ => None,
        }
    }
}

/// One copy of a shard.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Replica {
    pub node: NodeId,
    pub state: ReplicaState,
}

impl Replica {
    pub fn active(node: NodeId) -> Self {
        Replica { node, state: ReplicaState::Active }
    }
}

/// How many copies a collection keeps of each shard.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Replication {
    /// Full, searchable copies wanted of every shard, on distinct nodes.
    pub factor: u32,
    /// Below this many active replicas a write is refused (with a retry
    /// hint) instead of acknowledged by fewer copies.
    pub min_in_sync: u32,
}

impl Default for Replication {
    fn default() -> Self {
        Replication { factor: 1, min_in_sync: 1 }
    }
}

/// Where one shard lives.
///
/// `replicas` are the copies, on distinct nodes; at least one is always
/// active (the last in-sync copy is never dropped: a write that would need
/// to is refused instead). `epoch` counts ownership changes: every move
/// bumps it in the same transaction that switches the replicas, and shard
/// nodes refuse writes stamped with an older one, so a coordinator that
/// has not yet seen a move cannot write to the copy that was moved away.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardPlacement {
    pub replicas: Vec<Replica>,
    pub epoch: u64,
    /// A move of this shard under way, recorded before any copy is made so
    /// that whichever controller comes next finishes or undoes it.
    pub moving: Option<ShardMove>,
}

/// Where a move stands (docs/control-plane.md, "How a shard moves").
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MovePhase {
    /// `from` still owns the shard; `to` is being seeded and caught up.
    Copying,
    /// `to` owns the shard (the switch bumped the epoch); the copy on
    /// `from` is still to be dropped.
    Switched,
}

impl MovePhase {
    pub fn as_str(self) -> &'static str {
        match self {
            MovePhase::Copying => "copying",
            MovePhase::Switched => "switched",
        }
    }

    pub fn parse(s: &str) -> Option<MovePhase> {
        match s {
            "copying" => Some(MovePhase::Copying),
            "switched" => Some(MovePhase::Switched),
            _ => None,
        }
    }
}

/// What a recorded move makes of the copy on `from`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum MoveKind {
    /// The copy on `to` replaces the one on `from`, which is dropped.
    #[default]
    Move,
    /// The copy on `to` joins the active replicas and `from` keeps its own:
    /// a replica rejoining (its node held a dead copy), a repair, or a
    /// raised replication factor. Ends at the switch (no copy to drop).
    Copy,
}

impl MoveKind {
    pub fn as_str(self) -> &'static str {
        match self {
            MoveKind::Move => "move",
            MoveKind::Copy => "copy",
        }
    }

    pub fn parse(s: &str) -> Option<MoveKind> {
        match s {
            "move" => Some(MoveKind::Move),
            "copy" => Some(MoveKind::Copy),
            _ => None,
        }
    }
}

/// A shard moving from one node to another, or copied to another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShardMove {
    pub from: NodeId,
    pub to: NodeId,
    pub phase: MovePhase,
    pub kind: MoveKind,
    /// Bumped by every controller that (re)starts the copy, in the same
    /// conditional write: a stale controller still copying finds its
    /// attempt gone and stops instead of switching to a half-made copy.
    pub attempt: u64,
}

impl ShardPlacement {
    pub fn on(node: NodeId) -> Self {
        Self::at(node, 1)
    }

    /// A shard at `epoch` on `node`, not moving.
    pub fn at(node: NodeId, epoch: u64) -> Self {
        Self::on_all(vec![node], epoch)
    }

    /// A shard at `epoch` with an active replica on each of `nodes`.
    pub fn on_all(nodes: Vec<NodeId>, epoch: u64) -> Self {
        ShardPlacement { replicas: nodes.into_iter().map(Replica::active).collect(), epoch, moving: None }
    }

    /// The first active replica's node: where single-copy work goes (a
    /// move's source, a snapshot).
    pub fn node(&self) -> &NodeId {
        // `Collection::check` refuses a placement without an active
        // replica, and every constructor makes one.
        &self.in_sync().next().unwrap_or(&self.replicas[0]).node
    }

    /// The replicas that hold every acknowledged batch.
    pub fn in_sync(&self) -> impl Iterator<Item = &Replica> {
        self.replicas.iter().filter(|r| r.state == ReplicaState::Active)
    }

    /// The nodes of the active replicas.
    pub fn in_sync_nodes(&self) -> impl Iterator<Item = &NodeId> {
        self.in_sync().map(|r| &r.node)
    }

    /// True if `node` has a copy, in whatever state.
    pub fn holds(&self, node: &NodeId) -> bool {
        self.replica(node).is_some()
    }

    pub fn replica(&self, node: &NodeId) -> Option<&Replica> {
        self.replicas.iter().find(|r| &r.node == node)
    }

    /// True if replica `j`'s node also has one of the replicas before it.
    fn holds_before(&self, j: usize) -> bool {
        self.replicas[..j].iter().any(|r| r.node == self.replicas[j].node)
    }

    /// The nodes with a copy, in whatever state.
    pub fn nodes(&self) -> impl Iterator<Item = &NodeId> {
        self.replicas.iter().map(|r| &r.node)
    }
}

/// What a payload index holds (docs/filters.md): the engine's field
/// types by name.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FieldKind {
    Keyword,
    Integer,
    Float,
    Bool,
    Datetime,
}

impl FieldKind {
    pub const ALL: [FieldKind; 5] = [FieldKind::Keyword, FieldKind::Integer, FieldKind::Float, FieldKind::Bool, FieldKind::Datetime];

    pub fn as_str(self) -> &'static str {
        match self {
            FieldKind::Keyword => "keyword",
            FieldKind::Integer => "integer",
            FieldKind::Float => "float",
            FieldKind::Bool => "bool",
            FieldKind::Datetime => "datetime",
        }
    }

    pub fn parse(s: &str) -> Option<FieldKind> {
        FieldKind::ALL.into_iter().find(|k| k.as_str() == s)
    }
}

/// A payload index every shard of a collection keeps.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FieldIndexSpec {
    pub field: String,
    pub kind: FieldKind,
}

/// A collection and where each of its shards lives.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Collection {
    pub name: CollectionName,
    pub spec: CollectionSpec,
    pub replication: Replication,
    /// Shard i at index i.
    pub shards: Vec<ShardPlacement>,
    /// Its payload indexes, by field name.
    pub fields: Vec<FieldIndexSpec>,
}

impl Collection {
    pub fn shard_count(&self) -> u32 {
        self.shards.len() as u32
    }

    /// The node serving shard `i` (which must exist).
    pub fn node_of(&self, shard: u32) -> &NodeId {
        self.shards[shard as usize].node()
    }

    /// The invariants every stored collection keeps: one placement per
    /// shard, each naming at least one node, no node twice, at least one
    /// active replica; a replication factor of at least one, and a minimum
    /// of in-sync replicas between one and the factor.
    pub fn check(&self) -> Result<(), String> {
        if self.spec.shard_count == 0 || self.shards.len() != self.spec.shard_count as usize {
            return Err(format!("{} placements for {} shards", self.shards.len(), self.spec.shard_count));
        }
        let Replication { factor, min_in_sync } = self.replication;
        if factor == 0 || min_in_sync == 0 || min_in_sync > factor {
            return Err(format!("replication factor {factor} with a minimum of {min_in_sync} in sync"));
        }
        for (i, s) in self.shards.iter().enumerate() {
            if s.replicas.is_empty() {
                return Err(format!("shard {i} is placed on no node"));
            }
            if (1..s.replicas.len()).any(|j| s.holds_before(j)) {
                return Err(format!("shard {i} names a node twice"));
            }
            if s.in_sync().next().is_none() {
                return Err(format!("shard {i} has no active replica"));
            }
            if s.epoch == 0 {
                return Err(format!("shard {i} has epoch 0"));
            }
            if let Some(m) = &s.moving {
                let owner = match m.phase {
                    MovePhase::Copying => &m.from,
                    MovePhase::Switched => &m.to,
                };
                let copy_onto_active = m.kind == MoveKind::Copy && s.replica(&m.to).is_some_and(|r| r.state == ReplicaState::Active);
                if m.from == m.to || !s.holds(owner) || (m.phase == MovePhase::Copying && copy_onto_active) {
                    return Err(format!("shard {i}'s move from {} to {} ({}) does not match its replicas", m.from, m.to, m.phase.as_str()));
                }
            }
        }
        Ok(())
    }
}

/// What a node says about itself when it registers.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeState {
    /// Takes new shards.
    Serving,
    /// Its shards are being moved elsewhere; takes no new ones.
    Draining,
    /// Holds nothing any more; safe to stop.
    Removable,
}

impl NodeState {
    pub fn as_str(self) -> &'static str {
        match self {
            NodeState::Serving => "serving",
            NodeState::Draining => "draining",
            NodeState::Removable => "removable",
        }
    }

    pub fn parse(s: &str) -> Option<NodeState> {
        match s {
            "serving" => Some(NodeState::Serving),
            "draining" => Some(NodeState::Draining),
            "removable" => Some(NodeState::Removable),
            _ => None,
        }
    }
}

/// Room a node has left, as it last reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Capacity {
    pub disk_free_bytes: u64,
    pub shards: u32,
}

/// A shard node of the cluster.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub id: NodeId,
    /// `http://host:port`.
    pub address: String,
    pub state: NodeState,
    pub capacity: Capacity,
    /// Which life of the node this is: an id the node keeps in its data
    /// directory. A registration whose lease is still alive is taken over
    /// by a new one of the same incarnation (the node restarted after a
    /// crash, on the same data), and refused to any other. Empty: none
    /// (never taken over).
    pub incarnation: String,
}

impl Member {
    /// A member known from static configuration: serving, capacity unknown.
    pub fn configured(id: NodeId, address: String) -> Self {
        Member { id, address, state: NodeState::Serving, capacity: Capacity::default(), incarnation: String::new() }
    }

    /// Whether a registration of `self` may replace `live`'s, whose lease
    /// has not ended: the same node on the same data, restarted.
    pub fn succeeds(&self, live: &Member) -> bool {
        !self.incarnation.is_empty() && self.incarnation == live.incarnation
    }

    /// What a registration of `self` is refused with while `live` holds
    /// the id under a lease of `ttl`.
    pub fn refused_by(&self, live: &Member, ttl: std::time::Duration) -> String {
        let holder = if live.incarnation.is_empty() || self.incarnation.is_empty() {
            format!("held by a process at {} that keeps no incarnation", live.address)
        } else {
            format!(
                "held by another process, with another data directory, at {} (incarnation {}, this one {})",
                live.address, live.incarnation, self.incarnation
            )
        };
        format!("node {} ({holder}: stop that process, or wait at most {ttl:?} for its lease to end if it is gone)", self.id)
    }
}
