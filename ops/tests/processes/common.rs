//! What every process test needs: a cluster in a temporary directory,
//! clients, data with a printed seed, and a runtime to drive them.

use std::future::Future;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shoal_ops::procs::{ClusterSpec, Launcher, ProcessCluster};
use shoal_proto::v1;
use shoal_proto::v1::shoal_client::ShoalClient;
use tonic::transport::Channel;

/// A process cluster and the directory that holds it.
pub(crate) struct Fixture {
    pub(crate) cluster: ProcessCluster,
    pub(crate) dir: tempfile::TempDir,
}

impl Fixture {
    /// `nodes` shard nodes and a coordinator; `configure` adjusts the
    /// layout and settings before anything starts.
    pub(crate) fn start(nodes: usize, configure: impl FnOnce(&mut ClusterSpec)) -> anyhow::Result<Fixture> {
        let dir = tempfile::tempdir()?;
        let program = std::env::current_exe()?;
        let mut spec = ClusterSpec::new(Launcher::Roles(program), dir.path(), nodes);
        // Test shards build on two threads; searches of a stopped node must
        // fail within the tests' patience.
        spec.node_env.push(("SHOAL_SHARD_ENGINE__BUILD_THREADS".into(), "2".into()));
        spec.node_env.push(("SHOAL_SHARD_ENGINE__DURABLE".into(), "false".into()));
        configure(&mut spec);
        let cluster = ProcessCluster::start(&spec)?;
        Ok(Fixture { cluster, dir })
    }

    /// `nodes` shard nodes and `coordinators` coordinators on the test etcd
    /// (`SHOAL_TEST_ETCD_ENDPOINT`), under a key prefix of their own, with
    /// leases of `ttl`. `None` (and a printed SKIPPED) without an etcd.
    pub(crate) fn on_etcd(test: &str, nodes: usize, coordinators: usize, ttl: Duration) -> anyhow::Result<Option<Fixture>> {
        Self::on_etcd_with(test, nodes, coordinators, ttl, |_| {})
    }

    /// [`Fixture::on_etcd`], with `configure` adjusting the spec last.
    pub(crate) fn on_etcd_with(
        test: &str,
        nodes: usize,
        coordinators: usize,
        ttl: Duration,
        configure: impl FnOnce(&mut ClusterSpec),
    ) -> anyhow::Result<Option<Fixture>> {
        let Some(endpoint) = std::env::var("SHOAL_TEST_ETCD_ENDPOINT").ok().filter(|e| !e.is_empty()) else {
            eprintln!("SKIPPED {test}: SHOAL_TEST_ETCD_ENDPOINT is not set");
            return Ok(None);
        };
        let prefix = format!("/shoal-test/{test}-{:016x}", rand::random::<u64>());
        let ttl_ms = ttl.as_millis().to_string();
        let fx = Fixture::start(nodes, |spec| {
            spec.etcd = Some((endpoint, prefix));
            spec.coordinators = coordinators;
            spec.node_env.push(("SHOAL_SHARD_CLUSTER__LEASE_TTL_MS".into(), ttl_ms.clone()));
            spec.coordinator_env.push(("SHOAL_COORD_CLUSTER__LEASE_TTL_MS".into(), ttl_ms));
            configure(spec);
        })?;
        Ok(Some(fx))
    }

    pub(crate) async fn client(&self) -> anyhow::Result<ShoalClient<Channel>> {
        Ok(ShoalClient::connect(self.cluster.endpoint()).await?.max_decoding_message_size(256 << 20))
    }
}

/// Runs an async test body on its own runtime.
pub(crate) fn block_on<T>(f: impl Future<Output = anyhow::Result<T>>) -> anyhow::Result<T> {
    tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?.block_on(f)
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
    ids.map(|id| v1::Point { id, vector: vector(rng, dim), payload: None }).collect()
}

pub(crate) async fn create(
    client: &mut ShoalClient<Channel>,
    name: &str,
    dim: u32,
    shards: u32,
) -> Result<v1::CollectionInfo, tonic::Status> {
    create_replicated(client, name, dim, shards, 0).await
}

/// A cosine collection of `shards` shards with `factor` copies of each
/// (0: the cluster's default).
pub(crate) async fn create_replicated(
    client: &mut ShoalClient<Channel>,
    name: &str,
    dim: u32,
    shards: u32,
    factor: u32,
) -> Result<v1::CollectionInfo, tonic::Status> {
    create_with_metric(client, name, dim, shards, factor, v1::Metric::Cosine).await
}

/// [`create_replicated`] with another metric (Euclidean stores vectors as
/// sent, so a test can find their bytes in a file).
pub(crate) async fn create_with_metric(
    client: &mut ShoalClient<Channel>,
    name: &str,
    dim: u32,
    shards: u32,
    factor: u32,
    metric: v1::Metric,
) -> Result<v1::CollectionInfo, tonic::Status> {
    let req = v1::CreateCollectionRequest {
        name: name.into(),
        dimension: dim,
        metric: metric as i32,
        shard_count: shards,
        replication_factor: factor,
        ..Default::default()
    };
    Ok(client.create_collection(req).await?.into_inner())
}

/// Upserts `points` in batches of `batch`.
pub(crate) async fn upsert_all(client: &mut ShoalClient<Channel>, name: &str, points: Vec<v1::Point>, batch: usize) -> anyhow::Result<()> {
    let mut points = points.into_iter().peekable();
    while points.peek().is_some() {
        let chunk: Vec<v1::Point> = points.by_ref().take(batch).collect();
        client.upsert(v1::UpsertRequest { collection: name.into(), points: chunk }).await?;
    }
    Ok(())
}

pub(crate) async fn points_in(client: &mut ShoalClient<Channel>, name: &str) -> anyhow::Result<u64> {
    Ok(client.describe_collection(v1::DescribeCollectionRequest { name: name.into() }).await?.into_inner().points)
}

/// The `retry-after-ms` hint of a status, if any.
pub(crate) fn retry_hint(s: &tonic::Status) -> Option<Duration> {
    s.metadata().get("retry-after-ms")?.to_str().ok()?.parse().ok().map(Duration::from_millis)
}

/// Fails with `what` and the cluster's logs unless `cond`.
#[macro_export]
macro_rules! check {
    ($fx:expr, $cond:expr, $($what:tt)+) => {
        let holds: bool = $cond;
        if !holds {
            anyhow::bail!("{}\n{}", format!($($what)+), $fx.cluster.logs());
        }
    };
}
