//! Compact codes of vectors: what the graph is walked with.
//!
//! An HNSW insert or search evaluates thousands of distances, and on this
//! hardware each is bound by fetching the vector, not by the arithmetic
//! (see `docs/engine.md`). A code stores every component as an `i8` scaled
//! by the vector's largest magnitude, a quarter of the f32 bytes: four times
//! as many fit in the CPU caches and in a page of the map, so the graph's
//! working set stays in memory (and in the page cache on a network disk)
//! far longer. Searches re-score their best candidates with the exact
//! vectors, so results and reported distances stay exact.
//!
//! Layout of a stored code (little-endian): `scale: f32`, `norm2: f32`
//! (the exact squared length, for Euclidean), then the `dim` × `i8`
//! components split into two planes of nibbles, high first (`nibble`).
//! The scale is per vector, so no training or calibration is needed and a
//! code never changes once written.
//!
//! Why split: an insert walks the graph through ~1,500 codes, and once the
//! index's codes outgrow the CPU caches (about 100k points of 384-d here)
//! each is a trip to memory. The walk only has to find candidates, which
//! are then re-scored in full, so it reads the header and the high plane:
//! half the bytes, so twice the codes in the same cache. Searches and the
//! choice of links read both planes, at the full `i8` precision.

use crate::metric::Metric;
use crate::nibble::{self, plane_bytes};

/// Bytes in front of the components.
const HEADER: usize = 8;

/// Stored size of the code of a `dim`-dimensional vector.
pub(crate) fn code_bytes(dim: usize) -> usize {
    HEADER + 2 * plane_bytes(dim)
}

/// How precisely a distance between two codes is evaluated.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Precision {
    /// The high nibbles only: reads the header and one plane, about half
    /// the code. What an insert walks the graph with.
    Coarse,
    /// Every bit of the `i8` components. What searches walk with, and what
    /// chooses and prunes neighbours.
    Full,
}

impl Precision {
    /// Bytes from the start of a code that a distance of this precision
    /// reads (what to prefetch).
    #[inline]
    pub(crate) fn bytes(self, dim: usize) -> usize {
        match self {
            Precision::Coarse => HEADER + plane_bytes(dim),
            Precision::Full => code_bytes(dim),
        }
    }
}

/// A metric evaluated on codes at one precision: what a graph walk
/// measures with.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Walk {
    pub(crate) metric: Metric,
    pub(crate) precision: Precision,
}

impl Walk {
    pub(crate) fn coarse(metric: Metric) -> Self {
        Walk { metric, precision: Precision::Coarse }
    }

    pub(crate) fn full(metric: Metric) -> Self {
        Walk { metric, precision: Precision::Full }
    }

    #[inline]
    pub(crate) fn distance(self, a: Code<'_>, b: Code<'_>) -> f32 {
        self.metric.distance_at(self.precision, a, b)
    }

    /// Bytes of each code the walk reads (what to prefetch).
    #[inline]
    pub(crate) fn bytes(self, dim: usize) -> usize {
        self.precision.bytes(dim)
    }
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

    /// The plane of high nibbles.
    #[inline]
    fn high(&self) -> &'a [u8] {
        &self.bytes[HEADER..HEADER + plane_bytes(self.dim)]
    }

    /// The plane of low nibbles.
    #[inline]
    fn low(&self) -> &'a [u8] {
        &self.bytes[HEADER + plane_bytes(self.dim)..]
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
pub(crate) fn encode(v: &[f32], out: &mut Vec<u8>) {
    let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
    let scale = if max > 0.0 { max / 127.0 } else { 0.0 };
    let norm2 = v.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>() as f32;
    out.extend_from_slice(&scale.to_le_bytes());
    out.extend_from_slice(&norm2.to_le_bytes());
    let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
    let q = |j: usize| v.get(j).map_or(0, |&x| (x * inv).round().clamp(-127.0, 127.0) as i8);
    let half = plane_bytes(v.len());
    out.extend((0..half).map(|j| nibble::high(q(j)) | (nibble::high(q(j + half)) << 4)));
    out.extend((0..half).map(|j| nibble::low(q(j)) | (nibble::low(q(j + half)) << 4)));
}

/// An owned code (of a query).
pub(crate) struct OwnedCode {
    bytes: Vec<u8>,
    dim: usize,
}

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

impl Metric {
    /// Approximate internal distance between two codes; same scale and
    /// order as [`Metric::distance`] on the vectors.
    #[inline]
    pub(crate) fn code_distance(self, a: Code<'_>, b: Code<'_>) -> f32 {
        // The integer dot product is exact; only the rounding of the
        // components is approximate.
        let dot = nibble::full(a.high(), a.low(), b.high(), b.low());
        self.distance_from_dot(a, b, a.scale() * b.scale() * dot as f32)
    }

    /// Like [`Metric::code_distance`] from the high nibbles only: each
    /// component is taken as the middle of its 16-wide bucket,
    /// `16·h + 7.5`. About four times the error of the full code, which
    /// is what a walk to candidates tolerates (they are re-scored in full
    /// before any link is chosen).
    #[inline]
    pub(crate) fn coarse_distance(self, a: Code<'_>, b: Code<'_>) -> f32 {
        let (p, sa, sb) = nibble::coarse(a.high(), b.high());
        // Padding components (u = 8) out of the sums.
        let pad = (2 * plane_bytes(a.dim) - a.dim) as i64;
        let (p, sa, sb) = (i64::from(p) - 64 * pad, i64::from(sa) - 8 * pad, i64::from(sb) - 8 * pad);
        // Twice each bucket middle is 32·u - 241; expand the product of the
        // sums and halve twice, exactly in integers up to the last step.
        let four_dot = 1024 * p - 7712 * (sa + sb) + 58081 * a.dim as i64;
        self.distance_from_dot(a, b, a.scale() * b.scale() * (four_dot as f32 * 0.25))
    }

    /// Distance between two codes of the given precision.
    #[inline]
    pub(crate) fn distance_at(self, precision: Precision, a: Code<'_>, b: Code<'_>) -> f32 {
        match precision {
            Precision::Coarse => self.coarse_distance(a, b),
            Precision::Full => self.code_distance(a, b),
        }
    }

    #[inline]
    fn distance_from_dot(self, a: Code<'_>, b: Code<'_>, dot: f32) -> f32 {
        match self {
            Metric::Cosine => 1.0 - dot,
            Metric::Dot => -dot,
            Metric::Euclidean => a.norm2() + b.norm2() - 2.0 * dot,
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
    fn code_distances_are_close_to_exact_ones() {
        for metric in Metric::ALL {
            for seed in 0..50 {
                let (mut a, mut b) = (vector(384, seed), vector(384, seed + 1000));
                metric.prepare(&mut a);
                metric.prepare(&mut b);
                let (ca, cb) = (OwnedCode::new(&a), OwnedCode::new(&b));
                let exact = metric.distance(&a, &b);
                let approx = metric.code_distance(ca.code(), cb.code());
                // Scale of the values compared: |a|·|b| for dot products.
                let norm = (a.iter().map(|x| x * x).sum::<f32>() * b.iter().map(|x| x * x).sum::<f32>()).sqrt();
                assert!((exact - approx).abs() <= 0.01 * norm.max(1e-6), "{metric} seed {seed}: {exact} vs {approx}");
            }
        }
    }

    /// Component `j` of a code, from its two planes.
    fn component(code: Code<'_>, j: usize) -> i8 {
        let half = plane_bytes(code.dim());
        let (byte, shift) = if j < half { (j, 0) } else { (j - half, 4) };
        nibble::join((code.high()[byte] >> shift) & 15, (code.low()[byte] >> shift) & 15)
    }

    #[test]
    fn coarse_distances_track_exact_ones_and_full_ones_are_closer() {
        for metric in Metric::ALL {
            let (mut coarse_err, mut full_err) = (0f32, 0f32);
            for seed in 0..50 {
                // Odd and even dimensions: padding must not bias the sums.
                let dim = if seed % 2 == 0 { 384 } else { 385 };
                let (mut a, mut b) = (vector(dim, seed), vector(dim, seed + 1000));
                metric.prepare(&mut a);
                metric.prepare(&mut b);
                let (ca, cb) = (OwnedCode::new(&a), OwnedCode::new(&b));
                let exact = metric.distance(&a, &b);
                let norm = (a.iter().map(|x| x * x).sum::<f32>() * b.iter().map(|x| x * x).sum::<f32>()).sqrt();
                let coarse = (exact - metric.coarse_distance(ca.code(), cb.code())).abs() / norm.max(1e-6);
                let full = (exact - metric.code_distance(ca.code(), cb.code())).abs() / norm.max(1e-6);
                assert!(coarse <= 0.03, "{metric} seed {seed}: coarse error {coarse}");
                coarse_err += coarse;
                full_err += full;
            }
            assert!(full_err * 4.0 < coarse_err, "{metric}: full {full_err} vs coarse {coarse_err}");
        }
    }

    #[test]
    fn zero_vectors_encode_to_zero_distance_terms() {
        let z = OwnedCode::new(&[0.0; 8]);
        let v = OwnedCode::new(&[1.0, 2.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0]);
        assert_eq!(Metric::Dot.code_distance(z.code(), v.code()), 0.0);
        assert!((Metric::Euclidean.code_distance(z.code(), v.code()) - 5.0).abs() < 1e-6);
    }

    proptest! {
        #[test]
        fn codes_round_trip_their_bytes(v in proptest::collection::vec(-1e6f32..1e6, 1..64)) {
            let c = OwnedCode::new(&v);
            let code = c.code();
            prop_assert_eq!(code.dim(), v.len());
            prop_assert_eq!(code.as_ptr(), c.bytes.as_ptr());
            let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
            // Every component is within half a step of the original.
            for (j, x) in v.iter().enumerate() {
                let q = component(code, j);
                prop_assert!((x - f32::from(q) * code.scale()).abs() <= code.scale() * 0.5001 + max * 1e-6);
            }
            // A padding component (odd dim) is zero.
            if v.len() % 2 == 1 {
                prop_assert_eq!(component(code, v.len()), 0);
            }
            prop_assert!(Code::from_bytes(&c.bytes[1..], v.len()).is_none());
        }
    }
}
