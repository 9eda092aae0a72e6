//! Errors, grouped by what the caller can do about them.

use std::path::PathBuf;

use crate::metric::VectorError;

/// Result type of the engine.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Why an operation on an index failed. In every case the index is left
/// exactly as it was before the call.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The request itself is wrong; retrying it unchanged fails again.
    #[error(transparent)]
    Invalid(#[from] InvalidInput),

    /// The index on disk was created with other parameters than requested.
    #[error("index at {path} has {found}, but {requested} was requested")]
    ParamsMismatch {
        /// Directory of the environment.
        path: PathBuf,
        /// Parameters stored in the index.
        found: String,
        /// Parameters the caller asked for.
        requested: String,
    },

    /// The directory holds no index and the caller asked to open, not create.
    #[error("no index at {path}")]
    NotFound {
        /// Directory that was searched.
        path: PathBuf,
    },

    /// The on-disk format is one this build cannot read.
    #[error("index at {path} has format version {found}; this build reads version {supported}")]
    UnsupportedFormat {
        /// Directory of the environment.
        path: PathBuf,
        /// Version found on disk.
        found: u32,
        /// Version this build reads and writes.
        supported: u32,
    },

    /// The memory map reached its configured ceiling.
    #[error(
        "index at {path} is full: it reached the map size limit of {limit} bytes; \
         raise `max_map_size` (engine option `IndexOptions::max_map_size`, \
         shard-node setting `engine.max_map_size`) and retry"
    )]
    MapSizeLimit {
        /// Directory of the environment.
        path: PathBuf,
        /// The ceiling in bytes.
        limit: u64,
    },

    /// The map had to grow, and read transactions stayed open for longer
    /// than the resize waits; nothing was committed. Retry; if it persists,
    /// look for snapshots held open.
    #[error("index at {path} could not grow its map: read transactions stayed open for {waited:?}; retry the batch")]
    ResizeBlocked {
        /// Directory of the environment.
        path: PathBuf,
        /// How long the resize waited.
        waited: std::time::Duration,
    },

    /// A compaction waited for read transactions (a snapshot's copy, a
    /// long search) longer than `resize_wait`; nothing changed. Retry.
    #[error("index at {path} could not be compacted: read transactions stayed open for {waited:?}; retry later")]
    CompactBlocked {
        /// Directory of the environment.
        path: PathBuf,
        /// How long the compaction waited.
        waited: std::time::Duration,
    },

    /// The device is full; nothing was written (a batch was not committed,
    /// an index being created was not left behind).
    #[error("no space left on the device holding {path}; nothing was changed: free space, then retry")]
    DiskFull {
        /// Directory of the environment.
        path: PathBuf,
    },

    /// The process has no file descriptor left (`EMFILE`), or the system
    /// none (`ENFILE`), to open the index's files; nothing was left behind.
    #[error(
        "cannot open the index at {path}: too many open files; raise the process's open-file limit \
         (`ulimit -n`, systemd `LimitNOFILE`) or hold fewer shards on this node"
    )]
    OpenFileLimit {
        /// Directory of the environment.
        path: PathBuf,
    },

    /// A search gave up before it finished: its [`crate::Stop`] deadline
    /// passed, or its caller cancelled it. Nothing was returned.
    #[error("search stopped: {}", if *deadline_passed { "its deadline passed" } else { "the caller cancelled it" })]
    Stopped {
        /// True if the deadline passed, false if the caller's flag was set.
        deadline_passed: bool,
    },

    /// A filter names a field whose index is still being built (online,
    /// in steps); nothing was searched. Retry once it is ready, or allow
    /// a scan of the payloads (`allow_unindexed`).
    #[error(
        "filter {path}: the index on field {field} is being built ({percent}% done); retry when it is ready, or allow a scan with allow_unindexed"
    )]
    FieldIndexBuilding {
        /// Where in the filter.
        path: String,
        /// The field.
        field: String,
        /// How far the build is.
        percent: u32,
    },

    /// The index holds data that contradicts itself.
    #[error("index at {path} is corrupt: {detail}")]
    Corrupt {
        /// Directory of the environment.
        path: PathBuf,
        /// What was found.
        detail: String,
    },

    /// The write carries an epoch below the shard's: whoever sent it acted
    /// on a placement that has changed since (the shard moved, or is
    /// moving). Nothing was written. Re-read the placement and send the
    /// write where it now says, with its epoch.
    #[error("the shard is at epoch {current}, the write carries {carried}: its placement changed; re-read the placement")]
    StaleEpoch {
        /// The shard's epoch.
        current: u64,
        /// The write's.
        carried: u64,
    },

    /// A fence asked to lower the shard's epoch, which only ever grows.
    #[error("the shard is at epoch {current}; a fence cannot lower it to {requested}")]
    EpochLowered {
        /// The shard's epoch.
        current: u64,
        /// The fence's.
        requested: u64,
    },

    /// A batch log entry does not follow the last batch this copy applied:
    /// entries are applied in order, each exactly once. Read the copy's
    /// `last_seq` and send from the entry after it.
    #[error("log entry {seq} does not follow the last batch applied here ({last}): entries {} to {} are missing", last + 1, seq.saturating_sub(1))]
    LogGap {
        /// The copy's last sequence number.
        last: u64,
        /// The entry's.
        seq: u64,
    },

    /// The batch log no longer holds the entries asked for (retention
    /// trimmed them): a copy that far behind must be re-seeded from a
    /// snapshot.
    #[error("the batch log starts at entry {first}; entry {from} was trimmed: re-seed the copy from a snapshot")]
    LogTruncated {
        /// The first entry asked for.
        from: u64,
        /// The first entry the log holds.
        first: u64,
    },

    /// Entries asked for past the shard's last batch: the copy that asks
    /// claims to be ahead of this one (it applied writes this one never
    /// saw), so it cannot catch up from here.
    #[error("entry {from} was asked for, but the last batch applied here is {last}: the copies diverged")]
    LogAhead {
        /// The first entry asked for.
        from: u64,
        /// The shard's last sequence number.
        last: u64,
    },

    /// Internal ids are 32-bit; the shard holds as many points as it can.
    #[error("shard is out of internal ids ({used} used of {max}); split it into more shards")]
    IdSpaceExhausted {
        /// Ids handed out so far, tombstones included.
        used: u64,
        /// The maximum.
        max: u64,
    },

    /// LMDB failed in a way not covered above.
    #[error("storage error in {path}: {source}")]
    Storage {
        /// Directory of the environment.
        path: PathBuf,
        /// The error from heed/LMDB.
        #[source]
        source: heed::Error,
    },

    /// A file-system call failed.
    #[error("I/O error on {path}: {source}")]
    Io {
        /// The file or directory involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
}

impl Error {
    /// True when the caller sent something wrong (as opposed to the index
    /// or the machine failing).
    pub fn is_invalid_input(&self) -> bool {
        matches!(self, Error::Invalid(_))
    }
}

/// Where in a request a bad vector was found.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Location {
    /// The n-th operation of a batch (0-based).
    Op(usize),
    /// The query vector of a search.
    Query,
}

impl std::fmt::Display for Location {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Location::Op(i) => write!(f, "operation {i}"),
            Location::Query => f.write_str("query"),
        }
    }
}

/// A request the index refuses, and exactly why.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidInput {
    /// The batch carries no operation and no source offset.
    #[error("batch is empty: it has no upserts, no deletes and no source offset")]
    EmptyBatch,
    /// A vector is malformed.
    #[error("{at}: {error}")]
    Vector {
        /// Where the vector was.
        at: Location,
        /// What is wrong with it.
        error: VectorError,
    },
    /// A delete names an id the index does not hold.
    #[error("operation {op}: cannot delete id {id}: no such point")]
    UnknownId {
        /// Position of the delete in its batch.
        op: usize,
        /// The external id.
        id: u64,
    },
    /// A payload is larger than the index accepts.
    #[error("operation {op}: payload of {len} bytes exceeds the limit of {max} bytes")]
    PayloadTooLarge {
        /// Position of the upsert.
        op: usize,
        /// Payload length.
        len: usize,
        /// The limit (`IndexOptions::max_payload_bytes`).
        max: usize,
    },
    /// A source name is empty or too long to be an LMDB key.
    #[error("source name must be 1 to {max} bytes of UTF-8, got {len} bytes")]
    BadSourceName {
        /// Its length in bytes.
        len: usize,
        /// The limit.
        max: usize,
    },
    /// A source offset of `u64::MAX`: offsets must grow, so a source that
    /// reached it could never apply another batch.
    #[error("offset {offset} is reserved: offsets must be below 2^64-1")]
    OffsetOutOfRange {
        /// The offset the batch carried.
        offset: u64,
    },
    /// A search asked for zero results or an absurd number.
    #[error("k must be between 1 and {max}, got {k}")]
    BadK {
        /// Requested k.
        k: usize,
        /// The limit.
        max: usize,
    },
    /// A search `ef` outside the accepted range.
    #[error("ef must be between 1 and {max}, got {ef}")]
    BadEf {
        /// Requested ef.
        ef: usize,
        /// The limit.
        max: usize,
    },
    /// Index parameters that cannot build a sensible graph.
    #[error("invalid index parameters: {0}")]
    BadParams(String),
    /// A filter is malformed, or asks what the field indexes cannot
    /// answer; `path` says where inside the filter (`must[1].range.gte`).
    #[error("filter {path}: {reason}")]
    Filter {
        /// Where in the filter, from its top.
        path: String,
        /// What is wrong there.
        reason: String,
    },
    /// A page size of zero or past the limit.
    #[error("limit must be between 1 and {max}, got {limit}")]
    BadLimit {
        /// The limit asked for.
        limit: usize,
        /// The largest accepted.
        max: usize,
    },
    /// A field name that cannot be indexed.
    #[error("field name {field:?} must be 1 to {max} bytes of dotted, non-empty segments")]
    BadFieldName {
        /// The name given.
        field: String,
        /// The limit in bytes.
        max: usize,
    },
    /// The field is indexed already, as another type.
    #[error("field {field} is indexed as {existing}; drop that index before indexing it as {requested}")]
    FieldIndexExists {
        /// The field.
        field: String,
        /// Its index's type.
        existing: crate::FieldType,
        /// The type asked for.
        requested: crate::FieldType,
    },
    /// The shard holds as many field indexes as it may.
    #[error("a shard keeps at most {max} field indexes")]
    TooManyFieldIndexes {
        /// The limit.
        max: usize,
    },
}

impl From<shoal_filter::FilterError> for InvalidInput {
    fn from(e: shoal_filter::FilterError) -> Self {
        InvalidInput::Filter { path: e.path, reason: e.reason }
    }
}

/// Why one write of a group commit was refused. It left no trace; the
/// group's other writes went ahead.
#[derive(Clone, Debug, PartialEq, thiserror::Error)]
#[non_exhaustive]
pub enum Rejected {
    /// The batch itself is wrong.
    #[error(transparent)]
    Invalid(#[from] InvalidInput),
    /// The write carries an epoch below the shard's (see
    /// [`Error::StaleEpoch`]).
    #[error("the shard is at epoch {current}, the write carries {carried}: its placement changed; re-read the placement")]
    StaleEpoch {
        /// The shard's epoch when the write's turn came.
        current: u64,
        /// The write's.
        carried: u64,
    },
    /// A fence below the shard's epoch (see [`Error::EpochLowered`]).
    #[error("the shard is at epoch {current}; a fence cannot lower it to {requested}")]
    EpochLowered {
        /// The shard's epoch.
        current: u64,
        /// The fence's.
        requested: u64,
    },
    /// A log entry out of order (see [`Error::LogGap`]).
    #[error("log entry {seq} does not follow the last batch applied here ({last}): entries {} to {} are missing", last + 1, seq.saturating_sub(1))]
    LogGap {
        /// The copy's last sequence number.
        last: u64,
        /// The entry's.
        seq: u64,
    },
}

impl From<Rejected> for Error {
    fn from(r: Rejected) -> Error {
        match r {
            Rejected::Invalid(e) => Error::Invalid(e),
            Rejected::StaleEpoch { current, carried } => Error::StaleEpoch { current, carried },
            Rejected::EpochLowered { current, requested } => Error::EpochLowered { current, requested },
            Rejected::LogGap { last, seq } => Error::LogGap { last, seq },
        }
    }
}
