//! Repairing the graph around a retired node: the live nodes it linked to
//! that link back to it get good replacement neighbours.

use crate::error::Result;
use crate::hnsw::{Scored, prefetch_codes, select_neighbours};
use crate::view::Graph;

use super::build::{BuildCtx, BuildView, Worker};

impl BuildCtx<'_> {
    /// Repairs the graph around retired node `dead`, reading only the lists
    /// of `dead`, of its neighbours and of theirs: no scan for in-links.
    ///
    /// For each live neighbour `x` of `dead`: if `x` links to `dead`, its
    /// list is chosen again (the heuristic keeps the diverse ones) from its
    /// other links plus the nearest `ef_construction` nodes within two hops
    /// of `dead`, as hnswlib's `updatePoint` does; and `x` receives a link
    /// from the closest of `dead`'s other live neighbours, because `dead`
    /// may have been its only way in. Nodes that link to `dead` without
    /// `dead` linking back keep routing through it (a retired node keeps
    /// its vector and links) until their list is next pruned or the vacuum
    /// unlinks it.
    ///
    /// Why two hops: with only `dead`'s own neighbours to choose from, the
    /// lists around a retired node got a little worse at every round of
    /// churn (`loadtest churn`: recall 0.016 below a fresh build after 10
    /// rounds at 30k); the second hop offers the nodes a fresh build
    /// would have linked.
    pub(crate) fn repair(&self, view: &mut BuildView<'_>, w: &mut Worker, dead: u32) -> Result<()> {
        let metric = self.params.metric;
        let keep = self.params.ef_construction as usize;
        let level = view.base.node(dead)?.level;
        for l in 0..=level {
            let cap = self.params.max_links(l);
            view.links(dead, l, &mut w.links)?;
            let mut live = std::mem::take(&mut w.other);
            live.clear();
            for &x in &w.links {
                if x != dead && !view.is_tombstone(x)? {
                    live.push(x);
                }
            }
            let pool = self.two_hops(view, w, dead, l, &live)?;
            prefetch_codes(view, &pool)?;
            for &x in &live {
                let vx = view.code(x)?;
                if self.overlay.list_mut(&mut view.base, x, l)?.contains(&dead) {
                    // Scored outside the list's lock: other threads may be
                    // adding links to `x` meanwhile.
                    w.cands.clear();
                    for &y in &pool {
                        if y != x {
                            w.cands.push(Scored { dist: metric.code_distance(vx, view.code(y)?), id: y });
                        }
                    }
                    if w.cands.len() > keep {
                        w.cands.select_nth_unstable(keep);
                        w.cands.truncate(keep);
                    }
                    let mut list = self.overlay.list_mut(&mut view.base, x, l)?;
                    if list.contains(&dead) {
                        for &y in list.iter() {
                            if y != dead && y != x && pool.binary_search(&y).is_err() && !view.is_tombstone(y)? {
                                w.cands.push(Scored { dist: metric.code_distance(vx, view.code(y)?), id: y });
                            }
                        }
                        w.cands.sort_unstable();
                        select_neighbours(view, metric, &w.cands, cap, &mut w.pruned)?;
                        keep_routes(&mut w.pruned, &list[..], x, cap);
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
            w.pool = pool;
            w.other = live;
        }
        Ok(())
    }
}

/// Fewest links a repaired list keeps, of a level whose lists hold `cap`.
pub(crate) fn min_routes(cap: usize) -> usize {
    (cap / 4).max(1)
}

/// Tops `chosen` (the live links picked for `x`) up to [`min_routes`] with
/// the links `x` had (`old`), retired ones included, when the two hops
/// around a retired node offered too few live ones.
///
/// A retired node still routes until the vacuum unlinks it (and the vacuum
/// offers replacements from a search of the whole graph, not just two
/// hops), so keeping a link to it loses nothing, while dropping it can cut
/// `x` off: with 1,995 of 2,000 points deleted, the live entry point was
/// left with no links at all, and a search returned it alone.
pub(crate) fn keep_routes(chosen: &mut Vec<u32>, old: &[u32], x: u32, cap: usize) {
    let floor = min_routes(cap).min(cap);
    for &y in old {
        if chosen.len() >= floor {
            break;
        }
        if y != x && !chosen.contains(&y) {
            chosen.push(y);
        }
    }
}

impl BuildCtx<'_> {
    /// The live nodes within two hops of `dead` on level `l` (its live
    /// neighbours `live` and their live neighbours), sorted, without `dead`.
    fn two_hops(&self, view: &mut BuildView<'_>, w: &mut Worker, dead: u32, l: u8, live: &[u32]) -> Result<Vec<u32>> {
        let mut pool = std::mem::take(&mut w.pool);
        pool.clear();
        pool.extend_from_slice(live);
        for &y in live {
            view.links(y, l, &mut w.links)?;
            pool.extend(w.links.iter().copied().filter(|&z| z != dead));
        }
        pool.sort_unstable();
        pool.dedup();
        let mut kept = 0;
        for i in 0..pool.len() {
            let z = pool[i];
            if !view.is_tombstone(z)? {
                pool[kept] = z;
                kept += 1;
            }
        }
        pool.truncate(kept);
        Ok(pool)
    }
}
