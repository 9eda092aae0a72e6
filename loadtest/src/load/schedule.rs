//! When requests go out. Open loop: request `i` is due at `start + i / rate`
//! whatever happened to the ones before, and its latency runs from that
//! intended time, so a server that stalls shows the wait its callers would
//! have seen (no coordinated omission). Closed loop: each client sends its
//! next request when the last one is answered.

use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::Semaphore;
use tokio::time::Instant;

use super::stats::{Outcome, Recorder};

/// "30s", "500ms", "2m", "1h", or plain seconds ("1.5").
pub(crate) fn parse_duration(s: &str) -> Result<Duration, String> {
    let t = s.trim();
    let split = t.find(|c: char| c.is_ascii_alphabetic()).unwrap_or(t.len());
    let (num, unit) = t.split_at(split);
    let v: f64 = num.trim().parse().map_err(|_| format!("not a duration: {s:?} (e.g. 30s, 500ms, 2m)"))?;
    let scale = match unit {
        "ms" => 0.001,
        "" | "s" => 1.0,
        "m" | "min" => 60.0,
        "h" => 3600.0,
        u => return Err(format!("unknown unit {u:?} in {s:?} (ms, s, m, h)")),
    };
    if !v.is_finite() || v < 0.0 {
        return Err(format!("not a duration: {s:?}"));
    }
    Ok(Duration::from_secs_f64(v * scale))
}

/// An open loop's timetable.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Schedule {
    pub(crate) start: Instant,
    /// Requests per second.
    pub(crate) rate: f64,
}

impl Schedule {
    /// When request `i` is meant to go out.
    pub(crate) fn intended(&self, i: u64) -> Instant {
        self.start + Duration::from_secs_f64(i as f64 / self.rate)
    }
}

/// Where a loop stops: no request is started at or after `end`, nor more
/// than `count` of them.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Bound {
    pub(crate) end: Option<Instant>,
    pub(crate) count: Option<u64>,
}

impl Bound {
    /// Whether request `i`, due at `at`, is within the bound.
    pub(crate) fn allows(&self, i: u64, at: Instant) -> bool {
        self.count.is_none_or(|c| i < c) && self.end.is_none_or(|e| at < e)
    }
}

/// Runs `op(i)` for every request of the schedule within `bound`, each at
/// its intended time. At most `max_in_flight` run at once: a request that
/// finds them all busy is counted late and waits for a slot, its latency
/// still counted from its intended time; one still waiting `give_up` after
/// it was due is dropped (counted, never sent). Returns when every request
/// sent has finished.
pub(crate) async fn open_loop<F, Fut>(sched: Schedule, bound: Bound, max_in_flight: usize, give_up: Duration, rec: Arc<Recorder>, op: F)
where
    F: Fn(u64) -> Fut,
    Fut: Future<Output = Outcome> + Send + 'static,
{
    let slots = max_in_flight.clamp(1, Semaphore::MAX_PERMITS);
    let free = Arc::new(Semaphore::new(slots));
    let mut ticks = pace(sched, bound);
    while let Some(i) = ticks.recv().await {
        let due = sched.intended(i);
        rec.scheduled();
        let permit = match free.clone().try_acquire_owned() {
            Ok(p) => Some(p),
            Err(_) => {
                rec.late();
                tokio::time::timeout_at(due + give_up, free.clone().acquire_owned()).await.ok().and_then(Result::ok)
            }
        };
        let Some(permit) = permit else {
            rec.dropped();
            continue;
        };
        rec.sent(Instant::now().saturating_duration_since(due));
        let fut = op(i);
        let rec = rec.clone();
        tokio::spawn(async move {
            let outcome = fut.await;
            rec.finish(due, Instant::now(), outcome);
            drop(permit);
        });
    }
    // Every slot back: everything sent has finished.
    let _all = free.acquire_many(slots as u32).await;
}

/// The numbers of the schedule's requests within `bound`, each sent at its
/// intended time by a thread of its own. tokio's timer works in whole
/// milliseconds and wakes a sleep at the first tick at or after its
/// deadline: every request went out up to a millisecond late (send lag
/// p50 1.03 ms at 500/s), which the open loop then counted in every
/// latency. The kernel's high-resolution sleep, with the thread's timer
/// slack cut from 50 µs to 10 µs, wakes within tens of microseconds
/// (docs/loadtest.md, "Sends on time"). A request whose time has passed
/// (the loop waited for a slot) is sent on at once. The thread stops at
/// the bound or when the receiver is dropped.
fn pace(sched: Schedule, bound: Bound) -> tokio::sync::mpsc::UnboundedReceiver<u64> {
    let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
    let thread_tx = tx.clone();
    let started = std::thread::Builder::new().name("pacer".into()).spawn(move || {
        // SAFETY: PR_SET_TIMERSLACK takes a number and sets this thread's
        // slack only; a kernel that refuses it leaves the default.
        unsafe { libc::prctl(libc::PR_SET_TIMERSLACK, 10_000 as libc::c_ulong) };
        let mut i = 0u64;
        loop {
            let due = sched.intended(i);
            if !bound.allows(i, due) || thread_tx.is_closed() {
                return;
            }
            if let Some(wait) = due.into_std().checked_duration_since(std::time::Instant::now()) {
                std::thread::sleep(wait);
            }
            if thread_tx.send(i).is_err() {
                return;
            }
            i += 1;
        }
    });
    if let Err(e) = started {
        // No thread to spare: the runtime's timer, a millisecond coarser.
        eprintln!("warning: no pacer thread ({e}); requests go out on tokio's millisecond timer");
        tokio::spawn(async move {
            let mut i = 0u64;
            while bound.allows(i, sched.intended(i)) {
                tokio::time::sleep_until(sched.intended(i)).await;
                if tx.send(i).is_err() {
                    return;
                }
                i += 1;
            }
        });
    }
    rx
}

/// `clients` loops, each sending `op(i)` (i counted across them) when its
/// last request finished, until `bound`. Latency runs from the send.
pub(crate) async fn closed_loop<F, Fut>(clients: usize, bound: Bound, rec: Arc<Recorder>, op: F)
where
    F: Fn(u64) -> Fut + Send + Sync + 'static,
    Fut: Future<Output = Outcome> + Send + 'static,
{
    let next = Arc::new(AtomicU64::new(0));
    let op = Arc::new(op);
    let mut tasks = Vec::new();
    for _ in 0..clients.max(1) {
        let (next, op, rec) = (next.clone(), op.clone(), rec.clone());
        tasks.push(tokio::spawn(async move {
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let sent = Instant::now();
                if !bound.allows(i, sent) {
                    break;
                }
                rec.scheduled();
                rec.sent(Duration::ZERO);
                let outcome = op(i).await;
                rec.finish(sent, Instant::now(), outcome);
            }
        }));
    }
    for t in tasks {
        // A panicking op is a bug; let it show.
        if let Err(e) = t.await {
            std::panic::resume_unwind(e.into_panic());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::stats::summarize;

    #[test]
    fn durations_parse_with_units() {
        assert_eq!(parse_duration("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse_duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(parse_duration("2m"), Ok(Duration::from_secs(120)));
        assert_eq!(parse_duration("1.5"), Ok(Duration::from_millis(1500)));
        assert_eq!(parse_duration("1h"), Ok(Duration::from_secs(3600)));
        assert!(parse_duration("3 parsecs").is_err());
        assert!(parse_duration("-1s").is_err());
        assert!(parse_duration("").is_err());
    }

    #[test]
    fn the_schedule_spaces_requests_by_the_rate_from_the_start() {
        let start = Instant::now();
        let s = Schedule { start, rate: 200.0 };
        assert_eq!(s.intended(0), start);
        assert_eq!(s.intended(1) - start, Duration::from_millis(5));
        assert_eq!(s.intended(200) - start, Duration::from_secs(1));
        assert_eq!(s.intended(1001) - start, Duration::from_millis(5005));
        // Within a 1 s bound: requests 0..=199 (the 200th is due at the end).
        let b = Bound { end: Some(start + Duration::from_secs(1)), count: None };
        assert_eq!((0..1000).take_while(|&i| b.allows(i, s.intended(i))).count(), 200);
        let b = Bound { end: None, count: Some(7) };
        assert_eq!((0..1000).take_while(|&i| b.allows(i, s.intended(i))).count(), 7);
    }

    /// A server that takes 50 ms per request, one request at a time, asked
    /// for 100 per second: request i is due at 10i ms but can only go out at
    /// 50i ms, so its latency from the intended time is about 50 + 40i ms.
    /// A closed loop (or a generator timing from the send) would see 50 ms.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_stalled_open_loop_counts_the_wait_in_the_latency() {
        let start = Instant::now() + Duration::from_millis(20);
        let rec = Recorder::new("query", start);
        let op = |_| async {
            tokio::time::sleep(Duration::from_millis(50)).await;
            Outcome::ok(1)
        };
        let bound = Bound { end: None, count: Some(10) };
        open_loop(Schedule { start, rate: 100.0 }, bound, 1, Duration::from_secs(10), rec.clone(), op).await;
        let p = rec.take_phase();
        assert_eq!((p.counts.scheduled, p.counts.sent, p.counts.ok, p.counts.dropped), (10, 10, 10, 0));
        // Every request but the first found the one slot busy.
        assert_eq!(p.counts.late, 9);
        let l = summarize(&p.latency);
        // The last: due at 90 ms, sent at ~450 ms, done at ~500 ms.
        assert!(l.max_ms >= 400.0 && l.max_ms < 700.0, "{l:?}");
        assert!(l.p50_ms >= 180.0, "{l:?}");
        let lag = summarize(&p.send_lag);
        assert!(lag.max_ms >= 300.0, "{lag:?}");

        // The same server in a closed loop: every latency about 50 ms.
        let rec = Recorder::new("query", Instant::now());
        closed_loop(1, Bound { end: None, count: Some(5) }, rec.clone(), op).await;
        let p = rec.take_phase();
        assert_eq!((p.counts.sent, p.counts.ok, p.counts.late), (5, 5, 0));
        let l = summarize(&p.latency);
        assert!(l.max_ms >= 49.0 && l.max_ms < 150.0, "{l:?}");
    }

    /// Every request of the bound, in order, none before its time (a
    /// thread's sleep lasts at least what it asked).
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn the_pacer_gives_every_request_of_the_bound_never_early() {
        let start = Instant::now() + Duration::from_millis(5);
        let sched = Schedule { start, rate: 2000.0 };
        for (bound, n) in [
            (Bound { end: None, count: Some(50) }, 50),
            // Due before the end: 0 ms, 0.5 ms, ..., 9.5 ms.
            (Bound { end: Some(start + Duration::from_millis(10)), count: None }, 20),
        ] {
            let mut ticks = pace(sched, bound);
            let mut seen = Vec::new();
            while let Some(i) = ticks.recv().await {
                assert!(Instant::now() >= sched.intended(i), "request {i} went out before its time");
                seen.push(i);
            }
            assert_eq!(seen, (0..n).collect::<Vec<u64>>());
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn requests_that_wait_past_give_up_are_dropped_not_sent() {
        let start = Instant::now();
        let rec = Recorder::new("query", start);
        let op = |_| async {
            tokio::time::sleep(Duration::from_millis(300)).await;
            Outcome::Err("UNAVAILABLE".into())
        };
        // 100/s for 100 ms, one slot, give up after 50 ms: the first is sent,
        // the other nine wait and are dropped.
        let bound = Bound { end: Some(start + Duration::from_millis(100)), count: None };
        open_loop(Schedule { start, rate: 100.0 }, bound, 1, Duration::from_millis(50), rec.clone(), op).await;
        let p = rec.take_phase();
        assert_eq!((p.counts.scheduled, p.counts.sent, p.counts.errors, p.counts.dropped, p.counts.late), (10, 1, 1, 9, 9));
        assert_eq!(p.errors.get("UNAVAILABLE"), Some(&1));
        assert_eq!(p.counts.sent, p.counts.ok + p.counts.errors);
        assert_eq!(p.counts.scheduled, p.counts.sent + p.counts.dropped);
    }
}
