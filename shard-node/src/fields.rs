//! A node's field indexes, counts and scrolls: the filter requests that
//! are not searches (`search` has those).

use std::sync::Arc;

use prost::Message;
use shoal_engine::{FieldType, Where};
use shoal_proto::{ShoalError, v1};

use crate::convert::{payload_from_engine, shard_engine_error};
use crate::host::{Shard, ShardHost, ShardKey, blocking, key_of};
use crate::writer::Work;
use shoal_filter::wire::{field_type_from_proto, from_proto_opt};

impl ShardHost {
    /// Declares `fields` on `shard` (those it lacks; the ones it has with
    /// another type are refused).
    pub(crate) async fn declare_fields(&self, key: &ShardKey, shard: &Shard, fields: Vec<(String, FieldType)>) -> Result<(), ShoalError> {
        if fields.is_empty() {
            return Ok(());
        }
        let index = Arc::clone(&shard.index);
        let (c, s) = (key.0.to_string(), key.1);
        blocking(move || {
            for (field, kind) in fields {
                index.create_field_index(&field, kind).map_err(|e| shard_engine_error(&c, s, e))?;
            }
            Ok(())
        })
        .await?;
        // An idle writer waits for work: tell it there is a build to run.
        if shard.index.field_index_building() {
            shard.submit(key, Work::Wake).await?;
        }
        Ok(())
    }

    pub async fn create_field_index(&self, req: v1::ShardFieldIndexRequest) -> Result<v1::ShardStats, ShoalError> {
        let v1::ShardFieldIndexRequest { shard, index } = req;
        let key = key_of(shard)?;
        let v1::FieldIndex { field, r#type } = index.ok_or_else(|| ShoalError::invalid("the field index is missing"))?;
        let kind = field_type_from_proto(r#type)?;
        let target = self.get(&key)?;
        self.declare_fields(&key, &target, vec![(field, kind)]).await?;
        self.stats_of(&key, &target).await
    }

    pub async fn drop_field_index(&self, req: v1::DropShardFieldIndexRequest) -> Result<v1::ShardStats, ShoalError> {
        let v1::DropShardFieldIndexRequest { shard, field } = req;
        let key = key_of(shard)?;
        let target = self.get(&key)?;
        let index = Arc::clone(&target.index);
        let (c, s) = (key.0.to_string(), key.1);
        blocking(move || index.drop_field_index(&field).map_err(|e| shard_engine_error(&c, s, e))).await?;
        self.stats_of(&key, &target).await
    }

    pub async fn count(&self, req: v1::CountShardRequest) -> Result<v1::CountShardResponse, ShoalError> {
        let v1::CountShardRequest { shard, filter, allow_unindexed } = req;
        let key = key_of(shard)?;
        let filter = from_proto_opt(filter)?;
        let index = Arc::clone(&self.get(&key)?.index);
        let (c, s) = (key.0.to_string(), key.1);
        let count =
            blocking(move || index.count(Where { filter: &filter, allow_unindexed }).map_err(|e| shard_engine_error(&c, s, e))).await?;
        Ok(v1::CountShardResponse { count })
    }

    pub async fn scroll(&self, req: v1::ScrollShardRequest) -> Result<v1::ScrollShardResponse, ShoalError> {
        let v1::ScrollShardRequest { shard, filter, allow_unindexed, after, limit, with_vector } = req;
        let key = key_of(shard)?;
        let limit = shoal_proto::scroll_limit(limit)? as usize;
        let filter = from_proto_opt(filter)?;
        let index = Arc::clone(&self.get(&key)?.index);
        let (c, s) = (key.0.to_string(), key.1);
        let max_bytes = self.max_message_bytes.saturating_sub(1024);
        blocking(move || {
            let page = index
                .scroll(Where { filter: &filter, allow_unindexed }, after, limit, with_vector)
                .map_err(|e| shard_engine_error(&c, s, e))?;
            let mut points = Vec::with_capacity(page.points.len());
            let mut bytes = 0;
            for p in page.points {
                let p = v1::Point { id: p.id, vector: p.vector, payload: payload_from_engine(p.payload) };
                bytes += p.encoded_len() + 8;
                if bytes > max_bytes {
                    // A shorter page: the next one starts after the last
                    // point that fit.
                    let next_after = points.last().map(|p: &v1::Point| p.id).or(after);
                    if points.is_empty() {
                        return Err(ShoalError::exhausted(format!(
                            "point {} alone is more than the message limit of {max_bytes} bytes (max_message_bytes)",
                            p.id
                        )));
                    }
                    return Ok(v1::ScrollShardResponse { points, next_after });
                }
                points.push(p);
            }
            Ok(v1::ScrollShardResponse { points, next_after: page.next_after })
        })
        .await
    }
}
