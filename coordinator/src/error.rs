//! What can go wrong in the coordinator, by meaning, and the one place
//! where it becomes a gRPC status (`impl From<Error> for Status`).
//!
//! The variants carry what their message needs; the code and retry hint a
//! caller sees follow from the variant, so a function deciding *what* went
//! wrong does not also decide how it is retried. Calls to shard nodes fail
//! with the shard-node protocol's [`ShoalError`] (see `client.rs`); they
//! enter here as [`Error::Remote`], keeping the peer's code and hint.

use std::fmt::Display;
use std::time::Duration;

use shoal_control::metadata::MetaError;
use shoal_proto::{CollectionName, ErrorCode, IdError, NodeId, ShoalError};

/// The coordinator's result.
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// See the module documentation.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// The request is wrong; retrying it unchanged fails again.
    #[error("{0}")]
    Invalid(String),
    /// A collection name or node id that does not parse.
    #[error(transparent)]
    BadId(#[from] IdError),
    /// Over a size limit of the request or its answer.
    #[error("{0}")]
    TooLarge(String),
    #[error("collection {0} does not exist")]
    CollectionNotFound(CollectionName),
    #[error("collection {0} already exists")]
    CollectionExists(CollectionName),
    /// A restore without `replace` onto a collection that exists.
    #[error("collection {0} exists; set replace to overwrite its shards")]
    RestoreOverExisting(CollectionName),
    #[error("collection {collection} has {shards} shards; there is no shard {shard}")]
    NoSuchShard { collection: CollectionName, shard: u32, shards: u32 },
    /// A node, snapshot or manifest that does not exist.
    #[error("{0}")]
    NotFound(String),
    /// A node this coordinator cannot call now: not a member, or marked
    /// down by its health probe. `reason` follows the node's name.
    #[error("node {node} {reason}")]
    NodeUnavailable { node: NodeId, reason: String },
    /// No serving node takes new shards.
    #[error("the cluster has no shard node that takes new shards")]
    NoCapacity,
    /// No member to ask at all.
    #[error("the cluster has no shard nodes")]
    NoNodes,
    /// A write refused for its epoch, and no newer placement came within
    /// its deadline: the shard is being moved.
    #[error("shard {shard} of {collection} is moving (node {node} was fenced past epoch {epoch}): nothing was written to it")]
    ShardMoving { collection: CollectionName, shard: u32, node: NodeId, epoch: u64 },
    /// Conditional changes of a shard's placement kept losing to others.
    #[error("shard {shard} of {collection}: the collection kept changing under {attempts} attempts; try again")]
    Contended { collection: CollectionName, shard: u32, attempts: usize },
    /// A search some shards did not answer, partial results not allowed.
    /// `all_late`: every failure was a deadline, so waiting longer, not
    /// retrying soon, is what helps. When `first` is DATA_LOSS (every
    /// copy of that shard is damaged), so is the search: no retry helps
    /// until an operator recovers the shard.
    #[error(
        "{failed} of {total} shards did not answer (first: shard {shard} on node {node}: {first}); \
         set allow_partial to get what the others found"
    )]
    ShardsUnanswered { failed: usize, total: u32, shard: u32, node: NodeId, first: Box<Error>, all_late: bool },
    /// The metadata store refused or could not make a change.
    #[error(transparent)]
    Metadata(#[from] MetaError),
    /// A call to a shard node failed: what the node answered, or why it
    /// could not be reached (`ShoalError::from_peer` gave it its code).
    #[error(transparent)]
    Remote(#[from] ShoalError),
    /// A wait the caller asked for outlived its deadline.
    #[error("{0}")]
    Deadline(String),
    /// The cluster is not in the state the request needs (a node draining
    /// or still a member, a move already recorded, no snapshot).
    #[error("{0}")]
    Precondition(String),
    /// Fewer replicas of a shard in sync than its collection's minimum: a
    /// write is refused rather than acknowledged by fewer copies.
    #[error("shard {shard} of {collection} has {in_sync} replicas in sync, fewer than the {min} its writes need")]
    TooFewInSync { collection: CollectionName, shard: u32, in_sync: u32, min: u32 },
    /// Something this coordinator started was undone (a move rolled back,
    /// a recovery overtaken).
    #[error("{0}")]
    Aborted(String),
    /// A broken invariant.
    #[error("{0}")]
    Internal(String),
    /// `source`, prefixed with where it happened.
    #[error("{what}: {source}")]
    Context { what: String, source: Box<Error> },
}

impl Error {
    /// Prefixes the message with where the error happened; the code and
    /// retry hint stay the inner error's.
    pub fn context(self, what: impl Display) -> Error {
        Error::Context { what: what.to_string(), source: Box::new(self) }
    }

    pub fn code(&self) -> ErrorCode {
        match self {
            Error::Invalid(_) | Error::BadId(_) | Error::NoSuchShard { .. } => ErrorCode::InvalidArgument,
            Error::TooLarge(_) => ErrorCode::ResourceExhausted,
            Error::CollectionNotFound(_) | Error::NotFound(_) => ErrorCode::NotFound,
            Error::CollectionExists(_) | Error::RestoreOverExisting(_) => ErrorCode::AlreadyExists,
            Error::NodeUnavailable { .. }
            | Error::NoCapacity
            | Error::NoNodes
            | Error::ShardMoving { .. }
            | Error::Contended { .. }
            | Error::TooFewInSync { .. } => ErrorCode::Unavailable,
            Error::ShardsUnanswered { first, .. } if first.code() == ErrorCode::DataLoss => ErrorCode::DataLoss,
            Error::ShardsUnanswered { all_late: true, .. } => ErrorCode::DeadlineExceeded,
            Error::ShardsUnanswered { all_late: false, .. } => ErrorCode::Unavailable,
            // The store's own mapping (Conflict is UNAVAILABLE, ...).
            Error::Metadata(e) => ShoalError::from(e.clone()).code,
            Error::Remote(e) => e.code,
            Error::Deadline(_) => ErrorCode::DeadlineExceeded,
            Error::Precondition(_) => ErrorCode::FailedPrecondition,
            Error::Aborted(_) => ErrorCode::Aborted,
            Error::Internal(_) => ErrorCode::Internal,
            Error::Context { source, .. } => source.code(),
        }
    }

    /// How long to wait before retrying. Every UNAVAILABLE has a hint, so
    /// a client never has to guess how soon to come back.
    pub fn retry_after(&self) -> Option<Duration> {
        match self {
            // A replica rejoins once it has caught up, or is repaired.
            Error::NodeUnavailable { .. } | Error::Contended { .. } | Error::TooFewInSync { .. } => Some(Duration::from_secs(1)),
            // Adding or undraining a node takes a while.
            Error::NoCapacity | Error::NoNodes => Some(Duration::from_secs(5)),
            // A move's switch is a conditional write away.
            Error::ShardMoving { .. } => Some(Duration::from_millis(500)),
            // Damaged on every copy: retrying cannot help (the code says so).
            Error::ShardsUnanswered { first, .. } if first.code() == ErrorCode::DataLoss => None,
            Error::ShardsUnanswered { all_late: false, first, .. } => Some(first.retry_after().unwrap_or(Duration::from_secs(1))),
            Error::Metadata(e) => ShoalError::from(e.clone()).retry_after,
            Error::Remote(e) => e.retry_after.or((e.code == ErrorCode::Unavailable).then_some(Duration::from_secs(1))),
            Error::Context { source, .. } => source.retry_after(),
            Error::Invalid(_)
            | Error::BadId(_)
            | Error::TooLarge(_)
            | Error::CollectionNotFound(_)
            | Error::CollectionExists(_)
            | Error::RestoreOverExisting(_)
            | Error::NoSuchShard { .. }
            | Error::NotFound(_)
            | Error::ShardsUnanswered { all_late: true, .. }
            | Error::Deadline(_)
            | Error::Precondition(_)
            | Error::Aborted(_)
            | Error::Internal(_) => None,
        }
    }
}

impl From<Error> for tonic::Status {
    /// Through [`ShoalError`], whose conversion writes the
    /// `retry-after-ms` metadata every shoal client reads.
    fn from(e: Error) -> tonic::Status {
        ShoalError { code: e.code(), retry_after: e.retry_after(), message: e.to_string() }.into()
    }
}

#[cfg(test)]
mod tests {
    use tonic::{Code, Status};

    use super::*;

    fn name(s: &str) -> CollectionName {
        CollectionName::parse(s).unwrap()
    }

    fn node(s: &str) -> NodeId {
        NodeId::parse(s).unwrap()
    }

    fn retry_ms(s: &Status) -> Option<&str> {
        s.metadata().get(shoal_proto::RETRY_AFTER_MS).map(|v| v.to_str().unwrap())
    }

    #[test]
    fn every_variant_has_its_code() {
        let gone = || Box::new(Error::NodeUnavailable { node: node("n1"), reason: "went down".into() });
        let cases = [
            (Error::Invalid("k must be between 1 and 10, got 0".into()), Code::InvalidArgument),
            (Error::from(CollectionName::parse("no/slash").unwrap_err()), Code::InvalidArgument),
            (Error::TooLarge("over the message limit".into()), Code::ResourceExhausted),
            (Error::CollectionNotFound(name("docs")), Code::NotFound),
            (Error::CollectionExists(name("docs")), Code::AlreadyExists),
            (Error::RestoreOverExisting(name("docs")), Code::AlreadyExists),
            (Error::NoSuchShard { collection: name("docs"), shard: 5, shards: 3 }, Code::InvalidArgument),
            (Error::NotFound("node n9 is not a member".into()), Code::NotFound),
            (*gone(), Code::Unavailable),
            (Error::NoCapacity, Code::Unavailable),
            (Error::TooFewInSync { collection: name("docs"), shard: 1, in_sync: 1, min: 2 }, Code::Unavailable),
            (Error::NoNodes, Code::Unavailable),
            (Error::ShardMoving { collection: name("docs"), shard: 0, node: node("n0"), epoch: 2 }, Code::Unavailable),
            (Error::Contended { collection: name("docs"), shard: 0, attempts: 20 }, Code::Unavailable),
            (
                Error::ShardsUnanswered { failed: 1, total: 3, shard: 1, node: node("n1"), first: gone(), all_late: false },
                Code::Unavailable,
            ),
            (
                Error::ShardsUnanswered {
                    failed: 1,
                    total: 3,
                    shard: 1,
                    node: node("n1"),
                    first: Box::new(Error::Remote(ShoalError::deadline("no answer within 2s"))),
                    all_late: true,
                },
                Code::DeadlineExceeded,
            ),
            (
                Error::ShardsUnanswered {
                    failed: 1,
                    total: 3,
                    shard: 1,
                    node: node("n1"),
                    first: Box::new(Error::Remote(ShoalError::new(ErrorCode::DataLoss, "shard docs/1 on this node is damaged"))),
                    all_late: false,
                },
                Code::DataLoss,
            ),
            (Error::Metadata(MetaError::Conflict { what: "collection docs".into(), expected: 1, found: 2 }), Code::Unavailable),
            (Error::Metadata(MetaError::AlreadyExists("collection docs".into())), Code::AlreadyExists),
            (Error::Metadata(MetaError::NotFound("collection docs".into())), Code::NotFound),
            (Error::Metadata(MetaError::Unavailable("no leader".into())), Code::Unavailable),
            (Error::Metadata(MetaError::Corrupt { key: "k".into(), reason: "bad json".into() }), Code::Internal),
            (Error::Metadata(MetaError::Invalid("two owners".into())), Code::InvalidArgument),
            (Error::Deadline("still moving after 1s".into()), Code::DeadlineExceeded),
            (Error::Precondition("node n1 is draining".into()), Code::FailedPrecondition),
            (Error::Aborted("the move was rolled back".into()), Code::Aborted),
            (Error::Internal("the move ended while it was recorded".into()), Code::Internal),
        ];
        for (e, code) in cases {
            let message = e.to_string();
            let unavailable = code == Code::Unavailable;
            let s = Status::from(e);
            assert_eq!(s.code(), code, "{message}");
            assert_eq!(s.message(), message);
            assert_eq!(retry_ms(&s).is_some(), unavailable, "only UNAVAILABLE has a hint, and it always does: {message}");
        }
    }

    #[test]
    fn the_retry_hint_reaches_the_metadata() {
        let moving = Error::ShardMoving { collection: name("docs"), shard: 0, node: node("n0"), epoch: 2 };
        assert_eq!(retry_ms(&moving.into()), Some("500"));
        let conflict = Error::Metadata(MetaError::Conflict { what: "collection docs".into(), expected: 1, found: 2 });
        assert_eq!(retry_ms(&conflict.into()), Some("100"));
        let peer = Error::Remote(ShoalError::unavailable("shard 3 is restarting", Duration::from_millis(250)));
        assert_eq!(retry_ms(&peer.clone().into()), Some("250"));
        let first = Box::new(peer);
        let unanswered = Error::ShardsUnanswered { failed: 1, total: 3, shard: 3, node: node("n3"), first, all_late: false };
        assert_eq!(retry_ms(&unanswered.into()), Some("250"), "the first failure's hint");
        // A peer's UNAVAILABLE without a hint gets the default one.
        let bare = Error::Remote(ShoalError::new(ErrorCode::Unavailable, "shutting down"));
        assert_eq!(retry_ms(&bare.into()), Some("1000"));
    }

    #[test]
    fn context_prefixes_the_message_and_keeps_code_and_hint() {
        let e = Error::NodeUnavailable { node: node("n1"), reason: "went down".into() }.context("shard 2").context("nothing was written");
        assert_eq!(e.code(), ErrorCode::Unavailable);
        assert_eq!(e.retry_after(), Some(Duration::from_secs(1)));
        let s = Status::from(e);
        assert_eq!(s.message(), "nothing was written: shard 2: node n1 went down");
        assert_eq!(retry_ms(&s), Some("1000"));
        let e = Error::CollectionNotFound(name("docs")).context("batch job@7");
        assert_eq!((e.code(), e.to_string().as_str()), (ErrorCode::NotFound, "batch job@7: collection docs does not exist"));
    }

    #[test]
    fn a_remote_error_keeps_the_peers_code() {
        // What a shard node that moved answers a write with the old epoch:
        // the coordinator must see FAILED_PRECONDITION, not a bad request.
        let fenced: Status = ShoalError::failed_precondition("shard docs/0 is at epoch 3, the write carries 2").into();
        let e = Error::from(ShoalError::from_peer(fenced)).context("shard 0 on node n0");
        assert_eq!(e.code(), ErrorCode::FailedPrecondition);
        let s = Status::from(e);
        assert_eq!(s.code(), Code::FailedPrecondition);
        assert_eq!(s.message(), "shard 0 on node n0: shard docs/0 is at epoch 3, the write carries 2");
        assert_eq!(retry_ms(&s), None);
        let full = Error::from(ShoalError::exhausted("disk full"));
        assert_eq!(Status::from(full).code(), Code::ResourceExhausted);
    }
}
