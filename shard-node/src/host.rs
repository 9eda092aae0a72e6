//! The shards a node owns: their indexes, their writers, their directories.

use std::collections::{HashMap, HashSet};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use parking_lot::{Mutex, RwLock};
use shoal_engine::{Batch, BatchOutcome, Index, IndexOptions, Op, Point, Write, Written};
use shoal_proto::v1;
use shoal_proto::{CollectionName, ShoalError};
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::config::{NodeLimits, ShardNodeConfig};
use crate::convert::{engine_error, params_to_spec, payload_from_engine, payload_to_engine, shard_engine_error, spec_to_params};
use crate::files::shards_the_files_allow;
use crate::search::{Caller, Searches};
use crate::shard_file::{self, SHARD_FILE, ShardFile};
use crate::snapshots::{Snapshots, clean_up_after_restores, wait_for_last_user};
use crate::writer::{Answer, Failure, ShardWriter, Work, WriterOptions};

/// (collection, shard number).
pub type ShardKey = (CollectionName, u32);

/// Why a copy on this node is not served, and since when.
#[derive(Clone, Debug)]
struct Damaged {
    reason: String,
    since_ms: u64,
}

impl Damaged {
    fn now(reason: String) -> Self {
        let since_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
        Damaged { reason, since_ms }
    }
}

pub(crate) struct Shard {
    pub(crate) index: Arc<Index>,
    /// Shards of the collection (stored beside the environment).
    pub(crate) shard_count: u32,
    /// Which copy of the shard this is (`shard_file`).
    pub(crate) copy: u64,
    writer: Mutex<Option<ShardWriter>>,
}

impl Shard {
    /// Queues `work` for the shard's writer and waits for its answer; a
    /// failure names the shard `key`.
    pub(crate) async fn submit(&self, key: &ShardKey, work: Work) -> Result<Answer, ShoalError> {
        // The writer is taken out only by `close`; a part that arrives after
        // that finds the shard gone.
        let tx = self.writer.lock().as_ref().map(ShardWriter::sender);
        let answer = match tx {
            Some(tx) => ShardWriter::submit_via(tx, work).await,
            None => Err(Failure::Service(ShoalError::unavailable("shard is closing", std::time::Duration::from_millis(500)))),
        };
        answer.map_err(|f| match f {
            Failure::Refused(e) => shard_engine_error(key.0.as_str(), key.1, e),
            Failure::Service(e) => shard_error(key)(e),
        })
    }

    async fn close(&self) {
        let writer = self.writer.lock().take();
        if let Some(w) = writer {
            w.close().await;
        }
    }

    /// Batch parts waiting for the writer.
    pub(crate) fn queue_depth(&self) -> usize {
        self.writer.lock().as_ref().map_or(0, ShardWriter::queue_depth)
    }
}

/// Owns every shard of one node. Cheap to share (`Arc`).
pub struct ShardHost {
    root: PathBuf,
    engine: IndexOptions,
    writer: WriterOptions,
    limits: NodeLimits,
    /// `limits.max_shards`, lowered to what the open-file limit carries.
    max_shards: usize,
    shards: RwLock<HashMap<ShardKey, Arc<Shard>>>,
    /// Shards found on disk that failed to open, or that the scrub found
    /// damaged, with why: not served, but named in every request for them
    /// and in `list` until they are restored or dropped.
    broken: RwLock<HashMap<ShardKey, Damaged>>,
    /// Shards being created: they count against `max_shards` already.
    creating: Mutex<HashSet<ShardKey>>,
    searches: Searches,
    closing: AtomicBool,
    pub(crate) snapshots: Option<Snapshots>,
    /// Largest gRPC message the node sends or accepts.
    pub(crate) max_message_bytes: usize,
}

/// A shard's place under the node's limit while it is being created;
/// given back when the create ends, whichever way.
pub(crate) struct Creating<'h> {
    host: &'h ShardHost,
    key: ShardKey,
}

impl Drop for Creating<'_> {
    fn drop(&mut self) {
        self.host.creating.lock().remove(&self.key);
    }
}

fn shard_error(key: &ShardKey) -> impl Fn(ShoalError) -> ShoalError + '_ {
    move |e| e.context(format!("shard {}/{}", key.0, key.1))
}

pub(crate) fn key_of(id: Option<v1::ShardId>) -> Result<ShardKey, ShoalError> {
    let v1::ShardId { collection, shard } = id.ok_or_else(|| ShoalError::invalid("shard id is missing"))?;
    Ok((CollectionName::parse(&collection)?, shard))
}

pub(crate) async fn blocking<T: Send + 'static>(f: impl FnOnce() -> Result<T, ShoalError> + Send + 'static) -> Result<T, ShoalError> {
    tokio::task::spawn_blocking(f).await.map_err(|e| ShoalError::internal(format!("blocking task failed: {e}")))?
}

impl ShardHost {
    /// Opens every shard found under `<data_dir>/shards` and starts its
    /// writer, and the snapshot store.
    pub async fn open(cfg: &ShardNodeConfig) -> anyhow::Result<Arc<ShardHost>> {
        let root = cfg.data_dir.join("shards");
        std::fs::create_dir_all(&root)?;
        let snapshots = Some(Snapshots::open(&cfg.snapshot)?);
        if let Some(s) = &snapshots {
            tracing::info!(store = %s.url(), "snapshot store");
        }
        let mut engine = cfg.engine.index_options();
        // One pool links the batches of every shard: a pool per shard would
        // cost a thread (and its memory) per shard while building nothing.
        if engine.pool.is_none() && engine.build_threads > 1 {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(engine.build_threads - 1)
                .thread_name(|i| format!("shoal-build-{i}"))
                .build()?;
            engine.pool = Some(Arc::new(pool));
        }
        let max_shards = shards_the_files_allow(cfg);
        let host = Arc::new(ShardHost {
            root: root.clone(),
            engine,
            writer: cfg.writer.options(),
            limits: cfg.limits.clone(),
            max_shards,
            shards: RwLock::new(HashMap::new()),
            broken: RwLock::new(HashMap::new()),
            creating: Mutex::new(HashSet::new()),
            searches: Searches::new(&cfg.limits, cfg.max_message_bytes),
            closing: AtomicBool::new(false),
            snapshots,
            max_message_bytes: cfg.max_message_bytes,
        });
        // One damaged shard must not keep the node's other shards from
        // serving: it is left out and named (see `broken`).
        for (key, dir) in find_shards(&root)? {
            let opts = host.engine.clone();
            let opened = tokio::task::spawn_blocking(move || -> anyhow::Result<(Index, ShardFile)> {
                let file = shard_file::read(&dir)?;
                Ok((Index::open(dir, opts)?, file))
            })
            .await?;
            match opened {
                Ok((index, file)) => {
                    host.insert(key, index, file);
                }
                Err(e) => {
                    tracing::error!(
                        collection = %key.0, shard = key.1, error = %format!("{e:#}"),
                        "shard cannot be opened and is not served: restore it from a snapshot (shoalctl snapshot restore --replace) or drop it"
                    );
                    host.broken.write().insert(key, Damaged::now(format!("{e:#}")));
                }
            }
        }
        crate::metrics::watch(&host);
        let held = host.shards.read().len();
        if held > max_shards {
            tracing::warn!(held, max_shards, "this node holds more shards than its limit; it creates no more until some are dropped");
        }
        Ok(host)
    }

    fn insert(&self, key: ShardKey, index: Index, file: ShardFile) -> Arc<Shard> {
        let index = Arc::new(index);
        let writer = ShardWriter::spawn(Arc::clone(&index), self.writer, crate::metrics::labels(&key));
        let ShardFile { shard_count, copy } = file;
        let shard = Arc::new(Shard { index, shard_count, copy, writer: Mutex::new(Some(writer)) });
        // Restored over a damaged copy: served again.
        self.broken.write().remove(&key);
        self.shards.write().insert(key, Arc::clone(&shard));
        shard
    }

    pub(crate) fn dir(&self, key: &ShardKey) -> PathBuf {
        self.root.join(key.0.as_str()).join(key.1.to_string())
    }

    pub(crate) fn engine_options(&self) -> IndexOptions {
        self.engine.clone()
    }

    pub(crate) fn check_open(&self) -> Result<(), ShoalError> {
        if self.closing.load(Ordering::Acquire) {
            return Err(ShoalError::unavailable("node is shutting down", std::time::Duration::from_secs(1)));
        }
        Ok(())
    }

    /// Every shard served now.
    pub(crate) fn shards_now(&self) -> Vec<(ShardKey, Arc<Shard>)> {
        self.shards.read().iter().map(|(k, s)| (k.clone(), Arc::clone(s))).collect()
    }

    /// Takes copy `copy` of `key` out of service as damaged (`why`): every
    /// request for it answers DATA_LOSS from now on, `list` names it, and
    /// the controller has it made again from another replica. False if
    /// that copy is not served here (any more).
    pub(crate) async fn set_damaged(&self, key: &ShardKey, copy: u64, why: String) -> bool {
        let removed = {
            let mut shards = self.shards.write();
            if shards.get(key).is_none_or(|s| s.copy != copy) {
                return false;
            }
            // Named before it goes, so no request finds it merely missing.
            self.broken.write().insert(key.clone(), Damaged::now(why));
            shards.remove(key)
        };
        if let Some(shard) = removed {
            shard.close().await;
            let index = Arc::clone(&shard.index);
            drop(shard);
            wait_for_last_user(index).await;
        }
        true
    }

    pub(crate) fn is_closing(&self) -> bool {
        self.closing.load(Ordering::Acquire)
    }

    pub(crate) fn has(&self, key: &ShardKey) -> bool {
        self.shards.read().contains_key(key)
    }

    /// Takes a shard out of service: no new requests reach it, its queued
    /// batches commit, and its environment closes once the searches in
    /// flight are done. False if the node did not have it.
    pub(crate) async fn take_out(&self, key: &ShardKey) -> bool {
        let Some(shard) = self.shards.write().remove(key) else { return false };
        shard.close().await;
        let index = Arc::clone(&shard.index);
        drop(shard);
        wait_for_last_user(index).await;
        true
    }

    /// Opens the shard in `dir` and serves it.
    pub(crate) async fn reopen(&self, key: &ShardKey, dir: &Path) -> Result<(), ShoalError> {
        let (dir, opts) = (dir.to_owned(), self.engine.clone());
        let (index, file) = blocking(move || {
            let file = shard_file::read(&dir).map_err(|e| ShoalError::internal(e.to_string()))?;
            Ok((Index::open(&dir, opts).map_err(engine_error)?, file))
        })
        .await?;
        self.insert(key.clone(), index, file);
        Ok(())
    }

    pub(crate) fn get(&self, key: &ShardKey) -> Result<Arc<Shard>, ShoalError> {
        self.check_open()?;
        if let Some(shard) = self.shards.read().get(key) {
            return Ok(Arc::clone(shard));
        }
        Err(self.missing(key))
    }

    /// Why `key` is not served here: damaged (DATA_LOSS, with the cause),
    /// or not on this node.
    fn missing(&self, key: &ShardKey) -> ShoalError {
        match self.broken.read().get(key).map(|d| &d.reason) {
            Some(why) => ShoalError::new(
                shoal_proto::ErrorCode::DataLoss,
                format!(
                    "shard {}/{} on this node is damaged and not served ({why}): restore it from its newest snapshot \
                     (`shoalctl snapshot restore {} ID --shard {} --replace`), resync it from another replica, or drop it",
                    key.0, key.1, key.0, key.1
                ),
            ),
            None => ShoalError::not_found(format!("shard {}/{} is not on this node", key.0, key.1)),
        }
    }

    /// Creates a shard at the request's epoch (0: 1), or confirms one that
    /// exists with the same spec (so a coordinator can retry), raising its
    /// epoch to the request's if that is higher. A create that fails leaves
    /// nothing behind.
    pub async fn create_shard(&self, req: v1::CreateShardRequest) -> Result<v1::ShardStats, ShoalError> {
        let v1::CreateShardRequest { shard, spec, epoch, field_indexes } = req;
        let fields = field_indexes
            .into_iter()
            .map(|f| Ok((f.field, shoal_filter::wire::field_type_from_proto(f.r#type)?)))
            .collect::<Result<Vec<_>, ShoalError>>()?;
        let epoch = epoch.max(1);
        let key = key_of(shard)?;
        let spec = spec.ok_or_else(|| ShoalError::invalid("shard spec is missing"))?;
        let params = spec_to_params(&spec)?;
        let shard_count = spec.shard_count;
        if shard_count == 0 || key.1 >= shard_count {
            return Err(ShoalError::invalid(format!("shard {} of a collection of {shard_count} shards", key.1)));
        }
        if shard_count > self.limits.max_shards_per_collection {
            return Err(ShoalError::exhausted(format!(
                "a collection of {shard_count} shards is over this node's limit of {} shards per collection \
                 (shard_node.limits.max_shards_per_collection)",
                self.limits.max_shards_per_collection
            )));
        }
        if let Ok(existing) = self.get(&key) {
            if *existing.index.params() != params || existing.shard_count != shard_count {
                return Err(ShoalError::already_exists(format!(
                    "shard {}/{} exists with {}, not {}",
                    key.0,
                    key.1,
                    existing.index.params(),
                    params
                )));
            }
            if existing.index.stats().map_err(engine_error)?.epoch < epoch {
                existing.submit(&key, Work::Write(Write::Fence { epoch })).await?;
            }
            self.declare_fields(&key, &existing, fields).await?;
            return self.stats_of(&key, &existing).await;
        }
        let Some(_place) = self.reserve(&key)? else {
            return Err(ShoalError::unavailable(
                format!("shard {}/{} is being created by another request", key.0, key.1),
                std::time::Duration::from_millis(200),
            ));
        };
        let dir = self.dir(&key);
        let opts = self.engine.clone();
        let file = ShardFile::new_copy(shard_count);
        let index = blocking(move || {
            let index = create_in(&dir, params, epoch, opts, &file)?;
            // On the empty shard: ready at once, before any point arrives.
            for (field, kind) in &fields {
                index.create_field_index(field, *kind).map_err(engine_error)?;
            }
            Ok(index)
        })
        .await?;
        let shard = self.insert(key.clone(), index, file);
        self.stats_of(&key, &shard).await
    }

    /// Counts a shard being created against the node's limit. `None` if
    /// another request is creating the same shard right now.
    pub(crate) fn reserve(&self, key: &ShardKey) -> Result<Option<Creating<'_>>, ShoalError> {
        let mut creating = self.creating.lock();
        if creating.contains(key) {
            return Ok(None);
        }
        // A create puts its shard in service before its reservation ends
        // (it still answers with the shard's stats): count it once.
        let (held, pending) = {
            let shards = self.shards.read();
            (shards.len(), creating.iter().filter(|k| !shards.contains_key(*k)).count())
        };
        if held + pending >= self.max_shards {
            return Err(ShoalError::exhausted(format!(
                "this node holds {held} shards{} and its limit is {} (shard_node.limits.max_shards, and the \
                 open-file limit); add shard nodes, drop collections or raise the limit",
                if pending == 0 { String::new() } else { format!(" (+{pending} being created)") },
                self.max_shards
            )));
        }
        creating.insert(key.clone());
        Ok(Some(Creating { host: self, key: key.clone() }))
    }

    /// Closes a shard and deletes its data. A request that names a copy
    /// drops only that one: another copy made since (restored, created
    /// again) is refused with FAILED_PRECONDITION and kept.
    pub async fn drop_shard(&self, req: v1::DropShardRequest) -> Result<v1::DropShardResponse, ShoalError> {
        let v1::DropShardRequest { shard, copy } = req;
        let key = key_of(shard)?;
        let other_copy = |here: u64| {
            ShoalError::failed_precondition(format!(
                "shard {}/{} on this node is copy {here:016x}, not {copy:016x}: it was made after the drop was decided, \
                 and is kept",
                key.0, key.1
            ))
        };
        let removed = {
            let mut shards = self.shards.write();
            match shards.get(&key) {
                Some(s) if copy != 0 && s.copy != copy => return Err(other_copy(s.copy)),
                Some(_) => shards.remove(&key),
                None => None,
            }
        };
        match removed {
            Some(shard) => {
                shard.close().await;
                drop(shard);
            }
            // A damaged shard is dropped by removing its files; its shard
            // file, if it still reads, says which copy it is.
            None if self.broken.read().contains_key(&key) => {
                let here = shard_file::read(&self.dir(&key)).map(|f| f.copy).unwrap_or(copy);
                if copy != 0 && here != copy {
                    return Err(other_copy(here));
                }
                self.broken.write().remove(&key);
            }
            None => return Err(ShoalError::not_found(format!("shard {}/{} is not on this node", key.0, key.1))),
        }
        let dir = self.dir(&key);
        blocking(move || {
            std::fs::remove_dir_all(&dir).map_err(|e| ShoalError::internal(format!("removing {}: {e}", dir.display())))?;
            remove_if_empty(dir.parent());
            crate::memory::return_free_memory();
            Ok(())
        })
        .await?;
        Ok(v1::DropShardResponse {})
    }

    /// Applies one batch part; returns once it is committed. A part whose
    /// epoch is below the shard's is refused with FAILED_PRECONDITION; 0
    /// is an unfenced caller.
    pub async fn apply(&self, req: v1::ApplyBatchRequest) -> Result<v1::ApplyBatchResponse, ShoalError> {
        let v1::ApplyBatchRequest { shard, source, points, deletes, epoch, return_entry, delete_filter, allow_unindexed } = req;
        let key = key_of(shard)?;
        let target = self.get(&key)?;
        crate::admit::batch(&key, target.shard_count, &points, &deletes)?;
        let mut ops = Vec::with_capacity(points.len() + deletes.len() + 1);
        if let Some(f) = delete_filter {
            ops.push(Op::DeleteWhere { filter: shoal_filter::wire::from_proto(f)?, allow_unindexed });
        }
        for v1::Point { id, vector, payload } in points {
            ops.push(Op::Upsert(Point { id, vector, payload: payload_to_engine(payload) }));
        }
        ops.extend(deletes.into_iter().map(Op::DeleteIfPresent));
        let source = source.map(|v1::SourceOffset { source, offset }| shoal_engine::SourceOffset { source, offset });
        let span = tracing::info_span!(
            "apply",
            collection = %key.0,
            shard = key.1,
            ops = ops.len(),
            queue_wait_ms = tracing::field::Empty
        );
        let answer = target.submit(&key, Work::Write(Write::Batch { batch: Batch { ops, source }, epoch })).instrument(span).await?;
        let Answer::Written(Written::Batch { outcome, seq }) = answer else {
            return Err(ShoalError::internal(format!("shard {}/{}: the writer answered a batch with something else", key.0, key.1)));
        };
        // Only a replicated shard's primary is asked: an unreplicated write
        // pays no extra read.
        let (entry, last_seq) = if return_entry { self.logged(&key, &target, seq).await? } else { (None, 0) };
        Ok(match outcome {
            BatchOutcome::Applied { upserted, deleted, missing } => v1::ApplyBatchResponse {
                status: v1::BatchStatus::Applied as i32,
                upserted: upserted as u32,
                deleted: deleted as u32,
                missing: missing as u32,
                seq: seq.unwrap_or(0),
                last_seq,
                entry,
            },
            BatchOutcome::Skipped { .. } => {
                v1::ApplyBatchResponse { status: v1::BatchStatus::Skipped as i32, last_seq, ..Default::default() }
            }
        })
    }

    /// The log entry `seq` (none for a skipped batch) and the shard's last
    /// sequence number, read after the batch committed. The entry was
    /// written in that commit, so it is there unless the log is off; then
    /// the replicas cannot be fed and that is an error.
    async fn logged(&self, key: &ShardKey, shard: &Shard, seq: Option<u64>) -> Result<(Option<v1::LogEntry>, u64), ShoalError> {
        let index = Arc::clone(&shard.index);
        let (c, s) = (key.0.to_string(), key.1);
        blocking(move || {
            let Some(seq) = seq else {
                let last = index.snapshot().map_err(|e| shard_engine_error(&c, s, e))?.last_seq();
                return Ok((None, last));
            };
            // Max 1 byte: exactly the one entry (at least one comes back).
            let read = index.read_log(seq, 1).map_err(|e| shard_engine_error(&c, s, e))?;
            let entry = read.entries.into_iter().next().filter(|e| e.seq == seq).ok_or_else(|| {
                ShoalError::failed_precondition(format!(
                    "shard {c}/{s}: batch {seq} is not in the batch log (is it off? batch_log.max_batches = 0): it cannot be replicated"
                ))
            })?;
            Ok((Some(crate::convert::log_entry_to_proto(entry)), read.last_seq))
        })
        .await
    }

    /// Searches one shard with one or more queries, for as long as the
    /// caller waits.
    pub(crate) async fn search(&self, req: v1::SearchShardRequest, caller: Caller) -> Result<v1::SearchShardResponse, ShoalError> {
        let key = key_of(req.shard.clone())?;
        let target = self.get(&key)?;
        let span = tracing::info_span!(
            "search",
            collection = %key.0,
            shard = key.1,
            queries = req.queries.len(),
            k = req.k,
            ef = req.ef,
            filtered = req.filter.is_some(),
            plan = tracing::field::Empty,
            compared = tracing::field::Empty
        );
        let started = std::time::Instant::now();
        let results = self.searches.run(Arc::clone(&target.index), req, caller).instrument(span.clone()).await;
        let m = crate::metrics::get();
        m.search_duration.record(started.elapsed().as_secs_f64(), &crate::metrics::labels(&key));
        let results = results.map_err(shard_error(&key))?;
        let explained: Vec<&v1::Explain> = results.iter().filter_map(|r| r.explain.as_ref()).collect();
        for e in &explained {
            m.search_plans.add(1, &crate::metrics::plan_labels(&key, &e.plan));
        }
        if let Some(first) = explained.first() {
            span.record("plan", first.plan.as_str());
            span.record("compared", explained.iter().map(|e| e.compared).sum::<u64>());
        }
        Ok(v1::SearchShardResponse { results })
    }

    /// Points by id (those present).
    pub async fn get_points(&self, req: v1::GetPointsRequest) -> Result<v1::GetPointsResponse, ShoalError> {
        let v1::GetPointsRequest { shard, ids, with_vector } = req;
        let key = key_of(shard)?;
        let index = Arc::clone(&self.get(&key)?.index);
        let points = blocking(move || {
            let mut snap = index.snapshot().map_err(engine_error)?;
            let mut out = Vec::new();
            for id in ids {
                if let Some(p) = snap.get(id).map_err(engine_error)? {
                    out.push(v1::Point {
                        id,
                        vector: if with_vector { p.vector } else { Vec::new() },
                        payload: payload_from_engine(p.payload),
                    });
                }
            }
            Ok(out)
        })
        .await?;
        Ok(v1::GetPointsResponse { points })
    }

    pub async fn stats(&self, req: v1::ShardStatsRequest) -> Result<v1::ShardStats, ShoalError> {
        let key = key_of(req.shard)?;
        let shard = self.get(&key)?;
        self.stats_of(&key, &shard).await
    }

    pub async fn digest(&self, req: v1::DigestShardRequest) -> Result<v1::ShardDigest, ShoalError> {
        let key = key_of(req.shard)?;
        let index = Arc::clone(&self.get(&key)?.index);
        blocking(move || {
            // One snapshot for both, so the offsets are those of the
            // points hashed.
            let snap = index.snapshot().map_err(engine_error)?;
            let digest = snap.digest().map_err(engine_error)?;
            let offsets = snap.offsets().map_err(engine_error)?;
            Ok(v1::ShardDigest {
                shard: Some(v1::ShardId { collection: key.0.to_string(), shard: key.1 }),
                points: digest.points,
                digest: digest.hex(),
                offsets: offsets.into_iter().map(|(source, offset)| v1::SourceOffset { source, offset }).collect(),
                epoch: snap.epoch(),
                last_seq: snap.last_seq(),
                index_mismatches: digest.index_mismatches,
            })
        })
        .await
    }

    /// Vacuum steps through the shard's writer until no tombstone is left
    /// linked (or `max_tombstones` were vacuumed); writes queued meanwhile
    /// go between the steps.
    pub async fn vacuum(&self, req: v1::VacuumShardStepsRequest) -> Result<v1::ShardVacuum, ShoalError> {
        let key = key_of(req.shard)?;
        let step = if self.writer.vacuum_step > 0 { self.writer.vacuum_step } else { WriterOptions::default().vacuum_step };
        let (mut vacuumed, mut steps, mut pending) = (0u64, 0u32, 0u64);
        loop {
            let left = match req.max_tombstones {
                0 => step,
                max => step.min(max.saturating_sub(vacuumed) as usize),
            };
            if left == 0 {
                break;
            }
            let shard = self.get(&key)?;
            let span =
                tracing::info_span!("vacuum", collection = %key.0, shard = key.1, step = left, queue_wait_ms = tracing::field::Empty);
            let answer = shard.submit(&key, Work::Vacuum { max: left }).instrument(span).await?;
            let Answer::Vacuumed(o) = answer else {
                return Err(ShoalError::internal(format!("shard {}/{}: the writer answered a vacuum with something else", key.0, key.1)));
            };
            crate::metrics::get().vacuumed.add(o.vacuumed, &crate::metrics::labels(&key));
            steps += 1;
            vacuumed += o.vacuumed;
            pending = o.pending;
            if o.vacuumed == 0 {
                break;
            }
        }
        let index = Arc::clone(&self.get(&key)?.index);
        // The steps freed pages; give them back if enough are free. Batches
        // wait for the fold and the copy (the engine's writer lock),
        // searches only for the swap.
        let labels = crate::metrics::labels(&key);
        let (stats, reclaimed) = blocking(move || {
            // The steps' repairs went to the link log; searches read the
            // lists faster from their blocks.
            if index.fold_due().map_err(engine_error)? {
                let o = index.fold_link_log().map_err(engine_error)?;
                crate::metrics::get().folded_lists.add(o.lists, &labels);
            }
            let reclaimed = match index.compact_due().map_err(engine_error)? {
                true => {
                    let o = index.compact().map_err(engine_error)?;
                    crate::metrics::record_compaction(&labels, &o);
                    o.bytes_before.saturating_sub(o.bytes_after)
                }
                false => 0,
            };
            Ok((index.stats().map_err(engine_error)?, reclaimed))
        })
        .await
        .map_err(shard_error(&key))?;
        Ok(v1::ShardVacuum {
            shard: Some(v1::ShardId { collection: key.0.to_string(), shard: key.1 }),
            vacuumed,
            steps,
            pending,
            points: stats.live,
            tombstones: stats.tombstones,
            disk_bytes: stats.disk_bytes,
            used_bytes: stats.used_bytes,
            reclaimed_bytes: reclaimed,
        })
    }

    pub(crate) async fn stats_of(&self, key: &ShardKey, shard: &Shard) -> Result<v1::ShardStats, ShoalError> {
        let index = Arc::clone(&shard.index);
        let key = key.clone();
        let (shard_count, copy) = (shard.shard_count, shard.copy);
        let snapshot = self.snapshots.as_ref().and_then(|s| s.progress_of(&key));
        blocking(move || {
            let stats = index.stats().map_err(engine_error)?;
            let offsets = index.offsets().map_err(engine_error)?;
            let field_indexes =
                index.field_indexes().map_err(engine_error)?.into_iter().map(crate::filters::field_state_to_proto).collect();
            Ok(v1::ShardStats {
                shard: Some(v1::ShardId { collection: key.0.to_string(), shard: key.1 }),
                spec: Some(params_to_spec(&stats.params, shard_count)),
                points: stats.live,
                tombstones: stats.tombstones,
                disk_bytes: stats.disk_bytes,
                offsets: offsets.into_iter().map(|(source, offset)| v1::SourceOffset { source, offset }).collect(),
                snapshot,
                epoch: stats.epoch,
                last_seq: stats.last_seq,
                log_first_seq: stats.batch_log_first_seq,
                log_bytes: stats.batch_log_bytes,
                field_indexes,
                copy,
            })
        })
        .await
    }

    pub async fn list(&self) -> Result<v1::ListShardsResponse, ShoalError> {
        let all: Vec<(ShardKey, Arc<Shard>)> = self.shards.read().iter().map(|(k, s)| (k.clone(), Arc::clone(s))).collect();
        let mut shards = Vec::with_capacity(all.len());
        for (key, shard) in all {
            shards.push(self.stats_of(&key, &shard).await?);
        }
        shards.sort_by(|a, b| {
            let k = |s: &v1::ShardStats| s.shard.as_ref().map(|i| (i.collection.clone(), i.shard));
            k(a).cmp(&k(b))
        });
        let mut damaged: Vec<v1::DamagedShard> = self
            .broken
            .read()
            .iter()
            .map(|((c, s), d)| v1::DamagedShard {
                shard: Some(v1::ShardId { collection: c.to_string(), shard: *s }),
                reason: d.reason.clone(),
                since_ms: d.since_ms,
            })
            .collect();
        damaged.sort_by_key(|d| d.shard.as_ref().map(|i| (i.collection.clone(), i.shard)));
        Ok(v1::ListShardsResponse { shards, damaged })
    }

    /// Stops accepting requests, commits every queued part, closes the
    /// environments.
    pub async fn shutdown(&self) {
        self.closing.store(true, Ordering::Release);
        let shards: Vec<Arc<Shard>> = self.shards.write().drain().map(|(_, s)| s).collect();
        let closing: Vec<JoinHandle<()>> = shards.into_iter().map(|s| tokio::spawn(async move { s.close().await })).collect();
        for c in closing {
            let _ = c.await;
        }
    }
}

/// Shard directories under `root`: `<collection>/<shard number>/data.mdb`.
fn find_shards(root: &Path) -> anyhow::Result<Vec<(ShardKey, PathBuf)>> {
    let mut found = Vec::new();
    for coll in std::fs::read_dir(root)? {
        let coll = coll?;
        let Some(name) = coll.file_name().to_str().and_then(|n| CollectionName::parse(n).ok()) else { continue };
        if !coll.file_type()?.is_dir() {
            continue;
        }
        clean_up_after_restores(&coll.path())?;
        for shard in std::fs::read_dir(coll.path())? {
            let shard = shard?;
            let Some(n) = shard.file_name().to_str().and_then(|n| n.parse::<u32>().ok()) else { continue };
            if shard.path().join("data.mdb").exists() && shard.path().join(SHARD_FILE).exists() {
                found.push(((name.clone(), n), shard.path()));
            }
        }
    }
    found.sort();
    Ok(found)
}

/// Creates the index and its shard file in `dir`; on failure removes what
/// it made (the directory, and the collection's if it made that too), so a
/// refused create leaves no files behind.
fn create_in(dir: &Path, params: shoal_engine::IndexParams, epoch: u64, opts: IndexOptions, file: &ShardFile) -> Result<Index, ShoalError> {
    let parent = dir.parent().map(Path::to_owned);
    let parent_existed = parent.as_ref().is_some_and(|p| p.exists());
    let dir_existed = dir.exists();
    let made = Index::open_or_create_at_epoch(dir, params, epoch, opts).map_err(engine_error).and_then(|index| {
        shard_file::write(dir, file).map_err(|e| io_error(e, format!("writing {}", dir.join(SHARD_FILE).display())))?;
        Ok(index)
    });
    if made.is_err() {
        if !dir_existed {
            let _ = std::fs::remove_dir_all(dir);
        }
        if !parent_existed {
            remove_if_empty(parent.as_deref());
        }
    }
    made
}

/// Removes a collection directory that holds no shard any more.
fn remove_if_empty(dir: Option<&Path>) {
    if let Some(dir) = dir {
        // Fails (and keeps it) unless empty.
        let _ = std::fs::remove_dir(dir);
    }
}

/// A file-system error in the service's terms: a full disk or too many
/// open files is a limit, anything else a failure of this node.
pub(crate) fn io_error(e: std::io::Error, what: String) -> ShoalError {
    match e.raw_os_error() {
        Some(libc::ENOSPC) => ShoalError::exhausted(format!("{what}: no space left on the device")),
        Some(libc::EMFILE | libc::ENFILE) => {
            ShoalError::exhausted(format!("{what}: too many open files; raise the open-file limit or hold fewer shards"))
        }
        _ => ShoalError::internal(format!("{what}: {e}")),
    }
}

#[cfg(test)]
mod tests {
    use shoal_engine::{IndexParams, Metric};

    use super::*;

    /// A create puts its shard in service and then, still holding its
    /// reservation, answers with the shard's stats: in that window the
    /// shard must count once, or a node at its limit minus one refuses
    /// a create it has room for (seen in CI right after a drop).
    #[tokio::test]
    async fn a_shard_put_in_service_counts_once_while_its_create_ends() {
        let dir = tempfile::tempdir().unwrap();
        let mut cfg = ShardNodeConfig { data_dir: dir.path().join("node"), ..ShardNodeConfig::default() };
        cfg.snapshot.url = dir.path().join("snapshots").display().to_string();
        cfg.limits.max_shards = 2;
        let host = ShardHost::open(&cfg).await.unwrap();
        let key = |n| (CollectionName::parse("c").unwrap(), n);
        let first = host.reserve(&key(0)).unwrap().expect("nothing else creates it");
        let file = ShardFile::new_copy(2);
        let index = create_in(&host.dir(&key(0)), IndexParams::new(4, Metric::Euclidean), 1, host.engine_options(), &file).unwrap();
        host.insert(key(0), index, file);
        let second = host.reserve(&key(1)).expect("one shard held, none pending: room for one more");
        assert!(second.is_some());
        // Now the node is full: the third is refused and says why.
        let err = host.reserve(&key(2)).err().expect("over the limit");
        assert!(err.to_string().contains("holds 1 shards (+1 being created) and its limit is 2"), "{err}");
        drop((first, second));
    }
}
