//! The coordinator's core: collections, routing of writes, scatter-gather
//! of reads. Handlers in `service.rs` only convert; everything else is here.
//!
//! Every call that fans out to shard nodes has a deadline: the caller's
//! (`grpc-timeout`) when it set one, capped by the operation's default,
//! and it passes that deadline on to each node, which stops its work at it.
//! A node the prober marked down (see `liveness`) is not waited for: a
//! write that needs it fails before any part is sent, a search skips it.

use std::collections::{BTreeMap, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use futures::future::join_all;
use shoal_proto::{CollectionName, ErrorCode, NodeId, ShoalError, v1};
use tracing::Instrument;

use crate::client::{PeerSettings, ShardClient};
use crate::error::{Error, Result};
use crate::outstanding::Outstanding;
use crate::pool::{Connector, ShardPool};
use crate::routing::{Part, group_ids, split};
use crate::validate::{self, Limits};
use shoal_control::conversions::{collection_info as info, damaged_copy};
use shoal_control::metadata::{MetaError, MetadataStore, StoreHealth, Versioned, View, place_replicas};
use shoal_control::model::{Collection, CollectionSpec, FieldIndexSpec, IndexParams, Metric, ReplicaState, Replication, ShardPlacement};

/// Coordinator behaviour (configured in `[coordinator]`).
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// This coordinator's name in status, logs and the controller election.
    pub coordinator_id: String,
    pub default_shards: u32,
    pub search_timeout: Duration,
    pub write_timeout: Duration,
    /// Status, describe and other reads of shard statistics.
    pub status_timeout: Duration,
    pub limits: Limits,
    pub peers: PeerSettings,
    /// A node whose lease has been gone this long has its out-of-sync
    /// copies re-created on other nodes (docs/replication.md).
    pub repair_after: Duration,
    /// A copy no placement names is dropped once the controller has seen
    /// it so for this long (`reclaim.rs`); `None`: never (without etcd,
    /// where the nodes' shards are the record of the collections).
    pub reclaim_after: Option<Duration>,
    /// The reclaim pass restores a shard whose only in-sync copy is
    /// damaged from its newest snapshot (`restore_damaged.rs`).
    pub restore_damaged: bool,
    /// When a read asks a second replica of a shard.
    pub hedge: Hedge,
}

/// When a read of a replicated shard asks another replica as well as the
/// first (docs/replication.md, "Reads").
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Hedge {
    /// Only when the first one fails.
    Off,
    /// After the first replica's recent p95 answer time.
    RecentP95,
    /// After a fixed delay.
    After(Duration),
}

/// The hedge delay of a node no read has heard from yet.
const HEDGE_BEFORE_ANY_ANSWER: Duration = Duration::from_millis(50);

/// Hedges below this would double the load of a fast, healthy cluster for
/// no gain: the answer is on its way.
const HEDGE_AT_LEAST: Duration = Duration::from_millis(2);
/// How long a read waits for a replica the prober marked down, asked
/// because no other replica answered (see `scatter_until`).
const SUSPECT_GRACE: Duration = Duration::from_millis(250);

impl Default for ClusterOptions {
    fn default() -> Self {
        ClusterOptions {
            coordinator_id: "coordinator".into(),
            default_shards: 3,
            search_timeout: Duration::from_secs(2),
            write_timeout: Duration::from_secs(120),
            status_timeout: Duration::from_secs(1),
            limits: Limits::default(),
            peers: PeerSettings::default(),
            repair_after: Duration::from_secs(300),
            reclaim_after: None,
            restore_damaged: true,
            hedge: Hedge::RecentP95,
        }
    }
}

/// Creating, dropping and reading offsets are quick on a node that
/// answers; this bounds them on one that does not.
const ADMIN_TIMEOUT: Duration = Duration::from_secs(30);

/// How long a scatter waits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Until {
    /// For every shard's answer or failure.
    All,
    /// Until the first failure, if one comes before every answer.
    FirstFailure,
}

/// What came back from a scatter.
pub(crate) struct Gathered<T> {
    pub(crate) answers: Vec<(u32, T)>,
    /// Which node gave each answer, in the same order.
    pub(crate) by: Vec<(u32, NodeId)>,
    pub(crate) failures: Vec<(u32, NodeId, Error)>,
}

/// The cluster as one coordinator sees it.
pub struct Cluster {
    pub(crate) meta: Arc<dyn MetadataStore>,
    pool: Arc<ShardPool>,
    outstanding: Outstanding,
    follower: tokio::task::JoinHandle<()>,
    pub(crate) opts: ClusterOptions,
}

impl Drop for Cluster {
    fn drop(&mut self) {
        self.follower.abort();
    }
}

/// Every copy of every shard of `c`: (shard, node).
pub(crate) fn replica_nodes(c: &Collection) -> impl Iterator<Item = (u32, NodeId)> + '_ {
    c.shards.iter().enumerate().flat_map(|(i, p)| p.nodes().map(move |n| (i as u32, n.clone())))
}

/// A create request's replication, checked; 0 is the default of each.
pub(crate) fn replication_of(factor: u32, min_in_sync: u32) -> Result<Replication> {
    let factor = factor.max(1);
    let min_in_sync = min_in_sync.max(1);
    if min_in_sync > factor {
        return Err(Error::Invalid(format!("min_in_sync {min_in_sync} is above the replication factor {factor}")));
    }
    if factor > MAX_REPLICATION_FACTOR {
        return Err(Error::Invalid(format!("replication factor {factor} is above the limit of {MAX_REPLICATION_FACTOR}")));
    }
    Ok(Replication { factor, min_in_sync })
}

/// Copies beyond a handful buy no availability and multiply every write.
const MAX_REPLICATION_FACTOR: u32 = 8;

/// The time a call may take: the operation's own bound, or less if the
/// caller's deadline comes first.
pub fn bounded(default: Duration, caller: Option<Duration>) -> Duration {
    caller.map_or(default, |c| c.min(default))
}

impl Cluster {
    /// A cluster served from `meta`'s view, with a client (made by
    /// `connector`) and a health prober for every member it lists, now and
    /// as membership changes (so it must be made inside a tokio runtime).
    pub fn new(meta: Arc<dyn MetadataStore>, connector: Box<dyn Connector>, opts: ClusterOptions) -> Self {
        let pool = Arc::new(ShardPool::new(connector, &opts.peers));
        let follower = pool.follow(meta.watch());
        Cluster { meta, pool, outstanding: Outstanding::default(), follower, opts }
    }

    pub fn options(&self) -> &ClusterOptions {
        &self.opts
    }

    pub(crate) fn outstanding(&self) -> &Outstanding {
        &self.outstanding
    }

    pub(crate) fn client(&self, node: &NodeId) -> Result<ShardClient> {
        self.pool.get(node).or_else(|e| {
            // The view may be newer than the pool (its follower runs as a
            // task): a member the caller just saw must not look absent.
            let view = self.meta.view();
            if !view.members.contains_key(node) {
                return Err(e);
            }
            self.pool.sync(&view.members);
            self.pool.get(node)
        })
    }

    /// Runs `call` against `node`, unless the node is marked down; ends it
    /// early if the node is marked down meanwhile. The call's failure
    /// becomes an `Error::Remote`, keeping the node's code and hint.
    pub(crate) async fn on_node<T>(&self, node: &NodeId, call: impl Future<Output = Result<T, ShoalError>>) -> Result<T> {
        let liveness = self.pool.liveness();
        liveness.check(node)?;
        tokio::select! {
            r = call => Ok(r?),
            e = liveness.down(node) => Err(e),
        }
    }

    /// How long a read waits for `node` before asking another replica as
    /// well; `None` if reads are not hedged.
    fn hedge_delay(&self, node: &NodeId) -> Option<Duration> {
        match self.opts.hedge {
            Hedge::Off => None,
            Hedge::After(d) => Some(d),
            Hedge::RecentP95 => Some(self.outstanding.p95(node).unwrap_or(HEDGE_BEFORE_ANY_ANSWER).max(HEDGE_AT_LEAST)),
        }
    }

    /// What the health probes say of each node.
    pub fn liveness(&self) -> &crate::liveness::Liveness {
        self.pool.liveness()
    }

    /// False while the node is marked down by its health probe.
    pub(crate) fn node_up(&self, node: &NodeId) -> bool {
        self.pool.liveness().health(node).up
    }

    pub(crate) fn collection(&self, name: &str) -> Result<Collection> {
        self.versioned(name).map(|v| v.value)
    }

    /// The collection as last seen, with the revision to base a change on.
    pub(crate) fn versioned(&self, name: &str) -> Result<Versioned<Collection>> {
        let name = CollectionName::parse(name)?;
        self.meta.view().collection(&name).cloned().ok_or(Error::CollectionNotFound(name))
    }

    pub(crate) fn shard_id(c: &Collection, shard: u32) -> Option<v1::ShardId> {
        Some(v1::ShardId { collection: c.name.to_string(), shard })
    }

    /// Learns the collections from the shards the nodes hold. Returns the
    /// nodes that could not be asked (their shards are unknown until a
    /// later call).
    pub async fn discover(&self) -> Vec<(NodeId, Error)> {
        let view = self.meta.view();
        let members: Vec<&shoal_control::model::Member> = view.members.values().collect();
        let replies = join_all(members.iter().map(|m| async move {
            let c = self.client(&m.id)?;
            Ok::<_, Error>(c.list_shards(v1::ListShardsRequest {}, Duration::from_secs(5)).await?)
        }))
        .await;
        // Per collection: its spec, and each shard's node and epoch.
        type Found = (v1::ShardSpec, BTreeMap<u32, (NodeId, u64)>, Vec<FieldIndexSpec>);
        let mut found: BTreeMap<CollectionName, Found> = BTreeMap::new();
        let mut failed = Vec::new();
        for (m, reply) in members.iter().zip(replies) {
            match reply {
                Ok(list) => {
                    for s in list.shards {
                        let (Some(id), Some(spec)) = (s.shard, s.spec) else { continue };
                        let Ok(name) = CollectionName::parse(&id.collection) else { continue };
                        // The indexes every copy was declared with; a copy
                        // missing one narrows them (filters on it would fail there).
                        let fields: Vec<FieldIndexSpec> = s
                            .field_indexes
                            .iter()
                            .filter_map(|f| FieldIndexSpec::try_from(v1::FieldIndex { field: f.field.clone(), r#type: f.r#type }).ok())
                            .collect();
                        let entry = found.entry(name).or_insert_with(|| (spec, BTreeMap::new(), fields.clone()));
                        entry.2.retain(|f| fields.contains(f));
                        entry.1.insert(id.shard, (m.id.clone(), s.epoch.max(1)));
                    }
                }
                Err(e) => failed.push((m.id.clone(), e)),
            }
        }
        for (name, (spec, shards, fields)) in found {
            let count = spec.shard_count;
            // Only complete collections are served: a missing shard would
            // silently drop a part of every result.
            if count == 0 || (0..count).any(|i| !shards.contains_key(&i)) {
                tracing::warn!(collection = %name, have = shards.len(), want = count, "collection incomplete; not served yet");
                continue;
            }
            let spec = match CollectionSpec::try_from(spec) {
                Ok(spec) => spec,
                Err(e) => {
                    tracing::warn!(collection = %name, error = %e, "shards with a spec this coordinator cannot read; not served");
                    continue;
                }
            };
            // The epoch the shard is at: a write stamped lower would be refused.
            let shards = (0..count).map(|i| ShardPlacement::at(shards[&i].0.clone(), shards[&i].1)).collect();
            // Adopted shards are one copy each: a node lists what it holds,
            // not which other nodes hold copies of it.
            let c = Collection { name: name.clone(), spec, replication: Default::default(), shards, fields };
            match self.meta.create_collection(c).await {
                Ok(_) | Err(MetaError::AlreadyExists(_)) => {}
                Err(e) => tracing::warn!(collection = %name, error = %e, "could not record a collection found on the nodes"),
            }
        }
        failed
    }

    pub async fn create_collection(&self, req: v1::CreateCollectionRequest) -> Result<v1::CollectionInfo> {
        let v1::CreateCollectionRequest { name, dimension, metric, shard_count, index, replication_factor, min_in_sync, field_indexes } =
            req;
        let name = CollectionName::parse(&name)?;
        let mut fields = Vec::with_capacity(field_indexes.len());
        for f in field_indexes {
            let f = FieldIndexSpec::try_from(f).map_err(|e| Error::Invalid(e.message))?;
            if fields.iter().any(|g: &FieldIndexSpec| g.field == f.field) {
                return Err(Error::Invalid(format!("field {} is indexed twice", f.field)));
            }
            fields.push(f);
        }
        if fields.len() > crate::filtered::MAX_FIELD_INDEXES {
            return Err(Error::Invalid(format!("a collection keeps at most {} field indexes", crate::filtered::MAX_FIELD_INDEXES)));
        }
        fields.sort_by(|a, b| a.field.cmp(&b.field));
        if dimension == 0 || dimension > 65_536 {
            return Err(Error::Invalid(format!("dimension must be 1 to 65536, got {dimension}")));
        }
        // The conversion's error is the request's, not a shard node's.
        let metric = Metric::try_from(metric).map_err(|e| Error::Invalid(e.message))?;
        let shard_count = if shard_count == 0 { self.opts.default_shards } else { shard_count };
        let max_shards = self.opts.limits.max_shards_per_collection;
        if shard_count > max_shards {
            return Err(Error::TooLarge(format!(
                "a collection may have at most {max_shards} shards (coordinator.limits.max_shards_per_collection), \
                 {shard_count} were asked for"
            )));
        }
        let replication = replication_of(replication_factor, min_in_sync)?;
        let view = self.meta.view();
        if view.collection(&name).is_some() {
            return Err(Error::CollectionExists(name));
        }
        let spec = CollectionSpec { dimension, metric, index: IndexParams::from(index), shard_count };
        let placement = place_replicas(shard_count, replication.factor, view.placeable(), view.collections.values().map(|v| &v.value));
        if placement.len() < shard_count as usize {
            return Err(Error::NoCapacity);
        }
        if placement.iter().any(|nodes| nodes.len() < replication.factor as usize) {
            return Err(Error::Precondition(format!(
                "replication factor {} needs as many serving nodes; the cluster has {}",
                replication.factor,
                placement.iter().map(Vec::len).max().unwrap_or(0)
            )));
        }
        // All or nothing: a node known to be down would fail its part.
        if let Some(e) = placement.iter().flatten().find_map(|n| self.pool.liveness().check(n).err()) {
            return Err(e.context(format!("creating collection {name}: nothing was created")));
        }
        let c = Collection {
            name: name.clone(),
            spec,
            replication,
            shards: placement.into_iter().map(|nodes| ShardPlacement::on_all(nodes, 1)).collect(),
            fields,
        };
        let wire_spec = v1::ShardSpec::from(spec);
        let wire_fields: Vec<v1::FieldIndex> = c.fields.iter().map(shoal_control::conversions::field_index_to_wire).collect();
        let copies: Vec<(u32, NodeId)> = replica_nodes(&c).collect();
        let wire_fields = &wire_fields;
        let created = join_all(copies.iter().map(|(i, node)| {
            let c = &c;
            async move {
                let client = self.client(node)?;
                let req = v1::CreateShardRequest {
                    shard: Self::shard_id(c, *i),
                    spec: Some(wire_spec),
                    epoch: c.shards[*i as usize].epoch,
                    field_indexes: wire_fields.clone(),
                };
                self.on_node(node, client.create_shard(req, ADMIN_TIMEOUT)).await
            }
        }))
        .await;
        if let Some((k, Err(e))) = created.iter().enumerate().find(|(_, r)| r.is_err()) {
            let made = copies.iter().zip(&created).filter(|(_, r)| r.is_ok()).map(|(copy, _)| copy.clone());
            self.undo_create(&c, made).await;
            let (i, node) = &copies[k];
            return Err(e.clone().context(format!("creating shard {i} on node {node}")));
        }
        // Recorded last: a collection in the store always has its shards.
        if let Err(e) = self.meta.create_collection(c.clone()).await {
            self.undo_create(&c, copies.into_iter()).await;
            return Err(Error::from(e).context(format!("creating collection {name}: nothing was created")));
        }
        Ok(info(&c, Vec::new()))
    }

    /// Drops the copies of a create that failed; creation is all or nothing.
    async fn undo_create(&self, c: &Collection, copies: impl Iterator<Item = (u32, NodeId)>) {
        join_all(copies.map(|(j, node)| async move {
            if let Ok(client) = self.client(&node) {
                let req = v1::DropShardRequest { shard: Self::shard_id(c, j), copy: 0 };
                if let Err(e) = client.drop_shard(req, ADMIN_TIMEOUT).await {
                    tracing::warn!(collection = %c.name, shard = j, %node, error = %e, "could not undo a shard of a failed create");
                }
            }
        }))
        .await;
    }

    pub async fn drop_collection(&self, name: &str) -> Result<()> {
        let Versioned { value: c, revision } = self.versioned(name)?;
        let copies: Vec<(u32, NodeId)> = replica_nodes(&c).collect();
        let results = join_all(copies.iter().map(|(i, node)| {
            let c = &c;
            async move {
                let client = self.client(node)?;
                let req = v1::DropShardRequest { shard: Self::shard_id(c, *i), copy: 0 };
                match self.on_node(node, client.drop_shard(req, ADMIN_TIMEOUT)).await {
                    Err(e) if e.code() == ErrorCode::NotFound => Ok(()),
                    other => other.map(|_| ()),
                }
            }
        }))
        .await;
        for ((i, node), r) in copies.iter().zip(results) {
            let Err(e) = r else { continue };
            // An out-of-sync copy is often on a node that is gone: it must
            // not keep the collection alive. An in-sync one must go.
            if c.shards[*i as usize].replica(node).is_some_and(|r| r.state == ReplicaState::Active) {
                return Err(e.context(format!("dropping collection {}", c.name)));
            }
            tracing::warn!(collection = %c.name, shard = i, %node, error = %e, "could not drop an out-of-sync replica; its files stay on that node");
        }
        // A copy a move was making (or leaving) is in no placement: drop it
        // too, or it would outlive its collection on that node's disk.
        for (i, p) in c.shards.iter().enumerate() {
            let Some(m) = &p.moving else { continue };
            let other = if p.holds(&m.to) { &m.from } else { &m.to };
            if let Ok(client) = self.client(other) {
                let req = v1::DropShardRequest { shard: Self::shard_id(&c, i as u32), copy: 0 };
                if let Err(e) = self.on_node(other, client.drop_shard(req, ADMIN_TIMEOUT)).await
                    && e.code() != ErrorCode::NotFound
                {
                    tracing::warn!(collection = %c.name, shard = i, node = %other, error = %e, "could not drop a moving shard's other copy");
                }
            }
        }
        match self.meta.delete_collection(c.name.clone(), revision).await {
            Ok(()) | Err(MetaError::NotFound(_)) => Ok(()),
            Err(e) => Err(Error::from(e).context(format!("dropped the shards of {}, but not the collection", c.name))),
        }
    }

    pub fn list_collections(&self) -> Vec<v1::CollectionInfo> {
        self.meta.view().collections.values().map(|c| info(&c.value, Vec::new())).collect()
    }

    /// A collection with the live state of each shard.
    pub async fn describe(&self, name: &str, caller: Option<Duration>) -> Result<v1::CollectionInfo> {
        let c = self.collection(name)?;
        let stats = self.shard_stats(&c, bounded(self.opts.status_timeout, caller)).await;
        Ok(info(&c, stats))
    }

    async fn shard_stats(&self, c: &Collection, timeout: Duration) -> Vec<v1::ShardInfo> {
        let g =
            self.scatter(c, timeout, |client, shard, timeout| async move {
                client.get_shard_stats(v1::ShardStatsRequest { shard }, timeout).await
            })
            .await;
        let view = self.meta.view();
        let up = |n: &NodeId| view.member(n).is_some() && self.node_up(n);
        let mut out: Vec<v1::ShardInfo> = c
            .shards
            .iter()
            .enumerate()
            .map(|(i, p)| v1::ShardInfo {
                shard: i as u32,
                node: p.node().to_string(),
                replicas: shoal_control::conversions::replicas_info(p, up),
                epoch: p.epoch,
                moving: p.moving.as_ref().map(|m| crate::moves::move_info(&c.name, i as u32, m, m.phase.as_str())),
                ..Default::default()
            })
            .collect();
        for (i, s) in g.answers {
            let o = &mut out[i as usize];
            o.available = true;
            o.points = s.points;
            o.tombstones = s.tombstones;
            o.disk_bytes = s.disk_bytes;
            o.field_indexes = s.field_indexes;
        }
        out
    }

    /// Calls `f` for every shard of `c` concurrently, each with `timeout`
    /// (which `f` hands to the node); nodes marked down fail at once.
    pub(crate) async fn scatter<T, F, Fut>(&self, c: &Collection, timeout: Duration, f: F) -> Gathered<T>
    where
        F: Fn(ShardClient, Option<v1::ShardId>, Duration) -> Fut,
        Fut: Future<Output = Result<T, ShoalError>>,
    {
        self.scatter_until(c, timeout, Until::All, f).await
    }

    /// [`Cluster::scatter`], which with `Until::FirstFailure` returns as
    /// soon as one shard fails: the calls still running are dropped, which
    /// cancels them on their nodes, so a search that cannot succeed neither
    /// keeps its caller waiting for the slowest shard nor keeps the other
    /// nodes computing.
    pub(crate) async fn scatter_until<T, F, Fut>(&self, c: &Collection, timeout: Duration, until: Until, f: F) -> Gathered<T>
    where
        F: Fn(ShardClient, Option<v1::ShardId>, Duration) -> Fut,
        Fut: Future<Output = Result<T, ShoalError>>,
    {
        use futures::StreamExt;
        let f = &f;
        let mut running: futures::stream::FuturesUnordered<_> = (0..c.shard_count()).map(|i| self.read_shard(c, i, timeout, f)).collect();
        let mut g = Gathered { answers: Vec::new(), by: Vec::new(), failures: Vec::new() };
        while let Some((i, node, r)) = running.next().await {
            match r {
                Ok(v) => {
                    g.answers.push((i, v));
                    g.by.push((i, node));
                }
                Err(e) => {
                    g.failures.push((i, node, e));
                    if until == Until::FirstFailure {
                        break;
                    }
                }
            }
        }
        g.answers.sort_by_key(|a| a.0);
        g.by.sort_by_key(|a| a.0);
        g
    }

    /// Reads shard `i` of `c` from one of its in-sync replicas: `f` is
    /// called with a replica's client, the shard's id and the time left of
    /// `timeout`. Returns the shard, the node that answered (or the one
    /// whose failure is the shard's, see `replicas_failed`) and the answer.
    ///
    /// A replica that fails for any reason but the request's own fault is
    /// replaced by the next one at once: a node that is down or restarting
    /// (UNAVAILABLE), and equally a copy whose data is damaged on disk
    /// (DATA_LOSS), which another copy of the shard still serves. The
    /// shard fails only once every replica did (see `replicas_failed`).
    fn read_shard<'a, T, F, Fut>(
        &'a self,
        c: &'a Collection,
        i: u32,
        timeout: Duration,
        f: &'a F,
    ) -> impl Future<Output = (u32, NodeId, Result<T>)> + 'a
    where
        F: Fn(ShardClient, Option<v1::ShardId>, Duration) -> Fut,
        Fut: Future<Output = Result<T, ShoalError>> + 'a,
        T: 'a,
    {
        use futures::StreamExt;
        // The in-sync replicas, least busy first: the next one is
        // asked when one fails, or as well when one is slower than its
        // recent p95 (a hedge), within the same deadline.
        // Replicas the prober marked down go last: its verdict is a
        // suspicion (a probe that timed out on a busy node), so they
        // are still asked once every other replica failed.
        let (up, down): (Vec<_>, Vec<_>) =
            self.outstanding.least_busy_first(c.shards[i as usize].in_sync_nodes()).into_iter().partition(|n| self.node_up(n));
        let replicas: Vec<(NodeId, bool)> = up.into_iter().map(|n| (n, true)).chain(down.into_iter().map(|n| (n, false))).collect();
        let span = tracing::info_span!("shard", collection = %c.name, shard = i, node = tracing::field::Empty);
        async move {
            let started = tokio::time::Instant::now();
            // `gated`: the call fails at once if the prober marks the
            // node down, so that another replica is asked instead; not
            // the last replica's, which has no one to give way to. A
            // replica already marked down (asked only because every
            // other failed) gets SUSPECT_GRACE: a busy node whose probe
            // timed out answers a search in milliseconds, a stopped
            // one never, and the search must not wait its deadline.
            let ask = |(node, up): (NodeId, bool), last: bool| {
                let gated = up && !last;
                tracing::Span::current().record("node", tracing::field::display(&node));
                let tracked = self.outstanding.track(&node);
                let mut left = timeout.saturating_sub(started.elapsed());
                if !up {
                    left = left.min(SUSPECT_GRACE);
                }
                // Made inside the span, so the call carries its trace context.
                let call = self.client(&node).map(|cl| f(cl, Self::shard_id(c, i), left));
                async move {
                    let _tracked = tracked;
                    let asked = tokio::time::Instant::now();
                    let r = match call {
                        Ok(fut) if gated => self.on_node(&node, fut).await,
                        Ok(fut) if up => fut.await.map_err(Error::from),
                        // Its own deadline (the grace) ends the call on
                        // its side; a stopped node ends it on ours.
                        Ok(fut) => match tokio::time::timeout(left, fut).await {
                            Ok(Ok(v)) => Ok(v),
                            Ok(Err(e)) if e.code != ErrorCode::DeadlineExceeded => Err(Error::from(e)),
                            Ok(Err(_)) | Err(_) => Err(self.pool.liveness().check(&node).err().map_or_else(
                                || Error::Deadline(format!("node {node} did not answer within {left:?}")),
                                |e| e.context(format!("asked anyway, no answer within {left:?}")),
                            )),
                        },
                        Err(e) => Err(e),
                    };
                    if r.is_ok() {
                        self.outstanding.answered(&node, asked.elapsed());
                    }
                    (node, r)
                }
            };
            let mut waiting = replicas.into_iter();
            let mut running = futures::stream::FuturesUnordered::new();
            let mut hedge_at = None;
            if let Some(node) = waiting.next() {
                hedge_at = self.hedge_delay(&node.0).map(|d| started + d);
                running.push(ask(node, waiting.len() == 0));
            }
            let mut failed: Vec<(NodeId, Error)> = Vec::new();
            loop {
                let more = waiting.len() > 0 && started.elapsed() < timeout;
                let hedge = async {
                    match hedge_at {
                        Some(at) if more => tokio::time::sleep_until(at).await,
                        _ => std::future::pending().await,
                    }
                };
                tokio::select! {
                    done = running.next() => {
                        let Some((node, r)) = done else { break };
                        match r {
                            Ok(v) => return (i, node, Ok(v)),
                            // The request's own fault: another replica says the same.
                            Err(e) if matches!(e.code(), ErrorCode::InvalidArgument | ErrorCode::ResourceExhausted) => {
                                return (i, node, Err(e));
                            }
                            Err(e) => {
                                tracing::debug!(shard = i, %node, code = ?e.code(), error = %e, "replica failed; the next one, if any, is asked");
                                failed.push((node, e));
                            }
                        }
                        // Fail over: a replica is out, ask the next one now.
                        if let Some(next) = waiting.next().filter(|_| more) {
                            hedge_at = self.hedge_delay(&next.0).map(|d| tokio::time::Instant::now() + d);
                            running.push(ask(next, waiting.len() == 0));
                        }
                    }
                    () = hedge => {
                        if let Some(next) = waiting.next() {
                            tracing::debug!(shard = i, node = %next.0, "hedged read");
                            hedge_at = self.hedge_delay(&next.0).map(|d| tokio::time::Instant::now() + d);
                            running.push(ask(next, waiting.len() == 0));
                        }
                    }
                }
            }
            match replicas_failed(failed) {
                Some((node, e)) => (i, node, Err(e)),
                None => (i, c.node_of(i).clone(), Err(Error::Internal(format!("shard {i} has no replica in sync")))),
            }
        }
        .instrument(span)
    }

    /// Writes a batch: splits it by shard and applies the parts
    /// concurrently; returns once every part is committed. With a source,
    /// every shard receives its part (possibly empty) so that every shard
    /// records the source's offset.
    pub async fn write(
        &self,
        collection: &str,
        points: Vec<v1::Point>,
        deletes: Vec<u64>,
        source: Option<v1::SourceOffset>,
        caller: Option<Duration>,
    ) -> Result<Written> {
        self.write_where(collection, points, deletes, None, source, caller).await
    }

    /// [`Cluster::write`], deleting also every point that matches
    /// `delete_filter` (on every shard, before the batch's points).
    pub async fn write_where(
        &self,
        collection: &str,
        points: Vec<v1::Point>,
        deletes: Vec<u64>,
        delete_filter: Option<DeleteFilter>,
        source: Option<v1::SourceOffset>,
        caller: Option<Duration>,
    ) -> Result<Written> {
        let c = self.collection(collection)?;
        tracing::info_span!("validate", points = points.len(), deletes = deletes.len()).in_scope(|| {
            validate::write(&points, &deletes, delete_filter.is_some(), &c.spec, &self.opts.limits)?;
            if let Some(s) = &source {
                validate::source(s, &self.opts.limits)?;
            }
            if let Some(d) = &delete_filter {
                crate::filtered::check_filter(&c, &d.filter, d.allow_unindexed)?;
            }
            Ok::<_, Error>(())
        })?;
        let parts = tracing::info_span!("split", shards = c.shard_count()).in_scope(|| split(points, deletes, c.shard_count()));
        // Every shard may hold points the filter matches.
        let everywhere = source.is_some() || delete_filter.is_some();
        let targets: Vec<(u32, Part)> =
            parts.into_iter().enumerate().filter(|(_, p)| everywhere || !p.is_empty()).map(|(i, p)| (i as u32, p)).collect();
        // Fail before anything is sent when a node is known to be down:
        // otherwise the parts for the nodes that answer would commit and
        // the caller would hold a half-applied write.
        // (A shard with other replicas in sync writes to those instead.)
        for (i, _) in &targets {
            let p = &c.shards[*i as usize];
            if p.in_sync().nth(1).is_some() {
                continue;
            }
            let node = p.node();
            if let Err(e) = self.client(node).and_then(|_| self.pool.liveness().check(node)) {
                return Err(e.context(format!("shard {i}: nothing was written")));
            }
        }
        let timeout = bounded(self.opts.write_timeout, caller);
        let deadline = tokio::time::Instant::now() + timeout;
        let calls = targets.into_iter().map(|(i, part)| {
            let span = tracing::info_span!("shard", collection = %c.name, shard = i, node = %c.node_of(i), points = part.points.len());
            let req = v1::ApplyBatchRequest {
                shard: Self::shard_id(&c, i),
                source: source.clone(),
                points: part.points,
                deletes: part.deletes,
                // Fencing: a node that has been told of a newer placement
                // (a move) refuses this write instead of acknowledging it.
                epoch: c.shards[i as usize].epoch,
                return_entry: false,
                delete_filter: delete_filter.as_ref().map(|d| d.filter.clone()),
                allow_unindexed: delete_filter.as_ref().is_some_and(|d| d.allow_unindexed),
            };
            let placement = c.shards[i as usize].clone();
            let (name, min_in_sync) = (&c.name, c.replication.min_in_sync);
            async move { self.apply_replicated(name, i, placement, req, min_in_sync, deadline).await.map(|a| (i, a)) }.instrument(span)
        });
        let mut w = Written::default();
        let mut committed = Vec::new();
        let mut errors = Vec::new();
        for r in join_all(calls).await {
            match r {
                Ok((i, a)) => {
                    committed.push(i);
                    if a.status == v1::BatchStatus::Applied as i32 {
                        w.applied = true;
                    }
                    w.upserted += a.upserted;
                    w.deleted += a.deleted;
                    w.missing += a.missing;
                }
                Err(e) => errors.push(e),
            }
        }
        let Some(first) = errors.into_iter().next() else { return Ok(w) };
        // Parts that committed stay; the caller retries the batch, and the
        // shards that have it skip it by its offset (or, without one,
        // apply the same upserts and deletes again, which changes nothing).
        if committed.is_empty() {
            return Err(first.context("nothing was written"));
        }
        committed.sort_unstable();
        let done: Vec<String> = committed.iter().map(u32::to_string).collect();
        Err(first.context(format!("the write is incomplete (shards {} committed their parts): retry it", done.join(", "))))
    }

    /// Waits until the store's view places `shard` at an epoch above
    /// `epoch` (asking the store itself first), or the deadline passes.
    pub(crate) async fn newer_placement(
        &self,
        collection: &CollectionName,
        shard: u32,
        epoch: u64,
        deadline: tokio::time::Instant,
    ) -> Result<ShardPlacement, ()> {
        let newer =
            |view: &View| view.collection(collection).and_then(|c| c.value.shards.get(shard as usize)).filter(|p| p.epoch > epoch).cloned();
        let mut views = self.meta.watch();
        if let Ok(Ok(view)) = tokio::time::timeout_at(deadline, self.meta.sync()).await
            && let Some(p) = newer(&view)
        {
            return Ok(p);
        }
        loop {
            if let Some(p) = newer(&views.borrow_and_update()) {
                return Ok(p);
            }
            match tokio::time::timeout_at(deadline, views.changed()).await {
                Ok(Ok(())) => {}
                _ => return Err(()),
            }
        }
    }

    pub async fn ingest(&self, req: v1::IngestRequest, caller: Option<Duration>) -> Result<v1::IngestAck> {
        let v1::IngestRequest { collection, source, offset, points, deletes, delete_filter, allow_unindexed } = req;
        let at = |e: Error| e.context(format!("batch {source}@{offset}"));
        let delete_filter = delete_filter.map(|filter| DeleteFilter { filter, allow_unindexed });
        let w = self
            .write_where(&collection, points, deletes, delete_filter, Some(v1::SourceOffset { source: source.clone(), offset }), caller)
            .await
            .map_err(at)?;
        Ok(v1::IngestAck {
            status: if w.applied { v1::BatchStatus::Applied } else { v1::BatchStatus::Skipped } as i32,
            source,
            offset,
            upserted: w.upserted,
            deleted: w.deleted,
            missing: w.missing,
        })
    }

    /// Where each source stands: the lowest offset over the shards (a source
    /// some shard has not seen is not reported: the job starts it over).
    pub async fn offsets(&self, req: v1::GetOffsetsRequest, caller: Option<Duration>) -> Result<v1::GetOffsetsResponse> {
        let c = self.collection(&req.collection)?;
        let g = self
            .scatter(&c, bounded(Duration::from_secs(10), caller), |client, shard, timeout| async move {
                client.get_shard_stats(v1::ShardStatsRequest { shard }, timeout).await
            })
            .await;
        if let Some((i, node, e)) = g.failures.into_iter().next() {
            return Err(e.context(format!("reading offsets of shard {i} on node {node}")));
        }
        let mut per_source: BTreeMap<String, (u64, u32)> = BTreeMap::new();
        for (_, stats) in &g.answers {
            for o in &stats.offsets {
                let e = per_source.entry(o.source.clone()).or_insert((u64::MAX, 0));
                e.0 = e.0.min(o.offset);
                e.1 += 1;
            }
        }
        let offsets = per_source
            .into_iter()
            .filter(|(name, (_, seen))| *seen == c.shard_count() && (req.sources.is_empty() || req.sources.contains(name)))
            .map(|(source, (offset, _))| v1::SourceOffset { source, offset })
            .collect();
        Ok(v1::GetOffsetsResponse { offsets })
    }

    pub async fn get(&self, req: v1::GetRequest, caller: Option<Duration>) -> Result<v1::GetResponse> {
        let v1::GetRequest { collection, ids, with_vector } = req;
        let c = self.collection(&collection)?;
        if ids.len() > self.opts.limits.max_get_ids {
            return Err(Error::Invalid(format!("{} ids, more than the limit of {}", ids.len(), self.opts.limits.max_get_ids)));
        }
        let timeout = bounded(self.opts.search_timeout, caller);
        let groups = group_ids(&ids, c.shard_count());
        let c = &c;
        // Each shard's ids from any of its in-sync replicas, failing over
        // as a search does: every acknowledged write is on all of them.
        let calls = groups.into_iter().map(|(shard, ids)| async move {
            let read = |client: ShardClient, id: Option<v1::ShardId>, left: Duration| {
                let req = v1::GetPointsRequest { shard: id, ids: ids.clone(), with_vector };
                async move { client.get_points(req, left).await }
            };
            let (i, node, r) = self.read_shard(c, shard, timeout, &read).await;
            r.map_err(|e| e.context(format!("shard {i} on node {node}")))
        });
        let mut found = HashMap::new();
        for r in join_all(calls).await {
            for p in r?.points {
                found.insert(p.id, p);
            }
        }
        let mut points = Vec::new();
        let mut missing = Vec::new();
        for id in ids {
            match found.remove(&id) {
                Some(p) => points.push(p),
                None if points.iter().any(|p: &v1::Point| p.id == id) => {}
                None => missing.push(id),
            }
        }
        Ok(v1::GetResponse { points, missing })
    }

    /// The nodes and every collection's shards, within the status timeout
    /// (or the caller's): everything is asked at once, and a node that does
    /// not answer in time is reported down instead of delaying the answer.
    pub async fn status(&self, caller: Option<Duration>) -> v1::ClusterStatusResponse {
        let timeout = bounded(self.opts.status_timeout, caller);
        let view = self.meta.view();
        let collections: Vec<&Collection> = view.collections.values().map(|v| &v.value).collect();
        let members: Vec<&shoal_control::model::Member> = view.members.values().collect();
        let shards = join_all(collections.iter().map(|c| self.shard_stats(c, timeout)));
        let probes = join_all(members.iter().map(|m| async move {
            let client = self.client(&m.id)?;
            self.on_node(&m.id, client.list_shards(v1::ListShardsRequest {}, timeout)).await
        }));
        let (shards, probes) = tokio::join!(shards, probes);
        let nodes = members
            .iter()
            .zip(probes)
            .map(|(m, p)| v1::NodeInfo {
                id: m.id.to_string(),
                address: m.address.clone(),
                available: p.is_ok(),
                // What the node holds now, or what it last registered.
                shards: p.as_ref().map_or(m.capacity.shards, |l| l.shards.len() as u32),
                damaged: p.as_ref().map_or(Vec::new(), |l| l.damaged.iter().filter_map(damaged_copy).collect()),
                // An operator's drain overrides what the node says.
                state: match view.draining.contains(&m.id) {
                    true if crate::moves::holdings(&view, &m.id).is_empty() => "removable".into(),
                    true => "draining".into(),
                    false => m.state.as_str().into(),
                },
                disk_free_bytes: m.capacity.disk_free_bytes,
            })
            .collect();
        let collections = collections.into_iter().zip(shards).map(|(c, s)| info(c, s)).collect();
        v1::ClusterStatusResponse { nodes, collections, control_plane: Some(self.control_plane(&view)) }
    }

    fn control_plane(&self, view: &View) -> v1::ControlPlane {
        let (reachable, error, unreachable_since_ms) = match self.meta.health() {
            StoreHealth::Connected => (true, String::new(), 0),
            StoreHealth::Unreachable { since, error } => {
                (false, error, since.duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64))
            }
        };
        v1::ControlPlane {
            store: self.meta.kind().into(),
            reachable,
            error,
            unreachable_since_ms,
            controller: view.controller.clone().unwrap_or_default(),
            revision: view.revision,
            coordinator: self.opts.coordinator_id.clone(),
        }
    }
}

/// One shard's failure when every replica asked failed: the last one's
/// error (but see below), naming what the others answered so that an operator sees every
/// replica's reason, not only the last. The code is DATA_LOSS only when
/// every replica's was: if one copy was merely unreachable, a retry may
/// reach it and find the data, so that copy's error (and retry hint) is
/// the shard's.
fn replicas_failed(mut failed: Vec<(NodeId, Error)>) -> Option<(NodeId, Error)> {
    if failed.is_empty() {
        return None;
    }
    let headline = failed.iter().rposition(|(_, e)| e.code() != ErrorCode::DataLoss).unwrap_or(failed.len() - 1);
    let (node, e) = failed.remove(headline);
    if failed.is_empty() {
        return Some((node, e));
    }
    let others: Vec<String> = failed.iter().map(|(n, e)| format!("{n}: {e}")).collect();
    Some((node, e.context(format!("after the other replicas failed ({})", others.join("; ")))))
}

/// A write's delete by filter.
#[derive(Debug, Clone)]
pub struct DeleteFilter {
    pub filter: v1::Filter,
    pub allow_unindexed: bool,
}

/// Sum of a write's part outcomes.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Written {
    /// At least one shard applied its part (false: every shard skipped it).
    pub applied: bool,
    pub upserted: u32,
    pub deleted: u32,
    pub missing: u32,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(s: &str) -> NodeId {
        NodeId::parse(s).unwrap()
    }

    #[test]
    fn data_loss_is_the_shards_error_only_when_every_replica_lost_it() {
        let lost = |n: &str| Error::Remote(ShoalError::new(ErrorCode::DataLoss, format!("shard docs/1 on {n} is damaged")));
        let gone = Error::Remote(ShoalError::unavailable("connection lost", Duration::from_millis(300)));
        assert!(replicas_failed(Vec::new()).is_none());
        // One copy damaged, the other unreachable: a retry may reach the
        // other one, whichever failed last.
        for failed in [vec![(node("a"), lost("a")), (node("b"), gone.clone())], vec![(node("b"), gone.clone()), (node("a"), lost("a"))]] {
            let (n, e) = replicas_failed(failed).unwrap();
            assert_eq!((n.as_str(), e.code(), e.retry_after()), ("b", ErrorCode::Unavailable, Some(Duration::from_millis(300))));
            assert!(e.to_string().contains("a: shard docs/1 on a is damaged"), "the damaged copy is named too: {e}");
        }
        let (n, e) = replicas_failed(vec![(node("a"), lost("a")), (node("b"), lost("b"))]).unwrap();
        assert_eq!((n.as_str(), e.code(), e.retry_after()), ("b", ErrorCode::DataLoss, None));
        assert!(e.to_string().contains("on a is damaged") && e.to_string().contains("on b is damaged"), "{e}");
    }

    #[test]
    fn the_caller_deadline_caps_the_operation_default() {
        let d = Duration::from_secs(2);
        assert_eq!(bounded(d, None), d);
        assert_eq!(bounded(d, Some(Duration::from_millis(300))), Duration::from_millis(300));
        assert_eq!(bounded(d, Some(Duration::from_secs(60))), d);
    }
}
