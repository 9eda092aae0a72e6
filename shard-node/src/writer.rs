//! One writer per shard: coalesces the batch parts waiting for a shard into
//! one engine write transaction (group commit).
//!
//! LMDB has one writer per environment and every commit pays an fsync, so
//! committing parts one by one would serialise ingest on the disk. The
//! writer takes whatever is queued when it becomes free (up to a limit) and
//! commits it together; each part still gets its own outcome. The queue is
//! bounded: when it is full, `submit` waits, and that wait travels back to
//! the coordinator and through gRPC flow control to the ingest job.

use std::sync::Arc;
use std::time::Instant;

use opentelemetry::KeyValue;
use shoal_engine::{Batch, BatchOutcome, Index};
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
}

impl Default for WriterOptions {
    fn default() -> Self {
        WriterOptions { queue_depth: 64, max_group_parts: 64, max_group_ops: 50_000 }
    }
}

struct Job {
    batch: Batch,
    reply: oneshot::Sender<Result<BatchOutcome, ShoalError>>,
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

    /// Queues `batch` and waits until it is committed (or rejected).
    pub(crate) async fn submit_via(tx: JobSender, batch: Batch) -> Result<BatchOutcome, ShoalError> {
        let (reply, done) = oneshot::channel();
        tx.0.send(Job { batch, reply, span: tracing::Span::current(), queued: Instant::now() })
            .await
            .map_err(|_| ShoalError::unavailable("shard is closing", std::time::Duration::from_millis(500)))?;
        done.await.map_err(|_| ShoalError::internal("shard writer stopped before answering"))?
    }

    /// Stops accepting parts, commits everything already queued, and waits.
    pub(crate) async fn close(self) {
        drop(self.tx);
        let _ = self.task.await;
    }
}

async fn run(index: Arc<Index>, mut rx: mpsc::Receiver<Job>, opts: WriterOptions, labels: [KeyValue; 2]) {
    let m = metrics::get();
    while let Some(first) = rx.recv().await {
        let mut ops = first.batch.ops.len();
        let mut jobs = vec![first];
        while jobs.len() < opts.max_group_parts && ops < opts.max_group_ops {
            match rx.try_recv() {
                Ok(job) => {
                    ops += job.batch.ops.len();
                    jobs.push(job);
                }
                Err(_) => break,
            }
        }
        // One trace can hold the group's work: it goes in the first part's,
        // and the others' point to it.
        let group = tracing::info_span!(parent: &jobs[0].span, "commit_group", parts = jobs.len(), ops);
        for job in &jobs {
            let wait = job.queued.elapsed();
            m.queue_wait.record(wait.as_secs_f64(), &labels);
            job.span.record("queue_wait_ms", wait.as_secs_f64() * 1000.0);
            group.follows_from(&job.span);
        }
        let (batches, replies): (Vec<Batch>, Vec<_>) = jobs.into_iter().map(|j| (j.batch, j.reply)).unzip();
        let index = Arc::clone(&index);
        let started = Instant::now();
        let result = tokio::task::spawn_blocking(move || group.in_scope(|| index.apply_group(batches))).in_current_span().await;
        m.commit_duration.record(started.elapsed().as_secs_f64(), &labels);
        match result {
            Ok(Ok(outcomes)) => {
                for (reply, outcome) in replies.into_iter().zip(outcomes) {
                    if let Ok(BatchOutcome::Applied { upserted, deleted, .. }) = &outcome {
                        m.points_upserted.add(*upserted as u64, &labels);
                        m.points_deleted.add(*deleted as u64, &labels);
                    }
                    let _ = reply.send(outcome.map_err(|e| ShoalError::invalid(e.to_string())));
                }
            }
            Ok(Err(e)) => {
                let e = engine_error(e);
                for reply in replies {
                    let _ = reply.send(Err(e.clone()));
                }
            }
            Err(join) => {
                let e = ShoalError::internal(format!("shard writer panicked: {join}"));
                for reply in replies {
                    let _ = reply.send(Err(e.clone()));
                }
            }
        }
    }
}
