//! Files the tests of the benchmarks run on.

use rand::Rng;

/// Writes `rows` random vectors of `dim` components in `.fvecs` format.
pub(crate) fn write_fvecs(path: &std::path::Path, rows: usize, dim: usize, rng: &mut rand::rngs::StdRng) {
    let mut bytes = Vec::new();
    for _ in 0..rows {
        bytes.extend_from_slice(&(dim as i32).to_le_bytes());
        for _ in 0..dim {
            bytes.extend_from_slice(&rng.random_range(-1.0f32..1.0).to_le_bytes());
        }
    }
    std::fs::write(path, bytes).unwrap();
}
