//! A cluster per test, random data with a printed seed.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shoal_ops::embedded::{EmbeddedCluster, EmbeddedConfig};
use shoal_proto::v1;
use shoal_proto::v1::shoal_client::ShoalClient;
use tonic::transport::Channel;

pub(crate) struct TestCluster {
    pub(crate) cluster: EmbeddedCluster,
    pub(crate) client: ShoalClient<Channel>,
    dir: tempfile::TempDir,
}

impl TestCluster {
    /// Where shard node `i` keeps its data (`EmbeddedConfig::ephemeral`'s
    /// layout), for tests that damage it.
    pub(crate) fn node_dir(&self, i: usize) -> std::path::PathBuf {
        self.dir.path().join(format!("shard-{i}"))
    }
}

pub(crate) async fn cluster(nodes: usize) -> TestCluster {
    cluster_with_store(nodes, None).await
}

/// A cluster whose nodes keep snapshots at `store_url` (default: a
/// directory inside the cluster's own).
pub(crate) async fn cluster_with_store(nodes: usize, store_url: Option<&str>) -> TestCluster {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = EmbeddedConfig::ephemeral(dir.path(), nodes);
    if let Some(url) = store_url {
        cfg.snapshot.url = url.to_owned();
    }
    // Small chunks, so test shards have many.
    cfg.snapshot.chunk_bytes = 64 << 10;
    cfg.engine.build_threads = 2;
    // Searches against a stopped node must fail fast in these tests.
    cfg.coordinator.search_timeout_ms = 3_000;
    let cluster = EmbeddedCluster::start(cfg).await.unwrap();
    let client = cluster.client().await.unwrap();
    TestCluster { cluster, client, dir }
}

pub(crate) fn rng(test: &str) -> StdRng {
    let seed = std::env::var("SHOAL_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random::<u64>);
    eprintln!("{test}: seed {seed} (SHOAL_TEST_SEED={seed} replays it)");
    StdRng::seed_from_u64(seed)
}

pub(crate) fn vector(rng: &mut StdRng, dim: usize) -> Vec<f32> {
    (0..dim).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

pub(crate) fn points(rng: &mut StdRng, dim: usize, ids: std::ops::Range<u64>) -> Vec<v1::Point> {
    ids.map(|id| v1::Point {
        id,
        vector: vector(rng, dim),
        payload: Some(v1::Payload { kind: Some(v1::payload::Kind::Json(format!("{{\"id\":{id}}}"))) }),
    })
    .collect()
}

pub(crate) async fn create(client: &mut ShoalClient<Channel>, name: &str, dim: u32, metric: v1::Metric, shards: u32) {
    client
        .create_collection(v1::CreateCollectionRequest {
            name: name.into(),
            dimension: dim,
            metric: metric as i32,
            shard_count: shards,
            index: None,
            ..Default::default()
        })
        .await
        .unwrap();
}

/// Streams `batches` (each tagged source/offset) and returns the acks.
pub(crate) async fn ingest(
    client: &mut ShoalClient<Channel>,
    batches: Vec<v1::IngestRequest>,
) -> Result<Vec<v1::IngestAck>, tonic::Status> {
    let mut acks = client.ingest(tokio_stream::iter(batches)).await?.into_inner();
    let mut out = Vec::new();
    while let Some(a) = acks.message().await? {
        out.push(a);
    }
    Ok(out)
}

pub(crate) fn batch(collection: &str, source: &str, offset: u64, points: Vec<v1::Point>) -> v1::IngestRequest {
    v1::IngestRequest { collection: collection.into(), source: source.into(), offset, points, deletes: vec![], ..Default::default() }
}

pub(crate) async fn points_in(client: &mut ShoalClient<Channel>, name: &str) -> u64 {
    client.describe_collection(v1::DescribeCollectionRequest { name: name.into() }).await.unwrap().into_inner().points
}

/// A shard node on loopback with its data (and snapshots) under `dir`,
/// building on two threads.
pub(crate) async fn shard_node(dir: &std::path::Path, id: &str) -> shoal_shard_node::RunningShardNode {
    use shoal_shard_node::config::{EngineConfig, ShardNodeConfig, SnapshotConfig};
    let cfg = ShardNodeConfig {
        node_id: id.into(),
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.join(id),
        engine: EngineConfig { build_threads: 2, ..EngineConfig::default() },
        snapshot: SnapshotConfig { url: dir.join("snapshots").to_string_lossy().into_owned(), ..SnapshotConfig::default() },
        ..ShardNodeConfig::default()
    };
    shoal_shard_node::RunningShardNode::start(&cfg).await.unwrap()
}
