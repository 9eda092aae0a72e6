//! Repairing the graph around a retired node: the live nodes it linked to
//! that link back to it get good replacement neighbours.

use crate::error::Result;
use crate::hnsw::{Scored, prefetch_codes, select_neighbours};
use crate::quant::{Precision, Walk};
use crate::view::Graph;

use super::build::{BuildCtx, BuildView, Worker};

impl BuildCtx<'_> {
    /// Repairs the graph around retired node `dead`, reading only the lists
    /// of `dead` and of its neighbours: no scan for in-links.
    ///
    /// For each live neighbour `x` of `dead`: if `x` links to `dead`, its
    /// list is rebuilt from its other links plus `dead`'s neighbours (the
    /// heuristic keeps the diverse ones); and `x` receives a link from the
    /// closest of `dead`'s other live neighbours, because `dead` may have
    /// been its only way in. Nodes that link to `dead` without `dead`
    /// linking back keep routing through it (a retired node keeps its
    /// vector and links) until their list is next pruned.
    pub(crate) fn repair(&self, view: &mut BuildView<'_>, w: &mut Worker, dead: u32) -> Result<()> {
        let metric = self.params.metric;
        let level = view.base.node(dead)?.level;
        for l in 0..=level {
            view.links(dead, l, &mut w.links)?;
            let mut live = std::mem::take(&mut w.other);
            live.clear();
            for &x in &w.links {
                if x != dead && !view.is_tombstone(x)? {
                    live.push(x);
                }
            }
            // Every live neighbour's code is read for every other one below.
            prefetch_codes(view, &live, Precision::Full.bytes(self.params.dim as usize))?;
            let cap = self.params.max_links(l);
            for i in 0..live.len() {
                let x = live[i];
                let vx = view.code(x)?;
                {
                    let mut list = self.overlay.list_mut(&mut view.base, x, l)?;
                    if list.contains(&dead) {
                        w.cands.clear();
                        for &y in list.iter().chain(live.iter()) {
                            if y != dead && y != x && !w.cands.iter().any(|c| c.id == y) && !view.is_tombstone(y)? {
                                w.cands.push(Scored { dist: metric.code_distance(vx, view.code(y)?), id: y });
                            }
                        }
                        w.cands.sort_unstable();
                        select_neighbours(view, Walk::full(metric), &w.cands, cap, &mut w.pruned)?;
                        list.clear();
                        list.extend_from_slice(&w.pruned);
                    }
                }
                let mut closest: Option<Scored> = None;
                for &y in &live {
                    if y != x {
                        let d = metric.code_distance(vx, view.code(y)?);
                        if closest.is_none_or(|c| d < c.dist) {
                            closest = Some(Scored { dist: d, id: y });
                        }
                    }
                }
                if let Some(c) = closest {
                    self.add_back_link(view, w, c.id, x, l, c.dist)?;
                }
            }
            w.other = live;
        }
        Ok(())
    }
}
