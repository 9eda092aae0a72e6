//! Compact codes of vectors: what the graph is walked with.
//!
//! An HNSW insert or search evaluates thousands of distances, and on this
//! hardware each is bound by fetching the vector, not by the arithmetic
//! (see `docs/engine.md`). A code stores every component in 4 bits, scaled
//! by the vector's largest magnitude, an eighth of the f32 bytes: eight
//! times as many fit in the CPU caches and in a page of the map, so the
//! graph's working set stays in memory (and in the page cache on a network
//! disk) far longer. Searches re-score their best candidates with the
//! exact vectors, so results and reported distances stay exact.
//!
//! Layout of a stored code (little-endian): `scale: f32`, `norm2: f32`
//! (the exact squared length, for Euclidean), then the `dim` components as
//! one plane of 4-bit levels (`nibble`). The scale is per vector, so no
//! training or calibration is needed and a code never changes once written.
//!
//! Why 4 bits and not 8: format 8 stored each component as an `i8`, split
//! into a plane of high nibbles (what inserts walked with) and one of low
//! nibbles (what searches and the choice of links read). Walking, choosing
//! and pruning on the high nibbles alone measured the same recall, with
//! searches measuring from the query's own `i8` code ([`QueryCode`]), on
//! the PyPI set and the 1M stand-in (docs/scale.md, "4-bit codes";
//! figures in docs/benchmarks.md, "Build, search, file, memory"), and the
//! low plane was 0.13x of the file. A level is the high nibble of that
//! `i8`, so an index of format 8 migrates by dropping its low plane, and
//! its codes are then the ones this encoder writes.

use crate::metric::Metric;
use crate::nibble::{self, plane_bytes};

/// Bytes in front of the components.
const HEADER: usize = 8;

/// Stored size of the code of a `dim`-dimensional vector.
pub(crate) fn code_bytes(dim: usize) -> usize {
    HEADER + plane_bytes(dim)
}

/// A borrowed code: its stored bytes, read only when a distance needs them.
///
/// Making one touches no memory, so the graph code can resolve many codes
/// and prefetch them before the first distance waits for any.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Code<'a> {
    bytes: &'a [u8],
    dim: usize,
}

impl<'a> Code<'a> {
    /// A code over its stored bytes; `None` if they are not one of `dim`
    /// components (corruption). Reads only the slice's length.
    #[inline]
    pub(crate) fn from_bytes(bytes: &'a [u8], dim: usize) -> Option<Code<'a>> {
        (bytes.len() == code_bytes(dim)).then_some(Code { bytes, dim })
    }

    /// The code whose stored bytes start at `p`.
    ///
    /// # Safety
    /// `p` must point at `code_bytes(dim)` readable bytes that stay valid
    /// and unchanged for `'a` (a code read earlier through [`Code::as_ptr`]).
    #[inline]
    pub(crate) unsafe fn from_raw(p: *const u8, dim: usize) -> Code<'a> {
        // SAFETY: the caller's contract.
        Code { bytes: unsafe { std::slice::from_raw_parts(p, code_bytes(dim)) }, dim }
    }

    /// Multiplier from `i8` units back to the vector's scale.
    #[inline]
    fn scale(&self) -> f32 {
        f32::from_le_bytes([self.bytes[0], self.bytes[1], self.bytes[2], self.bytes[3]])
    }

    /// Exact squared length of the vector.
    #[inline]
    fn norm2(&self) -> f32 {
        f32::from_le_bytes([self.bytes[4], self.bytes[5], self.bytes[6], self.bytes[7]])
    }

    /// The plane of 4-bit levels.
    #[inline]
    fn levels(&self) -> &'a [u8] {
        &self.bytes[HEADER..]
    }

    /// Number of components.
    #[inline]
    pub(crate) fn dim(&self) -> usize {
        self.dim
    }

    /// Where the stored bytes start (for prefetching).
    #[inline]
    pub(crate) fn as_ptr(&self) -> *const u8 {
        self.bytes.as_ptr()
    }
}

/// Appends the code of the prepared vector `v` to `out`.
///
/// A component is first rounded to an `i8` step of `max / 127`, then its
/// level is that step's high nibble: 16 levels of 16 steps each. Keeping
/// the `i8` step (rather than 16 levels over `±max` directly, which would
/// be as accurate) is what makes a migrated format-8 code equal to one
/// encoded now.
pub(crate) fn encode(v: &[f32], out: &mut Vec<u8>) {
    let Steps { scale, norm2, q } = Steps::of(v);
    out.extend_from_slice(&scale.to_le_bytes());
    out.extend_from_slice(&norm2.to_le_bytes());
    let half = plane_bytes(v.len());
    out.extend((0..half).map(|j| nibble::level(q[j]) | (nibble::level(q[j + half]) << 4)));
}

/// A vector in `i8` steps of its largest magnitude / 127: what both a
/// stored code and a query's code start from.
struct Steps {
    scale: f32,
    /// Exact squared length.
    norm2: f32,
    /// Components rounded to steps, padded with 0 to `2 * plane_bytes`.
    q: Vec<i8>,
}

impl Steps {
    fn of(v: &[f32]) -> Self {
        let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
        let scale = if max > 0.0 { max / 127.0 } else { 0.0 };
        let norm2 = v.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>() as f32;
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        let mut q: Vec<i8> = v.iter().map(|&x| (x * inv).round().clamp(-127.0, 127.0) as i8).collect();
        q.resize(2 * plane_bytes(v.len()), 0);
        Steps { scale, norm2, q }
    }
}

/// An owned code, as a stored one (tests build them from vectors).
#[cfg(test)]
pub(crate) struct OwnedCode {
    bytes: Vec<u8>,
    dim: usize,
}

#[cfg(test)]
impl OwnedCode {
    pub(crate) fn new(v: &[f32]) -> Self {
        let mut bytes = Vec::with_capacity(code_bytes(v.len()));
        encode(v, &mut bytes);
        OwnedCode { bytes, dim: v.len() }
    }

    pub(crate) fn code(&self) -> Code<'_> {
        match Code::from_bytes(&self.bytes, self.dim) {
            Some(c) => c,
            None => unreachable!("encode writes code_bytes(dim) bytes"),
        }
    }
}

/// A search's query against stored codes: its components kept at the
/// full `i8` step, so only the stored side is rounded to a level.
///
/// Why: the query is at hand in full, and a distance with one side at 16
/// levels has about half the error of one with both (the unit test
/// `query_codes_are_closer_than_symmetric_ones`); the kernel reads the
/// same stored bytes and does the same work. Inserts walk with the new
/// node's stored code instead ([`Query`] for [`Code`]), as measured
/// (docs/scale.md, "4-bit codes").
pub(crate) struct QueryCode {
    scale: f32,
    norm2: f32,
    /// Components in plane order: `q[j]` meets the low nibble of plane
    /// byte `j`, `q[half + j]` its high nibble; padding is 0.
    q: Vec<i8>,
    /// `Σ q`, for the levels' offset.
    sum: i32,
    dim: usize,
}

impl QueryCode {
    pub(crate) fn new(v: &[f32]) -> Self {
        let Steps { scale, norm2, q } = Steps::of(v);
        let sum = q.iter().map(|&x| i32::from(x)).sum();
        QueryCode { scale, norm2, q, sum, dim: v.len() }
    }
}

/// What a graph walk measures from: a stored code (an insert's new node)
/// or a search's [`QueryCode`].
pub(crate) trait Query {
    /// Approximate internal distance to a stored code; same scale and
    /// order as [`Metric::distance`] on the vectors.
    fn distance(&self, metric: Metric, to: Code<'_>) -> f32;
    /// Number of components.
    fn dim(&self) -> usize;
}

impl Query for Code<'_> {
    #[inline]
    fn distance(&self, metric: Metric, to: Code<'_>) -> f32 {
        metric.code_distance(*self, to)
    }

    #[inline]
    fn dim(&self) -> usize {
        self.dim
    }
}

impl Query for QueryCode {
    #[inline]
    fn distance(&self, metric: Metric, to: Code<'_>) -> f32 {
        // Σ q·(16·h + 7.5) = 16·Σ q·u - 120.5·Σ q with h = u - 8; padding
        // has q = 0. Twice it is exact in integers.
        let twice = 32 * i64::from(nibble::query_dot(&self.q, to.levels())) - 241 * i64::from(self.sum);
        let dot = self.scale * to.scale() * (twice as f32 * 0.5);
        metric.distance_from_dot(self.norm2, to.norm2(), dot)
    }

    #[inline]
    fn dim(&self) -> usize {
        self.dim
    }
}

impl Metric {
    /// Approximate internal distance between two codes; same scale and
    /// order as [`Metric::distance`] on the vectors. Each component is
    /// taken as the middle of its level, `16·h + 7.5` steps (`h = u - 8`).
    #[inline]
    pub(crate) fn code_distance(self, a: Code<'_>, b: Code<'_>) -> f32 {
        let (p, sa, sb) = nibble::sums(a.levels(), b.levels());
        // Padding components (u = 8) out of the sums.
        let pad = (2 * plane_bytes(a.dim) - a.dim) as i64;
        let (p, sa, sb) = (i64::from(p) - 64 * pad, i64::from(sa) - 8 * pad, i64::from(sb) - 8 * pad);
        // Twice each level's middle is 32·u - 241; expand the product of
        // the sums and halve twice, exactly in integers up to the last step.
        let four_dot = 1024 * p - 7712 * (sa + sb) + 58081 * a.dim as i64;
        self.distance_from_dot(a.norm2(), b.norm2(), a.scale() * b.scale() * (four_dot as f32 * 0.25))
    }

    /// The distance from a dot product and (for Euclidean) the squared
    /// lengths.
    #[inline]
    fn distance_from_dot(self, a_norm2: f32, b_norm2: f32, dot: f32) -> f32 {
        match self {
            Metric::Cosine => 1.0 - dot,
            Metric::Dot => -dot,
            Metric::Euclidean => a_norm2 + b_norm2 - 2.0 * dot,
        }
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn vector(dim: usize, seed: u64) -> Vec<f32> {
        let mut x = seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1;
        (0..dim)
            .map(|_| {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                (x % 2001) as f32 / 1000.0 - 1.0
            })
            .collect()
    }

    #[test]
    fn code_distances_track_exact_ones() {
        for metric in Metric::ALL {
            let mut total = 0f32;
            for seed in 0..50 {
                // Odd and even dimensions: padding must not bias the sums.
                let dim = if seed % 2 == 0 { 384 } else { 385 };
                let (mut a, mut b) = (vector(dim, seed), vector(dim, seed + 1000));
                metric.prepare(&mut a);
                metric.prepare(&mut b);
                let (ca, cb) = (OwnedCode::new(&a), OwnedCode::new(&b));
                let exact = metric.distance(&a, &b);
                // Scale of the values compared: |a|·|b| for dot products.
                let norm = (a.iter().map(|x| x * x).sum::<f32>() * b.iter().map(|x| x * x).sum::<f32>()).sqrt();
                let err = (exact - metric.code_distance(ca.code(), cb.code())).abs() / norm.max(1e-6);
                assert!(err <= 0.03, "{metric} seed {seed}: error {err}");
                total += err;
            }
            // Unbiased: the errors of a 16-level code on 384 components
            // average well under the bound (about 0.005 measured).
            assert!(total / 50.0 <= 0.01, "{metric}: mean error {}", total / 50.0);
        }
    }

    /// Component `j` of a code, in `i8` steps: the middle of its level.
    fn component(code: Code<'_>, j: usize) -> f32 {
        let half = plane_bytes(code.dim());
        let (byte, shift) = if j < half { (j, 0) } else { (j - half, 4) };
        let u = (code.levels()[byte] >> shift) & 15;
        16.0 * (f32::from(u) - 8.0) + 7.5
    }

    #[test]
    fn query_codes_are_closer_than_symmetric_ones() {
        for metric in Metric::ALL {
            let (mut sym, mut asym) = (0f32, 0f32);
            for seed in 0..50 {
                let dim = if seed % 2 == 0 { 384 } else { 385 };
                let (mut a, mut b) = (vector(dim, seed), vector(dim, seed + 1000));
                metric.prepare(&mut a);
                metric.prepare(&mut b);
                let (ca, cb, qa) = (OwnedCode::new(&a), OwnedCode::new(&b), QueryCode::new(&a));
                let exact = metric.distance(&a, &b);
                let norm = (a.iter().map(|x| x * x).sum::<f32>() * b.iter().map(|x| x * x).sum::<f32>()).sqrt();
                let q_err = (exact - qa.distance(metric, cb.code())).abs() / norm.max(1e-6);
                assert!(q_err <= 0.02, "{metric} seed {seed}: error {q_err}");
                asym += q_err;
                sym += (exact - ca.code().distance(metric, cb.code())).abs() / norm.max(1e-6);
            }
            assert!(asym * 1.3 < sym, "{metric}: query codes {asym} against symmetric {sym}");
        }
    }

    #[test]
    fn zero_vectors_encode_to_zero_distance_terms() {
        let z = OwnedCode::new(&[0.0; 8]);
        let v = OwnedCode::new(&[1.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
        assert_eq!(Metric::Dot.code_distance(z.code(), v.code()), 0.0);
        assert!((Metric::Euclidean.code_distance(z.code(), v.code()) - 5.0).abs() < 1e-6);
        let zq = QueryCode::new(&[0.0; 8]);
        assert_eq!(zq.distance(Metric::Dot, v.code()), 0.0);
        assert!((zq.distance(Metric::Euclidean, v.code()) - 5.0).abs() < 1e-6);
    }

    proptest! {
        #[test]
        fn codes_round_trip_their_bytes(v in proptest::collection::vec(-1e6f32..1e6, 1..64)) {
            let c = OwnedCode::new(&v);
            let code = c.code();
            prop_assert_eq!(code.dim(), v.len());
            prop_assert_eq!(code.as_ptr(), c.bytes.as_ptr());
            let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
            // Every component is within half a level (8 steps) and the
            // rounding to a step of the original.
            for (j, x) in v.iter().enumerate() {
                prop_assert!((x - component(code, j) * code.scale()).abs() <= code.scale() * 8.5001 + max * 1e-6);
            }
            // A padding component (odd dim) is q = 0: level 8, middle 7.5.
            if v.len() % 2 == 1 {
                prop_assert_eq!(component(code, v.len()), 7.5);
            }
            prop_assert!(Code::from_bytes(&c.bytes[1..], v.len()).is_none());
        }
    }
}
