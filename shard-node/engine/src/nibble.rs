//! Dot products over nibble-split codes (see `quant`).
//!
//! A code's components are `i8`s `q = 16·h + l` with `h = q >> 4` in
//! `-8..=7` and `l = q & 15`. They are stored as two planes of 4-bit
//! nibbles: the *high* plane holds `u = h + 8` (unsigned, `0..=15`), the
//! *low* plane holds `l`. A walk of the graph reads only the high plane,
//! half the bytes; a full-precision distance reads both.
//!
//! Plane byte `j` holds component `j` in its low nibble and component
//! `j + half` in its high nibble (`half = ceil(dim / 2)`), so a SIMD
//! register of plane bytes unpacks into two runs of consecutive
//! components with one mask and one shift, and no shuffles. An odd `dim`
//! has one padding component, stored as `q = 0` (`u = 8`, `l = 0`).
//!
//! Why our own kernels: `simsimd` (used for every other kernel) has no
//! 4-bit integer type. The scalar versions are the reference the SIMD ones
//! are tested against.

/// Bytes in one plane of a `dim`-component code.
#[inline]
pub(crate) fn plane_bytes(dim: usize) -> usize {
    dim.div_ceil(2)
}

/// High nibble of component `q`, offset to be unsigned.
#[inline]
pub(crate) fn high(q: i8) -> u8 {
    ((q >> 4) + 8) as u8
}

/// Low nibble of component `q`.
#[inline]
pub(crate) fn low(q: i8) -> u8 {
    (q as u8) & 15
}

/// The component whose nibbles are `u` (high, offset) and `l` (low).
#[inline]
pub(crate) fn join(u: u8, l: u8) -> i8 {
    (((u << 4) | l) ^ 0x80) as i8
}

/// Sums over the high planes `a` and `b`: `(Σ u_a·u_b, Σ u_a, Σ u_b)`,
/// padding included.
#[inline]
pub(crate) fn coarse(a: &[u8], b: &[u8]) -> (u32, u32, u32) {
    debug_assert_eq!(a.len(), b.len());
    #[cfg(target_arch = "x86_64")]
    match level() {
        // SAFETY: the CPU has the features (checked at run time).
        Level::Vnni => return unsafe { x86_512::coarse_vnni(a, b) },
        Level::Avx2 => return unsafe { x86::coarse_avx2(a, b) },
        Level::Scalar => {}
    }
    coarse_scalar(a, b)
}

/// `Σ q_a·q_b` over every component of two codes given by their planes.
#[inline]
pub(crate) fn full(a_high: &[u8], a_low: &[u8], b_high: &[u8], b_low: &[u8]) -> i32 {
    debug_assert!(a_high.len() == a_low.len() && b_high.len() == b_low.len() && a_high.len() == b_high.len());
    #[cfg(target_arch = "x86_64")]
    match level() {
        // SAFETY: the CPU has the features (checked at run time).
        Level::Vnni => return unsafe { x86_512::full_vnni(a_high, a_low, b_high, b_low) },
        Level::Avx2 => return unsafe { x86::full_avx2(a_high, a_low, b_high, b_low) },
        Level::Scalar => {}
    }
    full_scalar(a_high, a_low, b_high, b_low)
}

/// The widest kernels this CPU runs.
#[cfg(target_arch = "x86_64")]
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Level {
    /// AVX-512 with byte operations and VNNI's u8 × i8 dot products.
    Vnni,
    Avx2,
    Scalar,
}

#[cfg(target_arch = "x86_64")]
#[inline]
fn level() -> Level {
    static LEVEL: std::sync::OnceLock<Level> = std::sync::OnceLock::new();
    *LEVEL.get_or_init(|| {
        use std::arch::is_x86_feature_detected as has;
        if has!("avx512f") && has!("avx512bw") && has!("avx512vnni") {
            Level::Vnni
        } else if has!("avx2") {
            Level::Avx2
        } else {
            Level::Scalar
        }
    })
}

pub(crate) fn coarse_scalar(a: &[u8], b: &[u8]) -> (u32, u32, u32) {
    let (mut p, mut sa, mut sb) = (0u32, 0u32, 0u32);
    for (&x, &y) in a.iter().zip(b) {
        let (x0, x1, y0, y1) = (u32::from(x & 15), u32::from(x >> 4), u32::from(y & 15), u32::from(y >> 4));
        p += x0 * y0 + x1 * y1;
        sa += x0 + x1;
        sb += y0 + y1;
    }
    (p, sa, sb)
}

pub(crate) fn full_scalar(a_high: &[u8], a_low: &[u8], b_high: &[u8], b_low: &[u8]) -> i32 {
    let mut s = 0i32;
    for j in 0..a_high.len() {
        for shift in [0, 4] {
            let qa = join((a_high[j] >> shift) & 15, (a_low[j] >> shift) & 15);
            let qb = join((b_high[j] >> shift) & 15, (b_low[j] >> shift) & 15);
            s += i32::from(qa) * i32::from(qb);
        }
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
    pub(super) fn coarse_avx2(a: &[u8], b: &[u8]) -> (u32, u32, u32) {
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
        let (p, s_a, s_b) = super::coarse_scalar(&a[i..n], &b[i..n]);
        (sum_i32(acc) as u32 + p, sum_u64(sa) as u32 + s_a, sum_u64(sb) as u32 + s_b)
    }

    /// The 32 components in the low (`SHIFT = 0`) or high (`SHIFT = 4`)
    /// nibbles of 32 plane bytes, as i8.
    #[target_feature(enable = "avx2")]
    fn components<const SHIFT: i32>(high: __m256i, low: __m256i) -> __m256i {
        let mask = _mm256_set1_epi8(0x0f);
        let u = _mm256_and_si256(_mm256_srli_epi16::<SHIFT>(high), mask);
        let l = _mm256_and_si256(_mm256_srli_epi16::<SHIFT>(low), mask);
        // u ≤ 15, so shifting its 16-bit lane left by 4 stays in its byte.
        _mm256_xor_si256(_mm256_or_si256(_mm256_slli_epi16::<4>(u), l), _mm256_set1_epi8(-128))
    }

    /// `Σ a·b` of 32 i8 pairs into eight i32 lanes. Components are never
    /// -128 (codes clamp to ±127), so |a|·b pairs sum to at most 32,258.
    #[target_feature(enable = "avx2")]
    fn dot_i8(a: __m256i, b: __m256i) -> __m256i {
        let p = _mm256_maddubs_epi16(_mm256_abs_epi8(a), _mm256_sign_epi8(b, a));
        _mm256_madd_epi16(p, _mm256_set1_epi16(1))
    }

    #[target_feature(enable = "avx2")]
    pub(super) fn full_avx2(a_high: &[u8], a_low: &[u8], b_high: &[u8], b_low: &[u8]) -> i32 {
        let n = a_high.len().min(a_low.len()).min(b_high.len()).min(b_low.len());
        let mut acc = _mm256_setzero_si256();
        let mut i = 0;
        while i + 32 <= n {
            // SAFETY: `i + 32 <= n` bytes are in all four slices.
            let (ah, al, bh, bl) = unsafe {
                (
                    _mm256_loadu_si256(a_high.as_ptr().add(i).cast()),
                    _mm256_loadu_si256(a_low.as_ptr().add(i).cast()),
                    _mm256_loadu_si256(b_high.as_ptr().add(i).cast()),
                    _mm256_loadu_si256(b_low.as_ptr().add(i).cast()),
                )
            };
            acc = _mm256_add_epi32(acc, dot_i8(components::<0>(ah, al), components::<0>(bh, bl)));
            acc = _mm256_add_epi32(acc, dot_i8(components::<4>(ah, al), components::<4>(bh, bl)));
            i += 32;
        }
        sum_i32(acc) + super::full_scalar(&a_high[i..n], &a_low[i..n], &b_high[i..n], &b_low[i..n])
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
    pub(super) fn coarse_vnni(a: &[u8], b: &[u8]) -> (u32, u32, u32) {
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

    /// `q + 128` (as u8) of the components in the low (`SHIFT = 0`) or
    /// high (`SHIFT = 4`) nibbles of 64 plane bytes.
    #[target_feature(enable = "avx512f,avx512bw")]
    fn biased<const SHIFT: u32>(high: __m512i, low: __m512i) -> __m512i {
        let m = _mm512_set1_epi8(0x0f);
        let u = _mm512_and_si512(_mm512_srli_epi16::<SHIFT>(high), m);
        let l = _mm512_and_si512(_mm512_srli_epi16::<SHIFT>(low), m);
        // u ≤ 15, so shifting its 16-bit lane left by 4 stays in its byte.
        _mm512_or_si512(_mm512_slli_epi16::<4>(u), l)
    }

    #[target_feature(enable = "avx512f,avx512bw,avx512vnni")]
    pub(super) fn full_vnni(a_high: &[u8], a_low: &[u8], b_high: &[u8], b_low: &[u8]) -> i32 {
        let n = a_high.len().min(a_low.len()).min(b_high.len()).min(b_low.len());
        let (a_high, a_low, b_high, b_low) = (&a_high[..n], &a_low[..n], &b_high[..n], &b_low[..n]);
        let flip = _mm512_set1_epi8(-128);
        let ones = _mm512_set1_epi8(1);
        let zero = _mm512_setzero_si512();
        let (mut acc, mut sum_b) = (zero, zero);
        let mut i = 0;
        while i < n {
            let ((ah, _), (al, _), (bh, _), (bl, mask)) = (load(a_high, i), load(a_low, i), load(b_high, i), load(b_low, i));
            // VNNI multiplies u8 by i8: take a's components as q + 128
            // (unsigned) and b's as q, then subtract 128·Σ q_b. Bytes past
            // the end are zero in a (no product) and masked to zero in b.
            let (a0, a1) = (biased::<0>(ah, al), biased::<4>(ah, al));
            let b0 = _mm512_maskz_mov_epi8(mask, _mm512_xor_si512(biased::<0>(bh, bl), flip));
            let b1 = _mm512_maskz_mov_epi8(mask, _mm512_xor_si512(biased::<4>(bh, bl), flip));
            acc = _mm512_dpbusd_epi32(acc, a0, b0);
            acc = _mm512_dpbusd_epi32(acc, a1, b1);
            sum_b = _mm512_dpbusd_epi32(sum_b, ones, b0);
            sum_b = _mm512_dpbusd_epi32(sum_b, ones, b1);
            i += 64;
        }
        _mm512_reduce_add_epi32(acc) - 128 * _mm512_reduce_add_epi32(sum_b)
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Planes of the components `q` (padded to an even count with 0).
    fn planes(q: &[i8]) -> (Vec<u8>, Vec<u8>) {
        let half = plane_bytes(q.len());
        let at = |j: usize| q.get(j).copied().unwrap_or(0);
        let hi = (0..half).map(|j| high(at(j)) | (high(at(j + half)) << 4)).collect();
        let lo = (0..half).map(|j| low(at(j)) | (low(at(j + half)) << 4)).collect();
        (hi, lo)
    }

    #[test]
    fn nibbles_join_back_into_every_component() {
        for q in -127i8..=127 {
            let (u, l) = (high(q), low(q));
            assert!(u <= 15 && l <= 15);
            assert_eq!(join(u, l), q);
            assert_eq!(i32::from(q), 16 * (i32::from(u) - 8) + i32::from(l));
        }
    }

    proptest! {
        #[test]
        fn kernels_match_the_arithmetic(
            pairs in proptest::collection::vec((-127i8..=127, -127i8..=127), 1..200)
        ) {
            let (a, b): (Vec<i8>, Vec<i8>) = pairs.into_iter().unzip();
            let (ah, al) = planes(&a);
            let (bh, bl) = planes(&b);
            let exact: i32 = a.iter().zip(&b).map(|(&x, &y)| i32::from(x) * i32::from(y)).sum();
            prop_assert_eq!(full(&ah, &al, &bh, &bl), exact);
            prop_assert_eq!(full_scalar(&ah, &al, &bh, &bl), exact);
            #[cfg(target_arch = "x86_64")]
            {
                use std::arch::is_x86_feature_detected as has;
                if has!("avx2") {
                    // SAFETY: checked just above.
                    prop_assert_eq!(unsafe { x86::full_avx2(&ah, &al, &bh, &bl) }, exact);
                }
                if has!("avx512f") && has!("avx512bw") && has!("avx512vnni") {
                    // SAFETY: checked just above.
                    prop_assert_eq!(unsafe { x86_512::full_vnni(&ah, &al, &bh, &bl) }, exact);
                }
            }
            let pad = 2 * plane_bytes(a.len()) - a.len();
            let us = |q: &[i8]| q.iter().map(|&x| u32::from(high(x))).sum::<u32>() + 8 * pad as u32;
            let p: u32 = a.iter().zip(&b).map(|(&x, &y)| u32::from(high(x)) * u32::from(high(y))).sum::<u32>() + 64 * pad as u32;
            prop_assert_eq!(coarse(&ah, &bh), (p, us(&a), us(&b)));
            prop_assert_eq!(coarse_scalar(&ah, &bh), (p, us(&a), us(&b)));
            #[cfg(target_arch = "x86_64")]
            {
                use std::arch::is_x86_feature_detected as has;
                if has!("avx2") {
                    // SAFETY: checked just above.
                    prop_assert_eq!(unsafe { x86::coarse_avx2(&ah, &bh) }, (p, us(&a), us(&b)));
                }
                if has!("avx512f") && has!("avx512bw") && has!("avx512vnni") {
                    // SAFETY: checked just above.
                    prop_assert_eq!(unsafe { x86_512::coarse_vnni(&ah, &bh) }, (p, us(&a), us(&b)));
                }
            }
        }
    }
}
