//! Distance metrics and the SIMD kernels behind them.
//!
//! Kernels come from `simsimd`, which picks AVX-512, AVX2/FMA, NEON or SVE
//! code at run time for the CPU it runs on. Every distance here is "smaller is
//! closer", so the graph code never needs to know which metric it serves.

use std::fmt;
use std::str::FromStr;

use simsimd::SpatialSimilarity;

/// How closeness between two vectors is measured.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Metric {
    /// Angle between vectors. Vectors are normalised when stored, so the
    /// kernel is a dot product; reported distance is `1 - cos`.
    Cosine,
    /// Inner product; reported distance is `-dot` (larger dot is closer).
    Dot,
    /// Euclidean distance; the graph uses its square, reports the root.
    Euclidean,
}

impl Metric {
    /// All metrics, in their stable on-disk order.
    pub const ALL: [Metric; 3] = [Metric::Cosine, Metric::Dot, Metric::Euclidean];

    /// Stable code written to disk.
    pub(crate) fn code(self) -> u8 {
        match self {
            Metric::Cosine => 1,
            Metric::Dot => 2,
            Metric::Euclidean => 3,
        }
    }

    pub(crate) fn from_code(code: u8) -> Option<Metric> {
        Metric::ALL.into_iter().find(|m| m.code() == code)
    }

    /// The name used in configuration and on the command line.
    pub fn name(self) -> &'static str {
        match self {
            Metric::Cosine => "cosine",
            Metric::Dot => "dot",
            Metric::Euclidean => "euclidean",
        }
    }

    /// Internal distance between two prepared vectors: smaller is closer.
    #[inline]
    pub(crate) fn distance(self, a: &[f32], b: &[f32]) -> f32 {
        debug_assert_eq!(a.len(), b.len());
        match self {
            // Both sides are unit length: 1 - dot is the cosine distance.
            Metric::Cosine => 1.0 - dot(a, b),
            Metric::Dot => -dot(a, b),
            Metric::Euclidean => l2sq(a, b),
        }
    }

    /// Turns an internal distance into the one reported to users.
    pub(crate) fn reported(self, internal: f32) -> f32 {
        match self {
            Metric::Cosine | Metric::Dot => internal,
            Metric::Euclidean => internal.max(0.0).sqrt(),
        }
    }

    /// Brings a validated vector into the form the graph stores and compares.
    pub(crate) fn prepare(self, v: &mut [f32]) {
        if self == Metric::Cosine {
            // f64 so that vectors whose length overflows f32 still normalise.
            let norm = squared_length(v).sqrt();
            v.iter_mut().for_each(|x| *x = (f64::from(*x) / norm) as f32);
        }
    }

    /// Checks a vector against `dim` and this metric; says what is wrong.
    pub fn validate(self, v: &[f32], dim: usize) -> Result<(), VectorError> {
        if v.is_empty() {
            return Err(VectorError::Empty);
        }
        if v.len() != dim {
            return Err(VectorError::WrongDimension { expected: dim, got: v.len() });
        }
        if let Some((index, &value)) = v.iter().enumerate().find(|(_, x)| !x.is_finite()) {
            return Err(VectorError::NonFinite { index, value });
        }
        let norm_sq = squared_length(v);
        match self {
            // Below f32's smallest normal the normalised vector loses its
            // direction to rounding: treat it as zero.
            Metric::Cosine if norm_sq.sqrt() < f64::from(f32::MIN_POSITIVE) => Err(VectorError::ZeroVector),
            Metric::Dot if !(norm_sq as f32).is_finite() => Err(VectorError::Overflow),
            // |a - b|² ≤ 4 max(|a|², |b|²): keep every distance finite.
            Metric::Euclidean if norm_sq > f64::from(f32::MAX) / 4.0 => Err(VectorError::Overflow),
            Metric::Cosine | Metric::Dot | Metric::Euclidean => Ok(()),
        }
    }
}

impl fmt::Display for Metric {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

impl FromStr for Metric {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        match s.to_ascii_lowercase().as_str() {
            "cosine" | "cos" => Ok(Metric::Cosine),
            "dot" | "ip" | "inner_product" => Ok(Metric::Dot),
            "euclidean" | "l2" => Ok(Metric::Euclidean),
            other => Err(format!("unknown metric `{other}` (expected cosine, dot or euclidean)")),
        }
    }
}

/// What is wrong with a vector that was offered to the index.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum VectorError {
    /// The vector has no components.
    #[error("vector is empty")]
    Empty,
    /// The vector's length differs from the index's dimension.
    #[error("vector has dimension {got}, the index expects {expected}")]
    WrongDimension {
        /// The index's dimension.
        expected: usize,
        /// The vector's length.
        got: usize,
    },
    /// A component is NaN or infinite.
    #[error("component {index} is {value}; every component must be finite")]
    NonFinite {
        /// Position of the first bad component.
        index: usize,
        /// Its value.
        value: f32,
    },
    /// A zero (or denormal) vector has no direction, so cosine is undefined.
    #[error("vector has zero length, which has no direction under the cosine metric")]
    ZeroVector,
    /// Components are finite but their squares overflow f32.
    #[error("vector's squared length overflows 32-bit floats; scale it down")]
    Overflow,
}

/// Squared length in f64: large but finite components cannot overflow it.
pub(crate) fn squared_length(v: &[f32]) -> f64 {
    v.iter().map(|&x| f64::from(x) * f64::from(x)).sum()
}

#[inline]
fn dot(a: &[f32], b: &[f32]) -> f32 {
    // Lengths are equal by construction (validated at the door), so the
    // kernel's `None` for a length mismatch cannot happen.
    f32::dot(a, b).unwrap_or(f64::NAN) as f32
}

#[inline]
fn l2sq(a: &[f32], b: &[f32]) -> f32 {
    f32::l2sq(a, b).unwrap_or(f64::NAN) as f32
}

#[cfg(test)]
mod tests {
    use super::*;

    fn naive(metric: Metric, a: &[f32], b: &[f32]) -> f32 {
        let d: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
        match metric {
            Metric::Cosine => 1.0 - d,
            Metric::Dot => -d,
            Metric::Euclidean => a.iter().zip(b).map(|(x, y)| (x - y) * (x - y)).sum(),
        }
    }

    #[test]
    fn kernels_match_naive_sums() {
        let a: Vec<f32> = (0..384).map(|i| ((i * 37 % 101) as f32 - 50.0) / 50.0).collect();
        let b: Vec<f32> = (0..384).map(|i| ((i * 53 % 97) as f32 - 48.0) / 48.0).collect();
        for metric in Metric::ALL {
            let (mut pa, mut pb) = (a.clone(), b.clone());
            metric.prepare(&mut pa);
            metric.prepare(&mut pb);
            let got = metric.distance(&pa, &pb);
            let want = naive(metric, &pa, &pb);
            assert!((got - want).abs() < 1e-3 * want.abs().max(1.0), "{metric}: {got} vs {want}");
        }
    }

    #[test]
    fn codes_round_trip_and_names_parse() {
        for m in Metric::ALL {
            assert_eq!(Metric::from_code(m.code()), Some(m));
            assert_eq!(m.name().parse::<Metric>(), Ok(m));
        }
        assert_eq!(Metric::from_code(0), None);
        assert!("manhattan".parse::<Metric>().is_err());
    }

    #[test]
    fn validation_names_the_problem() {
        let m = Metric::Cosine;
        assert_eq!(m.validate(&[], 3), Err(VectorError::Empty));
        assert_eq!(m.validate(&[1.0, 2.0], 3), Err(VectorError::WrongDimension { expected: 3, got: 2 }));
        assert!(matches!(m.validate(&[1.0, f32::NAN, 2.0], 3), Err(VectorError::NonFinite { index: 1, .. })));
        assert!(matches!(m.validate(&[1.0, 1.0, f32::INFINITY], 3), Err(VectorError::NonFinite { index: 2, .. })));
        assert_eq!(m.validate(&[0.0, 0.0, 0.0], 3), Err(VectorError::ZeroVector));
        assert_eq!(Metric::Euclidean.validate(&[0.0, 0.0, 0.0], 3), Ok(()));
        assert_eq!(Metric::Dot.validate(&[3e38, 3e38, 0.0], 3), Err(VectorError::Overflow));
        assert_eq!(Metric::Euclidean.validate(&[1.3e19, 0.0, 0.0], 3), Err(VectorError::Overflow));
        assert_eq!(Metric::Euclidean.validate(&[9e18, 0.0, 0.0], 3), Ok(()));
        let (a, b) = ([9e18f32, 0.0, 0.0], [-9e18f32, 0.0, 0.0]);
        assert!(Metric::Euclidean.distance(&a, &b).is_finite());
        assert_eq!(m.validate(&[3e38, 3e38, 0.0], 3), Ok(()));
        let mut big = vec![3e38, 3e38, 0.0];
        m.prepare(&mut big);
        assert!((big[0] - std::f32::consts::FRAC_1_SQRT_2).abs() < 1e-6, "{big:?}");
    }
}
