//! The gRPC face of a [`Cluster`]: convert, call, convert back.

use std::pin::Pin;
use std::sync::Arc;

use futures::Stream;
use shoal_proto::v1;
use shoal_proto::v1::shoal_server::Shoal;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};
use tracing::Instrument;

use crate::auth::{Auth, Principal, Role};
use crate::cluster::{Cluster, DeleteFilter};
use crate::error::Error;
use crate::search::SearchQuery;

/// Serves `shoal.v1.Shoal`.
pub struct ShoalService {
    cluster: Arc<Cluster>,
    max_message_bytes: usize,
    auth: Arc<Auth>,
}

impl ShoalService {
    /// Every call allowed; see [`ShoalService::with_auth`].
    pub fn new(cluster: Arc<Cluster>, max_message_bytes: usize) -> Self {
        ShoalService { cluster, max_message_bytes, auth: Auth::open() }
    }

    /// Calls need an API key from `auth`.
    #[must_use]
    pub fn with_auth(mut self, auth: Arc<Auth>) -> Self {
        self.auth = auth;
        self
    }

    /// The caller, if its key allows `need` on `collection` (None: the
    /// whole cluster); checked before anything is done.
    fn allow<T>(&self, r: &Request<T>, need: Role, collection: Option<&str>, rpc: &'static str) -> Result<Principal, Status> {
        let who = self.auth.authenticate(r.metadata(), rpc)?;
        who.allow(need, collection, rpc)?;
        Ok(who)
    }

    /// An answer that fits in one message, or RESOURCE_EXHAUSTED saying so
    /// (tonic would otherwise fail to encode it and the caller would see a
    /// bare transport error).
    fn fits<T: prost::Message>(&self, answer: T) -> Result<Response<T>, Status> {
        let len = answer.encoded_len();
        if len > self.max_message_bytes {
            return Err(Error::TooLarge(format!(
                "the answer is {len} bytes, over the message limit of {} bytes (max_message_bytes); \
                 ask for fewer hits, fewer queries or no payloads per request",
                self.max_message_bytes
            ))
            .into());
        }
        Ok(Response::new(answer))
    }
}

/// A request's collection, where empty means every collection (which
/// needs a key not limited to collections).
fn scoped(collection: &str) -> Option<&str> {
    (!collection.is_empty()).then_some(collection)
}

/// Time left before the caller's deadline, if it set one.
fn caller<T>(r: &Request<T>) -> Option<std::time::Duration> {
    shoal_proto::deadline::timeout_of(r.metadata())
}

/// The error reading an Ingest stream's next message ended it with, and
/// what became of the batches before: the stream reads a batch only after
/// the previous one's ack, so each was acknowledged (or the stream would
/// have ended there) and stays; nothing from the failed message on is
/// applied.
fn ended_after(status: Status, acked: u64, last: Option<(String, u64)>) -> Status {
    let before = match last {
        Some((source, offset)) => {
            let (n, stay) = if acked == 1 { ("1 batch".to_owned(), "stays") } else { (format!("{acked} batches"), "stay") };
            format!("the {n} acknowledged before it {stay} (the last: source {source:?}, offset {offset})")
        }
        None => "no batch was acknowledged before it".to_owned(),
    };
    Status::new(status.code(), format!("{}; {before}; nothing from it on is applied", status.message()))
}

type AckStream = Pin<Box<dyn Stream<Item = Result<v1::IngestAck, Status>> + Send>>;

#[tonic::async_trait]
impl Shoal for ShoalService {
    async fn create_collection(&self, r: Request<v1::CreateCollectionRequest>) -> Result<Response<v1::CollectionInfo>, Status> {
        self.allow(&r, Role::Admin, Some(&r.get_ref().name), "CreateCollection")?;
        Ok(Response::new(self.cluster.create_collection(r.into_inner()).await?))
    }

    async fn list_collections(&self, r: Request<v1::ListCollectionsRequest>) -> Result<Response<v1::ListCollectionsResponse>, Status> {
        // Every key may list; a key limited to collections sees those.
        let who = self.auth.authenticate(r.metadata(), "ListCollections")?;
        let collections = self.cluster.list_collections().into_iter().filter(|c| who.sees(&c.name)).collect();
        Ok(Response::new(v1::ListCollectionsResponse { collections }))
    }

    async fn describe_collection(&self, r: Request<v1::DescribeCollectionRequest>) -> Result<Response<v1::CollectionInfo>, Status> {
        self.allow(&r, Role::Read, Some(&r.get_ref().name), "DescribeCollection")?;
        let caller = caller(&r);
        Ok(Response::new(self.cluster.describe(&r.into_inner().name, caller).await?))
    }

    async fn drop_collection(&self, r: Request<v1::DropCollectionRequest>) -> Result<Response<v1::DropCollectionResponse>, Status> {
        self.allow(&r, Role::Admin, Some(&r.get_ref().name), "DropCollection")?;
        self.cluster.drop_collection(&r.into_inner().name).await?;
        Ok(Response::new(v1::DropCollectionResponse {}))
    }

    type IngestStream = AckStream;

    async fn ingest(&self, r: Request<Streaming<v1::IngestRequest>>) -> Result<Response<AckStream>, Status> {
        // A deadline on the stream bounds the whole stream.
        let deadline = caller(&r).and_then(|t| tokio::time::Instant::now().checked_add(t));
        // The key is checked once for the stream and its scope against
        // each batch's collection.
        let who = self.auth.authenticate(r.metadata(), "Ingest")?;
        who.has_role(Role::Write, "Ingest")?;
        // Its messages' errors name the message and blame the client for
        // bytes that are not a message.
        let mut batches = shoal_proto::RequestStream::new(r.into_inner(), "Ingest");
        let cluster = Arc::clone(&self.cluster);
        // One batch at a time per stream, so that a source's batches reach
        // each shard in order (the shard skips offsets at or below its own,
        // so reordering would drop data). The bounded channel and reading
        // the next batch only after the previous ack are the backpressure.
        let (tx, rx) = tokio::sync::mpsc::channel(4);
        // The stream's batches are traced under the Ingest call's span.
        let stream_span = tracing::Span::current();
        tokio::spawn(async move {
            let mut collection = String::new();
            let mut last_ack = None;
            loop {
                let mut batch = match batches.message().await {
                    Ok(Some(b)) => b,
                    Ok(None) => return,
                    Err(status) => {
                        let _ = tx.send(Err(ended_after(status, batches.read(), last_ack))).await;
                        return;
                    }
                };
                // Later batches of a stream may leave the collection empty.
                if batch.collection.is_empty() {
                    batch.collection.clone_from(&collection);
                } else {
                    collection.clone_from(&batch.collection);
                }
                if let Err(refused) = who.allow(Role::Write, Some(&batch.collection), "Ingest") {
                    let _ = tx.send(Err(refused)).await;
                    return;
                }
                let left = deadline.map(|d| d.saturating_duration_since(tokio::time::Instant::now()));
                // Made inside the stream's span, not with it as an explicit
                // parent: head sampling (shoal_server::sampling) reads a
                // new span's trace from the current span.
                let span = stream_span.in_scope(|| {
                    tracing::info_span!("ingest.batch", collection = %batch.collection, source = %batch.source, offset = batch.offset, points = batch.points.len())
                });
                let ack = cluster.ingest(batch, left).instrument(span).await.map_err(Status::from);
                if let Ok(a) = &ack {
                    last_ack = Some((a.source.clone(), a.offset));
                }
                let failed = ack.is_err();
                if tx.send(ack).await.is_err() || failed {
                    return;
                }
            }
        });
        Ok(Response::new(Box::pin(ReceiverStream::new(rx))))
    }

    async fn get_offsets(&self, r: Request<v1::GetOffsetsRequest>) -> Result<Response<v1::GetOffsetsResponse>, Status> {
        self.allow(&r, Role::Read, Some(&r.get_ref().collection), "GetOffsets")?;
        let caller = caller(&r);
        Ok(Response::new(self.cluster.offsets(r.into_inner(), caller).await?))
    }

    async fn upsert(&self, r: Request<v1::UpsertRequest>) -> Result<Response<v1::WriteResponse>, Status> {
        self.allow(&r, Role::Write, Some(&r.get_ref().collection), "Upsert")?;
        let caller = caller(&r);
        let v1::UpsertRequest { collection, points } = r.into_inner();
        let span = tracing::info_span!("upsert", collection = %collection, points = points.len());
        let w = self.cluster.write(&collection, points, Vec::new(), None, caller).instrument(span).await?;
        Ok(Response::new(v1::WriteResponse { upserted: w.upserted, deleted: w.deleted, missing: w.missing }))
    }

    async fn delete(&self, r: Request<v1::DeleteRequest>) -> Result<Response<v1::WriteResponse>, Status> {
        self.allow(&r, Role::Write, Some(&r.get_ref().collection), "Delete")?;
        let caller = caller(&r);
        let v1::DeleteRequest { collection, ids, filter, allow_unindexed } = r.into_inner();
        let span = tracing::info_span!("delete", collection = %collection, ids = ids.len(), filtered = filter.is_some());
        let delete_filter = filter.map(|filter| DeleteFilter { filter, allow_unindexed });
        let w = self.cluster.write_where(&collection, Vec::new(), ids, delete_filter, None, caller).instrument(span).await?;
        Ok(Response::new(v1::WriteResponse { upserted: w.upserted, deleted: w.deleted, missing: w.missing }))
    }

    async fn get(&self, r: Request<v1::GetRequest>) -> Result<Response<v1::GetResponse>, Status> {
        self.allow(&r, Role::Read, Some(&r.get_ref().collection), "Get")?;
        let caller = caller(&r);
        self.fits(self.cluster.get(r.into_inner(), caller).await?)
    }

    async fn search(&self, r: Request<v1::SearchRequest>) -> Result<Response<v1::SearchResponse>, Status> {
        self.allow(&r, Role::Read, Some(&r.get_ref().collection), "Search")?;
        let caller = caller(&r);
        let v1::SearchRequest { collection, vector, k, ef, with_payload, allow_partial, timeout_ms, filter, allow_unindexed } =
            r.into_inner();
        let q = SearchQuery { collection, queries: vec![vector], k, ef, with_payload, allow_partial, timeout_ms, filter, allow_unindexed };
        let span = tracing::info_span!("search", collection = %q.collection, queries = 1, k = q.k, ef = q.ef);
        let mut out = self.cluster.search_many(q, caller).instrument(span).await?;
        let hits = out.results.pop().ok_or_else(|| Error::Internal("search produced no result".into()))?;
        let explain = out.explain.pop().unwrap_or_default();
        self.fits(v1::SearchResponse {
            hits,
            shards_total: out.shards_total,
            shards_answered: out.shards_answered,
            partial: out.partial,
            explain,
        })
    }

    async fn search_batch(&self, r: Request<v1::SearchBatchRequest>) -> Result<Response<v1::SearchBatchResponse>, Status> {
        self.allow(&r, Role::Read, Some(&r.get_ref().collection), "SearchBatch")?;
        let caller = caller(&r);
        let v1::SearchBatchRequest { collection, queries, k, ef, with_payload, allow_partial, timeout_ms, filter, allow_unindexed } =
            r.into_inner();
        let queries = queries.into_iter().map(|v| v.values).collect();
        let q = SearchQuery { collection, queries, k, ef, with_payload, allow_partial, timeout_ms, filter, allow_unindexed };
        let span = tracing::info_span!("search", collection = %q.collection, queries = q.queries.len(), k = q.k, ef = q.ef);
        let out = self.cluster.search_many(q, caller).instrument(span).await?;
        self.fits(v1::SearchBatchResponse {
            results: out.results.into_iter().map(|hits| v1::SearchResult { hits, explain: None }).collect(),
            shards_total: out.shards_total,
            shards_answered: out.shards_answered,
            partial: out.partial,
            explain: out.explain.into_iter().map(|shards| v1::QueryExplain { shards }).collect(),
        })
    }

    async fn count(&self, r: Request<v1::CountRequest>) -> Result<Response<v1::CountResponse>, Status> {
        self.allow(&r, Role::Read, Some(&r.get_ref().collection), "Count")?;
        let caller = caller(&r);
        let req = r.into_inner();
        let span = tracing::info_span!("count", collection = %req.collection, filtered = req.filter.is_some());
        Ok(Response::new(self.cluster.count(req, caller).instrument(span).await?))
    }

    async fn scroll(&self, r: Request<v1::ScrollRequest>) -> Result<Response<v1::ScrollResponse>, Status> {
        self.allow(&r, Role::Read, Some(&r.get_ref().collection), "Scroll")?;
        let caller = caller(&r);
        let req = r.into_inner();
        let span = tracing::info_span!("scroll", collection = %req.collection, limit = req.limit);
        self.fits(self.cluster.scroll(req, caller).instrument(span).await?)
    }

    async fn create_field_index(&self, r: Request<v1::CreateFieldIndexRequest>) -> Result<Response<v1::CollectionInfo>, Status> {
        self.allow(&r, Role::Admin, Some(&r.get_ref().collection), "CreateFieldIndex")?;
        let caller = caller(&r);
        Ok(Response::new(self.cluster.create_field_index(r.into_inner(), caller).await?))
    }

    async fn drop_field_index(&self, r: Request<v1::DropFieldIndexRequest>) -> Result<Response<v1::CollectionInfo>, Status> {
        self.allow(&r, Role::Admin, Some(&r.get_ref().collection), "DropFieldIndex")?;
        let caller = caller(&r);
        Ok(Response::new(self.cluster.drop_field_index(r.into_inner(), caller).await?))
    }

    async fn cluster_status(&self, r: Request<v1::ClusterStatusRequest>) -> Result<Response<v1::ClusterStatusResponse>, Status> {
        let who = self.auth.authenticate(r.metadata(), "ClusterStatus")?;
        let mut status = self.cluster.status(caller(&r)).await;
        status.collections.retain(|c| who.sees(&c.name));
        Ok(Response::new(status))
    }

    async fn create_snapshot(&self, r: Request<v1::CreateSnapshotRequest>) -> Result<Response<v1::CreateSnapshotResponse>, Status> {
        self.allow(&r, Role::Admin, Some(&r.get_ref().collection), "CreateSnapshot")?;
        let req = r.into_inner();
        let span = tracing::info_span!("snapshot", collection = %req.collection);
        Ok(Response::new(self.cluster.create_snapshot(req).instrument(span).await?))
    }

    async fn list_snapshots(&self, r: Request<v1::ListSnapshotsRequest>) -> Result<Response<v1::ListSnapshotsResponse>, Status> {
        self.allow(&r, Role::Read, scoped(&r.get_ref().collection), "ListSnapshots")?;
        Ok(Response::new(self.cluster.list_snapshots(r.into_inner()).await?))
    }

    async fn restore_snapshot(&self, r: Request<v1::RestoreSnapshotRequest>) -> Result<Response<v1::RestoreSnapshotResponse>, Status> {
        self.allow(&r, Role::Admin, Some(&r.get_ref().collection), "RestoreSnapshot")?;
        let req = r.into_inner();
        let span = tracing::info_span!("restore", collection = %req.collection, snapshot = %req.snapshot_id);
        Ok(Response::new(self.cluster.restore_snapshot(req).instrument(span).await?))
    }

    async fn prune_snapshots(&self, r: Request<v1::PruneSnapshotsRequest>) -> Result<Response<v1::PruneSnapshotsResponse>, Status> {
        self.allow(&r, Role::Admin, scoped(&r.get_ref().collection), "PruneSnapshots")?;
        Ok(Response::new(self.cluster.prune_snapshots(r.into_inner()).await?))
    }

    async fn get_snapshot_progress(
        &self,
        r: Request<v1::GetSnapshotProgressRequest>,
    ) -> Result<Response<v1::SnapshotProgressResponse>, Status> {
        self.allow(&r, Role::Read, Some(&r.get_ref().collection), "GetSnapshotProgress")?;
        Ok(Response::new(self.cluster.snapshot_progress(r.into_inner()).await?))
    }

    async fn move_shard(&self, r: Request<v1::MoveShardRequest>) -> Result<Response<v1::MoveShardResponse>, Status> {
        self.allow(&r, Role::Admin, Some(&r.get_ref().collection), "MoveShard")?;
        let caller = caller(&r);
        Ok(Response::new(self.cluster.move_shard(r.into_inner(), caller).await?))
    }

    async fn drain_node(&self, r: Request<v1::DrainNodeRequest>) -> Result<Response<v1::DrainNodeResponse>, Status> {
        self.allow(&r, Role::Admin, None, "DrainNode")?;
        let caller = caller(&r);
        Ok(Response::new(self.cluster.drain_node(r.into_inner(), caller).await?))
    }

    async fn rebalance(&self, r: Request<v1::RebalanceRequest>) -> Result<Response<v1::RebalanceResponse>, Status> {
        self.allow(&r, Role::Admin, None, "Rebalance")?;
        let caller = caller(&r);
        Ok(Response::new(self.cluster.rebalance(r.into_inner(), caller).await?))
    }

    async fn recover_shard(&self, r: Request<v1::RecoverShardRequest>) -> Result<Response<v1::RecoverShardResponse>, Status> {
        self.allow(&r, Role::Admin, Some(&r.get_ref().collection), "RecoverShard")?;
        Ok(Response::new(self.cluster.recover_shard(r.into_inner()).await?))
    }

    async fn verify_shard(&self, r: Request<v1::VerifyShardRequest>) -> Result<Response<v1::VerifyShardResponse>, Status> {
        self.allow(&r, Role::Admin, Some(&r.get_ref().collection), "VerifyShard")?;
        Ok(Response::new(self.cluster.verify_shard(r.into_inner()).await?))
    }

    async fn vacuum_shard(&self, r: Request<v1::VacuumShardRequest>) -> Result<Response<v1::VacuumShardResponse>, Status> {
        self.allow(&r, Role::Admin, Some(&r.get_ref().collection), "VacuumShard")?;
        Ok(Response::new(self.cluster.vacuum_shard(r.into_inner()).await?))
    }

    async fn resync_replica(&self, r: Request<v1::ResyncReplicaRequest>) -> Result<Response<v1::CollectionInfo>, Status> {
        self.allow(&r, Role::Admin, Some(&r.get_ref().collection), "ResyncReplica")?;
        let caller = caller(&r);
        Ok(Response::new(self.cluster.resync_replica(r.into_inner(), caller).await?))
    }

    async fn set_replication(&self, r: Request<v1::SetReplicationRequest>) -> Result<Response<v1::CollectionInfo>, Status> {
        self.allow(&r, Role::Admin, Some(&r.get_ref().collection), "SetReplication")?;
        let caller = caller(&r);
        Ok(Response::new(self.cluster.set_replication(r.into_inner(), caller).await?))
    }
}
