//! Recall@k: how many of the true k nearest neighbours an answer found.

use std::collections::HashSet;

use rayon::prelude::*;
use shoal_engine::Metric;

/// The share of `truth`'s first `k` ids among the first `k` distinct ids of
/// `hits` (the merged top-k). An answer with fewer than k hits misses the
/// rest.
pub(crate) fn recall_at_k(hits: &[u64], truth: &[u64], k: usize) -> f64 {
    let want: HashSet<u64> = truth.iter().take(k).copied().collect();
    if want.is_empty() {
        return 1.0;
    }
    let got: HashSet<u64> = hits.iter().take(k).copied().collect();
    got.intersection(&want).count() as f64 / want.len() as f64
}

/// The exact `k` nearest `rows` (by index) to each query, by brute force.
pub(crate) fn exact_truth(rows: &[Vec<f32>], queries: &[Vec<f32>], metric: Metric, k: usize) -> Vec<Vec<u64>> {
    let unit = |v: &[f32]| -> Vec<f32> {
        let n = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(f32::MIN_POSITIVE);
        v.iter().map(|x| x / n).collect()
    };
    let prepared: Vec<Vec<f32>> = match metric {
        Metric::Cosine => rows.par_iter().map(|r| unit(r)).collect(),
        Metric::Dot | Metric::Euclidean => rows.to_vec(),
    };
    queries
        .par_iter()
        .map(|q| {
            let q = if metric == Metric::Cosine { unit(q) } else { q.clone() };
            let mut scored: Vec<(f32, u64)> = prepared
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    let d = match metric {
                        Metric::Euclidean => r.iter().zip(&q).map(|(a, b)| (a - b) * (a - b)).sum::<f32>(),
                        Metric::Cosine | Metric::Dot => -r.iter().zip(&q).map(|(a, b)| a * b).sum::<f32>(),
                    };
                    (d, i as u64)
                })
                .collect();
            scored.sort_by(|a, b| a.0.total_cmp(&b.0).then(a.1.cmp(&b.1)));
            scored.iter().take(k).map(|&(_, i)| i).collect()
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recall_counts_the_first_k_truth_ids_found_in_the_first_k_hits() {
        let truth = [1, 2, 3, 4, 5, 6];
        assert_eq!(recall_at_k(&[1, 2, 3, 4], &truth, 4), 1.0);
        assert_eq!(recall_at_k(&[4, 3, 2, 1], &truth, 4), 1.0);
        // 5 is a true neighbour but not among the first 4.
        assert_eq!(recall_at_k(&[1, 2, 5, 9], &truth, 4), 0.5);
        // A hit past k does not count.
        assert_eq!(recall_at_k(&[9, 8, 7, 6, 1], &truth, 4), 0.0);
        // Fewer hits than k: the missing ones are misses.
        assert_eq!(recall_at_k(&[1], &truth, 4), 0.25);
        // A repeated hit counts once.
        assert_eq!(recall_at_k(&[1, 1, 1, 1], &truth, 4), 0.25);
    }

    #[test]
    fn exact_truth_orders_by_the_metric() {
        let rows = vec![vec![1.0, 0.0], vec![0.0, 1.0], vec![10.0, 1.0], vec![-1.0, 0.0]];
        let q = vec![vec![1.0, 0.1]];
        assert_eq!(exact_truth(&rows, &q, Metric::Euclidean, 2), vec![vec![0, 1]]);
        // Cosine ignores length: row 2 (10, 1) points almost exactly along q.
        assert_eq!(exact_truth(&rows, &q, Metric::Cosine, 2), vec![vec![2, 0]]);
        assert_eq!(exact_truth(&rows, &q, Metric::Dot, 1), vec![vec![2]]);
    }
}
