//! Where a slow request's time went, from its trace: the spans one OTLP
//! sink received from every process of a cluster on one machine (so their
//! clocks agree), grouped by trace.
//!
//! A trace's root (the coordinator's `rpc` span) is cut along its slowest
//! remote call (the caller's span whose child span is in another process
//! and ends last) into five parts that add up to the root's duration:
//! `before` the call starts, `out` (from the caller's span starting to the
//! callee's starting: the request's encoding, the loopback and the
//! callee's wake-up), `remote` (the callee's own span), `back` (from the
//! callee's span ending to the caller's ending: the response's way back
//! and the caller's wake-up) and `after` (merging, answering). Which part
//! is the largest in the slow traces says which hop holds the tail
//! (docs/loadtest.md, "Which hop holds the tail").

use std::collections::HashMap;
use std::sync::Arc;

use serde::Serialize;

/// One received span.
#[derive(Clone, Debug)]
pub(crate) struct SpanRec {
    pub(crate) trace: [u8; 16],
    pub(crate) id: [u8; 8],
    /// All zero for a root.
    pub(crate) parent: [u8; 8],
    pub(crate) name: String,
    pub(crate) service: Arc<str>,
    pub(crate) start_ns: u64,
    pub(crate) end_ns: u64,
}

impl SpanRec {
    fn ms(&self) -> f64 {
        self.end_ns.saturating_sub(self.start_ns) as f64 / 1e6
    }
}

/// The five parts of one trace, in milliseconds.
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize)]
pub(crate) struct Parts {
    pub(crate) before: f64,
    pub(crate) out: f64,
    pub(crate) remote: f64,
    pub(crate) back: f64,
    pub(crate) after: f64,
}

impl Parts {
    const NAMES: [&'static str; 5] = ["before", "out", "remote", "back", "after"];

    fn values(&self) -> [f64; 5] {
        [self.before, self.out, self.remote, self.back, self.after]
    }

    fn values_mut(&mut self) -> [&mut f64; 5] {
        [&mut self.before, &mut self.out, &mut self.remote, &mut self.back, &mut self.after]
    }

    fn largest(&self) -> &'static str {
        let v = self.values();
        let i = (0..5).max_by(|&a, &b| v[a].total_cmp(&v[b])).unwrap_or(0);
        Self::NAMES[i]
    }
}

/// One slow trace, for reading by hand.
#[derive(Debug, Serialize)]
pub(crate) struct SlowTrace {
    pub(crate) trace_id: String,
    pub(crate) root_ms: f64,
    pub(crate) parts: Parts,
    /// The slowest call's callee, `service/name`.
    pub(crate) remote: String,
    /// Every span: service, name, start after the root's start and
    /// duration, in ms, by start.
    pub(crate) spans: Vec<(String, String, f64, f64)>,
}

/// Mean parts and how often each part was the largest.
#[derive(Debug, Default, Serialize)]
pub(crate) struct Summary {
    pub(crate) traces: usize,
    pub(crate) mean_root_ms: f64,
    pub(crate) mean_parts: Parts,
    pub(crate) largest: HashMap<&'static str, usize>,
}

impl Summary {
    fn add(&mut self, root_ms: f64, parts: &Parts) {
        self.traces += 1;
        self.mean_root_ms += root_ms;
        for (sum, x) in self.mean_parts.values_mut().into_iter().zip(parts.values()) {
            *sum += x;
        }
        *self.largest.entry(parts.largest()).or_default() += 1;
    }

    fn finish(&mut self) {
        let n = self.traces.max(1) as f64;
        self.mean_root_ms /= n;
        for x in self.mean_parts.values_mut() {
            *x /= n;
        }
    }
}

/// What [`breakdown`] found.
#[derive(Debug, Serialize)]
pub(crate) struct Report {
    pub(crate) slow_ms: f64,
    /// When the first cut trace started, nanoseconds since the Unix
    /// epoch: the origin of the times below, to line them up with other
    /// records of the same run (`host-noise`; `perf` after adding the
    /// offset between its clock and the real-time one).
    pub(crate) first_start_unix_ns: u64,
    /// Traces whose root and at least one remote call arrived.
    pub(crate) all: Summary,
    /// Those whose root took at least `slow_ms`.
    pub(crate) slow: Summary,
    /// Traces whose root is missing or that made no remote call.
    pub(crate) skipped: usize,
    /// Traces of other roots than the ones asked for.
    pub(crate) other: usize,
    /// When each slow trace started (seconds after the first trace of
    /// the report) and its root's ms, by start: whether the slow ones
    /// come in bursts, and how often.
    pub(crate) slow_at: Vec<(f64, f64)>,
    /// When every cut trace's root started, the same way, by start:
    /// whether requests reach the root's process evenly.
    pub(crate) starts: Vec<f64>,
    /// Their roots' ms, in the same order.
    #[serde(skip)]
    pub(crate) root_ms: Vec<f64>,
    /// The other traces' roots (a shard's idle fold or compaction, an
    /// ingest batch), by start: what else ran while the slow ones waited.
    pub(crate) background: Vec<Background>,
    /// How many cut traces, all and slow, overlapped a background root in
    /// time: if the slow ones do far more often, that work holds the tail.
    pub(crate) overlapping: Overlapping,
    /// The slowest traces, slowest first (at most `examples`).
    pub(crate) examples: Vec<SlowTrace>,
    /// How the traces lie against the host's slow episodes, when the sink
    /// was given them (`--host-noise`).
    pub(crate) host: Option<NearHost>,
}

/// See [`near_host`].
#[derive(Debug, PartialEq, Serialize)]
pub(crate) struct NearHost {
    /// Episodes at least `min_ms` long that the traces' time span meets.
    pub(crate) episodes: usize,
    pub(crate) min_ms: f64,
    /// The share of the traces' time span within `pad_ms` of one.
    pub(crate) time_share: f64,
    pub(crate) pad_ms: f64,
    /// The share of the slow traces that ran within `pad_ms` of one, and
    /// of all traces that did: if slow traces meet episodes far
    /// more often than time does, the host's episodes hold the tail.
    pub(crate) slow_share: f64,
    pub(crate) all_share: f64,
    /// The roots' p99 over all traces, and over those that ran away from
    /// every episode: the tail the cluster would have on a quiet host.
    pub(crate) p99_all_ms: f64,
    pub(crate) p99_away_ms: f64,
}

/// One root of another trace.
#[derive(Debug, PartialEq, Serialize)]
pub(crate) struct Background {
    pub(crate) service: String,
    pub(crate) name: String,
    /// Seconds after the report's first cut trace started (negative:
    /// before it).
    pub(crate) at: f64,
    pub(crate) ms: f64,
}

/// See [`Report::overlapping`].
#[derive(Debug, Default, PartialEq, Serialize)]
pub(crate) struct Overlapping {
    pub(crate) all: usize,
    pub(crate) slow: usize,
}

/// Which traces to cut and how many to keep whole.
pub(crate) struct Wanted<'a> {
    /// Only traces whose root's name contains this (`""`: all).
    pub(crate) root_contains: &'a str,
    /// A trace whose root takes this long or longer is slow.
    pub(crate) slow_ms: f64,
    /// Slow traces kept whole, slowest first.
    pub(crate) examples: usize,
}

/// Cuts every wanted trace in `spans` as the module says; keeps the
/// slowest whole.
pub(crate) fn breakdown(spans: &[SpanRec], wanted: &Wanted<'_>) -> Report {
    let Wanted { root_contains, slow_ms, examples } = *wanted;
    let mut traces: HashMap<[u8; 16], Vec<&SpanRec>> = HashMap::new();
    for s in spans {
        traces.entry(s.trace).or_default().push(s);
    }
    let (mut all, mut slow, mut skipped, mut other) = (Summary::default(), Summary::default(), 0, 0);
    let mut worst: Vec<(f64, SlowTrace)> = Vec::new();
    let mut slow_at: Vec<(u64, f64)> = Vec::new();
    let mut first_start = u64::MAX;
    let mut starts: Vec<(u64, f64)> = Vec::new();
    let mut background: Vec<&SpanRec> = Vec::new();
    let mut cut_roots: Vec<(&SpanRec, bool)> = Vec::new();
    for (trace, spans) in &traces {
        if let Some(root) = spans.iter().find(|s| s.parent == [0; 8] && !s.name.contains(root_contains)) {
            other += 1;
            background.push(root);
            continue;
        }
        let Some((root, parts, callee)) = cut(spans) else {
            skipped += 1;
            continue;
        };
        let root_ms = root.ms();
        all.add(root_ms, &parts);
        first_start = first_start.min(root.start_ns);
        starts.push((root.start_ns, root_ms));
        cut_roots.push((root, root_ms >= slow_ms));
        if root_ms < slow_ms {
            continue;
        }
        slow.add(root_ms, &parts);
        slow_at.push((root.start_ns, root_ms));
        let mut listed: Vec<(String, String, f64, f64)> = spans
            .iter()
            .map(|s| (s.service.to_string(), s.name.clone(), (s.start_ns as f64 - root.start_ns as f64) / 1e6, s.ms()))
            .collect();
        listed.sort_by(|a, b| a.2.total_cmp(&b.2));
        let remote = format!("{}/{}", callee.service, callee.name);
        worst.push((root_ms, SlowTrace { trace_id: hex(trace), root_ms, parts, remote, spans: listed }));
    }
    all.finish();
    slow.finish();
    worst.sort_by(|a, b| b.0.total_cmp(&a.0));
    worst.truncate(examples);
    slow_at.sort_by_key(|&(start, _)| start);
    starts.sort_by_key(|&(start, _)| start);
    let (starts, root_ms) = starts.into_iter().map(|(start, ms)| ((start - first_start) as f64 / 1e9, ms)).unzip();
    let slow_at = slow_at.into_iter().map(|(start, ms)| (start.saturating_sub(first_start) as f64 / 1e9, ms)).collect();
    background.sort_by_key(|s| s.start_ns);
    let overlapping = overlapping(&cut_roots, &background);
    let background = background
        .into_iter()
        .map(|s| Background {
            service: s.service.to_string(),
            name: s.name.clone(),
            at: (s.start_ns as f64 - first_start as f64) / 1e9,
            ms: s.ms(),
        })
        .collect();
    let examples = worst.into_iter().map(|(_, t)| t).collect();
    Report {
        host: None,
        slow_ms,
        first_start_unix_ns: if first_start == u64::MAX { 0 } else { first_start },
        all,
        slow,
        skipped,
        other,
        slow_at,
        starts,
        root_ms,
        background,
        overlapping,
        examples,
    }
}

/// Lines the report's traces up with the host's slow episodes
/// (`host_noise`: `(start, end)` in ns since the Unix epoch) of at least
/// `min_ms`, each widened by `pad_ms` on both sides.
pub(crate) fn near_host(r: &Report, episodes: &[(u64, u64)], min_ms: f64, pad_ms: f64) -> NearHost {
    let base = r.first_start_unix_ns as f64 / 1e9;
    let pad = pad_ms / 1000.0;
    let eps: Vec<(f64, f64)> = episodes
        .iter()
        .filter(|(s, e)| (e.saturating_sub(*s)) as f64 / 1e6 >= min_ms)
        .map(|&(s, e)| (s as f64 / 1e9 - base - pad, e as f64 / 1e9 - base + pad))
        .collect();
    let meets = |a: f64, b: f64| eps.iter().any(|&(s, e)| s < b && a < e);
    let share = |n: usize, of: usize| if of == 0 { 0.0 } else { n as f64 / of as f64 };
    let slow = r.slow_at.iter().filter(|&&(at, ms)| meets(at, at + ms / 1000.0)).count();
    let near: Vec<bool> = r.starts.iter().zip(&r.root_ms).map(|(&at, &ms)| meets(at, at + ms / 1000.0)).collect();
    let all = near.iter().filter(|&&n| n).count();
    let away: Vec<f64> = r.root_ms.iter().zip(&near).filter(|(_, n)| !**n).map(|(ms, _)| *ms).collect();
    let (lo, hi) = (r.starts.first().copied().unwrap_or(0.0), r.starts.last().copied().unwrap_or(0.0));
    let inside: Vec<(f64, f64)> = eps.iter().map(|&(s, e)| (s.max(lo), e.min(hi))).filter(|(s, e)| s < e).collect();
    // Merged, so that overlapping widened episodes count once.
    let mut covered = 0.0;
    let mut reach = f64::NEG_INFINITY;
    for (s, e) in inside {
        covered += (e - s.max(reach)).max(0.0);
        reach = reach.max(e);
    }
    NearHost {
        episodes: eps.iter().filter(|&&(s, e)| s < hi && e > lo).count(),
        min_ms,
        time_share: if hi > lo { covered / (hi - lo) } else { 0.0 },
        pad_ms,
        slow_share: share(slow, r.slow_at.len()),
        all_share: share(all, r.starts.len()),
        p99_all_ms: p99(&r.root_ms),
        p99_away_ms: p99(&away),
    }
}

fn p99(ms: &[f64]) -> f64 {
    let mut s = ms.to_vec();
    s.sort_by(f64::total_cmp);
    if s.is_empty() { 0.0 } else { s[((s.len() - 1) as f64 * 0.99).round() as usize] }
}

/// Counts the cut roots (flagged slow or not) that overlap a background
/// root, which are sorted by start.
fn overlapping(cut_roots: &[(&SpanRec, bool)], background: &[&SpanRec]) -> Overlapping {
    let mut o = Overlapping::default();
    for (root, is_slow) in cut_roots {
        // Background roots that started before this root ended; one of
        // them overlaps if it ends after the root started.
        let started = background.partition_point(|b| b.start_ns < root.end_ns);
        if background[..started].iter().any(|b| b.end_ns > root.start_ns) {
            o.all += 1;
            o.slow += usize::from(*is_slow);
        }
    }
    o
}

/// A trace's root, its five parts and the slowest call's callee span.
fn cut<'a>(spans: &[&'a SpanRec]) -> Option<(&'a SpanRec, Parts, &'a SpanRec)> {
    let root = *spans.iter().find(|s| s.parent == [0; 8])?;
    let by_id: HashMap<[u8; 8], &SpanRec> = spans.iter().map(|s| (s.id, *s)).collect();
    // Remote calls: a callee span whose parent is in another process.
    let (caller, callee) = spans
        .iter()
        .filter_map(|s| by_id.get(&s.parent).filter(|p| p.service != s.service).map(|p| (*p, *s)))
        .max_by_key(|(caller, _)| caller.end_ns)?;
    let ms = |a: u64, b: u64| (b as f64 - a as f64) / 1e6;
    let parts = Parts {
        before: ms(root.start_ns, caller.start_ns),
        out: ms(caller.start_ns, callee.start_ns),
        remote: ms(callee.start_ns, callee.end_ns),
        back: ms(callee.end_ns, caller.end_ns),
        after: ms(caller.end_ns, root.end_ns),
    };
    Some((root, parts, callee))
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn span(trace: u8, id: u8, parent: u8, service: &str, name: &str, start_us: u64, end_us: u64) -> SpanRec {
        SpanRec {
            trace: [trace; 16],
            id: [id; 8],
            parent: [parent; 8],
            name: name.into(),
            service: service.into(),
            start_ns: start_us * 1000,
            end_ns: end_us * 1000,
        }
    }

    /// A trace of a coordinator asking two shard nodes: cut along the call
    /// that ended last, whose parts add up to the root.
    #[test]
    fn a_trace_is_cut_along_its_slowest_call() {
        let spans = vec![
            span(1, 1, 0, "coordinator", "rpc", 0, 20_000),
            span(1, 2, 1, "coordinator", "search", 100, 19_900),
            span(1, 3, 2, "coordinator", "shard", 200, 5_000),
            span(1, 4, 2, "coordinator", "shard", 300, 19_000),
            span(1, 5, 3, "shard-0", "rpc", 400, 4_000),
            span(1, 6, 4, "shard-1", "rpc", 12_300, 13_300),
            span(1, 7, 6, "shard-1", "search", 12_400, 13_200),
            // A fast trace.
            span(2, 1, 0, "coordinator", "rpc", 0, 2_000),
            span(2, 3, 1, "coordinator", "shard", 100, 1_900),
            span(2, 5, 3, "shard-0", "rpc", 300, 1_500),
            // No root: skipped.
            span(3, 5, 3, "shard-0", "rpc", 300, 1_500),
            // Another root: not asked for.
            span(4, 1, 0, "coordinator", "ingest", 0, 90_000),
            span(4, 3, 1, "coordinator", "shard", 100, 1_900),
            span(4, 5, 3, "shard-0", "rpc", 300, 1_500),
        ];
        let r = breakdown(&spans, &Wanted { root_contains: "rpc", slow_ms: 10.0, examples: 5 });
        assert_eq!((r.all.traces, r.slow.traces, r.skipped, r.other), (2, 1, 1, 1));
        let t = &r.examples[0];
        assert_eq!(t.parts, Parts { before: 0.3, out: 12.0, remote: 1.0, back: 5.7, after: 1.0 });
        let sum: f64 = t.parts.values().iter().sum();
        assert!((sum - t.root_ms).abs() < 1e-9, "{sum} against {}", t.root_ms);
        assert_eq!(t.remote, "shard-1/rpc");
        assert_eq!(r.slow.largest.get("out"), Some(&1));
        assert_eq!(t.spans.len(), 7);
        assert_eq!(t.spans[0].1, "rpc");
        assert!((r.all.mean_root_ms - 11.0).abs() < 1e-9);
        assert_eq!(r.slow_at, vec![(0.0, 20.0)]);
        assert_eq!(r.starts, vec![0.0, 0.0]);
        // The ingest overlaps both cut traces, the slow one among them.
        assert_eq!(r.background, vec![Background { service: "coordinator".into(), name: "ingest".into(), at: 0.0, ms: 90.0 }]);
        assert_eq!(r.overlapping, Overlapping { all: 2, slow: 1 });
    }

    /// The slow trace meets the host's episode, and so does a fast one
    /// inside it; the later one does not.
    #[test]
    fn traces_are_lined_up_with_the_hosts_episodes() {
        let mut spans = Vec::new();
        for (t, start, end) in [(1u8, 0u64, 20_000u64), (2, 10_000, 12_000), (3, 500_000, 501_000)] {
            spans.push(span(t, 1, 0, "coordinator", "rpc", start, end));
            spans.push(span(t, 3, 1, "coordinator", "shard", start + 100, end - 100));
            spans.push(span(t, 5, 3, "shard-0", "rpc", start + 200, end - 200));
        }
        let r = breakdown(&spans, &Wanted { root_contains: "rpc", slow_ms: 10.0, examples: 0 });
        let base = r.first_start_unix_ns;
        let ms = |m: u64| base + m * 1_000_000;
        // 30 ms from 5 ms in; one of 5 ms, too short to count.
        let h = near_host(&r, &[(ms(5), ms(35)), (ms(300), ms(305))], 20.0, 0.0);
        assert_eq!((h.episodes, h.slow_share, h.all_share), (1, 1.0, 2.0 / 3.0));
        // The slowest ran into the episode; away from it, 1 ms.
        assert_eq!((h.p99_all_ms, h.p99_away_ms), (20.0, 1.0));
        assert!((h.time_share - 30.0 / 500.0).abs() < 1e-9, "{}", h.time_share);
    }

    /// Only background work that ran while a request did counts.
    #[test]
    fn overlap_is_counted_in_time() {
        let spans = vec![
            span(1, 1, 0, "coordinator", "rpc", 0, 20_000),
            span(1, 3, 1, "coordinator", "shard", 100, 19_000),
            span(1, 5, 3, "shard-0", "rpc", 12_000, 13_000),
            span(2, 1, 0, "coordinator", "rpc", 50_000, 51_000),
            span(2, 3, 1, "coordinator", "shard", 50_100, 50_900),
            span(2, 5, 3, "shard-0", "rpc", 50_300, 50_500),
            // Before the first, overlapping it; then between the two.
            span(7, 1, 0, "shard-0", "fold_link_log_step", 0, 5_000),
            span(8, 1, 0, "shard-1", "compact", 30_000, 40_000),
        ];
        let r = breakdown(&spans, &Wanted { root_contains: "rpc", slow_ms: 10.0, examples: 5 });
        assert_eq!(r.overlapping, Overlapping { all: 1, slow: 1 });
        let names: Vec<_> = r.background.iter().map(|b| (b.name.as_str(), b.at)).collect();
        assert_eq!(names, vec![("fold_link_log_step", 0.0), ("compact", 0.03)]);
    }
}
