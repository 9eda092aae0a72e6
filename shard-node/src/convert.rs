//! Conversions between the wire types (shoal.v1) and the engine's.
//! Destructuring proto messages field by field makes a new field a compile
//! error here until it is handled.

use shoal_engine::{Error as EngineError, IndexParams, LogEntry, Metric, Point, SourceOffset};
use shoal_proto::v1;
use shoal_proto::{ErrorCode, ShoalError};
use shoal_snapshot::{Manifest, Operation, ProgressReport, SnapshotError};

pub(crate) fn metric_from_proto(m: i32) -> Result<Metric, ShoalError> {
    match v1::Metric::try_from(m) {
        Ok(v1::Metric::Cosine) => Ok(Metric::Cosine),
        Ok(v1::Metric::Dot) => Ok(Metric::Dot),
        Ok(v1::Metric::Euclidean) => Ok(Metric::Euclidean),
        Ok(v1::Metric::Unspecified) | Err(_) => Err(ShoalError::invalid(format!("metric {m} is not one of COSINE, DOT, EUCLIDEAN"))),
    }
}

pub(crate) fn metric_to_proto(m: Metric) -> v1::Metric {
    match m {
        Metric::Cosine => v1::Metric::Cosine,
        Metric::Dot => v1::Metric::Dot,
        Metric::Euclidean => v1::Metric::Euclidean,
    }
}

/// Index parameters of a shard spec (0 = default for M and ef_construction).
pub(crate) fn spec_to_params(spec: &v1::ShardSpec) -> Result<IndexParams, ShoalError> {
    let v1::ShardSpec { dimension, metric, index, shard_count: _ } = spec;
    let mut p = IndexParams::new(*dimension, metric_from_proto(*metric)?);
    if let Some(v1::IndexParams { m, ef_construction }) = index {
        if *m != 0 {
            let m = u16::try_from(*m).map_err(|_| ShoalError::invalid(format!("m = {m} is too large")))?;
            p = p.with_m(m);
        }
        if *ef_construction != 0 {
            p = p.with_ef_construction(*ef_construction);
        }
    }
    p.validate().map_err(|e| ShoalError::invalid(e.to_string()))?;
    Ok(p)
}

pub(crate) fn params_to_spec(p: &IndexParams, shard_count: u32) -> v1::ShardSpec {
    v1::ShardSpec {
        dimension: p.dim,
        metric: metric_to_proto(p.metric) as i32,
        index: Some(v1::IndexParams { m: u32::from(p.m), ef_construction: p.ef_construction }),
        shard_count,
    }
}

const PAYLOAD_BINARY: u8 = 0;
const PAYLOAD_JSON: u8 = 1;

/// The engine stores payloads as opaque bytes; the first byte says whether
/// the rest is binary or JSON text.
pub(crate) fn payload_to_engine(p: Option<v1::Payload>) -> Option<Vec<u8>> {
    let kind = p?.kind?;
    let (tag, body) = match kind {
        v1::payload::Kind::Binary(b) => (PAYLOAD_BINARY, b),
        v1::payload::Kind::Json(s) => (PAYLOAD_JSON, s.into_bytes()),
    };
    let mut out = Vec::with_capacity(body.len() + 1);
    out.push(tag);
    out.extend_from_slice(&body);
    Some(out)
}

pub(crate) fn payload_from_engine(b: Option<Vec<u8>>) -> Option<v1::Payload> {
    let b = b?;
    let (tag, body) = b.split_first()?;
    let kind = match *tag {
        PAYLOAD_JSON => v1::payload::Kind::Json(String::from_utf8_lossy(body).into_owned()),
        _ => v1::payload::Kind::Binary(body.to_vec()),
    };
    Some(v1::Payload { kind: Some(kind) })
}

/// The engine's errors in the service's terms.
pub(crate) fn engine_error(e: EngineError) -> ShoalError {
    let code = match &e {
        EngineError::Invalid(_) | EngineError::ParamsMismatch { .. } => ErrorCode::InvalidArgument,
        EngineError::NotFound { .. } => ErrorCode::NotFound,
        EngineError::Stopped { .. } => ErrorCode::DeadlineExceeded,
        // The caller must re-read something first: the placement, the
        // copy's last_seq, or re-seed from a snapshot (the message says).
        EngineError::StaleEpoch { .. }
        | EngineError::FieldIndexBuilding { .. }
        | EngineError::EpochLowered { .. }
        | EngineError::LogGap { .. }
        | EngineError::LogTruncated { .. }
        | EngineError::LogAhead { .. } => ErrorCode::FailedPrecondition,
        EngineError::ResizeBlocked { .. } | EngineError::CompactBlocked { .. } => {
            return ShoalError::unavailable(e.to_string(), std::time::Duration::from_secs(1));
        }
        EngineError::MapSizeLimit { .. }
        | EngineError::DiskFull { .. }
        | EngineError::OpenFileLimit { .. }
        | EngineError::IdSpaceExhausted { .. } => ErrorCode::ResourceExhausted,
        // The engine's error is non-exhaustive: anything new is internal
        // until it gets its own code here.
        EngineError::Corrupt { .. } => ErrorCode::DataLoss,
        EngineError::UnsupportedFormat { .. } | EngineError::Storage { .. } | EngineError::Io { .. } | _ => ErrorCode::Internal,
    };
    ShoalError::new(code, e.to_string())
}

/// An engine error of shard `collection/shard` in the service's terms,
/// naming the shard. A write fenced off by its epoch says exactly that.
pub(crate) fn shard_engine_error(collection: &str, shard: u32, e: EngineError) -> ShoalError {
    if let EngineError::StaleEpoch { current, carried } = e {
        return ShoalError::failed_precondition(format!(
            "shard {collection}/{shard} is at epoch {current}, the write carries {carried}: its placement changed; re-read the placement"
        ));
    }
    engine_error(e).context(format!("shard {collection}/{shard}"))
}

/// A batch log entry on the wire.
pub(crate) fn log_entry_to_proto(e: LogEntry) -> v1::LogEntry {
    let LogEntry { seq, source, points, deletes } = e;
    v1::LogEntry {
        seq,
        source: source.map(|SourceOffset { source, offset }| v1::SourceOffset { source, offset }),
        points: points
            .into_iter()
            .map(|Point { id, vector, payload }| v1::Point { id, vector, payload: payload_from_engine(payload) })
            .collect(),
        deletes,
    }
}

/// A batch log entry from the wire.
pub(crate) fn log_entry_from_proto(e: v1::LogEntry) -> LogEntry {
    let v1::LogEntry { seq, source, points, deletes } = e;
    LogEntry {
        seq,
        source: source.map(|v1::SourceOffset { source, offset }| SourceOffset { source, offset }),
        points: points
            .into_iter()
            .map(|v1::Point { id, vector, payload }| Point { id, vector, payload: payload_to_engine(payload) })
            .collect(),
        deletes,
    }
}

/// Snapshot errors in the service's terms.
pub(crate) fn snapshot_error(e: SnapshotError) -> ShoalError {
    use std::time::Duration;
    if let SnapshotError::Engine(inner) = e {
        return engine_error(inner);
    }
    let code = match &e {
        SnapshotError::BadUrl { .. } | SnapshotError::Invalid(_) => ErrorCode::InvalidArgument,
        SnapshotError::ManifestMissing { .. } | SnapshotError::ChunkMissing { .. } => ErrorCode::NotFound,
        SnapshotError::AlreadyExists { .. } => ErrorCode::AlreadyExists,
        // The snapshot cannot be restored as it is: choose another one.
        SnapshotError::UnsupportedFormat { .. }
        | SnapshotError::BadManifest { .. }
        | SnapshotError::ChunkTruncated { .. }
        | SnapshotError::ChunkCorrupt { .. }
        | SnapshotError::Mismatch { .. } => ErrorCode::InvalidArgument,
        SnapshotError::ChunkVanished { .. } => return ShoalError::unavailable(e.to_string(), Duration::from_secs(1)),
        SnapshotError::Busy { .. } => return ShoalError::unavailable(e.to_string(), Duration::from_secs(5)),
        // Network, throttling, an unreachable endpoint: worth a retry.
        SnapshotError::Store { .. } => return ShoalError::unavailable(e.to_string(), Duration::from_secs(5)),
        SnapshotError::DiskFull { .. } => ErrorCode::ResourceExhausted,
        SnapshotError::Engine(_) | SnapshotError::Io { .. } | SnapshotError::Internal(_) => ErrorCode::Internal,
        _ => ErrorCode::Internal,
    };
    ShoalError::new(code, e.to_string())
}

/// A manifest as the API shows it (no chunk list).
pub(crate) fn snapshot_info(m: &Manifest, duration_ms: u64) -> v1::SnapshotInfo {
    v1::SnapshotInfo {
        collection: m.collection.clone(),
        shard: m.shard,
        id: m.id.clone(),
        created_at: m.created_at.clone(),
        shard_count: m.shard_count,
        points: m.points,
        tombstones: m.tombstones,
        offsets: m.offsets.iter().map(|o| v1::SourceOffset { source: o.source.clone(), offset: o.offset }).collect(),
        image_bytes: m.image_bytes,
        stored_bytes: m.stored_bytes,
        chunks: m.chunks.len() as u32,
        uploaded_chunks: m.uploaded_chunks as u32,
        uploaded_bytes: m.uploaded_bytes,
        zstd_level: m.compression.level,
        duration_ms,
        error: String::new(),
        dimension: m.index.dim,
        metric: m.index.params().map_or(v1::Metric::Unspecified, |p| metric_to_proto(p.metric)) as i32,
        index: Some(v1::IndexParams { m: u32::from(m.index.m), ef_construction: m.index.ef_construction }),
    }
}

/// A collection snapshot's summary as the API shows it.
pub(crate) fn collection_snapshot(c: &shoal_snapshot::CollectionSnapshot) -> v1::CollectionSnapshot {
    let now_ms = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64);
    v1::CollectionSnapshot {
        id: c.id.clone(),
        shard_count: c.shard_count.unwrap_or(0),
        shards: c.shards.clone(),
        missing: c.missing.clone(),
        complete: c.complete,
        why_incomplete: c.why_incomplete().unwrap_or_default(),
        newest_created_at_ms: c.newest_created_at_ms.unwrap_or(0),
        age_ms: c.age(now_ms).map_or(0, |d| d.as_millis() as u64),
    }
}

/// A running operation's progress as the API shows it.
pub(crate) fn progress_proto(collection: &str, shard: u32, id: &str, r: &ProgressReport) -> v1::SnapshotProgress {
    v1::SnapshotProgress {
        collection: collection.to_owned(),
        shard,
        operation: match r.op {
            Operation::Snapshot => v1::SnapshotOperation::Snapshot,
            Operation::Restore => v1::SnapshotOperation::Restore,
        } as i32,
        snapshot_id: id.to_owned(),
        phase: r.phase.name().into(),
        bytes_done: r.bytes_done,
        bytes_total: r.bytes_total,
        bytes_transferred: r.bytes_transferred,
        chunks_done: r.chunks_done,
        chunks_reused: r.chunks_reused,
        elapsed_ms: r.elapsed.as_millis() as u64,
        bytes_per_second: r.rate(),
        remaining_ms: r.remaining().map_or(0, |d| d.as_millis() as u64),
        node: String::new(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn payloads_keep_their_kind() {
        for kind in [v1::payload::Kind::Binary(vec![0, 1, 2]), v1::payload::Kind::Json("{\"a\":1}".into())] {
            let p = v1::Payload { kind: Some(kind) };
            assert_eq!(payload_from_engine(payload_to_engine(Some(p.clone()))), Some(p));
        }
        assert_eq!(payload_to_engine(None), None);
        assert_eq!(payload_to_engine(Some(v1::Payload { kind: None })), None);
    }

    /// Entries cross the wire unchanged, payload kinds and all.
    #[test]
    fn log_entries_round_trip() {
        let entry = v1::LogEntry {
            seq: 7,
            source: Some(v1::SourceOffset { source: "job".into(), offset: 3 }),
            points: vec![
                v1::Point { id: 1, vector: vec![0.6, 0.8], payload: None },
                v1::Point {
                    id: 2,
                    vector: vec![1.0, 0.0],
                    payload: Some(v1::Payload { kind: Some(v1::payload::Kind::Json("{}".into())) }),
                },
            ],
            deletes: vec![5, 9],
        };
        assert_eq!(log_entry_to_proto(log_entry_from_proto(entry.clone())), entry);
        let bare = v1::LogEntry { seq: 8, source: None, points: vec![], deletes: vec![] };
        assert_eq!(log_entry_to_proto(log_entry_from_proto(bare.clone())), bare);
    }

    /// A fenced write names the shard, both epochs and what to do.
    #[test]
    fn stale_epochs_are_failed_preconditions_that_say_why() {
        let e = shard_engine_error("docs", 3, EngineError::StaleEpoch { current: 5, carried: 4 });
        assert_eq!(e.code, ErrorCode::FailedPrecondition);
        assert_eq!(e.message, "shard docs/3 is at epoch 5, the write carries 4: its placement changed; re-read the placement");
        let e = shard_engine_error("docs", 3, EngineError::LogTruncated { from: 2, first: 10 });
        assert_eq!(e.code, ErrorCode::FailedPrecondition);
        assert!(e.message.starts_with("shard docs/3: ") && e.message.contains("re-seed"), "{}", e.message);
    }

    #[test]
    fn specs_round_trip_and_reject_nonsense() {
        let spec = v1::ShardSpec {
            dimension: 8,
            metric: v1::Metric::Dot as i32,
            index: Some(v1::IndexParams { m: 12, ef_construction: 50 }),
            shard_count: 3,
        };
        let p = spec_to_params(&spec).unwrap();
        assert_eq!((p.m, p.m0, p.ef_construction), (12, 24, 50));
        assert_eq!(params_to_spec(&p, 3), spec);
        let spec = |dimension, metric, m| v1::ShardSpec {
            dimension,
            metric,
            index: Some(v1::IndexParams { m, ef_construction: 0 }),
            shard_count: 1,
        };
        assert!(spec_to_params(&spec(8, 0, 0)).is_err());
        assert!(spec_to_params(&spec(0, 1, 0)).is_err());
        assert!(spec_to_params(&spec(8, 1, 100_000)).is_err());
    }
}
