//! Exact nearest neighbours by brute force, for `--limit` runs where the
//! file's ground truth (computed over the whole base) does not apply.

use anyhow::Result;
use rayon::prelude::*;
use shoal_engine::Metric;

use crate::fvecs::VecFile;

/// Ids of the exact `k` nearest base rows (of the first `n`) to each query.
///
/// The base is read a chunk of rows at a time, so a run over a million
/// rows does not hold 1.5 GB of them: the builder's memory that
/// `index-bench` measures afterwards is then its own, and a heap profile
/// of the run (`heaptrack`) shows the build's peak, not this one.
pub(crate) fn exact(base: &VecFile, n: usize, queries: &[Vec<f32>], metric: Metric, k: usize) -> Result<Vec<Vec<u32>>> {
    exact_among(base, &(0..n as u32).collect::<Vec<_>>(), queries, metric, k)
}

/// As [`exact`], among the base rows `ids` (ascending) only: a filter's
/// ground truth.
pub(crate) fn exact_among(base: &VecFile, ids: &[u32], queries: &[Vec<f32>], metric: Metric, k: usize) -> Result<Vec<Vec<u32>>> {
    const CHUNK: usize = 4096;
    let prep = |mut v: Vec<f32>| {
        if metric == Metric::Cosine {
            let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(f32::MIN_POSITIVE);
            v.iter_mut().for_each(|x| *x /= norm);
        }
        v
    };
    let distance = |r: &[f32], q: &[f32]| match metric {
        Metric::Euclidean => r.iter().zip(q).map(|(a, b)| (a - b) * (a - b)).sum::<f32>(),
        Metric::Cosine | Metric::Dot => -r.iter().zip(q).map(|(a, b)| a * b).sum::<f32>(),
    };
    let queries: Vec<Vec<f32>> = queries.iter().map(|q| prep(q.clone())).collect();
    // Per query, the best so far in ascending distance (the earlier row
    // wins a tie).
    let mut best: Vec<Vec<(f32, u32)>> = vec![Vec::with_capacity(k + 1); queries.len()];
    for chunk in ids.chunks(CHUNK) {
        let rows: Vec<Vec<f32>> = chunk.iter().map(|&i| base.f32_row(i as usize).map(prep)).collect::<Result<_>>()?;
        best.par_iter_mut().zip(&queries).for_each(|(top, q)| {
            for (j, r) in rows.iter().enumerate() {
                let d = distance(r, q);
                if top.len() == k && top.last().is_some_and(|&(worst, _)| d >= worst) {
                    continue;
                }
                let at = top.partition_point(|&(e, _)| e <= d);
                top.insert(at, (d, chunk[j]));
                top.truncate(k);
            }
        });
    }
    Ok(best.into_iter().map(|top| top.into_iter().map(|(_, i)| i).collect()).collect())
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    /// Streaming in chunks finds what a full sort of every distance finds,
    /// across chunk boundaries, for each metric.
    #[test]
    fn exact_by_chunks_matches_a_full_sort() {
        let (dim, n) = (8usize, 9_000usize);
        let mut rng = rand::rngs::StdRng::seed_from_u64(3);
        let rows: Vec<Vec<f32>> = (0..n).map(|_| (0..dim).map(|_| rng.random_range(-1.0f32..1.0)).collect()).collect();
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("base.fvecs");
        let mut bytes = Vec::new();
        for r in &rows {
            bytes.extend_from_slice(&(dim as i32).to_le_bytes());
            r.iter().for_each(|x| bytes.extend_from_slice(&x.to_le_bytes()));
        }
        std::fs::write(&path, bytes).unwrap();
        let base = VecFile::open(&path).unwrap();
        let queries: Vec<Vec<f32>> = (0..20).map(|_| (0..dim).map(|_| rng.random_range(-1.0f32..1.0)).collect()).collect();
        for metric in [Metric::Euclidean, Metric::Cosine, Metric::Dot] {
            let got = exact(&base, n - 7, &queries, metric, 10).unwrap();
            for (q, got) in queries.iter().zip(&got) {
                let norm = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
                let mut all: Vec<(f64, u32)> = rows[..n - 7]
                    .iter()
                    .enumerate()
                    .map(|(i, r)| {
                        let dot: f64 = r.iter().zip(q).map(|(a, b)| f64::from(a * b)).sum();
                        let d = match metric {
                            Metric::Euclidean => r.iter().zip(q).map(|(a, b)| f64::from((a - b) * (a - b))).sum(),
                            Metric::Cosine => -dot / f64::from(norm(r) * norm(q)),
                            Metric::Dot => -dot,
                        };
                        (d, i as u32)
                    })
                    .collect();
                all.sort_by(|a, b| a.0.total_cmp(&b.0));
                let want: Vec<u32> = all[..10].iter().map(|&(_, i)| i).collect();
                assert_eq!(got, &want, "{metric:?}");
            }
        }
    }
}
