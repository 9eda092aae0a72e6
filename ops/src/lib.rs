//! shoal's operator tooling: `shoalctl` (status, collections, the embedded
//! `dev` cluster and the `demo`), and the embedded cluster itself, which the
//! cluster tests and benchmarks share.

pub mod ctl;
pub mod demo;
pub mod demo_data;
pub mod embedded;
pub mod snapshots;
