//! shoal's per-shard vector index: an HNSW graph stored in LMDB.
//!
//! One [`Index`] owns one LMDB environment. A batch is applied in a single
//! write transaction: its vectors are written first, then every thread opens
//! a nested read transaction on the uncommitted transaction and links new
//! nodes in parallel, reading only the pages its searches need; the link
//! changes are collected in memory, written once the readers are gone, and
//! the batch commits atomically. Searches run on committed snapshots from
//! any number of threads.
//!
//! ```
//! use shoal_engine::{Batch, Index, IndexOptions, IndexParams, Metric, SearchParams};
//!
//! let dir = tempfile::tempdir()?;
//! let index = Index::open_or_create(dir.path(), IndexParams::new(3, Metric::Cosine), IndexOptions::default())?;
//! index.apply(Batch::upserts([(7, vec![1.0, 0.0, 0.0]), (8, vec![0.0, 1.0, 0.0])]).with_source("job-1", 0))?;
//! let hits = index.search(&[0.9, 0.1, 0.0], SearchParams::new(1, 16))?;
//! assert_eq!(hits[0].id, 7);
//! assert_eq!(index.offset("job-1")?, Some(0));
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![warn(missing_docs)]

#[cfg(not(target_endian = "little"))]
compile_error!("shoal stores vectors in little-endian order and reads them in place");

mod batch;
mod batch_log;
mod cache;
mod codec;
mod copy;
mod digest;
mod error;
#[cfg(test)]
mod fuzz_tests;
mod hnsw;
mod index;
mod links_log;
mod locality;
mod metric;
mod migrate;
mod nibble;
mod params;
mod plan;
mod quant;
mod session;
mod sparse_chunk;
mod stop;
mod store;
mod table;
mod tombstone_set;
mod view;
mod warm;

pub use batch::{Batch, BatchOutcome, MAX_SOURCE_BYTES, Op, Point, SourceOffset, Write, Written};
pub use batch_log::{BatchLogRetention, LogApplied, LogEntry, LogRead};
pub use copy::{CopyInfo, CopyMode};
pub use digest::ContentDigest;
pub use error::{Error, InvalidInput, Location, Rejected, Result};
pub use index::{CompactOutcome, FoldOutcome, FoldStep, Index, IndexOptions, IndexStats, LinkLog, Rescore, Snapshot, VacuumOutcome};
pub use metric::{Metric, VectorError};
pub use params::{IndexParams, MAX_DIM};
pub use session::{Hit, MAX_EF, MAX_K, SearchParams, StoredPoint};
pub use stop::Stop;
