//! Unlinking a tombstone from the graph for good, so its slot can be
//! reclaimed: the vacuum's graph work (`index::vacuum` does the rest).

use crate::error::Result;
use crate::hnsw::{Scored, greedy_closest, prefetch_codes, search_layer, select_neighbours};
use crate::stop::Stop;
use crate::view::Graph;

use super::build::{BuildCtx, BuildView, Worker};

impl BuildCtx<'_> {
    /// Takes tombstone `dead` out of the graph, walking from `entry`.
    ///
    /// Nothing records who links to a node, and a scan for in-links is what
    /// the write path must never do. The nodes that link to `dead` are
    /// (nearly all) among its nearest, so on each of its layers a search
    /// for `dead`'s own code finds them, as an insert of `dead` would: each
    /// of those (and `dead`'s own neighbours) that still links to `dead`
    /// gets its list rebuilt from its other links plus the live nodes on
    /// offer. `dead`'s own lists stay until its slot is reused: an in-link
    /// the search missed (about a third on data with little locality; see
    /// the test below `index::vacuum`) still routes through it. Emptying
    /// them made such in-links dead ends and cost up to a third of recall
    /// after removing 40% of a 2,000-point graph (the vacuum tests).
    pub(crate) fn unlink(&self, view: &mut BuildView<'_>, w: &mut Worker, dead: u32, entry: (u32, u8)) -> Result<()> {
        let metric = self.params.metric;
        let level = view.base.node(dead)?.level;
        let query = view.code(dead)?;
        let never = Stop::never();
        let (entry_id, top) = entry;
        let mut best = Scored { dist: metric.code_distance(query, view.code(entry_id)?), id: entry_id };
        for l in (level.saturating_add(1)..=top).rev() {
            best = greedy_closest(view, &mut w.scratch, metric, &query, best, l, &never)?;
        }
        let ef = self.params.ef_construction as usize;
        w.entry.clear();
        w.entry.push(best);
        let mut seen = Vec::new();
        for l in (0..=level.min(top)).rev() {
            // Routing through tombstones too: `dead`'s in-neighbours are
            // what is wanted here, live or not.
            search_layer(view, &mut w.scratch, metric, &query, &w.entry, ef, l, false, &mut w.found, &never)?;
            // The replacements on offer: `dead`'s live neighbours, and the
            // live nodes nearest to it (the search's answer, nearest first),
            // which are near whoever linked to `dead` too. With the second
            // kind, removing 40% of a graph costs about a point of recall
            // instead of several (measured by the vacuum tests).
            view.links(dead, l, &mut w.links)?;
            let mut live = std::mem::take(&mut w.other);
            live.clear();
            for &x in &w.links {
                if x != dead && !view.is_tombstone(x)? {
                    live.push(x);
                }
            }
            let neighbours = live.len();
            let cap = self.params.max_links(l);
            let mut offered = 0;
            for s in &w.found {
                if offered == cap {
                    break;
                }
                if s.id != dead && !live.contains(&s.id) && !view.is_tombstone(s.id)? {
                    live.push(s.id);
                    offered += 1;
                }
            }
            // Who may link to `dead`: what the search found, and `dead`'s
            // own neighbours (links are mostly mutual).
            let mut suspects: Vec<u32> = w.found.iter().map(|s| s.id).chain(live.iter().copied()).collect();
            suspects.sort_unstable();
            suspects.dedup();
            prefetch_codes(view, &live)?;
            for &x in &suspects {
                if x == dead || view.is_tombstone(x)? {
                    continue;
                }
                // Read before locking: a list taken for writing is written
                // back whether it changed or not. No other thread can add
                // `dead` to it meanwhile (replacements are live nodes).
                view.links(x, l, &mut seen)?;
                if !seen.contains(&dead) {
                    continue;
                }
                let mut list = self.overlay.list_mut(&mut view.base, x, l)?;
                if !list.contains(&dead) {
                    continue;
                }
                let vx = view.code(x)?;
                w.cands.clear();
                for &y in list.iter().chain(live.iter()) {
                    if y != dead && y != x && !w.cands.iter().any(|c| c.id == y) && !view.is_tombstone(y)? {
                        w.cands.push(Scored { dist: metric.code_distance(vx, view.code(y)?), id: y });
                    }
                }
                w.cands.sort_unstable();
                select_neighbours(view, metric, &w.cands, cap, &mut w.pruned)?;
                list.clear();
                list.extend_from_slice(&w.pruned);
            }
            // `dead` may have been the only way into one of its neighbours:
            // each gets a link from the nearest other node on offer.
            for i in 0..neighbours {
                let y = live[i];
                let vy = view.code(y)?;
                let mut closest: Option<Scored> = None;
                for &z in &live {
                    if z != y {
                        let d = metric.code_distance(vy, view.code(z)?);
                        if closest.is_none_or(|c| d < c.dist) {
                            closest = Some(Scored { dist: d, id: z });
                        }
                    }
                }
                if let Some(c) = closest {
                    self.add_back_link(view, w, c.id, y, l, c.dist)?;
                }
            }
            w.other = live;
            if !w.found.is_empty() {
                std::mem::swap(&mut w.entry, &mut w.found);
            }
        }
        Ok(())
    }
}
