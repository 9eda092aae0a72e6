//! Talking to shard nodes: over gRPC, or in process. Every call carries a
//! deadline, which travels to the node in `grpc-timeout` (the node stops
//! its work at it), and every failure comes back in shoal's terms through
//! [`ShoalError::from_peer`].

use std::sync::Arc;
use std::time::Duration;

use shoal_proto::v1::shard_node_client::ShardNodeClient;
use shoal_proto::v1::shard_node_server::ShardNode;
use shoal_proto::{ShoalError, v1};
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, health_check_response::ServingStatus};

/// How the coordinator's channels to shard nodes behave
/// (`[coordinator.peers]`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct PeerSettings {
    /// Giving up on opening a connection.
    pub connect_timeout_ms: u64,
    /// HTTP/2 pings on every channel this often, busy or idle ...
    pub keepalive_interval_ms: u64,
    /// ... and a ping unanswered this long closes the connection, failing
    /// its calls at once: a node that died or stopped is noticed without
    /// waiting for a request's deadline.
    pub keepalive_timeout_ms: u64,
    /// Each node's health is asked this often ...
    pub probe_interval_ms: u64,
    /// ... and a node that does not answer within this is marked down:
    /// writes to it fail fast, searches skip it, calls in flight to it end.
    pub probe_timeout_ms: u64,
    /// TLS to the shard nodes: the CA that signed their certificates and
    /// this coordinator's own certificate, which nodes requiring mutual TLS
    /// check. Node addresses are then dialled as `https://`.
    pub tls: Option<shoal_server::ClientTls>,
}

impl Default for PeerSettings {
    fn default() -> Self {
        PeerSettings {
            connect_timeout_ms: 1_000,
            keepalive_interval_ms: 1_000,
            keepalive_timeout_ms: 2_000,
            probe_interval_ms: 500,
            probe_timeout_ms: 1_000,
            tls: None,
        }
    }
}

/// A shard node, wherever it runs. Both kinds speak the same messages, so
/// the embedded cluster and a real one share all coordinator code.
#[derive(Clone)]
// Cloned for every call: boxing the larger variant would allocate each time.
#[allow(clippy::large_enum_variant)]
pub enum ShardClient {
    /// A node in another process, over gRPC.
    Remote {
        /// The node's `shoal.v1.ShardNode` service.
        node: ShardNodeClient<Channel>,
        /// Its standard health service, on the same channel.
        health: HealthClient<Channel>,
    },
    /// A node in this process (its service called directly).
    Local(Arc<dyn ShardNode>),
}

impl ShardClient {
    /// A lazily connecting gRPC client: a node that is down makes calls fail
    /// with UNAVAILABLE instead of making the coordinator fail to start.
    pub fn connect_lazy(address: &str, max_message_bytes: usize, peers: &PeerSettings) -> Result<Self, ShoalError> {
        let url = if peers.tls.is_some() { shoal_server::tls::https(address) } else { address.to_owned() };
        let mut endpoint =
            Endpoint::from_shared(url).map_err(|e| ShoalError::invalid(format!("bad shard node address {address:?}: {e}")))?;
        if let Some(tls) = &peers.tls {
            // Loaded per channel (rarely: channels are pooled per node), so
            // certificates renewed on disk are picked up by new channels.
            let config = tls.load().map_err(|e| ShoalError::invalid(format!("peers.tls: {e:#}")))?;
            endpoint = endpoint.tls_config(config).map_err(|e| ShoalError::invalid(format!("peers.tls: {e}")))?;
        }
        let endpoint = endpoint
            .connect_timeout(Duration::from_millis(peers.connect_timeout_ms.max(1)))
            .tcp_nodelay(true)
            .http2_keep_alive_interval(Duration::from_millis(peers.keepalive_interval_ms.max(1)))
            .keep_alive_timeout(Duration::from_millis(peers.keepalive_timeout_ms.max(1)))
            .keep_alive_while_idle(true);
        let channel = endpoint.connect_lazy();
        let node =
            ShardNodeClient::new(channel.clone()).max_decoding_message_size(max_message_bytes).max_encoding_message_size(max_message_bytes);
        Ok(ShardClient::Remote { node, health: HealthClient::new(channel) })
    }

    /// Asks the node whether it serves, within `timeout`.
    pub async fn ping(&self, timeout: Duration) -> Result<(), ShoalError> {
        let ShardClient::Remote { health, .. } = self else { return Ok(()) };
        let req = tonic::Request::new(HealthCheckRequest { service: "shoal.v1.ShardNode".into() });
        let answer = tokio::time::timeout(timeout, health.clone().check(req))
            .await
            .map_err(|_| ShoalError::deadline(format!("no answer within {timeout:?}")))?
            .map_err(ShoalError::from_peer)?;
        match answer.into_inner().status() {
            ServingStatus::Serving => Ok(()),
            other @ (ServingStatus::Unknown | ServingStatus::NotServing | ServingStatus::ServiceUnknown) => {
                Err(ShoalError::unavailable(format!("the node reports {}", other.as_str_name()), Duration::from_secs(1)))
            }
        }
    }
}

macro_rules! forward {
    ($name:ident, $req:ty, $resp:ty) => {
        /// The RPC of the same name, answered within `timeout` (which the
        /// node is told) or failed with DEADLINE_EXCEEDED.
        pub async fn $name(&self, req: $req, timeout: Duration) -> Result<$resp, ShoalError> {
            let mut request = tonic::Request::new(req);
            request.set_timeout(timeout);
            shoal_server::propagation::inject(request.metadata_mut());
            let call = async {
                match self {
                    ShardClient::Remote { node, .. } => node.clone().$name(request).await,
                    ShardClient::Local(s) => s.$name(request).await,
                }
            };
            match tokio::time::timeout(timeout, call).await {
                Ok(result) => result.map(tonic::Response::into_inner).map_err(ShoalError::from_peer),
                Err(_) => Err(ShoalError::deadline(format!("no answer within {timeout:?}"))),
            }
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
    forward!(fence_shard, v1::FenceShardRequest, v1::ShardStats);
    forward!(read_batch_log, v1::ReadBatchLogRequest, v1::ReadBatchLogResponse);
    forward!(apply_log_entries, v1::ApplyLogEntriesRequest, v1::ApplyLogEntriesResponse);
    forward!(digest_shard, v1::DigestShardRequest, v1::ShardDigest);
    forward!(vacuum_shard, v1::VacuumShardStepsRequest, v1::ShardVacuum);
    forward!(count_shard, v1::CountShardRequest, v1::CountShardResponse);
    forward!(scroll_shard, v1::ScrollShardRequest, v1::ScrollShardResponse);
    forward!(create_field_index, v1::ShardFieldIndexRequest, v1::ShardStats);
    forward!(drop_field_index, v1::DropShardFieldIndexRequest, v1::ShardStats);
}
