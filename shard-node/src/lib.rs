//! A shoal shard node: owns shards (one LMDB environment each, through
//! `shoal-engine`), runs one group-committing writer per shard, and serves
//! the internal `shoal.v1.ShardNode` gRPC API to coordinators.

mod admit;
pub mod cli;
pub mod config;
mod convert;
pub mod data_dir;
mod fields;
mod files;
pub mod filters;
pub mod host;
mod memory;
mod metrics;
mod moves;
pub mod registration;
mod search;
pub mod server;
pub mod service;
mod snapshots;
mod writer;

pub use config::ShardNodeConfig;
pub use host::ShardHost;
pub use server::RunningShardNode;
pub use writer::WriterOptions;
