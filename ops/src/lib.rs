//! shoal's operator tooling: `shoalctl` (status, collections, the embedded
//! `dev` cluster and the `demo`), and the embedded cluster itself, which the
//! cluster tests and benchmarks share, and clusters of separate processes
//! (`procs`) for the tests that kill and stop them, and the chaos run
//! (`chaos`) on such a cluster; `ingest` loads files of embeddings
//! (`shoalctl ingest`).
//!
//! # Layout
//!
//! - `src/main.rs`: the `shoalctl` binary, its clap `Command` tree (which
//!   `ops/check_docs.py` reads to check the commands the docs name) and
//!   the dispatch to the modules below; it first runs a coordinator or
//!   shard-node role when `procs` asks it to (`shoalctl dev --etcd`).
//! - Commands against a running cluster, one module per family: `ctl`
//!   (`status`, `collections`), `points` (`search`, `count`, `scroll`,
//!   `delete`, `index`), `placement` (`node`, `shard move`, `rebalance`),
//!   `snapshots`, `top` (a live view from every process's `/metrics`).
//! - `ingest`: files of embeddings in, exactly once, one way: `input`
//!   (rows read and checked in order; `parquet` for Parquet files), `plan`
//!   (batches that always come out the same, so a rerun resumes), `stream`
//!   (one source per stream, resent after a broken call).
//! - `vectors`: `.fvecs` and `.npy` files, mapped rather than read;
//!   shared with the benchmarks in `loadtest`.
//! - `security`: the files a secured cluster needs (`tls init`, `keys new`).
//! - Clusters to run: `embedded` (all in one process over loopback gRPC:
//!   `dev`, `demo`, the cluster tests, benchmarks), `procs` (separate
//!   processes, for tests that kill and stop them), `etcd_server` (an
//!   etcd of a run's own), `chaos` (the chaos run on `procs`), `demo` and
//!   `demo_data` (the demo and its shipped sample).
//! - Tests: `tests/cluster/` runs on `embedded`; `tests/processes/` on
//!   `procs`, its own binary (no harness) whose main also runs the roles
//!   it starts.

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
