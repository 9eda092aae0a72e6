//! Requests in flight per shard node, so that a read goes to the replica
//! with the fewest (docs/replication.md, "Reads"): a slow or busy node
//! collects requests, and the next ones go elsewhere. And each node's
//! recent answer times, whose p95 is how long a read waits before it asks
//! another replica as well (a hedge).

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use parking_lot::Mutex;
use shoal_proto::NodeId;

/// Answer times kept per node: enough for a p95 that follows a change of
/// load within a second or so of searches.
const SAMPLES: usize = 200;

/// The p95 is recomputed after this many new samples, not on every read.
const REFRESH_EVERY: usize = 20;

#[derive(Default)]
pub struct Outstanding {
    counts: Mutex<HashMap<NodeId, usize>>,
    latencies: Mutex<HashMap<NodeId, Recent>>,
}

#[derive(Default)]
struct Recent {
    samples: VecDeque<Duration>,
    since_refresh: usize,
    p95: Option<Duration>,
}

impl Outstanding {
    /// Records how long `node` took to answer a read.
    pub fn answered(&self, node: &NodeId, took: Duration) {
        let mut all = self.latencies.lock();
        let r = all.entry(node.clone()).or_default();
        if r.samples.len() == SAMPLES {
            r.samples.pop_front();
        }
        r.samples.push_back(took);
        r.since_refresh += 1;
        if r.p95.is_none() || r.since_refresh >= REFRESH_EVERY {
            let mut sorted: Vec<Duration> = r.samples.iter().copied().collect();
            sorted.sort_unstable();
            r.p95 = Some(sorted[(sorted.len() * 95 / 100).min(sorted.len() - 1)]);
            r.since_refresh = 0;
        }
    }

    /// The p95 of `node`'s recent answer times; `None` before any.
    pub fn p95(&self, node: &NodeId) -> Option<Duration> {
        self.latencies.lock().get(node).and_then(|r| r.p95)
    }

    /// Counts a request to `node` until the guard is dropped.
    pub fn track(&self, node: &NodeId) -> Tracked<'_> {
        *self.counts.lock().entry(node.clone()).or_insert(0) += 1;
        Tracked { outstanding: self, node: node.clone() }
    }

    pub fn of(&self, node: &NodeId) -> usize {
        self.counts.lock().get(node).copied().unwrap_or(0)
    }

    /// `nodes` by requests in flight, fewest first; ties keep their order
    /// (the placement's, primary first).
    pub fn least_busy_first<'n>(&self, nodes: impl IntoIterator<Item = &'n NodeId>) -> Vec<NodeId> {
        let counts = self.counts.lock();
        let mut v: Vec<(usize, usize, NodeId)> =
            nodes.into_iter().enumerate().map(|(i, n)| (counts.get(n).copied().unwrap_or(0), i, n.clone())).collect();
        v.sort_unstable_by_key(|(c, i, _)| (*c, *i));
        v.into_iter().map(|(_, _, n)| n).collect()
    }
}

pub struct Tracked<'a> {
    outstanding: &'a Outstanding,
    node: NodeId,
}

impl Drop for Tracked<'_> {
    fn drop(&mut self) {
        let mut counts = self.outstanding.counts.lock();
        if let Some(c) = counts.get_mut(&self.node) {
            *c -= 1;
            if *c == 0 {
                counts.remove(&self.node);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_least_busy_node_comes_first_and_ties_keep_their_order() {
        let o = Outstanding::default();
        let (a, b, c) = (NodeId::parse("a").unwrap(), NodeId::parse("b").unwrap(), NodeId::parse("c").unwrap());
        assert_eq!(o.least_busy_first([&a, &b, &c]), [a.clone(), b.clone(), c.clone()]);
        let t1 = o.track(&a);
        let t2 = o.track(&a);
        let t3 = o.track(&b);
        assert_eq!(o.least_busy_first([&a, &b, &c]), [c.clone(), b.clone(), a.clone()]);
        drop((t1, t2, t3));
        assert_eq!((o.of(&a), o.of(&b)), (0, 0));
        assert_eq!(o.least_busy_first([&b, &a]), [b, a]);
    }

    #[test]
    fn the_p95_follows_the_recent_answers() {
        let o = Outstanding::default();
        let a = NodeId::parse("a").unwrap();
        assert_eq!(o.p95(&a), None);
        // Refreshed at the first answer and every REFRESH_EVERY after it:
        // the 101st answer refreshes it over all of 1..=101 ms.
        for ms in 1..=101 {
            o.answered(&a, Duration::from_millis(ms));
        }
        assert_eq!(o.p95(&a), Some(Duration::from_millis(96)));
        // The node slows down: within the window, the p95 follows.
        for _ in 0..SAMPLES {
            o.answered(&a, Duration::from_millis(500));
        }
        assert_eq!(o.p95(&a), Some(Duration::from_millis(500)));
    }
}
