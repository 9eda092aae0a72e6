//! The gRPC face of a [`ShardHost`]: thin handlers, all logic in the host.

use std::sync::Arc;

use shoal_proto::v1;
use shoal_proto::v1::shard_node_server::ShardNode;
use tonic::{Request, Response, Status};

use crate::host::ShardHost;
use crate::search::Caller;

/// Serves `shoal.v1.ShardNode` from a host.
pub struct ShardNodeService {
    host: Arc<ShardHost>,
}

impl ShardNodeService {
    pub fn new(host: Arc<ShardHost>) -> Self {
        ShardNodeService { host }
    }
}

#[tonic::async_trait]
impl ShardNode for ShardNodeService {
    async fn create_shard(&self, r: Request<v1::CreateShardRequest>) -> Result<Response<v1::ShardStats>, Status> {
        Ok(Response::new(self.host.create_shard(r.into_inner()).await?))
    }

    async fn drop_shard(&self, r: Request<v1::DropShardRequest>) -> Result<Response<v1::DropShardResponse>, Status> {
        Ok(Response::new(self.host.drop_shard(r.into_inner()).await?))
    }

    async fn apply_batch(&self, r: Request<v1::ApplyBatchRequest>) -> Result<Response<v1::ApplyBatchResponse>, Status> {
        Ok(Response::new(self.host.apply(r.into_inner()).await?))
    }

    async fn search_shard(&self, r: Request<v1::SearchShardRequest>) -> Result<Response<v1::SearchShardResponse>, Status> {
        // The search runs on another thread: it learns that the caller
        // gave up from the deadline and from this future being dropped.
        let (caller, _gone_on_drop) = Caller::new(shoal_proto::deadline::timeout_of(r.metadata()));
        Ok(Response::new(self.host.search(r.into_inner(), caller).await?))
    }

    async fn get_points(&self, r: Request<v1::GetPointsRequest>) -> Result<Response<v1::GetPointsResponse>, Status> {
        Ok(Response::new(self.host.get_points(r.into_inner()).await?))
    }

    async fn get_shard_stats(&self, r: Request<v1::ShardStatsRequest>) -> Result<Response<v1::ShardStats>, Status> {
        Ok(Response::new(self.host.stats(r.into_inner()).await?))
    }

    async fn list_shards(&self, _: Request<v1::ListShardsRequest>) -> Result<Response<v1::ListShardsResponse>, Status> {
        Ok(Response::new(self.host.list().await?))
    }

    async fn snapshot_shard(&self, r: Request<v1::SnapshotShardRequest>) -> Result<Response<v1::SnapshotInfo>, Status> {
        Ok(Response::new(self.host.snapshot_shard(r.into_inner()).await?))
    }

    async fn restore_shard(&self, r: Request<v1::RestoreShardRequest>) -> Result<Response<v1::ShardStats>, Status> {
        Ok(Response::new(self.host.restore_shard(r.into_inner()).await?))
    }

    async fn list_snapshots(&self, r: Request<v1::ListSnapshotsRequest>) -> Result<Response<v1::ListSnapshotsResponse>, Status> {
        Ok(Response::new(self.host.list_snapshots(r.into_inner()).await?))
    }

    async fn prune_snapshots(&self, r: Request<v1::PruneSnapshotsRequest>) -> Result<Response<v1::PruneSnapshotsResponse>, Status> {
        Ok(Response::new(self.host.prune_snapshots(r.into_inner()).await?))
    }

    async fn fence_shard(&self, r: Request<v1::FenceShardRequest>) -> Result<Response<v1::ShardStats>, Status> {
        Ok(Response::new(self.host.fence_shard(r.into_inner()).await?))
    }

    async fn read_batch_log(&self, r: Request<v1::ReadBatchLogRequest>) -> Result<Response<v1::ReadBatchLogResponse>, Status> {
        Ok(Response::new(self.host.read_batch_log(r.into_inner()).await?))
    }

    async fn digest_shard(&self, r: Request<v1::DigestShardRequest>) -> Result<Response<v1::ShardDigest>, Status> {
        Ok(Response::new(self.host.digest(r.into_inner()).await?))
    }

    async fn vacuum_shard(&self, r: Request<v1::VacuumShardStepsRequest>) -> Result<Response<v1::ShardVacuum>, Status> {
        Ok(Response::new(self.host.vacuum(r.into_inner()).await?))
    }

    async fn apply_log_entries(&self, r: Request<v1::ApplyLogEntriesRequest>) -> Result<Response<v1::ApplyLogEntriesResponse>, Status> {
        Ok(Response::new(self.host.apply_log_entries(r.into_inner()).await?))
    }

    async fn count_shard(&self, r: Request<v1::CountShardRequest>) -> Result<Response<v1::CountShardResponse>, Status> {
        Ok(Response::new(self.host.count(r.into_inner()).await?))
    }

    async fn scroll_shard(&self, r: Request<v1::ScrollShardRequest>) -> Result<Response<v1::ScrollShardResponse>, Status> {
        Ok(Response::new(self.host.scroll(r.into_inner()).await?))
    }

    async fn create_field_index(&self, r: Request<v1::ShardFieldIndexRequest>) -> Result<Response<v1::ShardStats>, Status> {
        Ok(Response::new(self.host.create_field_index(r.into_inner()).await?))
    }

    async fn drop_field_index(&self, r: Request<v1::DropShardFieldIndexRequest>) -> Result<Response<v1::ShardStats>, Status> {
        Ok(Response::new(self.host.drop_field_index(r.into_inner()).await?))
    }

    async fn get_snapshot_progress(
        &self,
        _: Request<v1::SnapshotProgressRequest>,
    ) -> Result<Response<v1::SnapshotProgressResponse>, Status> {
        Ok(Response::new(self.host.snapshot_progress()))
    }
}
