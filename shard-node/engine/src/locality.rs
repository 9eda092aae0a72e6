//! The order in which a batch's new points receive internal ids.
//!
//! Internal ids decide where a point's code, vector and links sit in the
//! B-trees (ids are dense and appended). Giving similar vectors nearby ids
//! puts their codes on the same pages: a graph search, which mostly visits
//! points close to its query, then touches fewer pages, which is what a
//! cold page cache on a network disk pays for (see `docs/network-disks.md`).
//! Inserting them in that order also lets consecutive inserts reuse what
//! the previous one brought into the CPU caches.
//!
//! The order is a random-hyperplane hash (SimHash) of each vector relative
//! to the batch's mean, so it works for any metric and any offset of the
//! data; points with equal hashes keep their input order. It is a pure
//! function of the batch and the index's seed: the same input builds the
//! same index.

use crate::params::IndexParams;
use crate::plan::NewPoint;

/// Hyperplanes, i.e. bits of the hash.
const BITS: usize = 16;

/// Reorders `points` so that similar vectors are adjacent.
pub(crate) fn order(points: &mut Vec<NewPoint<'_>>, params: &IndexParams) {
    // Below a few dozen points there is no locality to win.
    if points.len() < 64 {
        return;
    }
    let dim = params.dim as usize;
    let mut mean = vec![0f64; dim];
    for p in points.iter() {
        for (m, &x) in mean.iter_mut().zip(p.vector) {
            *m += f64::from(x);
        }
    }
    let n = points.len() as f64;
    let mean: Vec<f32> = mean.iter().map(|m| (m / n) as f32).collect();
    let planes = hyperplanes(params.seed, dim);
    // Each plane's offset so that it passes through the mean: h·(v - mean).
    let offsets: Vec<f32> = planes.chunks_exact(dim).map(|h| dot(h, &mean)).collect();
    let mut keyed: Vec<(u16, usize, NewPoint<'_>)> = points
        .drain(..)
        .enumerate()
        .map(|(i, p)| {
            let mut key = 0u16;
            for (b, (h, off)) in planes.chunks_exact(dim).zip(&offsets).enumerate() {
                if dot(h, p.vector) > *off {
                    key |= 1 << (BITS - 1 - b);
                }
            }
            (key, i, p)
        })
        .collect();
    keyed.sort_unstable_by_key(|&(key, i, _)| (key, i));
    points.extend(keyed.into_iter().map(|(_, _, p)| p));
}

/// `BITS` pseudo-random directions of `dim` components, fixed by `seed`.
fn hyperplanes(seed: u64, dim: usize) -> Vec<f32> {
    let mut x = seed ^ 0x243f_6a88_85a3_08d3;
    (0..BITS * dim)
        .map(|_| {
            // xorshift64*: cheap, and only has to spread directions.
            x ^= x >> 12;
            x ^= x << 25;
            x ^= x >> 27;
            let r = x.wrapping_mul(0x2545_f491_4f6c_dd1d);
            ((r >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
        })
        .collect()
}

fn dot(a: &[f32], b: &[f32]) -> f32 {
    a.iter().zip(b).map(|(x, y)| x * y).sum()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metric::Metric;

    fn points(vectors: &[Vec<f32>]) -> Vec<NewPoint<'_>> {
        vectors.iter().enumerate().map(|(i, v)| NewPoint { external: i as u64, vector: v, payload: None }).collect()
    }

    #[test]
    fn similar_vectors_end_up_adjacent_and_nothing_is_lost() {
        // Two tight clusters, interleaved in the input.
        let mut vectors = Vec::new();
        for i in 0..200 {
            let c = if i % 2 == 0 { 1.0 } else { -1.0 };
            vectors.push((0..32).map(|d| c * (1.0 + 0.01 * ((i * 7 + d) % 13) as f32)).collect::<Vec<f32>>());
        }
        let params = IndexParams::new(32, Metric::Euclidean);
        let mut p = points(&vectors);
        order(&mut p, &params);
        let mut ids: Vec<u64> = p.iter().map(|p| p.external).collect();
        // Cluster changes along the order: once, not 199 times.
        let switches = ids.windows(2).filter(|w| w[0] % 2 != w[1] % 2).count();
        assert_eq!(switches, 1, "{ids:?}");
        ids.sort_unstable();
        assert_eq!(ids, (0..200).collect::<Vec<u64>>());
        // Deterministic.
        let mut again = points(&vectors);
        order(&mut again, &params);
        assert!(again.iter().zip(&p).all(|(a, b)| a.external == b.external));
    }
}
