//! Searching one layer of the graph.

use std::cmp::{Ordering, Reverse};
use std::collections::BinaryHeap;

use crate::cache::Visited;
use crate::error::Result;
use crate::metric::Metric;
use crate::prefetch::prefetch;
use crate::quant::{Code, Query, code_bytes};
use crate::stop::Stop;
use crate::view::Graph;

/// A node and its distance to the current query.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Scored {
    pub(crate) dist: f32,
    pub(crate) id: u32,
}

impl PartialEq for Scored {
    fn eq(&self, other: &Self) -> bool {
        self.cmp(other) == Ordering::Equal
    }
}
impl Eq for Scored {}
impl PartialOrd for Scored {
    fn partial_cmp(&self, other: &Self) -> Option<Ordering> {
        Some(self.cmp(other))
    }
}
impl Ord for Scored {
    fn cmp(&self, other: &Self) -> Ordering {
        self.dist.total_cmp(&other.dist).then(self.id.cmp(&other.id))
    }
}

/// Buffers one thread reuses across searches, so a search allocates nothing.
pub(crate) struct Scratch {
    pub(crate) visited: Visited,
    candidates: BinaryHeap<Reverse<Scored>>,
    results: BinaryHeap<Scored>,
    links: Vec<u32>,
    /// Unvisited neighbours of the node being expanded, with their codes.
    fresh: Fresh,
    /// Distances computed on codes since the counter was last taken
    /// (what `explain` reports).
    pub(crate) compared: u64,
}

/// Codes that are only meaningful during one `search_layer` call; the
/// buffer is kept for its capacity and cleared before every use.
struct Fresh(Vec<(u32, *const u8)>);

// SAFETY: the pointers are never read outside the call that wrote them, so
// moving the (stale) buffer to another thread is harmless.
unsafe impl Send for Fresh {}

impl Scratch {
    pub(crate) fn new() -> Self {
        Scratch {
            visited: Visited::new(),
            candidates: BinaryHeap::new(),
            results: BinaryHeap::new(),
            links: Vec::with_capacity(64),
            fresh: Fresh(Vec::with_capacity(64)),
            compared: 0,
        }
    }

    pub(crate) fn bytes(&self) -> usize {
        self.visited.bytes()
    }
}

/// Greedy descent on an upper layer: move to the closest neighbour until no
/// neighbour is closer (ef = 1).
pub(crate) fn greedy_closest<'g, G: Graph<'g>, Q: Query + ?Sized>(
    graph: &mut G,
    scratch: &mut Scratch,
    metric: Metric,
    query: &Q,
    mut best: Scored,
    level: u8,
    stop: &Stop,
) -> Result<Scored> {
    let mut pacer = stop.pacer();
    loop {
        pacer.step()?;
        let mut moved = false;
        graph.links(best.id, level, &mut scratch.links)?;
        prefetch_codes(graph, &scratch.links)?;
        scratch.compared += scratch.links.len() as u64;
        for i in 0..scratch.links.len() {
            let n = scratch.links[i];
            let d = query.distance(metric, graph.code(n)?);
            if d < best.dist {
                best = Scored { dist: d, id: n };
                moved = true;
            }
        }
        if !moved {
            return Ok(best);
        }
    }
}

/// Who may enter a walk's results (every node it meets still routes).
pub(crate) trait Admit<'g, G: Graph<'g>> {
    fn admit(&mut self, graph: &mut G, id: u32) -> Result<bool>;
}

/// Every node: building and vacuuming look for neighbours, live or not.
pub(crate) struct Everyone;

impl<'g, G: Graph<'g>> Admit<'g, G> for Everyone {
    #[inline]
    fn admit(&mut self, _: &mut G, _: u32) -> Result<bool> {
        Ok(true)
    }
}

/// Live nodes only: tombstones route but are never returned.
pub(crate) struct LiveOnly;

impl<'g, G: Graph<'g>> Admit<'g, G> for LiveOnly {
    #[inline]
    fn admit(&mut self, graph: &mut G, id: u32) -> Result<bool> {
        Ok(!graph.is_tombstone(id)?)
    }
}

/// Best-first search of one layer from `entry` with a candidate list of
/// length `ef` (the paper's algorithm 2). Tombstones are traversed, since
/// they still route, but never returned with `skip_tombstones`. Results
/// go to `out`, closest first, at most `ef` of them. Gives up with
/// [`crate::Error::Stopped`] when `stop` says so (checked every few
/// expansions).
#[allow(clippy::too_many_arguments)]
pub(crate) fn search_layer<'g, G: Graph<'g>, Q: Query + ?Sized>(
    graph: &mut G,
    scratch: &mut Scratch,
    metric: Metric,
    query: &Q,
    entry: &[Scored],
    ef: usize,
    level: u8,
    skip_tombstones: bool,
    out: &mut Vec<Scored>,
    stop: &Stop,
) -> Result<()> {
    if skip_tombstones {
        walk_layer(graph, scratch, metric, query, entry, ef, level, &mut LiveOnly, out, stop)
    } else {
        walk_layer(graph, scratch, metric, query, entry, ef, level, &mut Everyone, out, stop)
    }
}

/// [`search_layer`] where `admit` says who may enter the results: every
/// node met routes, but only admitted ones count towards `ef`, so a walk
/// under a filter goes on until it holds `ef` matching nodes (or runs out
/// of nodes closer than the farthest of them).
#[allow(clippy::too_many_arguments)]
pub(crate) fn walk_layer<'g, G: Graph<'g>, Q: Query + ?Sized, A: Admit<'g, G>>(
    graph: &mut G,
    scratch: &mut Scratch,
    metric: Metric,
    query: &Q,
    entry: &[Scored],
    ef: usize,
    level: u8,
    admit: &mut A,
    out: &mut Vec<Scored>,
    stop: &Stop,
) -> Result<()> {
    let Scratch { visited, candidates, results, links, fresh: Fresh(fresh), compared } = scratch;
    visited.reset();
    candidates.clear();
    results.clear();
    for &e in entry {
        if !visited.insert(e.id) {
            continue;
        }
        candidates.push(Reverse(e));
        if admit.admit(graph, e.id)? {
            results.push(e);
        }
    }
    while results.len() > ef {
        results.pop();
    }
    let mut bound = if results.len() >= ef { results.peek().map_or(f32::INFINITY, |r| r.dist) } else { f32::INFINITY };
    let dim = query.dim();
    let code_bytes = code_bytes(dim);
    let mut pacer = stop.pacer();

    while let Some(Reverse(c)) = candidates.pop() {
        if c.dist > bound && results.len() >= ef {
            break;
        }
        pacer.step()?;
        // The next candidate's links are needed right after this one's
        // distances: start loading them now (as hnswlib does).
        if let Some(Reverse(next)) = candidates.peek() {
            graph.prefetch_links(next.id, level);
        }
        graph.links(c.id, level, links)?;
        // Resolve every unvisited neighbour's code and start loading all of
        // it before the first distance: the loop below is bound by memory
        // latency, not arithmetic, so the loads must overlap. (Resolving a
        // code reads no memory of it; see `quant::Code`.) Prefetching whole
        // codes up front measured faster than one code ahead.
        fresh.clear();
        for &n in links.iter() {
            if visited.insert(n) {
                let code = graph.code(n)?;
                prefetch(code.as_ptr(), code_bytes);
                fresh.push((n, code.as_ptr()));
            }
        }
        *compared += fresh.len() as u64;
        for &(n, p) in fresh.iter() {
            // SAFETY: `p` came from `graph.code` in this call: a code of
            // `dim` components that lives as long as the graph's transaction.
            let code = unsafe { Code::from_raw(p, dim) };
            let d = query.distance(metric, code);
            if results.len() < ef || d < bound {
                candidates.push(Reverse(Scored { dist: d, id: n }));
                if admit.admit(graph, n)? {
                    results.push(Scored { dist: d, id: n });
                    if results.len() > ef {
                        results.pop();
                    }
                }
                if results.len() >= ef {
                    bound = results.peek().map_or(f32::INFINITY, |r| r.dist);
                }
            }
        }
    }
    out.clear();
    out.extend(results.drain());
    out.sort_unstable();
    Ok(())
}

/// Starts loading the codes of `ids`, so that the distances computed next
/// overlap their memory latencies instead of waiting for one code after
/// the other.
pub(crate) fn prefetch_codes<'g, G: Graph<'g>>(graph: &mut G, ids: &[u32]) -> Result<()> {
    for &id in ids {
        let code = graph.code(id)?;
        prefetch(code.as_ptr(), code_bytes(code.dim()));
    }
    Ok(())
}
