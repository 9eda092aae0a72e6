//! Talking to shard nodes: over gRPC, or in process.

use std::sync::Arc;
use std::time::Duration;

use shoal_proto::v1::shard_node_client::ShardNodeClient;
use shoal_proto::v1::shard_node_server::ShardNode;
use shoal_proto::{ShoalError, v1};
use tonic::transport::{Channel, Endpoint};

/// A shard node, wherever it runs. Both kinds speak the same messages, so
/// the embedded cluster and a real one share all coordinator code.
#[derive(Clone)]
pub enum ShardClient {
    /// A node in another process, over gRPC.
    Remote(ShardNodeClient<Channel>),
    /// A node in this process (its service called directly).
    Local(Arc<dyn ShardNode>),
}

impl ShardClient {
    /// A lazily connecting gRPC client: a node that is down makes calls fail
    /// with UNAVAILABLE instead of making the coordinator fail to start.
    pub fn connect_lazy(address: &str, max_message_bytes: usize) -> Result<Self, ShoalError> {
        let endpoint = Endpoint::from_shared(address.to_owned())
            .map_err(|e| ShoalError::invalid(format!("bad shard node address {address:?}: {e}")))?
            .connect_timeout(Duration::from_secs(2))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_secs(10))
            .keep_alive_while_idle(true);
        let client = ShardNodeClient::new(endpoint.connect_lazy())
            .max_decoding_message_size(max_message_bytes)
            .max_encoding_message_size(max_message_bytes);
        Ok(ShardClient::Remote(client))
    }
}

macro_rules! forward {
    ($name:ident, $req:ty, $resp:ty) => {
        pub async fn $name(&self, req: $req) -> Result<$resp, ShoalError> {
            let result = match self {
                ShardClient::Remote(c) => c.clone().$name(req).await,
                ShardClient::Local(s) => s.$name(tonic::Request::new(req)).await,
            };
            result.map(tonic::Response::into_inner).map_err(ShoalError::from)
        }
    };
}

impl ShardClient {
    forward!(create_shard, v1::CreateShardRequest, v1::ShardStats);
    forward!(drop_shard, v1::DropShardRequest, v1::DropShardResponse);
    forward!(apply_batch, v1::ApplyBatchRequest, v1::ApplyBatchResponse);
    forward!(search_shard, v1::SearchShardRequest, v1::SearchShardResponse);
    forward!(get_points, v1::GetPointsRequest, v1::GetPointsResponse);
    forward!(get_shard_stats, v1::ShardStatsRequest, v1::ShardStats);
    forward!(list_shards, v1::ListShardsRequest, v1::ListShardsResponse);
    forward!(snapshot_shard, v1::SnapshotShardRequest, v1::SnapshotInfo);
    forward!(restore_shard, v1::RestoreShardRequest, v1::ShardStats);
    forward!(list_snapshots, v1::ListSnapshotsRequest, v1::ListSnapshotsResponse);
    forward!(prune_snapshots, v1::PruneSnapshotsRequest, v1::PruneSnapshotsResponse);
    forward!(get_snapshot_progress, v1::SnapshotProgressRequest, v1::SnapshotProgressResponse);
}
