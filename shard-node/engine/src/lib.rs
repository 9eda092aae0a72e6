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
//!
//! # Layout
//!
//! - `index` (with `index/`): the [`Index`] and its operations, one file
//!   each: `writer` (batches), `reader` (searches, snapshots, stats),
//!   `filtered` (searches, counts and scrolls under a filter), `fields`
//!   (declaring and building field indexes), `vacuum`, `compact`, `fold`.
//! - `plan`: a group of batches resolved into what one write transaction
//!   does; `batch`, `batch_log`: what writers send and what the shard
//!   keeps of it for other copies.
//! - `hnsw`: the graph algorithms over the `view::Graph` trait (build,
//!   insert, repair, vacuum, search), shared by readers and the writer.
//! - `session`: a read transaction with its caches; `session/filtered`
//!   carries out the `planner`'s choice for a filter.
//! - `filter`: the filter language (`json`), its resolution against the
//!   field indexes (`prepare`), and its answer from the indexes
//!   (`on_index`) or from one payload (`on_payload`).
//! - `fields`: field index definitions (`schema`), what a payload holds
//!   for a field (`value`), and the tables (`postings`, `columns`) with
//!   their per-transaction changes (`update`).
//! - Storage: `store` (the LMDB environment), `table` (typed keys),
//!   `codec` (values), `quant` and `nibble` (4-bit codes), `view` and
//!   `cache` (reading the graph through a transaction), `links_log`,
//!   `tombstone_set`, `migrate`, `copy`, `digest`, `warm`; `prefetch`, the
//!   cache hint both the walk and the views give; `scrub`, checking every
//!   stored value's checksum (`table`) in paced steps.
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
mod fields;
mod filter;
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
mod planner;
mod prefetch;
mod quant;
mod scrub;
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
pub use fields::value::{PAYLOAD_BINARY, PAYLOAD_JSON};
pub use fields::{FieldIndexInfo, FieldState, FieldType, MAX_FIELD_INDEXES, MAX_FIELD_NAME_BYTES};
pub use filter::{Bound, Condition, Filter, MatchValue, Range};
pub use index::{
    BuildStep, CompactOutcome, FoldOutcome, FoldStep, Index, IndexOptions, IndexStats, LinkLog, MAX_SCROLL_LIMIT, Rescore, Snapshot,
    VacuumOutcome, Where,
};
pub use metric::{Metric, VectorError};
pub use params::{IndexParams, MAX_DIM};
pub use planner::{Explain, Plan, PlannerOptions};
pub use scrub::{ScrubCursor, ScrubStep};
pub use session::{Found, Hit, MAX_EF, MAX_K, Page, SearchParams, StoredPoint};
pub use shoal_filter::{
    MAX_ANY_VALUES, MAX_FILTER_CONDITIONS, MAX_FILTER_DEPTH, MAX_HAS_IDS, MAX_KEYWORD_BYTES, parse_json as parse_filter,
};
pub use stop::Stop;
