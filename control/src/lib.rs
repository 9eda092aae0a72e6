//! shoal's control plane: what a cluster is made of (collections, where
//! their shards live, the member nodes) and the store every process reads
//! it from and changes it through. Shared by coordinators (which route by
//! it and, one at a time, decide placement) and shard nodes (which
//! register in it). See `docs/control-plane.md`.

pub mod config;
pub mod conversions;
pub mod metadata;
pub mod model;
pub use config::ClusterConfig;
