//! A shoal coordinator: holds the collections and their placement, routes
//! ingest by point id to shard nodes, and answers searches by scattering to
//! every shard and merging the global top-k.
//!
//! # Layout
//!
//! - The process: `src/main.rs` (the `shoal-coordinator` binary: only
//!   `cli::main`, which `shoal_ops::procs` also calls to run a coordinator
//!   in a test binary), `cli` (flags, runtime, telemetry), `config`,
//!   `server` (the store, the cluster and its gRPC service through
//!   `shoal_server`; graceful shutdown).
//! - The request path: `service` (the gRPC face: convert, call, convert
//!   back), `auth` (API keys and roles), `validate` (checks once at entry,
//!   so a batch never half-applies for bad input), `cluster` (the core:
//!   collections, routing of writes, scatter-gather of reads), `routing`
//!   and `merge` (pure: which shard a point is on, the global top-k),
//!   `replica_writes` (a shard's part to its primary, then its replicas),
//!   `search`, `filtered` (counts, scrolls, field indexes).
//! - Operations of a [`Cluster`] in files of their own (`impl Cluster`
//!   blocks, so `cluster.rs` keeps only what every call needs):
//!   `snapshots`, `vacuum`, `verify` (replicas that agree), `recover`
//!   (a dead node's shard from its snapshot), `moves` (operator requests
//!   to move, drain, rebalance, recorded for the controller).
//! - The controller, run by the one elected coordinator: `controller`
//!   (the election loop), `mover` (carries out recorded moves), `repair`
//!   (the replication factor, decisions pure over the view), `reclaim`
//!   (disk of copies no placement names, dropped by copy id, and damaged
//!   copies taken out of the in-sync set), `restore_damaged` (a shard
//!   whose only in-sync copy is damaged, from its newest snapshot).
//! - Shard nodes: `client` (gRPC or in process, with deadlines), `pool`
//!   (one client per current member, following the view), `liveness`
//!   (the prober that marks nodes down), `outstanding` (requests in
//!   flight and answer times, for choosing and hedging replicas).
//! - `error`: what goes wrong, by meaning; the one place it becomes a
//!   gRPC status.
//! - `conversions`, `metadata`, `model` are `shoal_control`'s,
//!   re-exported.

pub mod auth;
pub mod cli;
pub mod client;
pub mod cluster;
pub mod config;
pub mod controller;
pub mod error;
pub mod filtered;
pub mod liveness;
pub mod merge;
mod mover;
pub(crate) mod moves;
pub mod outstanding;
pub mod pool;
mod reclaim;
mod recover;
mod repair;
mod replica_writes;
mod restore_damaged;
pub mod routing;
pub mod search;
pub mod server;
pub mod service;
pub mod snapshots;
mod vacuum;
pub mod validate;
mod verify;

pub use cluster::{Cluster, ClusterOptions};
pub use config::CoordinatorConfig;
pub use error::Error;
pub use server::RunningCoordinator;
/// The control plane's model and store, where the coordinator has always
/// had them.
pub use shoal_control::{conversions, metadata, model};
