//! The shard node's side of moving a shard while it serves
//! (docs/control-plane.md, "How a shard moves"): fencing a shard by its
//! epoch, reading its batch log, and applying another copy's log entries.
//! The engine does the work (`Index::fence`, `read_log`, `apply_log`);
//! writes go through the shard's writer, in queue order with batches.

use std::sync::Arc;

use prost::Message;
use shoal_engine::{Write, Written};
use shoal_proto::{ShoalError, v1};
use tracing::Instrument;

use crate::convert::{log_entry_from_proto, log_entry_to_proto, shard_engine_error};
use crate::host::{ShardHost, blocking, key_of};
use crate::writer::{Answer, Work};

/// Room left in a message for everything around the entries.
const MESSAGE_OVERHEAD: usize = 4 << 10;

impl ShardHost {
    /// Raises a shard's epoch through its writer (batches queued before
    /// the fence commit first) and returns its stats.
    pub async fn fence_shard(&self, req: v1::FenceShardRequest) -> Result<v1::ShardStats, ShoalError> {
        let v1::FenceShardRequest { shard, epoch } = req;
        let key = key_of(shard)?;
        if epoch == 0 {
            return Err(ShoalError::invalid("a fence's epoch must be at least 1"));
        }
        let target = self.get(&key)?;
        let span = tracing::info_span!("fence", collection = %key.0, shard = key.1, epoch, queue_wait_ms = tracing::field::Empty);
        let answer = target.submit(&key, Work::Write(Write::Fence { epoch })).instrument(span).await?;
        let Answer::Written(Written::Fenced { epoch: now }) = answer else {
            return Err(ShoalError::internal(format!("shard {}/{}: the writer answered a fence with something else", key.0, key.1)));
        };
        tracing::info!(collection = %key.0, shard = key.1, epoch = now, "shard fenced");
        self.stats_of(&key, &target).await
    }

    /// Entries of a shard's batch log from `from_seq` on, as many as fit
    /// in `max_bytes` and in one message of the node's limit (at least one
    /// if there is one).
    pub async fn read_batch_log(&self, req: v1::ReadBatchLogRequest) -> Result<v1::ReadBatchLogResponse, ShoalError> {
        let v1::ReadBatchLogRequest { shard, from_seq, max_bytes } = req;
        let key = key_of(shard)?;
        let index = Arc::clone(&self.get(&key)?.index);
        let limit = self.max_message_bytes.saturating_sub(MESSAGE_OVERHEAD).max(1);
        // The engine counts its own encoding, a few bytes per point smaller
        // than the wire's: ask for a quarter less, then check exactly.
        let asked = match max_bytes {
            0 => limit as u64,
            n => n.min(limit as u64),
        };
        let engine_bytes = asked - asked / 4;
        let (c, s) = (key.0.to_string(), key.1);
        let read = blocking(move || index.read_log(from_seq, engine_bytes).map_err(|e| shard_engine_error(&c, s, e))).await?;
        let mut entries = Vec::with_capacity(read.entries.len());
        let mut bytes = 0usize;
        for entry in read.entries.into_iter().map(log_entry_to_proto) {
            let len = entry.encoded_len();
            // Tag and length prefix of the repeated field.
            let framed = len + 1 + prost::length_delimiter_len(len);
            if bytes + framed > limit {
                if entries.is_empty() {
                    return Err(ShoalError::exhausted(format!(
                        "shard {}/{}: batch log entry {} takes {framed} bytes, over the message limit of {} (max_message_bytes)",
                        key.0, key.1, entry.seq, self.max_message_bytes
                    )));
                }
                break;
            }
            bytes += framed;
            entries.push(entry);
        }
        Ok(v1::ReadBatchLogResponse { entries, first_seq: read.first_seq, last_seq: read.last_seq })
    }

    /// Applies entries of another copy's batch log through the shard's
    /// writer, all or none.
    pub async fn apply_log_entries(&self, req: v1::ApplyLogEntriesRequest) -> Result<v1::ApplyLogEntriesResponse, ShoalError> {
        let v1::ApplyLogEntriesRequest { shard, epoch, entries } = req;
        let key = key_of(shard)?;
        let target = self.get(&key)?;
        let entries: Vec<_> = entries.into_iter().map(log_entry_from_proto).collect();
        let span = tracing::info_span!(
            "apply_log",
            collection = %key.0,
            shard = key.1,
            entries = entries.len(),
            first = entries.first().map_or(0, |e| e.seq),
            queue_wait_ms = tracing::field::Empty
        );
        let answer = target.submit(&key, Work::Log { entries, epoch }).instrument(span).await?;
        let Answer::Log(applied) = answer else {
            return Err(ShoalError::internal(format!("shard {}/{}: the writer answered log entries with something else", key.0, key.1)));
        };
        Ok(v1::ApplyLogEntriesResponse { last_seq: applied.last_seq, applied: applied.applied as u32, skipped: applied.skipped as u32 })
    }
}
