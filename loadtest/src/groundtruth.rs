//! Exact nearest neighbours by brute force, for `--limit` runs where the
//! file's ground truth (computed over the whole base) does not apply.

use anyhow::Result;
use rayon::prelude::*;
use shoal_engine::Metric;

use crate::fvecs::VecFile;

/// Ids of the exact `k` nearest base rows (of the first `n`) to each query.
pub(crate) fn exact(base: &VecFile, n: usize, queries: &[Vec<f32>], metric: Metric, k: usize) -> Result<Vec<Vec<u32>>> {
    let prep = |mut v: Vec<f32>| {
        if metric == Metric::Cosine {
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(f32::MIN_POSITIVE);
            v.iter_mut().for_each(|x| *x /= norm);
        }
        v
    };
    let rows: Vec<Vec<f32>> = (0..n).map(|i| base.f32_row(i).map(prep)).collect::<Result<_>>()?;
    Ok(queries
        .par_iter()
        .map(|q| {
            let q = prep(q.clone());
            let mut scored: Vec<(f32, u32)> = rows
                .iter()
                .enumerate()
                .map(|(i, r)| {
                    let d = match metric {
                        Metric::Euclidean => r.iter().zip(&q).map(|(a, b)| (a - b) * (a - b)).sum::<f32>(),
                        Metric::Cosine | Metric::Dot => -r.iter().zip(&q).map(|(a, b)| a * b).sum::<f32>(),
                    };
                    (d, i as u32)
                })
                .collect();
            let nth = k.min(scored.len() - 1);
            scored.select_nth_unstable_by(nth, |a, b| a.0.total_cmp(&b.0));
            scored.truncate(k);
            scored.sort_by(|a, b| a.0.total_cmp(&b.0));
            // A fresh Vec: collecting from `into_iter` would reuse (and keep)
            // the n-sized buffer for every query.
            scored.iter().map(|&(_, i)| i).collect::<Vec<u32>>()
        })
        .collect())
}
