//! Searching one shard: check the request, wait for a slot, run the
//! queries on a blocking thread until they are done, the caller's deadline
//! passes, the caller goes away or the answer outgrows a message; answer.
//!
//! A search holds a thread and its results while it runs, so the node runs
//! a bounded number at once and bounds each one's hits (queries × k): a
//! burst of huge searches waits or is refused instead of taking the node's
//! memory, and one whose caller has gone stops within an expansion or two.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use prost::Message;
use shoal_engine::{Filter, Index, MAX_EF, MAX_K, SearchParams, Stop, Where};
use shoal_proto::{ErrorCode, ShoalError, v1};
use tokio::sync::Semaphore;

use crate::config::NodeLimits;
use crate::convert::{engine_error, payload_from_engine};
use crate::host::blocking;

/// The searches of one node: their slots and limits.
pub(crate) struct Searches {
    slots: Arc<Semaphore>,
    max_queries: usize,
    max_hits: u64,
    /// Searches up to this much work (queries × ef) run on the request's
    /// own task.
    inline_work: u64,
    /// Largest answer that fits in one gRPC message, with room for framing.
    max_answer_bytes: usize,
}

/// Searches asking for this many hits (queries × k) allocate megabytes,
/// which glibc would keep after they end (see `memory`).
const LARGE_SEARCH_HITS: u64 = 100_000;

/// When the caller stops waiting: at its deadline, or when its handler is
/// dropped (the client went away or reset the stream; tonic also drops it
/// at the `grpc-timeout` deadline).
pub(crate) struct Caller {
    deadline: Option<Instant>,
    gone: Arc<AtomicBool>,
}

/// Marks the caller gone when dropped; lives in the handler's future.
pub(crate) struct GoneOnDrop(Arc<AtomicBool>);

impl Drop for GoneOnDrop {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}

impl Caller {
    /// A caller with `timeout` left (none: it waits as long as it takes).
    pub(crate) fn new(timeout: Option<Duration>) -> (Caller, GoneOnDrop) {
        let gone = Arc::new(AtomicBool::new(false));
        let deadline = timeout.and_then(|t| Instant::now().checked_add(t));
        (Caller { deadline, gone: Arc::clone(&gone) }, GoneOnDrop(gone))
    }

    /// What the engine checks while it walks.
    fn stop(&self) -> Stop {
        let stop = match self.deadline {
            Some(d) => Stop::at(d),
            None => Stop::never(),
        };
        stop.with_flag(Arc::clone(&self.gone))
    }

    fn deadline_passed(&self) -> bool {
        self.deadline.is_some_and(|d| Instant::now() >= d)
    }

    async fn deadline_reached(&self) {
        match self.deadline {
            Some(d) => tokio::time::sleep_until(d.into()).await,
            None => std::future::pending().await,
        }
    }
}

/// A request that passed every check.
struct Checked {
    queries: Vec<Vec<f32>>,
    params: SearchParams,
    /// The filter, if the request has one.
    filter: Option<Filter>,
    allow_unindexed: bool,
}

impl Searches {
    pub(crate) fn new(limits: &NodeLimits, max_message_bytes: usize) -> Self {
        Searches {
            slots: Arc::new(Semaphore::new(limits.concurrent_searches().max(1))),
            max_queries: limits.max_queries.max(1),
            max_hits: limits.max_hits.max(1),
            inline_work: limits.inline_search_work,
            max_answer_bytes: max_message_bytes.saturating_sub(1024),
        }
    }

    /// Runs `req` on `index` for `caller`.
    pub(crate) async fn run(
        &self,
        index: Arc<Index>,
        req: v1::SearchShardRequest,
        caller: Caller,
    ) -> Result<Vec<v1::SearchResult>, ShoalError> {
        let checked = self.check(&index, req)?;
        let slot = tokio::select! {
            slot = Arc::clone(&self.slots).acquire_owned() => {
                slot.map_err(|_| ShoalError::unavailable("node is shutting down", Duration::from_secs(1)))?
            }
            () = caller.deadline_reached() => return Err(stopped_error(&caller, 0, checked.queries.len())),
        };
        let max_answer_bytes = self.max_answer_bytes;
        let large = checked.queries.len() as u64 * checked.params.k as u64 >= LARGE_SEARCH_HITS;
        let work = checked.queries.len() as u64 * checked.params.ef as u64;
        let answered = if work <= self.inline_work {
            // A small search takes less time than handing it to a blocking
            // thread and back (a futex wake and two context switches).
            let _slot = slot;
            answer(&index, &checked, &caller, max_answer_bytes)
        } else {
            let span = tracing::Span::current();
            blocking(move || {
                let _slot = slot;
                span.in_scope(|| answer(&index, &checked, &caller, max_answer_bytes))
            })
            .await
        };
        if large {
            // Its answer is freed once sent, or already was if it stopped.
            crate::memory::return_free_memory_soon();
        }
        answered
    }

    /// Everything about the request that can be wrong, in the order a
    /// caller should fix it: the queries first, then k and ef, then size.
    fn check(&self, index: &Index, req: v1::SearchShardRequest) -> Result<Checked, ShoalError> {
        let v1::SearchShardRequest { shard: _, queries, k, ef, with_payload, filter, allow_unindexed } = req;
        if queries.is_empty() || queries.len() > self.max_queries {
            return Err(ShoalError::invalid(format!("a search takes 1 to {} query vectors, got {}", self.max_queries, queries.len())));
        }
        let p = index.params();
        let n = queries.len();
        let queries: Vec<Vec<f32>> = queries.into_iter().map(|v| v.values).collect();
        for (i, q) in queries.iter().enumerate() {
            if let Err(e) = p.metric.validate(q, p.dim as usize) {
                let at = if n == 1 { "query".to_owned() } else { format!("query {i}") };
                return Err(ShoalError::invalid(format!("{at}: {e}")));
            }
        }
        if k == 0 || k as usize > MAX_K {
            return Err(ShoalError::invalid(format!("k must be between 1 and {MAX_K}, got {k}")));
        }
        if ef as usize > MAX_EF {
            return Err(ShoalError::invalid(format!("ef must be at most {MAX_EF}, got {ef}")));
        }
        let hits = n as u64 * u64::from(k);
        if hits > self.max_hits {
            return Err(too_many_hits(n, k, self.max_hits));
        }
        let ef = if ef == 0 { shoal_proto::default_ef(k) } else { ef.max(k) };
        let filter = filter.map(shoal_filter::wire::from_proto).transpose()?;
        Ok(Checked { queries, params: SearchParams { k: k as usize, ef: ef as usize, with_payload }, filter, allow_unindexed })
    }
}

/// The error for a search that asks for more hits than a node returns.
pub(crate) fn too_many_hits(queries: usize, k: u32, max: u64) -> ShoalError {
    ShoalError::invalid(format!(
        "a search may ask for at most {max} hits (queries × k); this one asks for {queries} × {k} = {}: \
         lower k or send fewer queries per request",
        queries as u64 * u64::from(k)
    ))
}

/// Runs the queries one after the other (each is already parallel with the
/// other requests), checking `stop` inside every walk and the answer's
/// size after every query.
fn answer(index: &Index, c: &Checked, caller: &Caller, max_bytes: usize) -> Result<Vec<v1::SearchResult>, ShoalError> {
    let stop = caller.stop();
    let mut out = Vec::with_capacity(c.queries.len());
    let mut bytes = 0usize;
    for (i, q) in c.queries.iter().enumerate() {
        let found = match &c.filter {
            Some(filter) => index.search_where(q, c.params, Where { filter, allow_unindexed: c.allow_unindexed }, &stop),
            None => index.search_with(q, c.params, &stop),
        };
        let found = match found {
            Ok(found) => found,
            Err(shoal_engine::Error::Stopped { .. }) => return Err(stopped_error(caller, i, c.queries.len())),
            Err(e) => return Err(engine_error(e)),
        };
        let result = v1::SearchResult {
            hits: found
                .hits
                .into_iter()
                .map(|h| v1::Hit { id: h.id, distance: h.distance, payload: payload_from_engine(h.payload) })
                .collect(),
            explain: Some(crate::filters::explain_to_proto(found.explain)),
        };
        bytes += result.encoded_len() + 8;
        if bytes > max_bytes {
            return Err(ShoalError::exhausted(format!(
                "the answer outgrew the message limit of {max_bytes} bytes after {} of {} queries \
                 (max_message_bytes); ask for fewer hits, fewer queries per request, or no payloads",
                i + 1,
                c.queries.len()
            )));
        }
        out.push(result);
    }
    Ok(out)
}

fn stopped_error(caller: &Caller, done: usize, of: usize) -> ShoalError {
    let why = if caller.deadline_passed() { "its deadline passed" } else { "the caller cancelled it" };
    ShoalError::new(ErrorCode::DeadlineExceeded, format!("search stopped after {done} of {of} queries: {why}"))
}
