//! Filters through the cluster (docs/filters.md): a filter is checked once
//! here against the collection's field indexes, then sent to every shard;
//! counts add up, scroll pages merge in id order; and the field indexes
//! a collection's shards keep are declared and dropped on every copy.

use std::time::Duration;

use shoal_control::conversions::field_index_to_wire;
use shoal_control::metadata::MetaError;
use shoal_control::model::{Collection, FieldIndexSpec, FieldKind};
use shoal_proto::{CollectionName, v1};

use crate::cluster::{Cluster, Until, bounded, replica_nodes};
use crate::error::{Error, Result};
use crate::moves::CONFLICT_RETRIES;
use crate::search::search_failure;

/// Most field indexes a collection keeps (the engine's limit per shard).
pub const MAX_FIELD_INDEXES: usize = 64;

/// Field index calls to shard nodes: declaring one writes a record, the
/// build runs after the answer.
const INDEX_TIMEOUT: Duration = Duration::from_secs(30);

fn filter_kind(k: FieldKind) -> shoal_filter::FieldType {
    match k {
        FieldKind::Keyword => shoal_filter::FieldType::Keyword,
        FieldKind::Integer => shoal_filter::FieldType::Integer,
        FieldKind::Float => shoal_filter::FieldType::Float,
        FieldKind::Bool => shoal_filter::FieldType::Bool,
        FieldKind::Datetime => shoal_filter::FieldType::Datetime,
    }
}

/// Checks `f` for collection `c` as every shard would: its form, its
/// limits, and its fields against the collection's indexes. A filter that
/// passes fails on no shard for a reason the caller could fix.
pub(crate) fn check_filter(c: &Collection, f: &v1::Filter, allow_unindexed: bool) -> Result<()> {
    let filter = shoal_filter::wire::from_proto(f.clone()).map_err(|e| Error::Invalid(e.message))?;
    let fields: Vec<(String, shoal_filter::FieldType)> = c.fields.iter().map(|f| (f.field.clone(), filter_kind(f.kind))).collect();
    filter.check_against(&fields, allow_unindexed).map_err(|e| Error::Invalid(e.to_string()))
}

/// The merged page of a scroll: the shards' pages (each sorted, each with
/// the id past which it holds more, if it does) cut where the first of
/// them stops, so that no point after the cut can be missing from another
/// shard; then to `limit`.
pub(crate) fn merge_pages(pages: Vec<v1::ScrollShardResponse>, limit: usize) -> v1::ScrollResponse {
    let cut = pages.iter().filter_map(|p| p.next_after).min();
    let mut points: Vec<v1::Point> = pages.into_iter().flat_map(|p| p.points).filter(|p| cut.is_none_or(|c| p.id <= c)).collect();
    points.sort_by_key(|p| p.id);
    let more = points.len() > limit || cut.is_some();
    points.truncate(limit);
    let next_after = if more { points.last().map(|p| p.id).or(cut) } else { None };
    v1::ScrollResponse { points, next_after }
}

impl Cluster {
    /// How many points match a filter, over every shard.
    pub async fn count(&self, req: v1::CountRequest, caller: Option<Duration>) -> Result<v1::CountResponse> {
        let v1::CountRequest { collection, filter, allow_unindexed, allow_partial, timeout_ms } = req;
        let c = self.collection(&collection)?;
        if let Some(f) = &filter {
            check_filter(&c, f, allow_unindexed)?;
        }
        let own = if timeout_ms == 0 { self.opts.search_timeout } else { Duration::from_millis(u64::from(timeout_ms)) };
        let until = if allow_partial { Until::All } else { Until::FirstFailure };
        let g = self
            .scatter_until(&c, bounded(own, caller), until, |client, shard, timeout| {
                let req = v1::CountShardRequest { shard, filter: filter.clone(), allow_unindexed };
                async move { client.count_shard(req, timeout).await }
            })
            .await;
        let total = c.shard_count();
        if let Some(e) = search_failure(&g.failures, total, allow_partial) {
            return Err(e);
        }
        let answered = g.answers.len() as u32;
        let count = g.answers.iter().map(|(_, r)| r.count).sum();
        Ok(v1::CountResponse { count, shards_total: total, shards_answered: answered, partial: answered < total })
    }

    /// A page of the points matching a filter, in id order. Every shard
    /// must answer: a page without one would skip its points for good.
    pub async fn scroll(&self, req: v1::ScrollRequest, caller: Option<Duration>) -> Result<v1::ScrollResponse> {
        let v1::ScrollRequest { collection, filter, allow_unindexed, after, limit, with_vector, timeout_ms } = req;
        let c = self.collection(&collection)?;
        if let Some(f) = &filter {
            check_filter(&c, f, allow_unindexed)?;
        }
        let limit_n = shoal_proto::scroll_limit(limit).map_err(|e| Error::Invalid(e.message))? as usize;
        let own = if timeout_ms == 0 { self.opts.search_timeout } else { Duration::from_millis(u64::from(timeout_ms)) };
        let g = self
            .scatter_until(&c, bounded(own, caller), Until::FirstFailure, |client, shard, timeout| {
                let req =
                    v1::ScrollShardRequest { shard, filter: filter.clone(), allow_unindexed, after, limit: limit_n as u32, with_vector };
                async move { client.scroll_shard(req, timeout).await }
            })
            .await;
        if let Some(e) = search_failure(&g.failures, c.shard_count(), false) {
            return Err(e);
        }
        Ok(merge_pages(g.answers.into_iter().map(|(_, p)| p).collect(), limit_n))
    }

    /// Declares a field index on the collection and on every copy of its
    /// shards; with `wait`, answers once every copy's index is ready.
    pub async fn create_field_index(&self, req: v1::CreateFieldIndexRequest, caller: Option<Duration>) -> Result<v1::CollectionInfo> {
        let v1::CreateFieldIndexRequest { collection, index, wait } = req;
        let name = CollectionName::parse(&collection)?;
        let wire = index.ok_or_else(|| Error::Invalid("the field index is missing".into()))?;
        let spec = FieldIndexSpec::try_from(wire).map_err(|e| Error::Invalid(e.message))?;
        self.store_fields(&name, |fields| {
            match fields.iter().find(|f| f.field == spec.field) {
                Some(f) if f.kind == spec.kind => return Ok(false),
                Some(f) => {
                    return Err(Error::Precondition(format!(
                        "field {} is indexed as {}; drop that index before indexing it as {}",
                        f.field,
                        f.kind.as_str(),
                        spec.kind.as_str()
                    )));
                }
                None => {}
            }
            if fields.len() >= MAX_FIELD_INDEXES {
                return Err(Error::Invalid(format!("a collection keeps at most {} field indexes", MAX_FIELD_INDEXES)));
            }
            fields.push(spec.clone());
            fields.sort_by(|a, b| a.field.cmp(&b.field));
            Ok(true)
        })
        .await?;
        let c = self.collection(name.as_str())?;
        let wire = field_index_to_wire(&spec);
        self.on_every_copy(&c, |client, shard| {
            let req = v1::ShardFieldIndexRequest { shard, index: Some(wire.clone()) };
            async move { client.create_field_index(req, INDEX_TIMEOUT).await.map(drop) }
        })
        .await?;
        if wait {
            self.wait_for_index(&c, &spec.field, caller).await?;
        }
        self.describe(name.as_str(), caller).await
    }

    /// Drops a field index from the collection and every copy.
    pub async fn drop_field_index(&self, req: v1::DropFieldIndexRequest, caller: Option<Duration>) -> Result<v1::CollectionInfo> {
        let v1::DropFieldIndexRequest { collection, field } = req;
        let name = CollectionName::parse(&collection)?;
        let mut known = false;
        self.store_fields(&name, |fields| {
            let before = fields.len();
            fields.retain(|f| f.field != field);
            known = before != fields.len();
            Ok(known)
        })
        .await?;
        let c = self.collection(name.as_str())?;
        if !known {
            return Err(Error::NotFound(format!("collection {name} has no index on field {field:?}")));
        }
        self.on_every_copy(&c, |client, shard| {
            let req = v1::DropShardFieldIndexRequest { shard, field: field.clone() };
            async move { client.drop_field_index(req, INDEX_TIMEOUT).await.map(drop) }
        })
        .await?;
        self.describe(name.as_str(), caller).await
    }

    /// Changes the collection's field indexes with `change` (which says
    /// whether it changed anything), conditionally on the revision read.
    async fn store_fields(&self, name: &CollectionName, mut change: impl FnMut(&mut Vec<FieldIndexSpec>) -> Result<bool>) -> Result<()> {
        for _ in 0..CONFLICT_RETRIES {
            let view = self.meta.view();
            let v = view.collection(name).ok_or_else(|| Error::CollectionNotFound(name.clone()))?;
            let mut c = v.value.clone();
            if !change(&mut c.fields)? {
                return Ok(());
            }
            match self.meta.update_collection(c, v.revision).await {
                Ok(_) => return Ok(()),
                Err(MetaError::Conflict { .. }) => {
                    let _ = self.meta.sync().await;
                }
                Err(e) => return Err(Error::from(e).context(format!("collection {name}"))),
            }
        }
        Err(Error::Contended { collection: name.clone(), shard: 0, attempts: CONFLICT_RETRIES })
    }

    /// Runs `call` on every copy of every shard of `c` that is in sync or
    /// recovering; a copy that fails fails the whole (the call is
    /// idempotent: the caller retries it).
    async fn on_every_copy<F, Fut>(&self, c: &Collection, call: F) -> Result<()>
    where
        F: Fn(crate::client::ShardClient, Option<v1::ShardId>) -> Fut,
        Fut: std::future::Future<Output = Result<(), shoal_proto::ShoalError>>,
    {
        let copies: Vec<(u32, shoal_proto::NodeId)> = replica_nodes(c)
            .filter(|(i, n)| c.shards[*i as usize].replica(n).is_some_and(|r| r.state != shoal_control::model::ReplicaState::Dead))
            .collect();
        let call = &call;
        let results = futures::future::join_all(copies.iter().map(|(i, node)| async move {
            let client = self.client(node)?;
            self.on_node(node, call(client, Self::shard_id(c, *i))).await
        }))
        .await;
        for ((i, node), r) in copies.iter().zip(results) {
            if let Err(e) = r {
                return Err(e.context(format!("shard {i} on node {node} (the others that answered have it; retry to reach this one)")));
            }
        }
        Ok(())
    }

    /// Waits until every copy's index on `field` is ready.
    async fn wait_for_index(&self, c: &Collection, field: &str, caller: Option<Duration>) -> Result<()> {
        let deadline = tokio::time::Instant::now() + caller.unwrap_or(Duration::from_secs(3600));
        loop {
            let g = self
                .scatter(c, Duration::from_secs(10), |client, shard, timeout| async move {
                    client.get_shard_stats(v1::ShardStatsRequest { shard }, timeout).await
                })
                .await;
            let ready = g.failures.is_empty() && g.answers.iter().all(|(_, s)| s.field_indexes.iter().any(|f| f.field == field && f.ready));
            if ready {
                return Ok(());
            }
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::Deadline(format!("the index on {field} was not ready on every shard of {} in time", c.name)));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn page(ids: &[u64], next_after: Option<u64>) -> v1::ScrollShardResponse {
        v1::ScrollShardResponse { points: ids.iter().map(|&id| v1::Point { id, ..Default::default() }).collect(), next_after }
    }

    fn ids(r: &v1::ScrollResponse) -> Vec<u64> {
        r.points.iter().map(|p| p.id).collect()
    }

    #[test]
    fn scroll_pages_merge_in_id_order_and_never_skip_a_point() {
        // Every shard done: the page is everything, and the end.
        let r = merge_pages(vec![page(&[1, 5], None), page(&[2, 3], None)], 10);
        assert_eq!((ids(&r), r.next_after), (vec![1, 2, 3, 5], None));
        // More than the limit: cut at it.
        let r = merge_pages(vec![page(&[1, 5, 7], None), page(&[2, 3], None)], 3);
        assert_eq!((ids(&r), r.next_after), (vec![1, 2, 3], Some(3)));
        // A shard with more after 4: nothing past 4 may be returned yet,
        // another shard's 6 would come before its next points.
        let r = merge_pages(vec![page(&[1, 4], Some(4)), page(&[2, 6, 9], None)], 10);
        assert_eq!((ids(&r), r.next_after), (vec![1, 2, 4], Some(4)));
        // Exactly the limit, all done: no empty page after it.
        let r = merge_pages(vec![page(&[1], None), page(&[2], None)], 2);
        assert_eq!((ids(&r), r.next_after), (vec![1, 2], None));
        let r = merge_pages(vec![page(&[], None), page(&[], None)], 5);
        assert_eq!((ids(&r), r.next_after), (vec![], None));
    }
}
