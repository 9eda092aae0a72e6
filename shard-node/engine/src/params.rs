//! The parameters an index is created with; fixed for its lifetime.

use std::fmt;

use crate::error::InvalidInput;
use crate::metric::Metric;

/// Largest accepted dimension. LMDB values can be larger, but a vector this
/// long is already 256 KiB and would dominate every page fetch.
pub const MAX_DIM: u32 = 65_536;

/// How an index's graph is shaped. Stored in the index; reopening with other
/// values is an error.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct IndexParams {
    /// Number of components of every vector.
    pub dim: u32,
    /// Distance metric.
    pub metric: Metric,
    /// Links per node on the upper layers (HNSW's `M`).
    pub m: u16,
    /// Links per node on the bottom layer (HNSW's `M0`, usually `2 * m`).
    pub m0: u16,
    /// Candidate list length while building (`ef_construction`).
    pub ef_construction: u32,
    /// Seed for the level of each node; levels are a pure function of
    /// (seed, internal id), so a rebuild from the same input is the same.
    pub seed: u64,
}

impl IndexParams {
    /// Parameters with the usual defaults: M=16, M0=32, ef_construction=100.
    pub fn new(dim: u32, metric: Metric) -> Self {
        IndexParams { dim, metric, m: 16, m0: 32, ef_construction: 100, seed: 0x5eed_5ba1 }
    }

    /// Sets M and M0 = 2M.
    pub fn with_m(mut self, m: u16) -> Self {
        self.m = m;
        self.m0 = m.saturating_mul(2);
        self
    }

    /// Sets ef_construction.
    pub fn with_ef_construction(mut self, ef: u32) -> Self {
        self.ef_construction = ef;
        self
    }

    /// Checks that the parameters can build a graph.
    pub fn validate(&self) -> Result<(), InvalidInput> {
        let bad = |s: String| Err(InvalidInput::BadParams(s));
        if self.dim == 0 || self.dim > MAX_DIM {
            return bad(format!("dim must be 1 to {MAX_DIM}, got {}", self.dim));
        }
        if !(2..=256).contains(&self.m) {
            return bad(format!("m must be 2 to 256, got {}", self.m));
        }
        if self.m0 < self.m || self.m0 > 512 {
            return bad(format!("m0 must be between m ({}) and 512, got {}", self.m, self.m0));
        }
        if !(1..=4096).contains(&self.ef_construction) {
            return bad(format!("ef_construction must be 1 to 4096, got {}", self.ef_construction));
        }
        Ok(())
    }

    /// Bytes of one stored vector.
    pub(crate) fn vector_bytes(&self) -> usize {
        self.dim as usize * 4
    }

    /// Bytes of one code (`quant`).
    pub(crate) fn code_bytes(&self) -> usize {
        crate::quant::code_bytes(self.dim as usize)
    }

    /// Capacity of a node's link list on `level`.
    pub(crate) fn max_links(&self, level: u8) -> usize {
        if level == 0 { self.m0 as usize } else { self.m as usize }
    }

    /// 1 / ln(M): the level distribution's scale, as in the HNSW paper.
    pub(crate) fn level_scale(&self) -> f64 {
        1.0 / f64::from(self.m).ln()
    }
}

impl fmt::Display for IndexParams {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "dim={} metric={} m={} m0={} ef_construction={}", self.dim, self.metric, self.m, self.m0, self.ef_construction)
    }
}
