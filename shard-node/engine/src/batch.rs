//! What a writer sends to an index, and what it gets back.

/// One point to insert or replace.
#[derive(Clone, Debug, PartialEq)]
pub struct Point {
    /// The caller's id.
    pub id: u64,
    /// Its vector; must have the index's dimension.
    pub vector: Vec<f32>,
    /// Optional bytes returned with hits and by `get`.
    pub payload: Option<Vec<u8>>,
}

/// One change in a batch.
#[derive(Clone, Debug, PartialEq)]
pub enum Op {
    /// Insert the point, or replace the point with the same id.
    Upsert(Point),
    /// Remove the point with this id; it must exist.
    Delete(u64),
    /// Remove the point with this id if it exists; count it as missing if
    /// not. For callers that cannot know (a coordinator routing a job's
    /// deletes, a replay after a crash).
    DeleteIfPresent(u64),
    /// Remove every point that matches the filter at this operation's
    /// place: as the index holds it, with the batch's earlier operations
    /// and the group's earlier batches applied. The ids it removes count
    /// as deleted, and the batch log records them (not the filter), so
    /// another copy removes exactly the same points.
    DeleteWhere {
        /// Which points.
        filter: crate::Filter,
        /// Read fields without a ready index from the payloads (a scan of
        /// every point) instead of refusing the batch.
        allow_unindexed: bool,
    },
}

/// Where a batch sits in an ingest job's input, so the job can resume.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SourceOffset {
    /// The job's input stream (for example a file name or a topic
    /// partition); 1 to [`MAX_SOURCE_BYTES`] bytes.
    pub source: String,
    /// Position of the batch in that stream; must grow from batch to batch,
    /// and stay below `u64::MAX` (reserved: nothing could follow it).
    pub offset: u64,
}

/// Longest accepted source name (LMDB keys are at most 511 bytes).
pub const MAX_SOURCE_BYTES: usize = 255;

/// Operations applied atomically: after a commit searches see all of them,
/// before it none. A batch with a source but no operations only records
/// the source's offset.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Batch {
    /// Applied in order; for an id named twice, the later operation wins.
    pub ops: Vec<Op>,
    /// If set, the batch is applied only if `offset` is above the highest
    /// offset stored for `source`, and that offset is stored with the data.
    pub source: Option<SourceOffset>,
}

impl Batch {
    /// A batch of upserts without payloads.
    pub fn upserts(points: impl IntoIterator<Item = (u64, Vec<f32>)>) -> Self {
        Batch { ops: points.into_iter().map(|(id, vector)| Op::Upsert(Point { id, vector, payload: None })).collect(), source: None }
    }

    /// Tags the batch with its place in a source.
    pub fn with_source(mut self, source: impl Into<String>, offset: u64) -> Self {
        self.source = Some(SourceOffset { source: source.into(), offset });
        self
    }
}

/// What happened to one batch.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BatchOutcome {
    /// The batch was committed.
    ///
    /// The counts are of distinct ids, each in at most one of them, by
    /// what the batch did to the id: compare the id before the batch (as
    /// the index, or the earlier batches of the same group, left it) with
    /// the id after it. An id upserted and then deleted within the batch
    /// that held no point before it counts in none: nothing changed.
    Applied {
        /// Ids the batch leaves holding one of its points: the last upsert
        /// of an id in a batch wins; each id counts once.
        upserted: usize,
        /// Ids that held a point before the batch and hold none after it.
        deleted: usize,
        /// Ids that a `DeleteIfPresent` found without a point, which held
        /// none before the batch and hold none after it.
        missing: usize,
    },
    /// The batch's offset was not above the stored one: it was applied
    /// before, and nothing was changed.
    Skipped {
        /// Highest offset stored for the source.
        current: u64,
    },
}

/// One write of a group commit ([`crate::Index::write`]), in the order the
/// shard's writer received it.
///
/// Epochs fence writes where they land: the control plane raises a
/// shard's epoch whenever its ownership changes, and a write stamped with
/// an epoch below the shard's is refused ([`crate::Rejected::StaleEpoch`]),
/// whatever the sender believes. Epoch 0 means an unfenced writer (the
/// single coordinator, tests): never refused, never raising anything.
#[derive(Clone, Debug, PartialEq)]
pub enum Write {
    /// A batch, stamped with the epoch of the placement its sender acted
    /// on. An epoch above the shard's raises the shard's to it, in the
    /// batch's transaction (if the batch is accepted).
    Batch {
        /// The batch.
        batch: Batch,
        /// Its epoch; 0 for an unfenced writer.
        epoch: u64,
    },
    /// Raises the shard's epoch to `epoch` (an equal one changes nothing;
    /// a lower one is refused). Writes after it in the group, and every
    /// later group, are checked against it.
    Fence {
        /// The new epoch.
        epoch: u64,
    },
}

/// What one accepted [`Write`] did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Written {
    /// The batch was applied or skipped.
    Batch {
        /// What it did.
        outcome: BatchOutcome,
        /// The sequence number it took in the shard (its batch log
        /// entry's), if it was applied.
        seq: Option<u64>,
    },
    /// The shard's epoch is now `epoch`.
    Fenced {
        /// The epoch after the fence.
        epoch: u64,
    },
}
