//! Dot products over codes of 4-bit levels (see `quant`).
//!
//! A code's component is the high nibble `h = q >> 4` (in `-8..=7`) of its
//! `i8` step count `q`, stored offset as `u = h + 8` (`0..=15`): a plane of
//! 4-bit levels, two to a byte.
//!
//! Plane byte `j` holds component `j` in its low nibble and component
//! `j + half` in its high nibble (`half = ceil(dim / 2)`), so a SIMD
//! register of plane bytes unpacks into two runs of consecutive
//! components with one mask and one shift, and no shuffles. An odd `dim`
//! has one padding component, stored as `q = 0` (`u = 8`).
//!
//! Why our own kernels: `simsimd` (used for every other kernel) has no
//! 4-bit integer type. The scalar version is the reference the SIMD ones
//! are tested against.

/// Bytes in one plane of a `dim`-component code.
#[inline]
pub(crate) fn plane_bytes(dim: usize) -> usize {
    dim.div_ceil(2)
}

/// Level of component `q`: its high nibble, offset to be unsigned.
#[inline]
pub(crate) fn level(q: i8) -> u8 {
    ((q >> 4) + 8) as u8
}

/// Sums over the planes `a` and `b`: `(Σ u_a·u_b, Σ u_a, Σ u_b)`,
/// padding included.
#[inline]
pub(crate) fn sums(a: &[u8], b: &[u8]) -> (u32, u32, u32) {
    debug_assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    match kernels() {
        // SAFETY: the CPU has the features (checked at run time).
        Kernels::Vnni => return unsafe { x86_512::sums_vnni(a, b) },
        Kernels::Avx2 => return unsafe { x86::sums_avx2(a, b) },
        Kernels::Scalar => {}
    }
    sums_scalar(a, b)
}

/// `Σ q·u` of a query's `i8` components `q` against a plane of levels:
/// `q[j]` meets the low nibble of plane byte `j`, `q[half + j]` its high
/// nibble (`q.len() == 2 * plane.len()`).
#[inline]
pub(crate) fn query_dot(q: &[i8], plane: &[u8]) -> i32 {
    debug_assert_eq!(q.len(), 2 * plane.len());
    #[cfg(target_arch = "x86_64")]
    match kernels() {
        // SAFETY: the CPU has the features (checked at run time).
        Kernels::Vnni => return unsafe { x86_512::query_dot_vnni(q, plane) },
        Kernels::Avx2 => return unsafe { x86::query_dot_avx2(q, plane) },
        Kernels::Scalar => {}
    }
    query_dot_scalar(q, plane)
}

/// The widest kernels this CPU runs.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kernels {
    /// AVX-512 with byte operations and VNNI's u8 × i8 dot products.
    Vnni,
    Avx2,
    Scalar,
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn kernels() -> Kernels {
    static KERNELS: std::sync::OnceLock<Kernels> = std::sync::OnceLock::new();
    *KERNELS.get_or_init(|| {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx512f") && has!("avx512bw") && has!("avx512vnni") {
            Kernels::Vnni
        } else if has!("avx2") {
            Kernels::Avx2
        } else {
            Kernels::Scalar
        }
    })
}

pub(crate) fn sums_scalar(a: &[u8], b: &[u8]) -> (u32, u32, u32) {
    let (mut p, mut sa, mut sb) = (0u32, 0u32, 0u32);
    for (&x, &y) in a.iter().zip(b) {
        let (x0, x1, y0, y1) = (u32::from(x & 15), u32::from(x >> 4), u32::from(y & 15), u32::from(y >> 4));
        p += x0 * y0 + x1 * y1;
        sa += x0 + x1;
        sb += y0 + y1;
    }
    (p, sa, sb)
}

pub(crate) fn query_dot_scalar(q: &[i8], plane: &[u8]) -> i32 {
    let (lo, hi) = q.split_at(plane.len());
    query_dot_scalar_parts(lo, hi, plane)
}

fn query_dot_scalar_parts(lo: &[i8], hi: &[i8], plane: &[u8]) -> i32 {
    let mut s = 0i32;
    for ((&p, &a), &b) in plane.iter().zip(lo).zip(hi) {
        s += i32::from(a) * i32::from(p & 15) + i32::from(b) * i32::from(p >> 4);
    }
    s
}

#[cfg(target_arch = "x86_64")]
mod x86 {
    use std::arch::x86_64::*;

    /// Horizontal sum of eight i32 lanes.
    #[target_feature(enable = "avx2")]
    fn sum_i32(v: __m256i) -> i32 {
        let s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b01_00_11_10>(s));
        let s = _mm_add_epi32(s, _mm_shuffle_epi32::<0b10_11_00_01>(s));
        _mm_cvtsi128_si32(s)
    }

    /// Horizontal sum of four u64 lanes (each small).
    #[target_feature(enable = "avx2")]
    fn sum_u64(v: __m256i) -> u64 {
        let s = _mm_add_epi64(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
        (_mm_cvtsi128_si64(s) + _mm_extract_epi64::<1>(s)) as u64
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn sums_avx2(a: &[u8], b: &[u8]) -> (u32, u32, u32) {
        let n = a.len().min(b.len());
        let mask = _mm256_set1_epi8(0x0f);
        let ones = _mm256_set1_epi16(1);
        let zero = _mm256_setzero_si256();
        let (mut acc, mut sa, mut sb) = (zero, zero, zero);
        let mut i = 0;
        while i + 32 <= n {
            // SAFETY: `i + 32 <= n` bytes are in both slices; loadu has no
            // alignment requirement.
            let (x, y) = unsafe { (_mm256_loadu_si256(a.as_ptr().add(i).cast()), _mm256_loadu_si256(b.as_ptr().add(i).cast())) };
            let x0 = _mm256_and_si256(x, mask);
            let x1 = _mm256_and_si256(_mm256_srli_epi16::<4>(x), mask);
            let y0 = _mm256_and_si256(y, mask);
            let y1 = _mm256_and_si256(_mm256_srli_epi16::<4>(y), mask);
            // Nibbles are at most 15: a pair sums to at most 450, two
            // pairs to 900, far from i16 saturation.
            let p = _mm256_add_epi16(_mm256_maddubs_epi16(x0, y0), _mm256_maddubs_epi16(x1, y1));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(p, ones));
            sa = _mm256_add_epi64(sa, _mm256_sad_epu8(_mm256_add_epi8(x0, x1), zero));
            sb = _mm256_add_epi64(sb, _mm256_sad_epu8(_mm256_add_epi8(y0, y1), zero));
            i += 32;
        }
        let (p, s_a, s_b) = super::sums_scalar(&a[i..n], &b[i..n]);
        (sum_i32(acc) as u32 + p, sum_u64(sa) as u32 + s_a, sum_u64(sb) as u32 + s_b)
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn query_dot_avx2(q: &[i8], plane: &[u8]) -> i32 {
        let n = plane.len();
        let (lo, hi) = q.split_at(n);
        let mask = _mm256_set1_epi8(0x0f);
        let ones = _mm256_set1_epi16(1);
        let mut acc = _mm256_setzero_si256();
        let mut i = 0;
        while i + 32 <= n {
            // SAFETY: `i + 32 <= n` bytes are in the plane and in both
            // halves of `q`; loadu has no alignment requirement.
            let (p, a, b) = unsafe {
                (
                    _mm256_loadu_si256(plane.as_ptr().add(i).cast()),
                    _mm256_loadu_si256(lo.as_ptr().add(i).cast()),
                    _mm256_loadu_si256(hi.as_ptr().add(i).cast()),
                )
            };
            let u0 = _mm256_and_si256(p, mask);
            let u1 = _mm256_and_si256(_mm256_srli_epi16::<4>(p), mask);
            // maddubs takes its first operand unsigned (levels, at most
            // 15) and its second signed (|q| ≤ 127): a pair sums to at
            // most 3,810, two pairs to 7,620, far from i16 saturation.
            let s16 = _mm256_add_epi16(_mm256_maddubs_epi16(u0, a), _mm256_maddubs_epi16(u1, b));
            acc = _mm256_add_epi32(acc, _mm256_madd_epi16(s16, ones));
            i += 32;
        }
        sum_i32(acc) + super::query_dot_scalar_parts(&lo[i..n], &hi[i..n], &plane[i..n])
    }
}

#[cfg(target_arch = "x86_64")]
mod x86_512 {
    use std::arch::x86_64::*;

    /// Bytes `i..i + 64` of `s`, zero past its end; and the mask of those
    /// that are in it.
    #[target_feature(enable = "avx512f,avx512bw")]
    fn load(s: &[u8], i: usize) -> (__m512i, __mmask64) {
        let left = s.len() - i;
        let mask = if left >= 64 { u64::MAX } else { (1u64 << left) - 1 };
        // SAFETY: the mask covers only bytes inside `s`; masked-off lanes
        // are not read and never fault.
        (unsafe { _mm512_maskz_loadu_epi8(mask, s.as_ptr().add(i).cast()) }, mask)
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) fn sums_vnni(a: &[u8], b: &[u8]) -> (u32, u32, u32) {
        let n = a.len().min(b.len());
        let (a, b) = (&a[..n], &b[..n]);
        let m = _mm512_set1_epi8(0x0f);
        let zero = _mm512_setzero_si512();
        let (mut acc, mut sa, mut sb) = (zero, zero, zero);
        let mut i = 0;
        while i < n {
            let ((x, _), (y, _)) = (load(a, i), load(b, i));
            let x0 = _mm512_and_si512(x, m);
            let x1 = _mm512_and_si512(_mm512_srli_epi16::<4>(x), m);
            let y0 = _mm512_and_si512(y, m);
            let y1 = _mm512_and_si512(_mm512_srli_epi16::<4>(y), m);
            // u8 × (u8 ≤ 15, so also a valid i8), four products per lane.
            acc = _mm512_dpbusd_epi32(acc, x0, y0);
            acc = _mm512_dpbusd_epi32(acc, x1, y1);
            sa = _mm512_add_epi64(sa, _mm512_sad_epu8(_mm512_add_epi8(x0, x1), zero));
            sb = _mm512_add_epi64(sb, _mm512_sad_epu8(_mm512_add_epi8(y0, y1), zero));
            i += 64;
        }
        (_mm512_reduce_add_epi32(acc) as u32, _mm512_reduce_add_epi64(sa) as u32, _mm512_reduce_add_epi64(sb) as u32)
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) fn query_dot_vnni(q: &[i8], plane: &[u8]) -> i32 {
        let n = plane.len();
        // SAFETY: i8 and u8 have the same size and alignment; the bytes
        // are only handed to VNNI as the signed operand.
        let q = unsafe { std::slice::from_raw_parts(q.as_ptr().cast::<u8>(), q.len()) };
        let (lo, hi) = q.split_at(n);
        let m = _mm512_set1_epi8(0x0f);
        let mut acc = _mm512_setzero_si512();
        let mut i = 0;
        while i < n {
            // Past the end all three are zero: no product.
            let ((p, _), (a, _), (b, _)) = (load(plane, i), load(lo, i), load(hi, i));
            let u0 = _mm512_and_si512(p, m);
            let u1 = _mm512_and_si512(_mm512_srli_epi16::<4>(p), m);
            // Levels as the unsigned operand, the query's i8 as the signed.
            acc = _mm512_dpbusd_epi32(acc, u0, a);
            acc = _mm512_dpbusd_epi32(acc, u1, b);
            i += 64;
        }
        _mm512_reduce_add_epi32(acc)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// The plane of the components `q` (padded to an even count with 0).
    fn plane(q: &[i8]) -> Vec<u8> {
        let half = plane_bytes(q.len());
        let at = |j: usize| q.get(j).copied().unwrap_or(0);
        (0..half).map(|j| level(at(j)) | (level(at(j + half)) << 4)).collect()
    }

    #[test]
    fn every_component_has_a_level_of_four_bits() {
        for q in -127i8..=127 {
            let u = level(q);
            assert!(u <= 15);
            // The level's 16 steps hold q.
            let low = 16 * (i32::from(u) - 8);
            assert!((low..low + 16).contains(&i32::from(q)), "{q} in level {u}");
        }
    }

    proptest! {
        #[test]
        fn kernels_match_the_arithmetic(
            pairs in proptest::collection::vec((-127i8..=127, -127i8..=127), 1..200)
        ) {
            let (a, b): (Vec<i8>, Vec<i8>) = pairs.into_iter().unzip();
            let (pa, pb) = (plane(&a), plane(&b));
            let pad = 2 * plane_bytes(a.len()) - a.len();
            let us = |q: &[i8]| q.iter().map(|&x| u32::from(level(x))).sum::<u32>() + 8 * pad as u32;
            let p: u32 = a.iter().zip(&b).map(|(&x, &y)| u32::from(level(x)) * u32::from(level(y))).sum::<u32>() + 64 * pad as u32;
            let want = (p, us(&a), us(&b));
            // A query's i8 components against the levels of b.
            let mut qa: Vec<i8> = a.clone();
            qa.resize(2 * plane_bytes(a.len()), 0);
            let qd: i32 = qa.iter().zip(b.iter().chain(std::iter::repeat(&0))).map(|(&x, &y)| i32::from(x) * i32::from(level(y))).sum();
            prop_assert_eq!(query_dot(&qa, &pb), qd);
            prop_assert_eq!(query_dot_scalar(&qa, &pb), qd);
            #[cfg(target_arch = "x86_64")]
            {
                use std::arch::is_x86_feature_detected as has;
                if has!("avx2") {
                    // SAFETY: checked just above.
                    prop_assert_eq!(unsafe { x86::query_dot_avx2(&qa, &pb) }, qd);
                }
                if has!("avx512f") && has!("avx512bw") && has!("avx512vnni") {
                    // SAFETY: checked just above.
                    prop_assert_eq!(unsafe { x86_512::query_dot_vnni(&qa, &pb) }, qd);
                }
            }
            prop_assert_eq!(sums(&pa, &pb), want);
            prop_assert_eq!(sums_scalar(&pa, &pb), want);
            #[cfg(target_arch = "x86_64")]
            {
                use std::arch::is_x86_feature_detected as has;
                if has!("avx2") {
                    // SAFETY: checked just above.
                    prop_assert_eq!(unsafe { x86::sums_avx2(&pa, &pb) }, want);
                }
                if has!("avx512f") && has!("avx512bw") && has!("avx512vnni") {
                    // SAFETY: checked just above.
                    prop_assert_eq!(unsafe { x86_512::sums_vnni(&pa, &pb) }, want);
                }
            }
        }
    }
}
