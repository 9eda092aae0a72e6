//! One ingest stream of a job: sends its batches in order on one `Ingest`
//! call, up to `window` ahead of their acks, and when the call breaks
//! (a coordinator restarting, a node failing over) opens another and sends
//! again every batch not yet acknowledged: a shard skips what it applied
//! already, so nothing is applied twice. A batch the cluster refuses for
//! what it holds (INVALID_ARGUMENT and the like) ends the job, named.

use std::collections::VecDeque;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, bail};
use shoal_proto::v1;
use tokio::sync::mpsc;
use tokio::time::Instant;
use tokio_stream::wrappers::ReceiverStream;
use tonic::Code;

use super::plan::Batch;

/// A batch on its way: what to send and what it covers.
pub struct Outgoing {
    pub batch: Batch,
    pub offset: u64,
}

/// What every stream adds to, for the progress bar and the summary.
#[derive(Default)]
pub struct Counters {
    pub rows: AtomicU64,
    pub bytes: AtomicU64,
    pub batches: AtomicU64,
    /// Batches the cluster reported as applied before (a resend).
    pub skipped: AtomicU64,
    pub retries: AtomicU64,
}

pub struct Stream {
    pub client: shoal_proto::auth::KeyedClient,
    pub collection: String,
    pub source: String,
    pub window: usize,
    /// Give up after this long without an ack.
    pub retry_for: Duration,
    pub counters: Arc<Counters>,
    pub progress: indicatif::ProgressBar,
}

struct Pending {
    request: v1::IngestRequest,
    rows: std::ops::Range<u64>,
    batch: u64,
    bytes: usize,
}

/// Codes that say the batch itself or the collection is wrong, or the
/// cluster has no room for it (a full disk, a limit): sending it again
/// would get the same answer. The job stops; run again, it resumes.
fn final_code(code: Code) -> bool {
    matches!(
        code,
        Code::InvalidArgument
            | Code::NotFound
            | Code::AlreadyExists
            | Code::PermissionDenied
            | Code::Unauthenticated
            | Code::OutOfRange
            | Code::ResourceExhausted
    )
}

fn retry_hint(s: &tonic::Status) -> Duration {
    let ms = s.metadata().get(shoal_proto::RETRY_AFTER_MS).and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(200);
    Duration::from_millis(ms).clamp(Duration::from_millis(50), Duration::from_secs(2))
}

impl Stream {
    /// Sends what `input` yields until it closes, and returns once every
    /// batch sent is acknowledged.
    pub async fn run(mut self, mut input: mpsc::Receiver<Outgoing>) -> Result<()> {
        let mut pending: VecDeque<Pending> = VecDeque::new();
        let mut input_done = false;
        let mut last_ack = Instant::now();
        loop {
            if input_done && pending.is_empty() {
                return Ok(());
            }
            let failure = self.one_call(&mut input, &mut pending, &mut input_done, &mut last_ack).await;
            let Err(status) = failure else { continue };
            let front = pending.front().map_or(String::new(), |p| {
                format!(
                    " (batch {}, rows {}..{}, offset {} of source {})",
                    p.batch, p.rows.start, p.rows.end, p.request.offset, self.source
                )
            });
            if final_code(status.code()) {
                bail!("the cluster refused a batch{front}: {}: {}", code_name(status.code()), status.message());
            }
            if last_ack.elapsed() > self.retry_for {
                bail!("no batch acknowledged for {:?}{front}; last error: {status}", self.retry_for);
            }
            self.counters.retries.fetch_add(1, Ordering::Relaxed);
            self.progress.set_message(format!("retrying after {}: {}", code_name(status.code()), status.message()));
            tokio::time::sleep(retry_hint(&status)).await;
        }
    }

    /// One `Ingest` call: resends what is pending, then sends and acks
    /// until the input is done and acknowledged (`Ok`) or the call fails.
    async fn one_call(
        &mut self,
        input: &mut mpsc::Receiver<Outgoing>,
        pending: &mut VecDeque<Pending>,
        input_done: &mut bool,
        last_ack: &mut Instant,
    ) -> Result<(), tonic::Status> {
        let (tx, rx) = mpsc::channel::<v1::IngestRequest>(self.window.max(1) + pending.len());
        for p in pending.iter() {
            // The channel has room for every pending batch.
            let _ = tx.try_send(p.request.clone());
        }
        let mut acks = self.client.ingest(ReceiverStream::new(rx)).await?.into_inner();
        let mut tx = Some(tx);
        loop {
            if *input_done && pending.is_empty() {
                return Ok(());
            }
            if *input_done {
                // Nothing more to send: closing the request side lets the
                // call end once the last ack is out.
                tx = None;
            }
            let can_send = !*input_done && pending.len() < self.window.max(1);
            tokio::select! {
                next = input.recv(), if can_send => match next {
                    Some(o) => {
                        let p = pending_of(&self.collection, &self.source, o);
                        let request = p.request.clone();
                        pending.push_back(p);
                        if let Some(tx) = &tx
                            && tx.send(request).await.is_err()
                        {
                            return Err(tonic::Status::unavailable("the call ended while sending"));
                        }
                    }
                    None => *input_done = true,
                },
                ack = acks.message() => match ack? {
                    Some(ack) => {
                        let Some(p) = pending.pop_front() else {
                            return Err(tonic::Status::internal(format!("an ack for offset {} that was not sent", ack.offset)));
                        };
                        if ack.offset != p.request.offset || ack.source != self.source {
                            return Err(tonic::Status::internal(format!(
                                "ack for {}@{} while waiting for {}@{}", ack.source, ack.offset, self.source, p.request.offset
                            )));
                        }
                        if ack.status == v1::BatchStatus::Skipped as i32 {
                            self.counters.skipped.fetch_add(1, Ordering::Relaxed);
                        }
                        let rows = p.rows.end - p.rows.start;
                        self.counters.rows.fetch_add(rows, Ordering::Relaxed);
                        let bytes = self.counters.bytes.fetch_add(p.bytes as u64, Ordering::Relaxed) + p.bytes as u64;
                        self.counters.batches.fetch_add(1, Ordering::Relaxed);
                        self.progress.inc(rows);
                        // Also clears a retry's message: acks flow again.
                        let secs = self.progress.elapsed().as_secs_f64().max(1e-3);
                        self.progress.set_message(format!("{:.1} MB/s", bytes as f64 / secs / 1e6));
                        *last_ack = Instant::now();
                    }
                    None if pending.is_empty() => {
                        if *input_done {
                            return Ok(());
                        }
                        return Err(tonic::Status::unavailable("the coordinator ended the stream"));
                    }
                    None => return Err(tonic::Status::unavailable("the stream ended before every batch was acknowledged")),
                },
            }
        }
    }
}

fn pending_of(collection: &str, source: &str, o: Outgoing) -> Pending {
    let Outgoing { batch, offset } = o;
    let points = batch
        .points
        .into_iter()
        .map(|r| v1::Point {
            id: r.id,
            vector: r.vector,
            payload: r.payload.map(|json| v1::Payload { kind: Some(v1::payload::Kind::Json(json)) }),
        })
        .collect();
    let request = v1::IngestRequest { collection: collection.to_owned(), source: source.to_owned(), offset, points, ..Default::default() };
    Pending { request, rows: batch.rows, batch: batch.number, bytes: batch.bytes }
}

fn code_name(code: Code) -> String {
    format!("{code:?}").chars().fold(String::new(), |mut s, c| {
        if c.is_uppercase() && !s.is_empty() {
            s.push('_');
        }
        s.push(c.to_ascii_uppercase());
        s
    })
}

/// Asks where each of `sources` stands in `collection`.
pub async fn offsets(client: &mut shoal_proto::auth::KeyedClient, collection: &str) -> Result<Vec<v1::SourceOffset>> {
    let req = v1::GetOffsetsRequest { collection: collection.to_owned(), sources: vec![] };
    Ok(client.get_offsets(req).await.with_context(|| format!("asking where the sources of {collection} stand"))?.into_inner().offsets)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn codes_read_as_in_the_docs() {
        assert_eq!(code_name(Code::InvalidArgument), "INVALID_ARGUMENT");
        assert_eq!(code_name(Code::Unavailable), "UNAVAILABLE");
        assert!(final_code(Code::InvalidArgument) && !final_code(Code::Unavailable) && !final_code(Code::DeadlineExceeded));
    }
}
