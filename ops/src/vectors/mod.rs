//! Files of vectors, mapped rather than read: `.fvecs` (the TEXMEX format)
//! and `.npy` (2-d float32). `shoalctl ingest` loads them; the benchmarks
//! read their data sets with them.

pub mod fvecs;
pub mod npy;
