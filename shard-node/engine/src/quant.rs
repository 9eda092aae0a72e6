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
//! (the exact squared length, for Euclidean), then `dim` × `i8`. The scale
//! is per vector, so no training or calibration is needed and a code never
//! changes once written.

use simsimd::SpatialSimilarity;

use crate::metric::Metric;

/// Bytes in front of the components.
const HEADER: usize = 8;

/// Stored size of the code of a `dim`-dimensional vector.
pub(crate) fn code_bytes(dim: usize) -> usize {
    HEADER + dim
}

/// A borrowed code: its stored bytes, read only when a distance needs them.
///
/// Making one touches no memory, so the graph code can resolve many codes
/// and prefetch them before the first distance waits for any.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Code<'a> {
    bytes: &'a [u8],
}

impl<'a> Code<'a> {
    /// A code over its stored bytes; `None` if they are not one of `dim`
    /// components (corruption). Reads only the slice's length.
    #[inline]
    pub(crate) fn from_bytes(bytes: &'a [u8], dim: usize) -> Option<Code<'a>> {
        (bytes.len() == code_bytes(dim)).then_some(Code { bytes })
    }

    /// The code whose stored bytes start at `p`.
    ///
    /// # Safety
    /// `p` must point at `code_bytes(dim)` readable bytes that stay valid
    /// and unchanged for `'a` (a code read earlier through [`Code::as_ptr`]).
    #[inline]
    pub(crate) unsafe fn from_raw(p: *const u8, dim: usize) -> Code<'a> {
        // SAFETY: the caller's contract.
        Code { bytes: unsafe { std::slice::from_raw_parts(p, code_bytes(dim)) } }
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

    /// The components.
    #[inline]
    fn q(&self) -> &'a [i8] {
        let body = &self.bytes[HEADER..];
        // SAFETY: i8 and u8 have the same size and alignment, and every bit
        // pattern is valid for both.
        unsafe { std::slice::from_raw_parts(body.as_ptr().cast::<i8>(), body.len()) }
    }

    /// Number of components.
    #[inline]
    pub(crate) fn dim(&self) -> usize {
        self.bytes.len() - HEADER
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
    out.extend(v.iter().map(|&x| (x * inv).round().clamp(-127.0, 127.0) as i8 as u8));
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
        // The i8 dot product is exact (integer sums); only the rounding of
        // the components is approximate.
        let dot = a.scale() * b.scale() * i8::dot(a.q(), b.q()).unwrap_or(f64::NAN) as f32;
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
            prop_assert_eq!(code.q().len(), v.len());
            prop_assert_eq!(code.dim(), v.len());
            prop_assert_eq!(code.as_ptr(), c.bytes.as_ptr());
            let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
            // Every component is within half a step of the original.
            for (x, q) in v.iter().zip(code.q()) {
                prop_assert!((x - f32::from(*q) * code.scale()).abs() <= code.scale() * 0.5001 + max * 1e-6);
            }
            prop_assert!(Code::from_bytes(&c.bytes[1..], v.len()).is_none());
        }
    }
}
