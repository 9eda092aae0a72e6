//! Linking one new node: walk down from the entry point, choose its
//! neighbours on each of its layers, then link back from them.

use crate::error::Result;
use crate::hnsw::{Scored, greedy_closest, prefetch_codes, search_layer, select_neighbours};
use crate::stop::Stop;
use crate::view::Graph;

use super::build::{BuildCtx, BuildView, Worker};

impl BuildCtx<'_> {
    /// Links new node `node` into the graph, starting from `entry`.
    pub(crate) fn insert(&self, view: &mut BuildView<'_>, w: &mut Worker, node: u32, entry: (u32, u8)) -> Result<()> {
        let metric = self.params.metric;
        let query = view.code(node)?;
        let level = self.overlay.level_of_new(node);
        let (entry_id, top) = entry;
        let mut best = Scored { dist: metric.code_distance(query, view.code(entry_id)?), id: entry_id };
        // Linking a batch is never stopped half-way.
        let never = Stop::never();
        for l in (level.saturating_add(1)..=top).rev() {
            best = greedy_closest(view, &mut w.scratch, metric, &query, best, l, &never)?;
        }
        // Never longer than the live point count: with mostly tombstones,
        // a longer list could only be filled by visiting every node.
        let ef = (self.params.ef_construction as usize).max(self.params.m as usize).min(self.live.max(1) as usize);
        w.entry.clear();
        w.entry.push(best);
        w.back.clear();
        for l in (0..=level.min(top)).rev() {
            search_layer(view, &mut w.scratch, metric, &query, &w.entry, ef, l, self.has_tombstones, &mut w.found, &never)?;
            w.found.retain(|s| s.id != node);
            if w.found.is_empty() && self.has_tombstones {
                // Every node this search reached is retired: link to them
                // anyway (as hnswlib links to a deleted entry point), or the
                // new node would be unreachable. Pruning drops those links
                // later, once live neighbours exist.
                search_layer(view, &mut w.scratch, metric, &query, &w.entry, ef, l, false, &mut w.found, &never)?;
                w.found.retain(|s| s.id != node);
            }
            // The walk's distances are the ones links are chosen by (one
            // precision since format 9), in the order it found them.
            w.cands.clear();
            w.cands.extend_from_slice(&w.found);
            // As in hnswlib, a new node takes M links on every layer; M0 is
            // the room existing bottom-layer nodes have for back links.
            select_neighbours(view, metric, &w.cands, self.params.m as usize, &mut w.chosen)?;
            self.set_own_links(view, w, node, l)?;
            for &n in &w.chosen {
                let d = w.cands.iter().find(|s| s.id == n).map_or(f32::INFINITY, |s| s.dist);
                w.back.push((l, Scored { dist: d, id: n }));
            }
            if !w.found.is_empty() {
                std::mem::swap(&mut w.entry, &mut w.found);
            }
        }
        // Only now, with its own lists set on every level, does the node
        // become reachable: a search that found it on an upper layer and
        // descended would otherwise meet its still empty lower lists, and
        // two new nodes could link only to each other (hnswlib prevents the
        // same by holding the node's lock for its whole insertion).
        self.overlay.mark_linked(node);
        for i in 0..w.back.len() {
            let (l, s) = w.back[i];
            self.add_back_link(view, w, s.id, node, l, s.dist)?;
        }
        Ok(())
    }

    /// Sets the list of new node `node` on `level` to `w.chosen`. Another
    /// thread may already have linked back to `node` here (it can reach
    /// `node` through an upper layer before `node` reaches this one); those
    /// links are kept, or the other node could become unreachable.
    fn set_own_links(&self, view: &mut BuildView<'_>, w: &mut Worker, node: u32, level: u8) -> Result<()> {
        let mut own = self.overlay.list_mut(&mut view.base, node, level)?;
        if own.is_empty() {
            own.extend_from_slice(&w.chosen);
            return Ok(());
        }
        for &c in &w.chosen {
            if !own.contains(&c) {
                own.push(c);
            }
        }
        let cap = self.params.max_links(level);
        if own.len() > cap {
            let metric = self.params.metric;
            let v = view.code(node)?;
            w.cands.clear();
            for &x in own.iter() {
                w.cands.push(Scored { dist: metric.code_distance(v, view.code(x)?), id: x });
            }
            w.cands.sort_unstable();
            select_neighbours(view, metric, &w.cands, cap, &mut w.pruned)?;
            own.clear();
            own.extend_from_slice(&w.pruned);
        }
        Ok(())
    }

    /// Adds `new` to the list of `n` on `level`; a full list is pruned with
    /// the selection heuristic, dropping tombstones on the way.
    pub(super) fn add_back_link(&self, view: &mut BuildView<'_>, w: &mut Worker, n: u32, new: u32, level: u8, dist: f32) -> Result<()> {
        let cap = self.params.max_links(level);
        let metric = self.params.metric;
        let mut list = self.overlay.list_mut(&mut view.base, n, level)?;
        if list.contains(&new) {
            return Ok(());
        }
        if list.len() < cap {
            list.push(new);
            return Ok(());
        }
        let vn = view.code(n)?;
        // Start loading every member's code before the first distance waits
        // for one: at 100k points most of them miss the CPU caches, and one
        // after the other they would cost a full memory latency each.
        prefetch_codes(view, &list[..])?;
        w.cands.clear();
        w.cands.push(Scored { dist, id: new });
        for &x in list.iter() {
            if !view.is_tombstone(x)? {
                w.cands.push(Scored { dist: metric.code_distance(vn, view.code(x)?), id: x });
            }
        }
        w.cands.sort_unstable();
        select_neighbours(view, metric, &w.cands, cap, &mut w.pruned)?;
        list.clear();
        list.extend_from_slice(&w.pruned);
        Ok(())
    }
}
