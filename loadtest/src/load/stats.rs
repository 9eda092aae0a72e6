//! What a workload measured: counts, latencies in HDR histograms (one for
//! the phase, one per second of the run), errors by gRPC code, recall.
//!
//! A [`Recorder`] is one series of requests ("query", "ingest", "upsert",
//! "delete"). Its per-second buckets stay open for a few seconds (answers
//! arrive a little out of order across tasks), then shrink to a [`Second`]
//! and give their histogram back, so a long run holds a few histograms, not
//! one per second.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use hdrhistogram::Histogram;
use parking_lot::Mutex;
use serde::Serialize;
use tokio::time::Instant;

/// Latencies are recorded in microseconds, up to an hour.
const MAX_MICROS: u64 = 3_600_000_000;
/// Buckets this many seconds older than the newest one are closed.
const OPEN_SECONDS: u64 = 3;

pub(crate) fn histogram() -> Histogram<u64> {
    Histogram::new_with_bounds(1, MAX_MICROS, 3).expect("constant bounds are valid")
}

fn micros(d: Duration) -> u64 {
    u64::try_from(d.as_micros()).unwrap_or(u64::MAX).max(1)
}

/// p50, p90, p99, p99.9 and max of a histogram of microseconds, in ms.
#[derive(Serialize, Clone, Debug, Default, PartialEq)]
pub(crate) struct LatencySummary {
    pub(crate) count: u64,
    pub(crate) mean_ms: f64,
    pub(crate) p50_ms: f64,
    pub(crate) p90_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) p999_ms: f64,
    pub(crate) max_ms: f64,
}

pub(crate) fn summarize(h: &Histogram<u64>) -> LatencySummary {
    if h.is_empty() {
        return LatencySummary::default();
    }
    let ms = |v: u64| v as f64 / 1000.0;
    LatencySummary {
        count: h.len(),
        mean_ms: h.mean() / 1000.0,
        p50_ms: ms(h.value_at_quantile(0.5)),
        p90_ms: ms(h.value_at_quantile(0.9)),
        p99_ms: ms(h.value_at_quantile(0.99)),
        p999_ms: ms(h.value_at_quantile(0.999)),
        max_ms: ms(h.max()),
    }
}

/// The canonical name of a gRPC code, as in `UNAVAILABLE: 12`.
pub(crate) fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code;
    match code {
        Code::Ok => "OK",
        Code::Cancelled => "CANCELLED",
        Code::Unknown => "UNKNOWN",
        Code::InvalidArgument => "INVALID_ARGUMENT",
        Code::DeadlineExceeded => "DEADLINE_EXCEEDED",
        Code::NotFound => "NOT_FOUND",
        Code::AlreadyExists => "ALREADY_EXISTS",
        Code::PermissionDenied => "PERMISSION_DENIED",
        Code::ResourceExhausted => "RESOURCE_EXHAUSTED",
        Code::FailedPrecondition => "FAILED_PRECONDITION",
        Code::Aborted => "ABORTED",
        Code::OutOfRange => "OUT_OF_RANGE",
        Code::Unimplemented => "UNIMPLEMENTED",
        Code::Internal => "INTERNAL",
        Code::Unavailable => "UNAVAILABLE",
        Code::DataLoss => "DATA_LOSS",
        Code::Unauthenticated => "UNAUTHENTICATED",
    }
}

/// How one request ended.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Outcome {
    /// Answered. `items`: what it carried (1 query, or a batch's acked
    /// vectors); `recall` when there is a ground truth.
    Ok { items: u64, partial: bool, skipped: bool, recall: Option<f64> },
    /// Failed with this code (a gRPC code's name, or `CLIENT_*` for what
    /// the load generator gave up on).
    Err(String),
}

impl Outcome {
    pub(crate) fn ok(items: u64) -> Outcome {
        Outcome::Ok { items, partial: false, skipped: false, recall: None }
    }

    pub(crate) fn status(s: &tonic::Status) -> Outcome {
        Outcome::Err(code_name(s.code()).to_owned())
    }
}

/// Requests of a phase, by what happened to them. Every request due is
/// `scheduled`; it is `sent` or `dropped` (never sent: no free slot in time);
/// every one sent is `ok` or `errors`. `late`: had to wait for a slot
/// (in-flight limit or ingest window) past its intended time.
#[derive(Serialize, Clone, Debug, Default, PartialEq)]
pub(crate) struct Counts {
    pub(crate) scheduled: u64,
    pub(crate) sent: u64,
    pub(crate) ok: u64,
    pub(crate) errors: u64,
    pub(crate) late: u64,
    pub(crate) dropped: u64,
    /// Answers with `partial` set (a shard missing, `--allow-partial`).
    pub(crate) partial: u64,
    /// Ingest batches acknowledged as SKIPPED.
    pub(crate) skipped: u64,
    /// Items of the answered requests (vectors acked, queries answered).
    pub(crate) items: u64,
}

/// Recall@k over the answered queries that have a ground truth.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub(crate) struct RecallSummary {
    pub(crate) mean: f64,
    pub(crate) queries: u64,
}

/// One phase's accumulated measurements.
pub(crate) struct PhaseStats {
    pub(crate) counts: Counts,
    pub(crate) latency: Histogram<u64>,
    pub(crate) error_latency: Histogram<u64>,
    pub(crate) send_lag: Histogram<u64>,
    pub(crate) errors: BTreeMap<String, u64>,
    recall_sum: f64,
    recall_n: u64,
}

impl PhaseStats {
    fn new() -> PhaseStats {
        PhaseStats {
            counts: Counts::default(),
            latency: histogram(),
            error_latency: histogram(),
            send_lag: histogram(),
            errors: BTreeMap::new(),
            recall_sum: 0.0,
            recall_n: 0,
        }
    }

    pub(crate) fn recall(&self) -> Option<RecallSummary> {
        (self.recall_n > 0).then(|| RecallSummary { mean: self.recall_sum / self.recall_n as f64, queries: self.recall_n })
    }
}

/// One second of one series: what finished in it.
#[derive(Serialize, Clone, Debug, Default, PartialEq)]
pub(crate) struct Second {
    pub(crate) ok: u64,
    pub(crate) errors: u64,
    pub(crate) items: u64,
    pub(crate) p50_ms: f64,
    pub(crate) p99_ms: f64,
    pub(crate) max_ms: f64,
}

struct Bucket {
    ok: u64,
    errors: u64,
    items: u64,
    latency: Histogram<u64>,
}

/// Per-second aggregation by completion time.
pub(crate) struct Timeline {
    open: BTreeMap<u64, Bucket>,
    closed: Vec<Second>,
    spare: Vec<Histogram<u64>>,
}

impl Timeline {
    pub(crate) fn new() -> Timeline {
        Timeline { open: BTreeMap::new(), closed: Vec::new(), spare: Vec::new() }
    }

    /// Counts an answer (with its latency) or an error finishing in second `t`.
    pub(crate) fn record(&mut self, t: u64, latency: Option<Duration>, ok: bool, items: u64) {
        while let Some((&first, _)) = self.open.first_key_value() {
            if first + OPEN_SECONDS >= t {
                break;
            }
            let (s, b) = self.open.pop_first().expect("non-empty");
            self.close(s, b);
        }
        if (t as usize) < self.closed.len() {
            // Later than a closed second: counted, not in its percentiles.
            let s = &mut self.closed[t as usize];
            if ok {
                s.ok += 1;
                s.items += items;
            } else {
                s.errors += 1;
            }
            return;
        }
        let spare = &mut self.spare;
        let b = self.open.entry(t).or_insert_with(|| Bucket { ok: 0, errors: 0, items: 0, latency: spare.pop().unwrap_or_else(histogram) });
        if ok {
            b.ok += 1;
            b.items += items;
            if let Some(l) = latency {
                b.latency.saturating_record(micros(l));
            }
        } else {
            b.errors += 1;
        }
    }

    fn close(&mut self, t: u64, mut b: Bucket) {
        while (self.closed.len() as u64) < t {
            self.closed.push(Second::default());
        }
        let l = summarize(&b.latency);
        self.closed.push(Second { ok: b.ok, errors: b.errors, items: b.items, p50_ms: l.p50_ms, p99_ms: l.p99_ms, max_ms: l.max_ms });
        b.latency.reset();
        self.spare.push(b.latency);
    }

    /// Closes every bucket; one row per second from 0 to `until` (or the
    /// last second with anything, if later), zero where nothing finished.
    pub(crate) fn finish(&mut self, until: u64) -> Vec<Second> {
        while let Some((s, b)) = self.open.pop_first() {
            self.close(s, b);
        }
        while (self.closed.len() as u64) < until {
            self.closed.push(Second::default());
        }
        self.closed.clone()
    }
}

struct Inner {
    phase: PhaseStats,
    timeline: Timeline,
    /// Latencies of the last second seen live, for the progress line.
    live: Histogram<u64>,
    live_second: u64,
    live_ok: u64,
    live_items: u64,
    /// The second before `live_second`: (second, items, p99 ms).
    live_prev: Option<(u64, u64, f64)>,
}

/// One series' measurements, shared by the tasks that send its requests.
pub(crate) struct Recorder {
    pub(crate) series: &'static str,
    start: Instant,
    inner: Mutex<Inner>,
}

/// What the progress line shows for a series.
#[derive(Debug, Default, Clone)]
pub(crate) struct Live {
    pub(crate) items_per_s: u64,
    pub(crate) p99_ms: f64,
    pub(crate) ok: u64,
    pub(crate) errors: u64,
}

impl Recorder {
    pub(crate) fn new(series: &'static str, start: Instant) -> Arc<Recorder> {
        Arc::new(Recorder {
            series,
            start,
            inner: Mutex::new(Inner {
                phase: PhaseStats::new(),
                timeline: Timeline::new(),
                live: histogram(),
                live_second: 0,
                live_ok: 0,
                live_items: 0,
                live_prev: None,
            }),
        })
    }

    pub(crate) fn scheduled(&self) {
        self.inner.lock().phase.counts.scheduled += 1;
    }

    pub(crate) fn late(&self) {
        self.inner.lock().phase.counts.late += 1;
    }

    pub(crate) fn dropped(&self) {
        self.inner.lock().phase.counts.dropped += 1;
    }

    /// A request went out `lag` after its intended time.
    pub(crate) fn sent(&self, lag: Duration) {
        let mut g = self.inner.lock();
        g.phase.counts.sent += 1;
        g.phase.send_lag.saturating_record(micros(lag));
    }

    /// A request meant to go out at `intended` finished at `done`.
    pub(crate) fn finish(&self, intended: Instant, done: Instant, outcome: Outcome) {
        let latency = done.saturating_duration_since(intended);
        let t = done.saturating_duration_since(self.start).as_secs();
        let mut g = self.inner.lock();
        let g = &mut *g;
        match outcome {
            Outcome::Ok { items, partial, skipped, recall } => {
                let p = &mut g.phase;
                p.counts.ok += 1;
                p.counts.items += items;
                p.counts.partial += u64::from(partial);
                p.counts.skipped += u64::from(skipped);
                p.latency.saturating_record(micros(latency));
                if let Some(r) = recall {
                    p.recall_sum += r;
                    p.recall_n += 1;
                }
                g.timeline.record(t, Some(latency), true, items);
                if t != g.live_second {
                    g.live_prev = Some((g.live_second, g.live_items, g.live.value_at_quantile(0.99) as f64 / 1000.0));
                    g.live_second = t;
                    g.live.reset();
                    g.live_ok = 0;
                    g.live_items = 0;
                }
                g.live.saturating_record(micros(latency));
                g.live_ok += 1;
                g.live_items += items;
            }
            Outcome::Err(code) => {
                g.phase.counts.errors += 1;
                g.phase.error_latency.saturating_record(micros(latency));
                *g.phase.errors.entry(code).or_default() += 1;
                g.timeline.record(t, None, false, 0);
            }
        }
    }

    /// The phase so far, and a fresh one from now on.
    pub(crate) fn take_phase(&self) -> PhaseStats {
        std::mem::replace(&mut self.inner.lock().phase, PhaseStats::new())
    }

    /// The per-second rows of the whole run, `until` seconds at least.
    pub(crate) fn timeline(&self, until: u64) -> Vec<Second> {
        self.inner.lock().timeline.finish(until)
    }

    /// Items and p99 of the last complete second (answers finished in it),
    /// counts of the phase.
    pub(crate) fn live(&self, now: Instant) -> Live {
        let g = self.inner.lock();
        let Some(last) = now.saturating_duration_since(self.start).as_secs().checked_sub(1) else {
            return Live { ok: g.phase.counts.ok, errors: g.phase.counts.errors, ..Live::default() };
        };
        let (items_per_s, p99_ms) = if g.live_second == last {
            (g.live_items, g.live.value_at_quantile(0.99) as f64 / 1000.0)
        } else {
            match g.live_prev {
                Some((s, items, p99)) if s == last => (items, p99),
                // Nothing finished in that second.
                Some(_) | None => (0, 0.0),
            }
        };
        Live { items_per_s, p99_ms, ok: g.phase.counts.ok, errors: g.phase.counts.errors }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_reports_the_percentiles_in_milliseconds() {
        let mut h = histogram();
        // 1..=1000 ms, one each.
        for ms in 1..=1000u64 {
            h.record(ms * 1000).unwrap();
        }
        let s = summarize(&h);
        assert_eq!(s.count, 1000);
        let near = |a: f64, b: f64| (a - b).abs() <= b * 0.002 + 0.01;
        assert!(near(s.p50_ms, 500.0), "{s:?}");
        assert!(near(s.p90_ms, 900.0), "{s:?}");
        assert!(near(s.p99_ms, 990.0), "{s:?}");
        assert!(near(s.p999_ms, 999.0), "{s:?}");
        assert!(near(s.max_ms, 1000.0), "{s:?}");
        assert!(near(s.mean_ms, 500.5), "{s:?}");
        assert_eq!(summarize(&histogram()), LatencySummary::default());
    }

    #[test]
    fn code_names_are_the_canonical_ones() {
        assert_eq!(code_name(tonic::Code::Unavailable), "UNAVAILABLE");
        assert_eq!(code_name(tonic::Code::DeadlineExceeded), "DEADLINE_EXCEEDED");
        assert_eq!(code_name(tonic::Code::ResourceExhausted), "RESOURCE_EXHAUSTED");
        assert_eq!(code_name(tonic::Code::InvalidArgument), "INVALID_ARGUMENT");
    }

    #[test]
    fn timeline_buckets_by_second_fills_gaps_and_keeps_late_arrivals() {
        let mut tl = Timeline::new();
        for ms in [10u64, 20, 30] {
            tl.record(0, Some(Duration::from_millis(ms)), true, 2);
        }
        tl.record(0, None, false, 0);
        // Nothing in seconds 1 to 3, then second 4 and 9 (which closes 0..=5).
        tl.record(4, Some(Duration::from_millis(100)), true, 5);
        tl.record(9, Some(Duration::from_millis(7)), true, 1);
        // An answer for second 0 arriving after second 0 closed.
        tl.record(0, Some(Duration::from_millis(1)), true, 1);
        let rows = tl.finish(12);
        assert_eq!(rows.len(), 12);
        assert_eq!((rows[0].ok, rows[0].errors, rows[0].items), (4, 1, 7));
        assert!((rows[0].p50_ms - 20.0).abs() < 0.05 && (rows[0].max_ms - 30.0).abs() < 0.05, "{:?}", rows[0]);
        for t in [1, 2, 3, 5, 6, 7, 8, 10, 11] {
            assert_eq!(rows[t], Second::default(), "second {t}");
        }
        assert_eq!((rows[4].ok, rows[4].items), (1, 5));
        assert!((rows[4].p99_ms - 100.0).abs() < 0.1);
        assert_eq!(rows[9].ok, 1);
        // Closed buckets hand their histograms back for reuse.
        assert!(tl.open.is_empty() && !tl.spare.is_empty());
    }

    #[test]
    fn recorder_counts_add_up_and_latency_runs_from_the_intended_time() {
        let start = Instant::now();
        let r = Recorder::new("query", start);
        for _ in 0..3 {
            r.scheduled();
        }
        r.sent(Duration::ZERO);
        r.sent(Duration::from_millis(5));
        r.dropped();
        r.late();
        // Meant for start, done 50 ms later: 50 ms even if it was sent late.
        r.finish(start, start + Duration::from_millis(50), Outcome::Ok { items: 1, partial: true, skipped: false, recall: Some(0.5) });
        r.finish(start, start + Duration::from_millis(1500), Outcome::Err("UNAVAILABLE".into()));
        let p = r.take_phase();
        assert_eq!(p.counts, Counts { scheduled: 3, sent: 2, ok: 1, errors: 1, late: 1, dropped: 1, partial: 1, skipped: 0, items: 1 });
        assert_eq!(p.errors.get("UNAVAILABLE"), Some(&1));
        assert!((summarize(&p.latency).max_ms - 50.0).abs() < 0.1);
        assert!((summarize(&p.error_latency).max_ms - 1500.0).abs() < 2.0);
        assert!((summarize(&p.send_lag).max_ms - 5.0).abs() < 0.01);
        assert_eq!(p.recall(), Some(RecallSummary { mean: 0.5, queries: 1 }));
        // The next phase starts empty; the timeline goes on.
        assert_eq!(r.take_phase().counts, Counts::default());
        // Live: what finished in the last complete second, not the current one.
        r.finish(start, start + Duration::from_millis(1200), Outcome::ok(3));
        r.finish(start, start + Duration::from_millis(1300), Outcome::ok(4));
        r.finish(start, start + Duration::from_millis(2100), Outcome::ok(100));
        let l = r.live(start + Duration::from_millis(2500));
        // (ok counts the phase, which began after the take above.)
        assert_eq!((l.items_per_s, l.ok), (7, 3), "{l:?}");
        assert!((l.p99_ms - 1300.0).abs() < 2.0, "{l:?}");
        assert_eq!(r.live(start + Duration::from_millis(3500)).items_per_s, 100);
        assert_eq!(r.live(start + Duration::from_millis(4500)).items_per_s, 0);
        assert_eq!(r.live(start + Duration::from_millis(500)).items_per_s, 0);
        let tl = r.timeline(2);
        assert_eq!((tl[0].ok, tl[1].errors, tl[1].ok, tl[2].ok), (1, 1, 2, 1));
    }
}
