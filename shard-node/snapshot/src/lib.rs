//! Snapshots of shards in object storage, and restores from them.
//!
//! A snapshot is the engine's copy of one commit ([`shoal_engine::Index::copy_to`]),
//! cut into fixed-size chunks that are compressed with zstd one by one and
//! stored under the BLAKE3 of their raw bytes, so a chunk the store already
//! has is not uploaded again; a JSON [`Manifest`] written last publishes it.
//! A restore downloads and checks every chunk, rebuilds `data.mdb` in a
//! staging directory, opens it, compares it with the manifest, and only then
//! is swapped into place. See `docs/snapshots.md`.
//!
//! ```no_run
//! # async fn example(index: std::sync::Arc<shoal_engine::Index>) -> shoal_snapshot::Result<()> {
//! use std::sync::Arc;
//! use shoal_snapshot::*;
//! let store = SnapshotStore::open("./shoal-data/snapshots")?;
//! let target = SnapshotTarget { collection: "docs".into(), shard: 0, shard_count: 1, id: None };
//! let progress = Arc::new(Progress::new(Operation::Snapshot));
//! let m = create_snapshot(&store, index, &target, &SnapshotOptions::default(), progress).await?;
//! let source = RestoreSource { collection: "docs".into(), shard: 0, id: m.id.clone() };
//! let staging = std::path::Path::new("/srv/shoal/.restore");
//! let progress = Arc::new(Progress::new(Operation::Restore));
//! restore_to_staging(&store, &source, staging, &RestoreOptions::default(), progress).await?;
//! swap_into_place(staging, std::path::Path::new("/srv/shoal/shards/docs/0"))?;
//! # Ok(()) }
//! ```
//!
//! # Layout
//!
//! - The two operations: `upload` (a snapshot: the engine's copy stream
//!   into chunks on a blocking thread, uploads concurrent, manifest last)
//!   and `restore` (chunks downloaded and checked into a staging
//!   directory, then the swap), which writes through `image_file` (direct
//!   I/O where the file system takes it: the page-cache copy was most of a
//!   restore's CPU).
//! - The format: `chunk` (fixed-offset chunks named by the BLAKE3 of their
//!   raw bytes, so an unchanged region is the same object whatever the
//!   zstd version), `manifest` (what one snapshot holds; it exists exactly
//!   when its manifest does), `layout` (object keys, snapshot ids).
//! - The store: `store_url` (a local directory or an S3 bucket, from a
//!   URL), `objects` (one object at a time: multipart uploads, ranged
//!   reads).
//! - Around them: `catalog` (listing, per shard or per collection
//!   snapshot), `prune` (retention, and the chunks no manifest names),
//!   `progress` (readable from any thread while an operation runs),
//!   `error` (grouped by what the caller can do).
//! - `fuzz_tests` (tests only): hostile bytes for everything read back
//!   from the store.
#![warn(missing_docs)]

mod catalog;
mod chunk;
mod error;
#[cfg(test)]
mod fuzz_tests;
mod image_file;
mod layout;
mod manifest;
mod objects;
mod progress;
mod prune;
mod restore;
mod store_url;
mod upload;

pub use catalog::{CollectionSnapshot, Listed, MAX_LISTED_MISSING, list_collection_snapshots, list_snapshots, summarize};
pub use error::{Result, SnapshotError};
pub use layout::{new_snapshot_id, validate_id};
pub use manifest::{ChunkRef, CompressionDoc, FORMAT, FORMAT_VERSION, MAX_CHUNK_SIZE, Manifest, OffsetDoc, ParamsDoc};
pub use objects::{TransferOptions, get_object, put_object, read_manifest};
pub use progress::{Operation, Phase, Progress, ProgressReport};
pub use prune::{PruneReport, prune};
pub use restore::{RestoreOptions, RestoreSource, restore_to_staging, sibling, swap_into_place};
pub use store_url::SnapshotStore;
pub use upload::{SnapshotOptions, SnapshotTarget, create_snapshot};

/// The object store underneath, for tests and tools that inspect or damage
/// objects on purpose.
pub fn object_store(store: &SnapshotStore) -> &std::sync::Arc<dyn object_store::ObjectStore> {
    &store.store
}

/// Object key of a chunk (for tests and tools).
pub fn chunk_key(hash: &str) -> object_store::path::Path {
    layout::chunk_key(hash)
}

/// Object key of a manifest (for tests and tools).
pub fn manifest_key(collection: &str, shard: u32, id: &str) -> object_store::path::Path {
    layout::manifest_key(collection, shard, id)
}
