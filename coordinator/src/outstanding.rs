//! Requests in flight per shard node, so that a read goes to the replica
//! with the fewest (docs/replication.md, "Reads"): a slow or busy node
//! collects requests, and the next ones go elsewhere.

use std::collections::HashMap;

use parking_lot::Mutex;
use shoal_proto::NodeId;

#[derive(Default)]
pub struct Outstanding {
    counts: Mutex<HashMap<NodeId, usize>>,
}

impl Outstanding {
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
}
