//! A shoal shard node: owns shards (one LMDB environment each, through
//! `shoal-engine`), runs one group-committing writer per shard, and serves
//! the internal `shoal.v1.ShardNode` gRPC API to coordinators.
//!
//! # Layout
//!
//! - The process: `src/main.rs` (the `shoal-shard-node` binary: only
//!   `cli::main`, which `shoal_ops::procs` also calls to run a node in a
//!   test binary), `cli` (flags, runtime, telemetry), `config`, `server`
//!   (the gRPC service through `shoal_server`; graceful shutdown),
//!   `data_dir` (the directory's lock and incarnation, so a restarted node
//!   takes its own registration over at once), `registration` (membership
//!   in the metadata store under a lease).
//! - The request path: `service` (thin gRPC handlers), `host` (the shards
//!   the node owns: their indexes, writers and directories; every handler
//!   lands here), `admit` (what every write is checked for, whoever sent
//!   it), `writer` (one group-committing writer per shard; fences and
//!   batch-log entries go through it, in queue order), `search` (a
//!   bounded number of searches on blocking threads, stopped at the
//!   caller's deadline); `scrub` (the background check of every stored
//!   value, which takes a damaged copy out of service).
//! - Operations of a [`ShardHost`] in files of their own (`impl ShardHost`
//!   blocks): `fields` (field indexes, counts, scrolls), `moves` (fencing
//!   by epoch, reading and applying batch logs), `snapshots` (the host's
//!   side of `shoal-snapshot`: one operation per shard at a time).
//! - Wire types: `convert` (`shoal.v1` to and from the engine's types,
//!   field by field so a new field fails to compile until handled),
//!   `filters` (filter and field-index states, plans, scroll pages).
//! - On disk beside each shard: `shard_file` (`shard.json`: the shard
//!   count the engine does not record, and the copy id that makes a
//!   stale `DropShard` miss a newer copy).
//! - Resources: `files` (the open-file limit, which caps the shards a node
//!   can hold), `memory` (freed heap given back to the OS), `metrics`
//!   (labelled by shard, never by point or request, so their number
//!   grows only with the shards held).

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
mod scrub;
mod search;
pub mod server;
pub mod service;
mod shard_file;
mod snapshots;
mod writer;

pub use config::ShardNodeConfig;
pub use host::ShardHost;
pub use server::RunningShardNode;
pub use writer::WriterOptions;
