//! One writer per shard: coalesces the batch parts waiting for a shard into
//! one engine write transaction (group commit).
//!
//! LMDB has one writer per environment and every commit pays an fsync, so
//! committing parts one by one would serialise ingest on the disk. The
//! writer takes whatever is queued when it becomes free (up to a limit) and
//! commits it together; each part still gets its own outcome. The queue is
//! bounded: when it is full, `submit` waits, and that wait travels back to
//! the coordinator and through gRPC flow control to the ingest job.
//!
//! Everything that writes a shard goes through its writer, in queue order:
//! a fence (`FenceShard`) commits in the group after the batches queued
//! before it and refuses the stale ones queued after it, and entries of
//! another copy's batch log (`ApplyLogEntries`) commit in a transaction of
//! their own, all or none.

use std::sync::Arc;
use std::time::{Duration, Instant};

use opentelemetry::KeyValue;
use shoal_engine::{BatchOutcome, Error as EngineError, Index, LogApplied, LogEntry, VacuumOutcome, Write, Written};
use shoal_proto::ShoalError;
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;
use tracing::Instrument;

use crate::convert::engine_error;
use crate::metrics;

/// Limits of one group commit.
#[derive(Clone, Copy, Debug)]
pub struct WriterOptions {
    /// Parts waiting per shard before `submit` blocks.
    pub queue_depth: usize,
    /// Most parts committed together.
    pub max_group_parts: usize,
    /// Most operations committed together (bounds the transaction's memory).
    pub max_group_ops: usize,
    /// Tombstones per vacuum step run while the queue is empty and the
    /// shard's tombstones pass its ratio (0: no vacuum on its own).
    pub vacuum_step: usize,
    /// After this long without a write the shard is at rest, and is
    /// compacted once if its free pages are at least `rest_compact_ratio`
    /// of the file (zero: never). The engine's own ratio
    /// (`engine.compact_free_ratio`, 0.2) is high because a shard taking
    /// batches needs about one commit's worth of free pages again at once;
    /// at rest nothing will, and a freshly loaded million-point shard
    /// keeps 10% of its file free that way (docs/scale.md).
    pub rest_after: Duration,
    pub rest_compact_ratio: f64,
}

impl Default for WriterOptions {
    fn default() -> Self {
        // A step of 1,000 tombstones takes about as long as a batch of
        // 1,000 inserts: a write that arrives meanwhile waits that long.
        WriterOptions {
            queue_depth: 64,
            max_group_parts: 64,
            max_group_ops: 50_000,
            vacuum_step: 1000,
            rest_after: Duration::from_secs(60),
            rest_compact_ratio: 0.05,
        }
    }
}

/// What a job asks of the shard's writer.
pub(crate) enum Work {
    /// A batch or a fence: committed together with the others waiting.
    Write(Write),
    /// Entries of another copy's batch log: applied in a transaction of
    /// their own, all or none, in queue order with everything else.
    Log { entries: Vec<LogEntry>, epoch: u64 },
    /// One vacuum step of up to `max` tombstones, in a transaction of its
    /// own (`shoalctl shard vacuum`).
    Vacuum { max: usize },
    /// Nothing: wakes an idle writer so that it looks for idle work (a
    /// field index just declared, whose build it then runs).
    Wake,
}

impl Work {
    fn ops(&self) -> usize {
        match self {
            Work::Write(Write::Batch { batch, .. }) => batch.ops.len(),
            Work::Write(Write::Fence { .. }) => 1,
            Work::Log { entries, .. } => entries.iter().map(|e| e.points.len() + e.deletes.len()).sum(),
            Work::Vacuum { max } => *max,
            Work::Wake => 0,
        }
    }
}

/// What the writer did with a job.
pub(crate) enum Answer {
    Written(Written),
    Log(LogApplied),
    Vacuumed(VacuumOutcome),
    Woken,
}

/// Why a job was not done.
pub(crate) enum Failure {
    /// This job failed on its own (refused as invalid, fenced off or out
    /// of order; or, for a log job, any engine error); the others went
    /// ahead.
    Refused(EngineError),
    /// The commit or the writer failed; nothing was written.
    Service(ShoalError),
}

struct Job {
    work: Work,
    reply: oneshot::Sender<Result<Answer, Failure>>,
    /// The submitting request's span: the group commit continues its trace
    /// and records its queue wait in it.
    span: tracing::Span,
    queued: Instant,
}

/// Queues parts for one writer.
pub(crate) struct JobSender(mpsc::Sender<Job>);

/// Handle to a shard's writer task.
pub(crate) struct ShardWriter {
    tx: mpsc::Sender<Job>,
    task: JoinHandle<()>,
}

impl ShardWriter {
    /// A writer for `index`, reporting its metrics with `labels`.
    pub(crate) fn spawn(index: Arc<Index>, opts: WriterOptions, labels: [KeyValue; 2]) -> Self {
        let (tx, rx) = mpsc::channel(opts.queue_depth.max(1));
        let task = tokio::spawn(run(index, rx, opts, labels));
        ShardWriter { tx, task }
    }

    /// Parts waiting in the queue now.
    pub(crate) fn queue_depth(&self) -> usize {
        self.tx.max_capacity() - self.tx.capacity()
    }

    /// A sender to queue parts with, usable after the lock that guards the
    /// writer is released.
    pub(crate) fn sender(&self) -> JobSender {
        JobSender(self.tx.clone())
    }

    /// Queues `work` and waits until it is committed (or refused).
    pub(crate) async fn submit_via(tx: JobSender, work: Work) -> Result<Answer, Failure> {
        let (reply, done) = oneshot::channel();
        tx.0.send(Job { work, reply, span: tracing::Span::current(), queued: Instant::now() })
            .await
            .map_err(|_| Failure::Service(ShoalError::unavailable("shard is closing", std::time::Duration::from_millis(500))))?;
        done.await.map_err(|_| Failure::Service(ShoalError::internal("shard writer stopped before answering")))?
    }

    /// Stops accepting parts, commits everything already queued, and waits.
    pub(crate) async fn close(self) {
        drop(self.tx);
        let _ = self.task.await;
    }
}

async fn run(index: Arc<Index>, mut rx: mpsc::Receiver<Job>, opts: WriterOptions, labels: [KeyValue; 2]) {
    let m = metrics::get();
    // A log job found while gathering a group: it runs right after it.
    let mut held: Option<Job> = None;
    // After a failed compaction, when to try again.
    let mut compact_after: Option<Instant> = None;
    // Whether the shard has been at rest since its last job (see
    // `WriterOptions::rest_after`).
    let mut rested = false;
    loop {
        let first = match held.take() {
            Some(job) => job,
            None => match rx.try_recv() {
                Ok(job) => job,
                Err(mpsc::error::TryRecvError::Disconnected) => break,
                Err(mpsc::error::TryRecvError::Empty) => {
                    // Idle: a step of a field index build, then a vacuum
                    // step if one is due, then look again (writes that
                    // came meanwhile go first).
                    if index.field_index_building() && build_step(&index, &labels).await {
                        continue;
                    }
                    if opts.vacuum_step > 0 && idle_vacuum(&index, opts.vacuum_step, &labels).await {
                        continue;
                    }
                    // Then move the link log's lists back into their
                    // blocks, where searches read them faster, a bounded
                    // step at a time, if it holds enough of them; then give
                    // free pages back if enough are (a write that comes
                    // meanwhile waits for the compaction).
                    if idle_fold(&index, &labels).await {
                        continue;
                    }
                    if compact_after.is_none_or(|t| Instant::now() >= t) {
                        compact_after = idle_compact(&index, None, &labels).await;
                    }
                    let next = if rested || opts.rest_after.is_zero() {
                        rx.recv().await
                    } else {
                        match tokio::time::timeout(opts.rest_after, rx.recv()).await {
                            Ok(next) => next,
                            Err(_) => {
                                // At rest: once, until the next write.
                                rested = true;
                                if compact_after.is_none_or(|t| Instant::now() >= t) {
                                    compact_after = idle_compact(&index, Some(opts.rest_compact_ratio), &labels).await;
                                }
                                continue;
                            }
                        }
                    };
                    match next {
                        Some(job) => job,
                        None => break,
                    }
                }
            },
        };
        rested = false;
        let mut ops = first.work.ops();
        let mut jobs = vec![first];
        while matches!(jobs[0].work, Work::Write(_)) && jobs.len() < opts.max_group_parts && ops < opts.max_group_ops {
            match rx.try_recv() {
                Ok(job) if matches!(job.work, Work::Log { .. } | Work::Vacuum { .. } | Work::Wake) => {
                    held = Some(job);
                    break;
                }
                Ok(job) => {
                    ops += job.work.ops();
                    jobs.push(job);
                }
                Err(_) => break,
            }
        }
        // One trace can hold the group's work: it goes in the first part's,
        // and the others' point to it.
        // Inside the first part's span rather than with it as an explicit
        // parent: head sampling reads a new span's trace from the current
        // span (shoal_server::sampling).
        let group = jobs[0].span.in_scope(|| tracing::info_span!("commit_group", parts = jobs.len(), ops));
        for job in &jobs {
            let wait = job.queued.elapsed();
            m.queue_wait.record(wait.as_secs_f64(), &labels);
            job.span.record("queue_wait_ms", wait.as_secs_f64() * 1000.0);
            group.follows_from(&job.span);
        }
        let started = Instant::now();
        let (works, replies): (Vec<Work>, Vec<_>) = jobs.into_iter().map(|j| (j.work, j.reply)).unzip();
        let committing = Arc::clone(&index);
        let result = tokio::task::spawn_blocking(move || group.in_scope(|| commit(&committing, works))).in_current_span().await;
        m.commit_duration.record(started.elapsed().as_secs_f64(), &labels);
        match result {
            Ok(Ok(answers)) => {
                for (reply, answer) in replies.into_iter().zip(answers) {
                    if let Ok(Answer::Written(Written::Batch { outcome: BatchOutcome::Applied { upserted, deleted, .. }, .. })) = &answer {
                        m.points_upserted.add(*upserted as u64, &labels);
                        m.points_deleted.add(*deleted as u64, &labels);
                    }
                    let _ = reply.send(answer);
                }
            }
            Ok(Err(e)) => {
                for reply in replies {
                    let _ = reply.send(Err(Failure::Service(e.clone())));
                }
            }
            Err(join) => {
                let e = ShoalError::internal(format!("shard writer panicked: {join}"));
                for reply in replies {
                    let _ = reply.send(Err(Failure::Service(e.clone())));
                }
            }
        }
        // A build goes on under a steady stream of writes too: a step
        // after each group, never two groups without one.
        if index.field_index_building() {
            build_step(&index, &labels).await;
        }
    }
}

/// Ids one step of a field index build goes over: about 10 ms of payloads
/// to read and index, what a batch waits at most behind it.
const BUILD_STEP_IDS: u32 = 10_000;

/// One step of the online build of a field index; true if it indexed
/// anything. A failure is logged (the index stays not ready, and filters
/// on it are refused; the next step tries again).
async fn build_step(index: &Arc<Index>, labels: &[KeyValue; 2]) -> bool {
    let index = Arc::clone(index);
    let span = tracing::info_span!("field_index_build_step");
    let result = tokio::task::spawn_blocking(move || {
        let _in = span.enter();
        index.build_field_indexes(BUILD_STEP_IDS)
    })
    .await;
    match result {
        Ok(Ok(Some(step))) => {
            metrics::get().field_index_built.add(u64::from(BUILD_STEP_IDS.min(step.of)), labels);
            if step.done {
                tracing::info!(field = %step.field, points = step.of, "field index built");
            }
            true
        }
        Ok(Ok(None)) => false,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "field index build step failed");
            false
        }
        Err(join) => {
            tracing::error!(error = %join, "field index build step panicked");
            false
        }
    }
}

/// Runs one vacuum step if the shard's tombstones are due for one; true if
/// it vacuumed anything. Failures are logged and end the idle vacuum until
/// the next write (a damaged shard answers its requests with the error).
async fn idle_vacuum(index: &Arc<Index>, step: usize, labels: &[KeyValue; 2]) -> bool {
    let index = Arc::clone(index);
    let started = Instant::now();
    let span = tracing::info_span!("vacuum_step", step);
    let result = tokio::task::spawn_blocking(move || -> Result<Option<VacuumOutcome>, EngineError> {
        let _in = span.enter();
        if !index.vacuum_due()? {
            return Ok(None);
        }
        index.vacuum(step).map(Some)
    })
    .await;
    match result {
        Ok(Ok(Some(o))) => {
            metrics::get().vacuumed.add(o.vacuumed, labels);
            tracing::debug!(vacuumed = o.vacuumed, pending = o.pending, seconds = started.elapsed().as_secs_f64(), "vacuum step");
            o.vacuumed > 0
        }
        Ok(Ok(None)) => false,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "vacuum step failed");
            false
        }
        Err(join) => {
            tracing::error!(error = %join, "vacuum step panicked");
            false
        }
    }
}

/// Runs one step of a fold of the shard's link log into its blocks if it
/// holds enough lists or a fold is under way; true if it ran one (the
/// writer then looks for writes before the next step). A failure is
/// logged and ends the idle fold until the next write (a damaged shard
/// answers its requests with the error).
async fn idle_fold(index: &Arc<Index>, labels: &[KeyValue; 2]) -> bool {
    let index = Arc::clone(index);
    let started = Instant::now();
    let span = tracing::info_span!("fold_link_log_step");
    let result = tokio::task::spawn_blocking(move || {
        let _in = span.enter();
        if !index.fold_due()? {
            return Ok(None);
        }
        index.fold_link_log_step().map(Some)
    })
    .await;
    match result {
        Ok(Ok(Some(step))) => {
            metrics::get().folded_lists.add(step.lists, labels);
            tracing::debug!(
                lists = step.lists,
                blocks = step.blocks,
                ended = step.ended,
                seconds = started.elapsed().as_secs_f64(),
                "link log fold step"
            );
            true
        }
        Ok(Ok(None)) => false,
        Ok(Err(e)) => {
            tracing::warn!(error = %e, "folding the link log failed");
            false
        }
        Err(join) => {
            tracing::error!(error = %join, "folding the link log panicked");
            false
        }
    }
}

/// Compacts the shard's file if its free pages are due for it: at the
/// engine's ratio, or at `at_rest` once the shard is at rest. A failure
/// (a snapshot's copy held its read transaction past `resize_wait`) is
/// logged and the next try waits a minute; returns when that is.
async fn idle_compact(index: &Arc<Index>, at_rest: Option<f64>, labels: &[KeyValue; 2]) -> Option<Instant> {
    let index = Arc::clone(index);
    let span = tracing::info_span!("compact", at_rest = at_rest.is_some());
    let result = tokio::task::spawn_blocking(move || {
        let _in = span.enter();
        let due = match at_rest {
            Some(ratio) => index.compact_due_at(ratio)?,
            None => index.compact_due()?,
        };
        if !due {
            return Ok(None);
        }
        index.compact().map(Some)
    })
    .await;
    let failed = match result {
        Ok(Ok(Some(o))) => {
            metrics::record_compaction(labels, &o);
            return None;
        }
        Ok(Ok(None)) => return None,
        Ok(Err(e)) => e.to_string(),
        Err(join) => join.to_string(),
    };
    tracing::warn!(error = %failed, "compaction failed; trying again in a minute");
    Some(Instant::now() + std::time::Duration::from_secs(60))
}

/// Commits one group: writes together, or one log job alone. The outer
/// error means nothing was committed.
fn commit(index: &Index, works: Vec<Work>) -> Result<Vec<Result<Answer, Failure>>, ShoalError> {
    let mut writes = Vec::with_capacity(works.len());
    for work in works {
        match work {
            Work::Write(w) => writes.push(w),
            // Gathered alone (see `run`).
            Work::Log { entries, epoch } => {
                return Ok(vec![index.apply_log(entries, epoch).map(Answer::Log).map_err(Failure::Refused)]);
            }
            Work::Vacuum { max } => {
                return Ok(vec![index.vacuum(max).map(Answer::Vacuumed).map_err(Failure::Refused)]);
            }
            Work::Wake => return Ok(vec![Ok(Answer::Woken)]),
        }
    }
    let outcomes = index.write(writes).map_err(engine_error)?;
    Ok(outcomes.into_iter().map(|o| o.map(Answer::Written).map_err(|r| Failure::Refused(r.into()))).collect())
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::{Duration, Instant};

    use rand::{Rng, SeedableRng};
    use shoal_engine::{Batch, Index, IndexOptions, IndexParams, LinkLog, Metric, Op, Point};

    use super::{ShardWriter, WriterOptions};

    /// An index whose link log holds lists: batches of new points and of
    /// upserts, each changing existing nodes' lists, which go to the log.
    fn index_with_logged_lists(dir: &std::path::Path, idle_fold_ratio: f64) -> Arc<Index> {
        let opts = IndexOptions {
            build_threads: 1,
            durable: false,
            link_log: LinkLog::Always { fold_lists: 1 << 20 },
            idle_fold_ratio,
            // A fold of several steps, each its own commit.
            fold_step_blocks: 2,
            ..IndexOptions::default()
        };
        let index = Index::open_or_create(dir, IndexParams::new(8, Metric::Euclidean), opts).unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(9);
        let mut upsert = |ids: std::ops::Range<u64>| {
            let ops = ids.map(|id| Op::Upsert(Point { id, vector: (0..8).map(|_| rng.random_range(-1.0..1.0)).collect(), payload: None }));
            index.apply(Batch { ops: ops.collect(), source: None }).unwrap();
        };
        upsert(0..300);
        // Small batches: a batch folds once the log would hold more lists
        // than the index has nodes, so stop at one that appended.
        for b in 0..10u64 {
            upsert(300 + b * 20..320 + b * 20);
            if index.stats().unwrap().link_log_lists > 0 {
                break;
            }
        }
        assert!(index.stats().unwrap().link_log_lists > 0, "the batches logged no list");
        Arc::new(index)
    }

    /// A shard with free pages below the engine's ratio keeps them while
    /// it takes writes, and gives them back once at rest; with
    /// `rest_after` zero it never does.
    #[tokio::test]
    async fn a_shard_at_rest_is_compacted_at_the_lower_ratio() {
        let dir = tempfile::tempdir().unwrap();
        let labels = crate::metrics::labels(&(shoal_proto::CollectionName::parse("c").unwrap(), 0));
        let with_free_pages = |name: &str| {
            // The engine's own ratio never triggers here; the minimum size
            // does not stand in the way.
            let opts =
                IndexOptions { build_threads: 1, durable: false, compact_free_ratio: 0.0, compact_min_bytes: 0, ..IndexOptions::default() };
            let index = Index::open_or_create(dir.path().join(name), IndexParams::new(8, Metric::Euclidean), opts).unwrap();
            let mut rng = rand::rngs::StdRng::seed_from_u64(3);
            for _ in 0..6 {
                let ops = (0..400u64)
                    .map(|id| Op::Upsert(Point { id, vector: (0..8).map(|_| rng.random_range(-1.0..1.0)).collect(), payload: None }));
                index.apply(Batch { ops: ops.collect(), source: None }).unwrap();
            }
            let s = index.stats().unwrap();
            assert!(s.free_bytes * 50 > s.disk_bytes, "too few free pages to tell: {s:?}");
            Arc::new(index)
        };
        let at_rest = |rest_after| WriterOptions { rest_after, rest_compact_ratio: 0.01, ..WriterOptions::default() };

        let index = with_free_pages("rests");
        let before = index.stats().unwrap().disk_bytes;
        let writer = ShardWriter::spawn(Arc::clone(&index), at_rest(Duration::from_millis(300)), labels.clone());
        // Not yet at rest: nothing given back.
        tokio::time::sleep(Duration::from_millis(100)).await;
        assert_eq!(index.stats().unwrap().disk_bytes, before);
        let deadline = Instant::now() + Duration::from_secs(10);
        while index.stats().unwrap().disk_bytes >= before {
            assert!(Instant::now() < deadline, "the file is still {before} bytes");
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        writer.close().await;
        let s = index.stats().unwrap();
        assert!(s.free_bytes * 100 < s.disk_bytes, "{s:?}");

        let index = with_free_pages("never");
        let before = index.stats().unwrap().disk_bytes;
        let writer = ShardWriter::spawn(Arc::clone(&index), at_rest(Duration::ZERO), labels);
        tokio::time::sleep(Duration::from_millis(500)).await;
        writer.close().await;
        assert_eq!(index.stats().unwrap().disk_bytes, before);
    }

    /// The writer folds a log past `idle_fold_ratio` as soon as it is idle,
    /// a step (a commit) at a time until the log is empty, and leaves it
    /// alone with a ratio of 0.
    #[tokio::test]
    async fn an_idle_writer_folds_the_link_log_when_it_is_due() {
        let dir = tempfile::tempdir().unwrap();
        let index = index_with_logged_lists(&dir.path().join("due"), 0.01);
        let labels = crate::metrics::labels(&(shoal_proto::CollectionName::parse("c").unwrap(), 0));
        let commits = index.stats().unwrap().commits;
        let writer = ShardWriter::spawn(Arc::clone(&index), WriterOptions::default(), labels.clone());
        let deadline = Instant::now() + Duration::from_secs(10);
        while index.stats().unwrap().link_log_lists > 0 {
            assert!(Instant::now() < deadline, "still {} lists in the log", index.stats().unwrap().link_log_lists);
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        writer.close().await;
        let steps = index.stats().unwrap().commits - commits;
        assert!(steps >= 2, "the fold took {steps} commits");

        let index = index_with_logged_lists(&dir.path().join("off"), 0.0);
        let lists = index.stats().unwrap().link_log_lists;
        let writer = ShardWriter::spawn(Arc::clone(&index), WriterOptions::default(), labels);
        tokio::time::sleep(Duration::from_millis(300)).await;
        writer.close().await;
        assert_eq!(index.stats().unwrap().link_log_lists, lists);
    }
}
