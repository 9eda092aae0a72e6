//! shoal's operator tooling: `shoalctl` (status, collections, the embedded
//! `dev` cluster and the `demo`), and the embedded cluster itself, which the
//! cluster tests and benchmarks share, and clusters of separate processes
//! (`procs`) for the tests that kill and stop them, and the chaos run
//! (`chaos`) on such a cluster; `ingest` loads files of embeddings
//! (`shoalctl ingest`).

pub mod chaos;
pub mod ctl;
pub mod demo;
pub mod demo_data;
pub mod embedded;
pub mod etcd_server;
pub mod ingest;
pub mod placement;
pub mod points;
pub mod procs;
pub mod security;
pub mod snapshots;
pub mod top;
pub mod vectors;
