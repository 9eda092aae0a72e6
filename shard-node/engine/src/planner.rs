//! Choosing how to search the points a filter matches, and saying so.
//!
//! A walk of the graph that admits only matching nodes into its results
//! routes through the others, so it keeps its recall whatever the filter,
//! but it meets about `ef / share` nodes before it holds `ef` matching
//! ones: for a narrow filter that is more work than comparing the query
//! with every matching point. So the planner compares instead when the
//! matches are few: with their exact vectors when fewer than
//! [`PlannerOptions::exact_max`] (the answer is then exact), else with
//! their codes up to [`PlannerOptions::scan_max`], re-scoring the best
//! with their vectors, as long as that costs less than the walk would.
//! Above both it walks.
//!
//! What a walk costs: about `ef / share` nodes met, each a random read,
//! against a scan's `matches` comparisons in id order, so the two cross
//! where `matches × share` is a multiple of `ef`
//! ([`PlannerOptions::scan_per_ef`]): on the PyPI set a 10% filter is
//! walked faster at ef 64 and scanned faster at ef 96 and above. The same choice applies to a
//! search without a filter on a shard whose graph is mostly tombstones:
//! its live points are what it matches.

/// The plan a search ran, as `explain` reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Plan {
    /// The graph, every live node admitted (no filter).
    Graph,
    /// Every matching point compared by its exact vector.
    Exact,
    /// Every matching point compared by its code, the best re-scored.
    Scan,
    /// The graph walked through every node, only matching ones admitted.
    FilteredGraph,
    /// Nothing matched: no point was compared.
    Empty,
}

impl Plan {
    /// The plan's name in responses, spans and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Plan::Graph => "graph",
            Plan::Exact => "exact",
            Plan::Scan => "scan",
            Plan::FilteredGraph => "filtered_graph",
            Plan::Empty => "empty",
        }
    }
}

/// What one shard did for one search.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Explain {
    /// The plan it ran.
    pub plan: Plan,
    /// Points the filter matches: exact when `matches_exact`, else the
    /// planner's estimate.
    pub matches: u64,
    /// Whether `matches` is exact.
    pub matches_exact: bool,
    /// Distances computed (on codes and on exact vectors).
    pub compared: u64,
}

/// Where the planner draws its lines.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct PlannerOptions {
    /// Up to this many matching points, compare each by its exact vector:
    /// the answer is exact.
    pub exact_max: u64,
    /// Up to this many, compare each by its code and re-score the best
    /// [`PlannerOptions::scan_rescore`] × k by their vectors.
    pub scan_max: u64,
    /// Candidates per result a scan re-scores with exact vectors.
    pub scan_rescore: usize,
    /// A scan is chosen over the walk while `matches × share` (the share
    /// of the graph's nodes that match) is at most this many times ef.
    pub scan_per_ef: f64,
}

impl Default for PlannerOptions {
    fn default() -> Self {
        PlannerOptions { exact_max: 512, scan_max: 16_384, scan_rescore: 8, scan_per_ef: 16.0 }
    }
}

/// How a search of `matches` points at `ef` goes; `graph_share` is the
/// share of the graph's nodes they are (a walk meets about
/// `ef / graph_share`).
pub(crate) fn choose(opts: &PlannerOptions, matches: u64, known: bool, graph_share: f64, ef: usize, filtered: bool) -> Plan {
    if known && matches == 0 {
        return Plan::Empty;
    }
    if known && matches <= opts.exact_max && (filtered || graph_share < 0.5) {
        return Plan::Exact;
    }
    let cheaper = matches as f64 * graph_share <= opts.scan_per_ef * ef as f64;
    if known && matches <= opts.scan_max && filtered && cheaper {
        return Plan::Scan;
    }
    if filtered { Plan::FilteredGraph } else { Plan::Graph }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn few_matches_are_compared_and_many_walked() {
        let o = PlannerOptions::default();
        assert_eq!(choose(&o, 0, true, 0.0, 64, true), Plan::Empty);
        assert_eq!(choose(&o, 40, true, 0.0003, 64, true), Plan::Exact);
        assert_eq!(choose(&o, 1_200, true, 0.01, 64, true), Plan::Scan);
        assert_eq!(choose(&o, 1_200, false, 0.01, 64, true), Plan::FilteredGraph);
        assert_eq!(choose(&o, 60_000, true, 0.5, 64, true), Plan::FilteredGraph);
        // A 10% filter on 120k points: walked at ef 64, scanned at 128.
        assert_eq!(choose(&o, 12_000, true, 0.1, 64, true), Plan::FilteredGraph);
        assert_eq!(choose(&o, 12_000, true, 0.1, 128, true), Plan::Scan);
        // Without a filter: the graph, unless it is mostly tombstones.
        assert_eq!(choose(&o, 1_000, true, 1.0, 64, false), Plan::Graph);
        assert_eq!(choose(&o, 5, true, 0.0025, 64, false), Plan::Exact);
        assert_eq!(choose(&o, 100_000, true, 0.1, 64, false), Plan::Graph);
    }
}
