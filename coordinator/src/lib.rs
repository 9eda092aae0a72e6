//! A shoal coordinator: holds the collections and their placement, routes
//! ingest by point id to shard nodes, and answers searches by scattering to
//! every shard and merging the global top-k.

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
mod recover;
mod repair;
mod replica_writes;
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
