//! Choosing which candidates become a node's neighbours.

use crate::error::Result;
use crate::hnsw::Scored;
use crate::metric::Metric;
use crate::quant::Code;
use crate::view::Graph;

/// HNSW's neighbour-selection heuristic (the paper's algorithm 4, as in
/// hnswlib's `getNeighborsByHeuristic2`): walk the candidates from closest
/// to farthest and keep one only if it is closer to the base than to every
/// neighbour kept so far. This keeps links pointing in diverse directions,
/// which is what makes the graph navigable on clustered data.
///
/// `candidates` must be sorted by distance to the base, ascending.
pub(crate) fn select_neighbours<'g, G: Graph<'g>>(
    graph: &mut G,
    metric: Metric,
    candidates: &[Scored],
    m: usize,
    out: &mut Vec<u32>,
) -> Result<()> {
    out.clear();
    if candidates.len() <= m {
        out.extend(candidates.iter().map(|c| c.id));
        return Ok(());
    }
    let mut kept: Vec<Code<'g>> = Vec::with_capacity(m);
    for c in candidates {
        if out.len() >= m {
            break;
        }
        let v = graph.code(c.id)?;
        if kept.iter().all(|&k| metric.code_distance(v, k) >= c.dist) {
            out.push(c.id);
            kept.push(v);
        }
    }
    Ok(())
}
