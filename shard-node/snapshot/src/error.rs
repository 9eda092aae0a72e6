//! Errors of snapshots and restores, grouped by what the caller can do.

use std::path::PathBuf;

/// Result type of this crate.
pub type Result<T, E = SnapshotError> = std::result::Result<T, E>;

/// Why a snapshot, restore, listing or prune failed. A failed restore never
/// touches data that existed before it; a failed snapshot publishes nothing.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SnapshotError {
    /// The object store URL cannot be used.
    #[error("bad snapshot store URL {url:?}: {reason}")]
    BadUrl {
        /// The URL as given.
        url: String,
        /// What is wrong with it.
        reason: String,
    },

    /// A request argument is wrong (an id, a count).
    #[error("{0}")]
    Invalid(String),

    /// No manifest at that key: the snapshot does not exist (or was pruned,
    /// or its upload never finished).
    #[error("snapshot {id} of shard {collection}/{shard} does not exist (no manifest at {key})")]
    ManifestMissing {
        /// Collection name.
        collection: String,
        /// Shard number.
        shard: u32,
        /// Snapshot id.
        id: String,
        /// Object key that was read.
        key: String,
    },

    /// A snapshot with that id was already published for the shard.
    #[error("snapshot {id} of shard {collection}/{shard} already exists")]
    AlreadyExists {
        /// Collection name.
        collection: String,
        /// Shard number.
        shard: u32,
        /// Snapshot id.
        id: String,
    },

    /// The manifest was written by a build with another format version.
    #[error("manifest {key} has format version {found}; this build reads version {supported}")]
    UnsupportedFormat {
        /// Object key of the manifest.
        key: String,
        /// Version in the manifest.
        found: u64,
        /// Version this build reads and writes.
        supported: u64,
    },

    /// The manifest is not a valid manifest (not JSON, fields missing or
    /// contradicting each other).
    #[error("manifest {key} is unreadable: {reason}")]
    BadManifest {
        /// Object key of the manifest.
        key: String,
        /// What is wrong.
        reason: String,
    },

    /// A chunk named by the manifest is not in the store.
    #[error("chunk {index} ({key}) of snapshot {id} is missing from the store; restore another snapshot")]
    ChunkMissing {
        /// Snapshot id.
        id: String,
        /// Position of the chunk in the image.
        index: usize,
        /// Object key.
        key: String,
    },

    /// A chunk is shorter or longer than the manifest says.
    #[error(
        "chunk {index} ({key}) of snapshot {id} is truncated or altered: {found} bytes stored, manifest says {expected}; restore another snapshot"
    )]
    ChunkTruncated {
        /// Snapshot id.
        id: String,
        /// Position of the chunk in the image.
        index: usize,
        /// Object key.
        key: String,
        /// Size in the manifest.
        expected: u64,
        /// Size found.
        found: u64,
    },

    /// A chunk's content does not match its checksum (or does not
    /// decompress).
    #[error("chunk {index} ({key}) of snapshot {id} is corrupt: {reason}; restore another snapshot")]
    ChunkCorrupt {
        /// Snapshot id.
        id: String,
        /// Position of the chunk in the image.
        index: usize,
        /// Object key.
        key: String,
        /// What the check found.
        reason: String,
    },

    /// A chunk that an earlier snapshot uploaded, and this one reuses,
    /// disappeared before the manifest was written (a concurrent prune).
    /// Nothing was published; retry.
    #[error("chunk {key} that this snapshot reuses was deleted meanwhile (a concurrent prune?); nothing was published, retry")]
    ChunkVanished {
        /// Object key.
        key: String,
    },

    /// The restored environment does not hold what the manifest describes.
    #[error("restored image of snapshot {id} does not match its manifest: {what}; restore another snapshot")]
    Mismatch {
        /// Snapshot id.
        id: String,
        /// What differs.
        what: String,
    },

    /// A snapshot or restore of this shard is already running.
    #[error("a {running} of shard {collection}/{shard} is already running")]
    Busy {
        /// Collection name.
        collection: String,
        /// Shard number.
        shard: u32,
        /// "snapshot" or "restore".
        running: &'static str,
    },

    /// The device that receives a restore has too little space.
    #[error(
        "no space left on the device holding {path}: the image needs {needed} bytes ({available} available); nothing existing was changed"
    )]
    DiskFull {
        /// Directory being written.
        path: PathBuf,
        /// Bytes the image needs.
        needed: u64,
        /// Bytes free when the check ran (0 when the device filled up
        /// during the write).
        available: u64,
    },

    /// The object store failed (network, permissions, throttling).
    #[error("object store {op} of {key} failed: {source}")]
    Store {
        /// What was being done.
        op: &'static str,
        /// Object key or prefix.
        key: String,
        /// The error from object_store.
        #[source]
        source: object_store::Error,
    },

    /// The engine failed to copy or open the environment.
    #[error(transparent)]
    Engine(#[from] shoal_engine::Error),

    /// A local file operation failed.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file or directory.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },

    /// A background task died; a bug.
    #[error("internal error: {0}")]
    Internal(String),
}

impl SnapshotError {
    pub(crate) fn store(op: &'static str, key: impl std::fmt::Display, source: object_store::Error) -> Self {
        SnapshotError::Store { op, key: key.to_string(), source }
    }

    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        if source.raw_os_error() == Some(libc::ENOSPC) {
            return SnapshotError::DiskFull { path: path.into(), needed: 0, available: 0 };
        }
        SnapshotError::Io { path: path.into(), source }
    }

    /// True when the snapshot in the store cannot be restored as it is
    /// (another snapshot may work), as opposed to the store or this machine
    /// failing.
    pub fn is_unusable_snapshot(&self) -> bool {
        matches!(
            self,
            SnapshotError::UnsupportedFormat { .. }
                | SnapshotError::BadManifest { .. }
                | SnapshotError::ChunkMissing { .. }
                | SnapshotError::ChunkTruncated { .. }
                | SnapshotError::ChunkCorrupt { .. }
                | SnapshotError::Mismatch { .. }
        )
    }
}

pub(crate) fn join_error(e: tokio::task::JoinError) -> SnapshotError {
    SnapshotError::Internal(format!("a snapshot task failed: {e}"))
}
