//! The write side of an index: a group of batches becomes one write
//! transaction (resolve → write points → link on nested readers → write
//! links → batch log → commit).

use std::ops::Range;
use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use heed::RwTxn;
use parking_lot::Mutex;
use rustc_hash::FxHashMap;

use crate::batch::{Batch, BatchOutcome, Op, Write, Written};
use crate::batch_log::{self, LogApplied, LogEntry};
use crate::cache::SharedAddrs;
use crate::codec::{self, NODE_TOMBSTONE, NodeRecord, State};
use crate::error::{Error, InvalidInput, Rejected, Result};
use crate::fields::Schema;
use crate::fields::update::Changes;
use crate::hnsw::build::{BuildCtx, Overlay, WorkQueue};
use crate::hnsw::level_for;
use crate::links_log::{self, LogIndex};
use crate::plan::{self, Done, Item, Kind, Plan};
use crate::session::{self};
use crate::store::{self, Store};
use crate::table::{Block, Name, Retired, Table};
use crate::view::Frozen;

use super::Index;
use super::exclusive::Copies;
use super::log_policy::{self, Changed, Layer, LogDecision, LogShape};

impl Index {
    /// Applies one batch atomically, unfenced. Invalid input is an
    /// [`Error::Invalid`](crate::Error::Invalid) and changes nothing.
    pub fn apply(&self, batch: Batch) -> Result<BatchOutcome> {
        self.apply_fenced(batch, 0)
    }

    /// Applies one batch atomically if `epoch` is not below the shard's
    /// (0: unfenced); a higher epoch becomes the shard's in the batch's
    /// transaction. A lower one is [`Error::StaleEpoch`](crate::Error::StaleEpoch) and changes
    /// nothing.
    pub fn apply_fenced(&self, batch: Batch, epoch: u64) -> Result<BatchOutcome> {
        match self.write_one(Item { batch, kind: Kind::Fresh, epoch })? {
            Done::Batch(outcome, _) => Ok(outcome),
            Done::Fenced { .. } | Done::Replayed { .. } => Err(self.mixed_up()),
        }
    }

    /// Raises the shard's epoch to `epoch` durably and returns it; from
    /// then on writes stamped with a lower epoch are refused. Ordered
    /// with batches by the writer lock: a batch in flight commits first.
    /// Raising to the current epoch changes nothing; lowering it is
    /// [`Error::EpochLowered`](crate::Error::EpochLowered).
    pub fn fence(&self, epoch: u64) -> Result<u64> {
        match self.write_one(Item { batch: Batch::default(), kind: Kind::Fence, epoch })? {
            Done::Fenced { epoch } => Ok(epoch),
            Done::Batch(..) | Done::Replayed { .. } => Err(self.mixed_up()),
        }
    }

    /// Applies several unfenced batches in one write transaction (group
    /// commit). Each batch is accepted or rejected whole; the accepted ones
    /// commit together. The outer error means nothing was committed.
    pub fn apply_group(&self, batches: Vec<Batch>) -> Result<Vec<Result<BatchOutcome, Rejected>>> {
        let writes = batches.into_iter().map(|batch| Write::Batch { batch, epoch: 0 }).collect();
        let outcomes = self.write(writes)?;
        Ok(outcomes
            .into_iter()
            .map(|o| match o {
                Ok(Written::Batch { outcome, .. }) => Ok(outcome),
                // Only batches were written.
                Ok(Written::Fenced { epoch }) => Err(Rejected::EpochLowered { current: epoch, requested: 0 }),
                Err(e) => Err(e),
            })
            .collect())
    }

    /// Applies a group of writes, in order, in one write transaction
    /// (the shard writer's group commit). Each write is accepted or
    /// refused on its own ([`Rejected`]: invalid, or fenced off by its
    /// epoch) and a refused one leaves no trace; the accepted ones commit
    /// together. The outer error means nothing was committed.
    pub fn write(&self, writes: Vec<Write>) -> Result<Vec<Result<Written, Rejected>>> {
        let items = writes
            .into_iter()
            .map(|w| match w {
                Write::Batch { batch, epoch } => Item { batch, kind: Kind::Fresh, epoch },
                Write::Fence { epoch } => Item { batch: Batch::default(), kind: Kind::Fence, epoch },
            })
            .collect();
        let (done, _) = self.write_items(items, false)?;
        Ok(done
            .into_iter()
            .map(|d| match d? {
                Done::Batch(outcome, seq) => Ok(Written::Batch { outcome, seq }),
                Done::Fenced { epoch } => Ok(Written::Fenced { epoch }),
                // Only batches and fences were written.
                Done::Replayed { .. } => Err(Rejected::Invalid(InvalidInput::EmptyBatch)),
            })
            .collect())
    }

    /// Applies entries of another copy's batch log (see
    /// [`Index::read_log`](crate::Index::read_log)) in one write transaction, all or none, fenced
    /// by `epoch` like a batch. Each entry applies only if its sequence
    /// number is the one after this copy's last: entries this copy holds
    /// already are skipped, a gap is [`Error::LogGap`](crate::Error::LogGap). An applied entry
    /// moves its source's offset (never backwards) and is appended to
    /// this copy's own log under the same number, so this copy's log
    /// continues the other's.
    pub fn apply_log(&self, entries: Vec<LogEntry>, epoch: u64) -> Result<LogApplied> {
        let items: Vec<Item> = entries
            .into_iter()
            .map(|e| {
                let mut ops: Vec<Op> = Vec::with_capacity(e.deletes.len() + e.points.len());
                ops.extend(e.deletes.into_iter().map(Op::DeleteIfPresent));
                ops.extend(e.points.into_iter().map(Op::Upsert));
                Item { batch: Batch { ops, source: e.source }, kind: Kind::Replay(e.seq), epoch }
            })
            .collect();
        let (done, last_seq) = self.write_items(items, true)?;
        let (mut applied, mut skipped) = (0, 0);
        for d in done {
            match d? {
                Done::Replayed { skipped: true } => skipped += 1,
                Done::Replayed { skipped: false } => applied += 1,
                Done::Batch(..) | Done::Fenced { .. } => return Err(self.mixed_up()),
            }
        }
        Ok(LogApplied { last_seq, applied, skipped })
    }

    fn mixed_up(&self) -> Error {
        Error::Corrupt { path: self.path.clone(), detail: "a write's outcome is of another kind (a bug)".into() }
    }

    /// One item in its own transaction; its refusal is the error.
    fn write_one(&self, item: Item) -> Result<Done> {
        let (mut done, _) = self.write_items(vec![item], true)?;
        match done.pop() {
            Some(d) => Ok(d?),
            None => Err(self.mixed_up()),
        }
    }

    /// Writes a group of items in one transaction. With `all_or_nothing`,
    /// one refused item aborts the transaction (the outcomes say which).
    /// Also returns the last sequence number after the group.
    fn write_items(&self, mut items: Vec<Item>, all_or_nothing: bool) -> Result<(Vec<Result<Done, Rejected>>, u64)> {
        let checked: Vec<Result<(), InvalidInput>> =
            items.iter_mut().map(|item| plan::prepare_item(item, &self.params, self.opts.max_payload_bytes)).collect();
        let _writer = self.writer.lock();
        let _span = tracing::debug_span!("engine.apply", batches = items.len()).entered();
        loop {
            let attempt = {
                let shared = self.resize.read();
                self.write_once(&items, &checked, &shared, all_or_nothing)
            };
            match attempt {
                Ok(outcomes) => {
                    self.renew_shared_addrs();
                    return Ok(outcomes);
                }
                Err(Attempt::MapFull) => self.grow_map()?,
                Err(Attempt::Failed(e)) => return Err(e),
            }
        }
    }

    fn write_once(
        &self,
        items: &[Item],
        checked: &[Result<(), InvalidInput>],
        shared: &SharedAddrs,
        all_or_nothing: bool,
    ) -> Result<(Vec<Result<Done, Rejected>>, u64), Attempt> {
        let store = &self.store;
        let mut wtxn = store.env.write_txn().map_err(|e| attempt(store, e))?;
        let state = session::read_state(store, &wtxn)?;
        let resolving = tracing::debug_span!("resolve").entered();
        let mut plan = plan::resolve(
            items,
            checked,
            plan::Start { epoch: state.shard_epoch, last_seq: state.last_seq },
            |id| session::lookup_external(store, &wtxn, id),
            |source| session::read_offset(store, &wtxn, source),
            |filter, allow_unindexed| self.matching(&wtxn, &state, filter, allow_unindexed, &self.opts.planner),
        )?;
        crate::locality::order(&mut plan.inserts, &self.params);
        drop(resolving);
        if all_or_nothing && plan.outcomes.iter().any(Result::is_err) {
            wtxn.abort();
            return Ok((plan.outcomes, state.last_seq));
        }
        if plan.is_empty(state.shard_epoch) {
            wtxn.abort();
            return Ok((plan.outcomes, plan.last_seq));
        }
        let (reused, reused_vacuumed) = self.pick_reused(&wtxn, plan.inserts.len(), &state)?;
        let next = u64::from(state.next_id) + (plan.inserts.len() - reused.len()) as u64;
        if next > u64::from(u32::MAX) {
            return Err(Attempt::Failed(Error::IdSpaceExhausted { used: u64::from(state.next_id), max: u64::from(u32::MAX) }));
        }
        let live = (state.live + plan.inserts.len() as u64).checked_sub(plan.tombstones.len() as u64).ok_or_else(|| Error::Corrupt {
            path: store.path.clone(),
            detail: format!("{} live points, but {} to retire", state.live, plan.tombstones.len()),
        })?;
        let schema = Schema::read(store, &wtxn)?;
        let levels = tracing::debug_span!("write_points", inserts = plan.inserts.len(), retired = plan.tombstones.len())
            .in_scope(|| self.write_points(&mut wtxn, &plan, state.next_id, &reused, &schema))?;
        let log = self.log.get(state.log_epoch).ok_or_else(|| Error::Corrupt {
            path: store.path.clone(),
            detail: format!("link log epoch {} has no index (the file changed under the index?)", state.log_epoch),
        })?;
        let shared = (shared.valid_for == self.moved.load(Ordering::SeqCst)).then_some(shared);
        let Linked { entry, log: new_log } =
            self.link(&mut wtxn, &plan, levels, reused.clone(), Base { state: &state, shared, log: &log }, live)?;
        let (log_first_seq, log_bytes) = tracing::debug_span!("batch_log", entries = plan.logged.len())
            .in_scope(|| self.write_batch_log(&mut wtxn, items, &plan, &state, live))?;
        let new_state = State {
            next_id: next as u32,
            entry,
            live,
            tombstones: state.tombstones + plan.tombstones.len() as u64 - reused.len() as u64,
            vacuumed: state.vacuumed - reused_vacuumed,
            log_epoch: state.log_epoch + u64::from(new_log.is_some()),
            shard_epoch: plan.epoch,
            last_seq: plan.last_seq,
            log_first_seq,
            log_bytes,
        };
        let put = |w: &mut RwTxn<'_>, table: Table<Name>, k: &[u8], v: &[u8]| table.put(w, k, v).map_err(|e| attempt(store, e));
        put(&mut wtxn, store.dbs.meta, codec::META_STATE, &new_state.encode())?;
        for &(source, offset) in &plan.offsets {
            put(&mut wtxn, store.dbs.offsets, source.as_bytes(), &offset.to_be_bytes())?;
        }
        self.commit(wtxn, &state, &new_state, new_log, !reused.is_empty())?;
        Ok((plan.outcomes, plan.last_seq))
    }

    /// The points a delete by filter finds in the write transaction, as
    /// the commit before it left them; `Ok(Err)` refuses the batch.
    fn matching(
        &self,
        wtxn: &RwTxn<'_>,
        state: &State,
        filter: &crate::Filter,
        allow_unindexed: bool,
        planner: &crate::PlannerOptions,
    ) -> Result<Result<plan::Matching, InvalidInput>> {
        let store = &self.store;
        let schema = Schema::read(store, wtxn)?;
        let node = match crate::filter::prepare::prepare(filter, &schema, state.next_id, allow_unindexed) {
            Ok(node) => node,
            Err(Error::Invalid(e)) => return Ok(Err(e)),
            Err(Error::FieldIndexBuilding { path, field, percent }) => {
                let reason =
                    format!("the index on field {field} is being built ({percent}% done); retry when it is ready, or allow a scan");
                return Ok(Err(InvalidInput::Filter { path, reason }));
            }
            Err(other) => return Err(other),
        };
        let mut columns = crate::fields::columns::ColumnCache::default();
        let limits = crate::filter::on_index::Limits { gather: planner.scan_max, defer_passes: false };
        // SAFETY: a new cache, used with this transaction only.
        let mut eval = unsafe { crate::filter::on_index::Evaluator::new(store, wtxn, state.next_id, state.live, limits, &mut columns) };
        let ids = match eval.eval(&node)? {
            crate::filter::on_index::Set::Ids(ids) => ids.into_bits(),
            crate::filter::on_index::Set::Check { check, .. } => {
                let tombstones = if state.tombstones > 0 { crate::tombstone_set::TombstoneSet::read(store, wtxn, state)? } else { None };
                crate::filter::on_index::matching_ids(&mut eval, &check, state.next_id, tombstones.as_ref())?
            }
        };
        let mut committed = Vec::with_capacity(ids.len() as usize);
        for id in &ids {
            committed.push(session::read_node(store, wtxn, id)?.external);
        }
        Ok(Ok(plan::Matching { committed, node }))
    }

    /// Commits a write transaction that moves the state from `state` to
    /// `new_state` (already written) with the link log's next version, if
    /// it changed. `moves_frozen`: it rewrote code or vector blocks below
    /// the frozen bounds (reused slots).
    pub(super) fn commit(
        &self,
        wtxn: RwTxn<'_>,
        state: &State,
        new_state: &State,
        new_log: Option<LogIndex>,
        moves_frozen: bool,
    ) -> Result<(), Attempt> {
        // Readers that see this commit pair with its log version, so it must
        // exist before the commit does (`links_log::LogVersions`).
        if let Some(new_log) = new_log {
            self.log.stage(new_state.log_epoch, Arc::new(new_log));
        }
        // Pages of frozen ids move: readers that begin from here on must
        // not trust the shared addresses (`Session::open`).
        if moves_frozen {
            self.moved.fetch_add(1, Ordering::SeqCst);
        }
        let committed = tracing::debug_span!("commit").in_scope(|| wtxn.commit());
        if let Err(e) = committed {
            if new_state.log_epoch != state.log_epoch {
                self.log.unstage(new_state.log_epoch);
            }
            return Err(attempt(&self.store, e));
        }
        self.log.settle(new_state.log_epoch);
        self.generation.fetch_add(1, Ordering::Release);
        // Idle sessions pin the previous snapshot's pages; let them go.
        self.sessions.lock().clear();
        Ok(())
    }

    /// Appends the group's accepted batches to the batch log under their
    /// sequence numbers and drops the oldest entries past the retention.
    /// `live` is the shard's point count after the group. Returns the log's
    /// first sequence number and bytes afterwards.
    ///
    /// A point the group leaves as an entry says is logged by reference
    /// (its slot holds the vector); the points the group retires keep their
    /// old vectors for the entries before the group, under the group's
    /// first number (see `batch_log::encode`).
    fn write_batch_log(
        &self,
        wtxn: &mut RwTxn<'_>,
        items: &[Item],
        plan: &Plan<'_>,
        state: &State,
        live: u64,
    ) -> Result<(u64, u64), Attempt> {
        let store = &self.store;
        let db = store.dbs.batch_log;
        let err = |e| attempt(store, e);
        let retention = self.opts.batch_log;
        let max_batches = retention.max_batches;
        if max_batches == 0 {
            // Off: nothing is kept, and entries an earlier setting kept
            // would leave a hole in the numbers: drop them.
            if state.log_entries() > 0 {
                batch_log::clear(store, wtxn).map_err(err)?;
            }
            return Ok((plan.last_seq + 1, 0));
        }
        let (mut first, mut bytes) = (state.log_first_seq, state.log_bytes);
        let dim = self.params.dim as usize;
        let max_bytes = retention.byte_limit(live, dim);
        if state.log_entries() > 0 {
            // An entry before the group may refer to any of them (whether
            // one does is not recorded: each is kept).
            let (vector_bytes, per_block) = (self.params.vector_bytes(), self.params.vectors_per_block());
            let mut old = Vec::with_capacity(vector_bytes);
            for &dead in &plan.tombstones {
                let record = session::read_node(store, wtxn, dead)?;
                old.clear();
                old.extend_from_slice(session::stored_vector(store, wtxn, vector_bytes, per_block, dead)?);
                bytes += batch_log::keep_old_vector(store, wtxn, record.external, state.last_seq + 1, &old).map_err(err)?;
            }
        }
        // Which upsert left each point: the vector its slot now holds.
        let left: FxHashMap<u64, *const f32> = plan.inserts.iter().map(|p| (p.external, p.vector.as_ptr())).collect();
        let mut value = Vec::new();
        for logged in &plan.logged {
            let batch = &items[logged.item].batch;
            let points = logged.upserts.iter().filter_map(|&op| match &batch.ops[op] {
                Op::Upsert(p) => {
                    let by_reference = left.get(&p.id) == Some(&p.vector.as_ptr());
                    Some((p.id, (!by_reference).then_some(p.vector.as_slice()), p.payload.as_deref()))
                }
                Op::Delete(_) | Op::DeleteIfPresent(_) | Op::DeleteWhere { .. } => None,
            });
            let points: Vec<_> = points.collect();
            bytes += batch_log::encode(&mut value, batch.source.as_ref(), &logged.deletes, points.into_iter(), dim);
            // Sequence numbers only grow: every entry goes after the rest.
            batch_log::append(db, wtxn, logged.seq, &value).map_err(err)?;
        }
        // The oldest go first; the newest always stays.
        let mut entries = (plan.last_seq + 1).saturating_sub(first);
        while entries > max_batches || (entries > 1 && bytes > max_bytes) {
            let len = match batch_log::delete(db, wtxn, first).map_err(err)? {
                batch_log::Deleted::Entry(len) => len,
                batch_log::Deleted::Missing => return Err(self.corrupt(format!("batch log entry {first} is missing"))),
                batch_log::Deleted::Malformed => return Err(self.corrupt(format!("batch log entry {first} is malformed"))),
            };
            bytes = bytes.saturating_sub(len);
            first += 1;
            entries -= 1;
            bytes = bytes.saturating_sub(batch_log::drop_old_vectors(store, wtxn, first, dim).map_err(err)?);
        }
        Ok((first, bytes))
    }

    fn corrupt(&self, detail: String) -> Attempt {
        Attempt::Failed(Error::Corrupt { path: self.store.path.clone(), detail })
    }

    /// Up to `wanted` ids retired by earlier commits for this batch's new
    /// points, ascending, and how many of them were vacuumed: a slot reused
    /// keeps the file from growing with every upsert and delete. Vacuumed
    /// slots go first (nothing links to them any more). The entry point is
    /// never reused (a new node is linked by walking from it), nor are ids
    /// this batch retires (the repair around them reads their old links).
    fn pick_reused(&self, wtxn: &RwTxn<'_>, wanted: usize, state: &State) -> Result<(Vec<u32>, u64), Attempt> {
        if !self.opts.reuse_retired || wanted == 0 || state.tombstones == 0 {
            return Ok((Vec::new(), 0));
        }
        let entry = state.entry.map(|e| e.0);
        let mut ids = self.retired_ids(wtxn, Retired::Vacuumed, wanted, state, entry)?;
        let vacuumed = ids.len() as u64;
        if ids.len() < wanted {
            ids.extend(self.retired_ids(wtxn, Retired::Linked, wanted - ids.len(), state, entry)?);
        }
        ids.sort_unstable();
        Ok((ids, vacuumed))
    }

    /// Up to `wanted` retired ids of `kind`, ascending, but never `skip`.
    pub(super) fn retired_ids(
        &self,
        txn: &RwTxn<'_>,
        kind: Retired,
        wanted: usize,
        state: &State,
        skip: Option<u32>,
    ) -> Result<Vec<u32>, Attempt> {
        let store = &self.store;
        let mut ids = Vec::new();
        if wanted == 0 {
            return Ok(ids);
        }
        for id in store.dbs.retired.ids(txn, kind).map_err(|e| attempt(store, e))? {
            let id = id.map_err(|e| attempt(store, e))?;
            if id >= state.next_id {
                return Err(Attempt::Failed(Error::Corrupt {
                    path: store.path.clone(),
                    detail: format!("retired id {id} ({kind:?}) is past the last node {}", state.next_id),
                }));
            }
            if Some(id) != skip {
                ids.push(id);
                if ids.len() == wanted {
                    break;
                }
            }
        }
        Ok(ids)
    }

    /// After a commit that reused slots, the shared addresses may point at
    /// pages that moved: forget them once no reader holds them (a reader
    /// in the middle of a search is waited for briefly; until they are
    /// forgotten, readers simply do not use them).
    pub(super) fn renew_shared_addrs(&self) {
        let moved = self.moved.load(Ordering::SeqCst);
        if self.resize.read().valid_for == moved {
            return;
        }
        let deadline = std::time::Instant::now() + Duration::from_millis(5);
        loop {
            if let Some(mut shared) = self.resize.try_write() {
                shared.clear(moved);
                return;
            }
            if std::time::Instant::now() >= deadline {
                return;
            }
            std::thread::sleep(Duration::from_micros(50));
        }
    }

    /// Retires replaced and deleted nodes and writes the new points' vectors,
    /// records, payloads and ids: into `reused` slots first, then under new
    /// ids from `first_new`. Returns the new points' levels.
    fn write_points(
        &self,
        wtxn: &mut RwTxn<'_>,
        plan: &Plan<'_>,
        first_new: u32,
        reused: &[u32],
        schema: &Schema,
    ) -> Result<Vec<u8>, Attempt> {
        let store = &self.store;
        let dbs = &store.dbs;
        let err = |e| attempt(store, e);
        // The field indexes change in this same transaction: a retired id
        // leaves every set now, so a slot reused later never carries an
        // old entry.
        let mut fields = Changes::default();
        for &dead in &plan.tombstones {
            let mut record = session::read_node(store, wtxn, dead)?;
            record.flags |= NODE_TOMBSTONE;
            dbs.nodes.put(wtxn, dead, &record.encode()).map_err(err)?;
            if !schema.is_empty() {
                fields.remove_point(schema, dead, dbs.payloads.get(wtxn, dead).map_err(err)?);
            }
            dbs.payloads.delete(wtxn, dead).map_err(err)?;
            dbs.retired.put(wtxn, (Retired::Linked, dead), &[]).map_err(err)?;
        }
        for &external in &plan.removed {
            dbs.external.delete(wtxn, external).map_err(err)?;
        }
        let scale = self.params.level_scale();
        let mut code = Vec::with_capacity(self.params.code_bytes());
        let mut levels = Vec::with_capacity(plan.inserts.len());
        let mut ids: Vec<(u64, u32)> = Vec::with_capacity(plan.inserts.len());
        let mut codes = Vec::with_capacity(plan.inserts.len() * code.capacity());
        let mut reused_codes = Vec::with_capacity(reused.len() * code.capacity());
        // Vectors go in blocks like codes (`codec::vectors_block_nodes`), so
        // they are gathered first: a batch's copy of its own vectors.
        let vector_bytes = self.params.vector_bytes();
        let mut vectors = Vec::with_capacity(plan.inserts.len().saturating_sub(reused.len()) * vector_bytes);
        let mut reused_vectors = Vec::with_capacity(reused.len() * vector_bytes);
        for (i, p) in plan.inserts.iter().enumerate() {
            // A reused id keeps the level it had (levels follow from ids),
            // so its upper lists are overwritten, never orphaned.
            let id = match reused.get(i) {
                Some(&id) => id,
                None => first_new + (i - reused.len()) as u32,
            };
            let level = level_for(self.params.seed, id, scale);
            levels.push(level);
            if i < reused.len() {
                reused_vectors.extend_from_slice(codec::vector_bytes(p.vector));
                crate::quant::encode(p.vector, &mut reused_codes);
                let record = NodeRecord { external: p.external, level, flags: 0 };
                dbs.nodes.put(wtxn, id, &record.encode()).map_err(err)?;
                fields.add_point(schema, id, p.payload);
                if let Some(payload) = p.payload {
                    dbs.payloads.put(wtxn, id, payload).map_err(err)?;
                }
                dbs.retired.delete(wtxn, (Retired::Linked, id)).map_err(err)?;
                dbs.retired.delete(wtxn, (Retired::Vacuumed, id)).map_err(err)?;
                ids.push((p.external, id));
                continue;
            }
            vectors.extend_from_slice(codec::vector_bytes(p.vector));
            code.clear();
            crate::quant::encode(p.vector, &mut code);
            codes.extend_from_slice(&code);
            let record = NodeRecord { external: p.external, level, flags: 0 };
            dbs.nodes.append(wtxn, id, &record.encode()).map_err(err)?;
            fields.add_point(schema, id, p.payload);
            if let Some(payload) = p.payload {
                dbs.payloads.append(wtxn, id, payload).map_err(err)?;
            }
            ids.push((p.external, id));
        }
        let (per_code_block, code_bytes) = (self.params.codes_per_block(), self.params.code_bytes());
        let per_vector_block = self.params.vectors_per_block();
        self.patch_values(wtxn, dbs.codes, per_code_block, code_bytes, reused, &reused_codes)?;
        self.write_blocks(wtxn, dbs.codes, per_code_block, code_bytes, first_new, &codes)?;
        self.patch_values(wtxn, dbs.vectors, per_vector_block, vector_bytes, reused, &reused_vectors)?;
        self.write_blocks(wtxn, dbs.vectors, per_vector_block, vector_bytes, first_new, &vectors)?;
        // External ids are the user's and may be random: writing them in key
        // order at least keeps each touched page touched once.
        ids.sort_unstable();
        for (external, id) in ids {
            dbs.external.put(wtxn, external, &codec::mapped_id(id)).map_err(err)?;
        }
        if !fields.is_empty() {
            let _span = tracing::debug_span!("write_field_indexes").entered();
            fields.write(store, wtxn)?;
        }
        Ok(levels)
    }

    /// Writes the values of reused ids (ascending, `values` in the same
    /// order, `bytes` each) into their blocks of `table`, each block read,
    /// patched and rewritten once.
    fn patch_values(
        &self,
        wtxn: &mut RwTxn<'_>,
        table: Table<Block>,
        per_block: u32,
        bytes: usize,
        reused: &[u32],
        values: &[u8],
    ) -> Result<(), Attempt> {
        let store = &self.store;
        let err = |e| attempt(store, e);
        let name = table.name();
        let mut block: Vec<u8> = Vec::new();
        let mut i = 0;
        while i < reused.len() {
            let block_no = reused[i] / per_block;
            block.clear();
            match table.get(wtxn, block_no).map_err(err)? {
                Some(old) if old.len() % bytes == 0 => block.extend_from_slice(old),
                found => {
                    let detail = format!("{name} block {block_no} has {} bytes, not a multiple of {bytes}", found.map_or(0, <[u8]>::len));
                    return Err(Attempt::Failed(Error::Corrupt { path: store.path.clone(), detail }));
                }
            }
            while i < reused.len() && reused[i] / per_block == block_no {
                let at = (reused[i] % per_block) as usize * bytes;
                let Some(slot) = block.get_mut(at..at + bytes) else {
                    let detail = format!("{name} block {block_no} does not reach node {}", reused[i]);
                    return Err(Attempt::Failed(Error::Corrupt { path: store.path.clone(), detail }));
                };
                slot.copy_from_slice(&values[i * bytes..(i + 1) * bytes]);
                i += 1;
            }
            table.put(wtxn, block_no, &block).map_err(err)?;
        }
        Ok(())
    }

    /// Appends `values` (consecutive fixed-size values of ids `first_new..`)
    /// to `table`, stored `per_block` to a value keyed by block number: the
    /// newest block may be partial, so it is read and completed first; the
    /// rest are appended.
    fn write_blocks(
        &self,
        wtxn: &mut RwTxn<'_>,
        table: Table<Block>,
        per_block: u32,
        value_bytes: usize,
        first_new: u32,
        values: &[u8],
    ) -> Result<(), Attempt> {
        let store = &self.store;
        let err = |e| attempt(store, e);
        let full = per_block as usize * value_bytes;
        let mut block_no = first_new / per_block;
        let mut block: Vec<u8> = Vec::with_capacity(full);
        let held = (first_new % per_block) as usize;
        if held > 0 {
            match table.get(wtxn, block_no).map_err(err)? {
                Some(old) if old.len() == held * value_bytes => block.extend_from_slice(old),
                found => {
                    let detail = format!("block {block_no} has {} bytes, expected {}", found.map_or(0, <[u8]>::len), held * value_bytes);
                    return Err(Attempt::Failed(Error::Corrupt { path: store.path.clone(), detail }));
                }
            }
        }
        let mut replace = held > 0;
        let mut rest = values;
        while !rest.is_empty() {
            let take = (full - block.len()).min(rest.len());
            block.extend_from_slice(&rest[..take]);
            rest = &rest[take..];
            if block.len() == full || rest.is_empty() {
                // Block numbers only grow: a new block is the largest key.
                if replace { table.put(wtxn, block_no, &block) } else { table.append(wtxn, block_no, &block) }.map_err(err)?;
                block.clear();
                block_no += 1;
                replace = false;
            }
        }
        Ok(())
    }

    /// Repairs around retired nodes and links the new ones, in parallel on
    /// nested read transactions; then writes every changed link list.
    fn link(
        &self,
        wtxn: &mut RwTxn<'_>,
        plan: &Plan<'_>,
        levels: Vec<u8>,
        reused: Vec<u32>,
        from: Base<'_>,
        live: u64,
    ) -> Result<Linked, Attempt> {
        let Base { state, shared, log } = from;
        let first_new = state.next_id;
        let mut entry = state.entry;
        // Nodes whose level is above every level before them become the entry
        // point in turn; they are linked one by one first (there are only
        // O(log n) of them), so that the parallel phase has a fixed entry.
        // A retired entry point still routes, but the first new node that
        // reaches its level takes over, so searches start on a live node.
        let mut entry_retired = match entry {
            Some((id, _)) => session::read_node(&self.store, wtxn, id)?.is_tombstone(),
            None => false,
        };
        let mut promoters = Vec::new();
        let mut top = entry.map(|e| e.1);
        for (i, &l) in levels.iter().enumerate() {
            if top.is_none_or(|t| l > t || (entry_retired && l == t)) {
                promoters.push(i as u32);
                top = Some(l);
                entry_retired = false;
            }
        }
        // `reused` is ascending, so each list of blocks is too.
        let blocks_of = |per_block: u32| {
            let mut blocks: Vec<u32> = reused.iter().map(|id| id / per_block).collect();
            blocks.dedup();
            blocks
        };
        let (dirty_codes, dirty_vectors) = (blocks_of(self.params.codes_per_block()), blocks_of(self.params.vectors_per_block()));
        let overlay = Overlay::new(first_new, reused, levels);
        // Nothing of this transaction has written a link block yet, so the
        // addresses the last commit left are the ones its readers see.
        let mut link_blocks = self.link_blocks.lock();
        link_blocks.prepare(first_new);
        let ctx = BuildCtx {
            store: &self.store,
            params: &self.params,
            overlay: &overlay,
            link_blocks: &link_blocks,
            has_tombstones: state.tombstones > 0 || !plan.tombstones.is_empty(),
            live,
            cache_budget: self.opts.cache_budget_bytes,
            frozen: shared.map(|s| Frozen::new(s, first_new).with_dirty_blocks(&dirty_codes, &dirty_vectors)),
            log,
        };
        let pool = self.pool.as_deref();
        if !plan.tombstones.is_empty() {
            let _span = tracing::debug_span!("repair", retired = plan.tombstones.len()).entered();
            let queue = WorkQueue::new(plan.tombstones.len());
            ctx.run(wtxn, pool, |view, w| match queue.pop() {
                Some(i) => ctx.repair(view, w, plan.tombstones[i]).map(|()| true),
                None => Ok(false),
            })?;
        }
        if !promoters.is_empty() {
            let _span = tracing::debug_span!("promote", nodes = promoters.len()).entered();
            let shared_entry = Mutex::new(entry);
            ctx.run(wtxn, None, |view, w| {
                for &p in &promoters {
                    let id = overlay.new_id(p as usize);
                    let level = overlay.level_of_new(id);
                    let current = *shared_entry.lock();
                    if let Some(e) = current {
                        ctx.insert(view, w, id, e)?;
                    }
                    *shared_entry.lock() = Some((id, level));
                }
                Ok(false)
            })?;
            entry = shared_entry.into_inner();
        }
        if let Some(e) = entry {
            let rest: Vec<u32> = (0..overlay_len(plan)).filter(|i| promoters.binary_search(i).is_err()).collect();
            let _span = tracing::debug_span!("insert", nodes = rest.len()).entered();
            let queue = WorkQueue::new(rest.len());
            ctx.run(wtxn, pool, |view, w| match queue.pop() {
                Some(i) => ctx.insert(view, w, overlay.new_id(rest[i] as usize), e).map(|()| true),
                None => Ok(false),
            })?;
        }
        // `patch_blocks` forgets the addresses of the blocks it rewrites.
        drop(link_blocks);
        let _span = tracing::debug_span!("write_links", lists = tracing::field::Empty, blocks = tracing::field::Empty).entered();
        let changes = overlay.into_changes();
        let log = self.write_links(wtxn, changes, first_new, state.log_epoch, log)?;
        Ok(Linked { entry, log })
    }

    /// Writes every changed link list: upper layers one value per node;
    /// on the bottom layer, new nodes' lists into their blocks and existing
    /// nodes' lists either into theirs or appended to the link log (see
    /// [`LinkLog`](crate::LinkLog)). Returns the log's next version if this commit appends
    /// to it or folds it.
    pub(super) fn write_links(
        &self,
        wtxn: &mut RwTxn<'_>,
        changes: crate::hnsw::build::LinkChanges,
        first_new: u32,
        epoch: u64,
        log: &LogIndex,
    ) -> Result<Option<LogIndex>, Attempt> {
        let span = tracing::Span::current();
        let dbs = &self.store.dbs;
        let err = |e| attempt(&self.store, e);
        let mut old: Vec<(u32, &[u32])> = Vec::with_capacity(changes.touched.len());
        let mut new: Vec<(u32, &[u32])> = Vec::with_capacity(changes.new.len());
        let mut buf = Vec::new();
        // `touched` is sorted by (level, id): `old` comes out in id order.
        for ((l, id), list) in &changes.touched {
            if *l == 0 {
                old.push((*id, list));
            } else {
                codec::encode_links(list, self.params.max_links(*l), &mut buf);
                dbs.links_up.put(wtxn, (*l, *id), &buf).map_err(err)?;
            }
        }
        for (i, lists) in changes.new.iter().enumerate() {
            let id = changes.new_id(i);
            // A reused id's bottom list may be shadowed by an older one in
            // the link log, so it goes where existing nodes' lists go.
            if id < changes.first_new {
                old.push((id, &lists[0]));
            } else {
                new.push((id, &lists[0]));
            }
            for (l, list) in lists.iter().enumerate().skip(1) {
                codec::encode_links(list, self.params.max_links(l as u8), &mut buf);
                dbs.links_up.put(wtxn, (l as u8, id), &buf).map_err(err)?;
            }
        }
        if !changes.reused.is_empty() {
            old.sort_unstable_by_key(|(id, _)| *id);
        }
        span.record("lists", old.len() + new.len());
        let m0 = self.params.max_links(0);
        let next_epoch = epoch + 1;
        match self.log_decision(log, &old, first_new) {
            LogDecision::Keep => {
                let blocks = self.patch_blocks(wtxn, first_new, &new, log, 0..0)?;
                span.record("blocks", blocks);
                Ok(None)
            }
            LogDecision::Append { step } => {
                let _s = tracing::debug_span!("append_log", lists = old.len(), step_blocks = step).entered();
                // A step of the pass folds a range of blocks together with
                // the new points' blocks, each block rewritten once.
                let (range, ends) = step.map_or((0..0, false), |blocks| self.step_range(log, first_new, blocks));
                let blocks = self.patch_blocks(wtxn, first_new, &new, log, range.clone())?;
                span.record("blocks", blocks);
                let base = match step {
                    Some(_) => self.fold_range(wtxn, log, range, ends)?,
                    None => log.clone(),
                };
                // Written straight into the pages LMDB reserves: a batch's
                // value is about a megabyte at 100k points.
                let len = links_log::value_bytes(old.len(), m0, self.page_size);
                dbs.links0_log
                    .put_reserved(wtxn, next_epoch, len, |space| links_log::write_value(old.iter().copied(), m0, space))
                    .map_err(err)?;
                Ok(Some(base.with_value(next_epoch, old.iter().map(|(id, _)| *id))))
            }
            LogDecision::Fold => {
                let _s = tracing::debug_span!("fold_log", logged = log.records()).entered();
                let mut direct = old;
                direct.extend_from_slice(&new);
                let blocks = self.patch_blocks(wtxn, first_new, &direct, log, 0..u32::MAX)?;
                span.record("blocks", blocks);
                if log.is_empty() {
                    return Ok(None);
                }
                dbs.links0_log.clear(wtxn).map_err(err)?;
                Ok(Some(LogIndex::default()))
            }
        }
    }

    /// What this batch does with the changed lists of existing nodes,
    /// `old` (ascending ids), in an index of `nodes` nodes before it.
    fn log_decision(&self, log: &LogIndex, old: &[(u32, &[u32])], nodes: u32) -> LogDecision {
        let m0 = self.params.max_links(0);
        let per_block = codec::links0_block_nodes(m0) as u32;
        let mut blocks = 0u64;
        let mut last = None;
        for (id, _) in old {
            if last != Some(id / per_block) {
                blocks += 1;
                last = Some(id / per_block);
            }
        }
        log_policy::decide(
            self.opts.link_log,
            LogShape {
                records: log.records(),
                values: log.values().len(),
                in_pass: log.pass().is_some(),
                largest_value: log.largest_value(),
            },
            Changed { lists: old.len() as u64, blocks },
            Layer { nodes, list_bytes: codec::links_bytes(m0) as u64, per_block },
        )
    }

    /// The ids the next step of the log's pass folds (a new pass starts at
    /// id 0): `step_blocks` blocks from its cursor, in an index of `nodes`
    /// nodes. True if the step reaches the last node, ending the pass.
    pub(super) fn step_range(&self, log: &LogIndex, nodes: u32, step_blocks: u32) -> (Range<u32>, bool) {
        let per_block = codec::links0_block_nodes(self.params.max_links(0)) as u64;
        let start = log.pass().map_or(0, |p| p.cursor).min(nodes);
        let end = (u64::from(start) + u64::from(step_blocks.max(1)) * per_block).min(u64::from(nodes)) as u32;
        (start..end, end >= nodes)
    }

    /// The log's next version after a step of its pass folded `range`
    /// (already patched into the blocks); a step that `ends` the pass also
    /// deletes the values it folded.
    pub(super) fn fold_range(&self, wtxn: &mut RwTxn<'_>, log: &LogIndex, range: Range<u32>, ends: bool) -> Result<LogIndex, Attempt> {
        if ends {
            for &epoch in log.pass_values() {
                self.store.dbs.links0_log.delete(wtxn, epoch).map_err(|e| attempt(&self.store, e))?;
            }
        }
        Ok(log.folded(range, ends))
    }

    /// Patches bottom-layer lists into their blocks: `direct` (ascending
    /// ids), and every list of an id in `range` that the log version `fold`
    /// holds and `direct` does not replace (an empty range when not
    /// folding). Blocks are read, patched and rewritten
    /// once each, in key order; blocks past the ones that existed before
    /// `first_new` are appended. Returns how many blocks were written.
    pub(super) fn patch_blocks(
        &self,
        wtxn: &mut RwTxn<'_>,
        first_new: u32,
        direct: &[(u32, &[u32])],
        fold: &LogIndex,
        range: Range<u32>,
    ) -> Result<usize, Attempt> {
        // Lists are gathered a round at a time, as bytes, because the
        // logged ones are read from values of this very transaction, which
        // cannot be borrowed while blocks are written; a round bounds the
        // memory a fold needs whatever the log holds.
        const ROUND: usize = 4096;
        let dbs = &self.store.dbs;
        let err = |e| attempt(&self.store, e);
        let m0 = self.params.max_links(0);
        let per_block = codec::links0_block_nodes(m0) as u32;
        let list_len = codec::links_bytes(m0);
        // Blocks that held no node before this batch do not exist yet.
        let first_unwritten_block = first_new.div_ceil(per_block);
        let mut logged = fold.entries_in(range).peekable();
        let mut direct = direct.iter().peekable();
        let mut round: Vec<u32> = Vec::with_capacity(ROUND);
        let mut bytes: Vec<u8> = Vec::with_capacity(ROUND * list_len);
        let mut block_buf = Vec::new();
        let mut written = 0usize;
        let mut last_block: Option<u32> = None;
        // Every block written here, and those that may share its leaf page,
        // moves: the writer's kept addresses of them go (see `LinkBlocks`).
        let mut kept = self.link_blocks.lock();
        loop {
            round.clear();
            bytes.clear();
            {
                // Each log value read once per round.
                let mut values: Vec<Option<links_log::Value<'_>>> = Vec::new();
                while round.len() < ROUND {
                    let next_logged = logged.peek().map(|(id, _)| *id);
                    let next_direct = direct.peek().map(|(id, _)| *id);
                    let at = bytes.len();
                    // A list of this batch replaces the logged one of its id.
                    let take_direct = match (next_direct, next_logged) {
                        (None, None) => break,
                        (Some(d), Some(l)) => d <= l,
                        (Some(_), None) => true,
                        (None, Some(_)) => false,
                    };
                    if take_direct {
                        let Some(&(id, list)) = direct.next() else { break };
                        if next_logged == Some(id) {
                            logged.next();
                        }
                        bytes.resize(at + list_len, 0);
                        codec::write_links(list, &mut bytes[at..]);
                        round.push(id);
                    } else {
                        let Some((id, (slot, record))) = logged.next() else { break };
                        if values.len() <= slot {
                            values.resize(slot + 1, None);
                        }
                        let value = match values[slot] {
                            Some(v) => v,
                            None => *values[slot].insert(links_log::Value::read(&self.store, wtxn, fold, slot, list_len)?),
                        };
                        let list = value.list(record).ok_or_else(|| Error::Corrupt {
                            path: self.path.clone(),
                            detail: format!("link log record {record} of node {id} is past its value"),
                        })?;
                        bytes.extend_from_slice(list);
                        round.push(id);
                    }
                }
            }
            if round.is_empty() {
                break;
            }
            let mut i = 0;
            while i < round.len() {
                let block = round[i] / per_block;
                let exists = block < first_unwritten_block || last_block == Some(block);
                block_buf.clear();
                let block_len = list_len * per_block as usize;
                match dbs.links0.get(wtxn, block).map_err(err)? {
                    // A damaged block would make the patch below write
                    // outside it.
                    Some(old) if exists && old.len() != block_len => {
                        return Err(Attempt::Failed(Error::Corrupt {
                            path: self.path.clone(),
                            detail: format!("link block {block} has {} bytes, expected {block_len}", old.len()),
                        }));
                    }
                    Some(old) if exists => block_buf.extend_from_slice(old),
                    Some(_) | None => block_buf.resize(block_len, 0),
                }
                while i < round.len() && round[i] / per_block == block {
                    let at = (round[i] % per_block) as usize * list_len;
                    block_buf[at..at + list_len].copy_from_slice(&bytes[i * list_len..(i + 1) * list_len]);
                    i += 1;
                }
                // An append touches the last leaf, whose blocks are near too.
                kept.forget_near(block);
                if exists {
                    dbs.links0.put(wtxn, block, &block_buf).map_err(err)?;
                } else {
                    dbs.links0.append(wtxn, block, &block_buf).map_err(err)?;
                }
                if last_block != Some(block) {
                    written += 1;
                }
                last_block = Some(block);
            }
        }
        Ok(written)
    }

    pub(super) fn grow_map(&self) -> Result<()> {
        let new_size = self.store.next_map_size()?;
        // LMDB may only remap with no transaction open in the process: wait
        // for searches to finish, and for a copy in progress (the batch
        // needs the room).
        let Some(mut exclusive) = self.exclusive(Copies::Wait) else {
            return Err(Error::ResizeBlocked { path: self.path.clone(), waited: self.opts.resize_wait });
        };
        self.sessions.lock().clear();
        // The remap may move the map: every shared vector address goes stale,
        // and so does every kept link block address.
        exclusive.clear(self.moved.load(Ordering::SeqCst));
        self.link_blocks.lock().clear();
        // SAFETY: the writer lock is held and its transaction was dropped; the
        // exclusive resize lock guarantees no session or snapshot of this
        // index has a read transaction open.
        unsafe { self.store.env.resize(new_size as usize) }.map_err(|e| self.store.err(e))
    }
}

/// What a write transaction's linking starts from: the committed state, the
/// addresses shared across commits, and the link log as of that state.
#[derive(Clone, Copy)]
struct Base<'a> {
    state: &'a State,
    /// None while the shared addresses are stale (see `renew_shared_addrs`).
    shared: Option<&'a SharedAddrs>,
    log: &'a LogIndex,
}

/// What linking a batch leaves for the commit.
struct Linked {
    /// The graph's entry point.
    entry: Option<(u32, u8)>,
    /// The link log's next version, if the batch appended to it or folded it.
    log: Option<LogIndex>,
}

/// Why one write attempt stopped.
pub(super) enum Attempt {
    /// The map is full: grow it and replay the batches.
    MapFull,
    Failed(Error),
}

impl From<Error> for Attempt {
    fn from(e: Error) -> Self {
        match e {
            Error::Storage { source, .. } if store::is_map_full(&source) => Attempt::MapFull,
            other @ (Error::Invalid(_)
            | Error::ParamsMismatch { .. }
            | Error::NotFound { .. }
            | Error::UnsupportedFormat { .. }
            | Error::MapSizeLimit { .. }
            | Error::ResizeBlocked { .. }
            | Error::CompactBlocked { .. }
            | Error::DiskFull { .. }
            | Error::OpenFileLimit { .. }
            | Error::Stopped { .. }
            | Error::StaleEpoch { .. }
            | Error::EpochLowered { .. }
            | Error::LogGap { .. }
            | Error::LogTruncated { .. }
            | Error::LogAhead { .. }
            | Error::Corrupt { .. }
            | Error::FieldIndexBuilding { .. }
            | Error::IdSpaceExhausted { .. }
            | Error::Storage { .. }
            | Error::Io { .. }) => Attempt::Failed(other),
        }
    }
}

pub(super) fn attempt(store: &Store, e: heed::Error) -> Attempt {
    if store::is_map_full(&e) { Attempt::MapFull } else { Attempt::Failed(store.err(e)) }
}

fn overlay_len(plan: &Plan<'_>) -> u32 {
    plan.inserts.len() as u32
}
