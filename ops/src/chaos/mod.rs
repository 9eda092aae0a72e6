//! The chaos run (docs/replication.md, "Chaos"): separate processes on
//! loopback (an etcd of its own, coordinators, shard nodes), two
//! replicated collections (one written, one not: recall is measured on the
//! one whose data does not change), ingest streams and search clients
//! running throughout, and faults on a schedule: a shard node SIGKILLed
//! and restarted (after a short pause it rejoins; after a long one its
//! copies are repaired elsewhere first), a node SIGKILLed and started
//! again at once, only once (it must take over its own registration), a
//! node SIGSTOPped for a while, a bit flipped in a stored vector of a copy
//! (the node's scrub must find it and the copy be made again), the
//! controller coordinator SIGKILLed and restarted, etcd restarted; node
//! faults one at a time (only while every shard has its copies in sync).
//! At the end, from the streams' own records and a full read of every
//! point: acknowledged points missing, stale or phantom points, replicas
//! that disagree, failed and partial searches, refused starts, recall and
//! p99 during faults against the quiet start, and how long ingest,
//! replicas and repairs took. `shoal-loadtest chaos` runs it long; a
//! bounded run is a test.
//!
//! Every search and write goes to loopback only, bounded in count by the
//! run's duration.
//!
//! # Layout
//! - `clients`: the coordinators in order of preference, and what a
//!   failed call says about whom to try next.
//! - `load`: the ingest streams and search clients.
//! - `faults`: the schedule; `returns` times a killed node's way back;
//!   `damage` flips a bit and times its repair; `observe` reads shards,
//!   safe nodes and settling.
//! - `flip`: a bit flipped in a copy's file, behind LMDB's back.
//! - `report`: what was found, its targets and its table.

mod clients;
mod damage;
mod faults;
pub mod flip;
mod load;
mod observe;
mod report;
mod returns;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::Context;
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shoal_proto::v1;
use shoal_proto::v1::shoal_client::ShoalClient;
use tonic::transport::Channel;

use self::clients::Clients;
use self::faults::run_faults;
use self::load::{ingest_stream, search_loop};
use self::observe::settle;
use self::report::{Acked, Timeline, figures};
pub use self::report::{ChaosReport, LostPart};
use crate::etcd_server::Etcd;
use crate::procs::{ClusterSpec, Launcher, ProcessCluster};

/// What to run.
#[derive(Clone, Debug)]
pub struct ChaosConfig {
    pub launcher: Launcher,
    /// Data, logs and etcd's directory.
    pub dir: PathBuf,
    pub seed: u64,
    /// Load without faults first: the figures faults are compared with.
    pub quiet: Duration,
    /// Faults run this long after the quiet phase.
    pub faults_for: Duration,
    /// A fault starts this often (one at a time).
    pub fault_every: Duration,
    pub shard_nodes: usize,
    pub coordinators: usize,
    pub shards: u32,
    pub replication_factor: u32,
    pub streams: usize,
    pub searchers: usize,
    pub dim: usize,
    pub base_points: usize,
    pub batch_points: usize,
    /// Lease TTL of nodes and coordinators.
    pub lease_ttl: Duration,
    /// The coordinators' repair delay; every other node kill lasts longer
    /// than it (plus the lease), so that repair happens too.
    pub repair_after: Duration,
    /// A node back after its copies were repaired elsewhere gets copies
    /// again through a rebalance (shard moves under faults).
    pub rebalance_returned: bool,
}

impl ChaosConfig {
    /// The layout: 2 coordinators, 4 shard nodes, 6 shards with 2
    /// copies, 3 ingest streams and 8 search clients.
    pub fn new(launcher: Launcher, dir: PathBuf) -> Self {
        ChaosConfig {
            launcher,
            dir,
            seed: 1,
            quiet: Duration::from_secs(20),
            faults_for: Duration::from_secs(600),
            fault_every: Duration::from_secs(5),
            shard_nodes: 4,
            coordinators: 2,
            shards: 6,
            replication_factor: 2,
            streams: 3,
            searchers: 8,
            dim: 32,
            base_points: 5_000,
            batch_points: 100,
            lease_ttl: Duration::from_secs(4),
            repair_after: Duration::from_secs(8),
            rebalance_returned: true,
        }
    }
}

/// The base set, the queries and their exact top 10 over it. Ingested
/// points are shifted far away from both, so the exact answers hold while
/// ingest runs and recall is measured against a fixed truth.
struct Data {
    base: Vec<Vec<f32>>,
    queries: Vec<(Vec<f32>, Vec<u64>)>,
}

const INGEST_SHIFT: f32 = 100.0;

fn data(cfg: &ChaosConfig, rng: &mut StdRng) -> Data {
    let v = |rng: &mut StdRng| (0..cfg.dim).map(|_| rng.random_range(-1.0f32..1.0)).collect::<Vec<f32>>();
    let base: Vec<Vec<f32>> = (0..cfg.base_points).map(|_| v(rng)).collect();
    let queries = (0..200)
        .map(|_| {
            let q = v(rng);
            let mut d: Vec<(f32, u64)> =
                base.iter().enumerate().map(|(i, b)| (b.iter().zip(&q).map(|(x, y)| (x - y) * (x - y)).sum::<f32>(), i as u64)).collect();
            d.sort_by(|a, b| a.0.total_cmp(&b.0));
            (q, d[..10].iter().map(|x| x.1).collect())
        })
        .collect();
    Data { base, queries }
}

/// `chaos` takes the ingest streams; `still` holds the base points only,
/// so that recall is measured on data that does not change: the same
/// nodes hold both, and every fault hits both. (Recall measured on the
/// collection being filled would fall as it grows whatever the faults:
/// the ingested points are kept out of every query's top 10 by putting
/// them far away, and a graph mostly made of them is a longer walk to
/// the base points.)
const COLLECTIONS: [&str; 2] = ["chaos", "still"];

/// Vectors of an ingested batch, made again from its seed for the check.
fn batch_vectors(seed: u64, n: usize, dim: usize) -> Vec<Vec<f32>> {
    let mut rng = StdRng::seed_from_u64(seed);
    (0..n)
        .map(|_| {
            let mut v: Vec<f32> = (0..dim).map(|_| rng.random_range(-1.0f32..1.0)).collect();
            v[0] += INGEST_SHIFT;
            v
        })
        .collect()
}

/// Runs the whole thing; the report says what was found.
pub async fn run(cfg: ChaosConfig) -> anyhow::Result<ChaosReport> {
    std::fs::create_dir_all(&cfg.dir)?;
    let mut rng = StdRng::seed_from_u64(cfg.seed);
    let etcd = Arc::new(Mutex::new(tokio::task::block_in_place(|| Etcd::start(&cfg.dir))?));
    let endpoint = etcd.lock().endpoint();
    let mut spec = ClusterSpec::new(cfg.launcher.clone(), cfg.dir.join("cluster"), cfg.shard_nodes);
    spec.coordinators = cfg.coordinators;
    spec.etcd = Some((endpoint, "/shoal-chaos".into()));
    let ttl = cfg.lease_ttl.as_millis().to_string();
    spec.node_env.push(("SHOAL_SHARD_CLUSTER__LEASE_TTL_MS".into(), ttl.clone()));
    spec.node_env.push(("SHOAL_SHARD_ENGINE__BUILD_THREADS".into(), "1".into()));
    spec.coordinator_env.push(("SHOAL_COORD_CLUSTER__LEASE_TTL_MS".into(), ttl));
    spec.coordinator_env.push(("SHOAL_COORD_REPAIR_AFTER_MS".into(), cfg.repair_after.as_millis().to_string()));
    let cluster = tokio::task::block_in_place(|| ProcessCluster::start(&spec))?;
    let endpoints: Vec<String> = std::iter::once(&cluster.coordinator).chain(&cluster.more_coordinators).map(|p| p.endpoint()).collect();
    let cluster = Arc::new(Mutex::new(cluster));
    let result = drive(&cfg, &mut rng, &endpoints, &cluster, &etcd).await;
    if result.is_err() {
        eprintln!("{}", cluster.lock().logs());
    }
    result
}

async fn drive(
    cfg: &ChaosConfig,
    rng: &mut StdRng,
    endpoints: &[String],
    cluster: &Arc<Mutex<ProcessCluster>>,
    etcd: &Arc<Mutex<Etcd>>,
) -> anyhow::Result<ChaosReport> {
    let data = Arc::new(data(cfg, rng));
    let clients = Clients::connect(endpoints)?;
    let mut admin = clients.clients[0].clone();
    for name in COLLECTIONS {
        let create = v1::CreateCollectionRequest {
            name: name.into(),
            dimension: cfg.dim as u32,
            metric: v1::Metric::Euclidean as i32,
            shard_count: cfg.shards,
            replication_factor: cfg.replication_factor,
            ..Default::default()
        };
        admin.create_collection(create).await.with_context(|| format!("creating {name}"))?;
        for (n, chunk) in data.base.chunks(500).enumerate() {
            let points =
                chunk.iter().enumerate().map(|(j, v)| v1::Point { id: (n * 500 + j) as u64, vector: v.clone(), payload: None }).collect();
            let req =
                v1::IngestRequest { collection: name.into(), source: "base".into(), offset: n as u64 + 1, points, ..Default::default() };
            let mut acks = admin.ingest(tokio_stream::iter(vec![req])).await?.into_inner();
            acks.message().await?.context("no ack for a base batch")?;
        }
    }

    let started = Instant::now();
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let timeline = Arc::new(Mutex::new(Timeline::default()));
    let mut streams = Vec::new();
    for s in 0..cfg.streams {
        let (clients, stop, batch, dim) = (clients.clone(), Arc::clone(&stop), cfg.batch_points, cfg.dim);
        let seed = rng.random::<u64>();
        streams.push(tokio::spawn(async move { ingest_stream(s, clients, stop, batch, dim, seed, started).await }));
    }
    let mut searchers = Vec::new();
    for _ in 0..cfg.searchers {
        let (clients, stop, data) = (clients.clone(), Arc::clone(&stop), Arc::clone(&data));
        let seed = rng.random::<u64>();
        searchers.push(tokio::spawn(async move { search_loop(clients, stop, data, seed, started).await }));
    }

    tokio::time::sleep(cfg.quiet).await;
    timeline.lock().faults_from = Some(started.elapsed());
    let fault_seed = rng.random::<u64>();
    let faults = {
        let (cfg, cluster, etcd, timeline, admins, data) =
            (cfg.clone(), Arc::clone(cluster), Arc::clone(etcd), Arc::clone(&timeline), clients.clone(), Arc::clone(&data));
        tokio::spawn(async move { run_faults(&cfg, fault_seed, &cluster, &etcd, &timeline, admins, data, started).await })
    };
    let fault_result = faults.await?;
    let settle_started = Instant::now();
    let settled = settle(&clients, cfg.replication_factor as usize, Duration::from_secs(180)).await;
    let settle_s = settle_started.elapsed().as_secs_f64();
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut acked = Vec::new();
    for s in streams {
        acked.push(s.await??);
    }
    let mut searched = Vec::new();
    for s in searchers {
        searched.extend(s.await?);
    }
    let mut report = ChaosReport { settle_s, ..Default::default() };
    if let Err(e) = fault_result {
        report.errors.push(format!("fault schedule: {e:#}"));
    }
    if let Err(e) = settled {
        report.errors.push(e);
    }
    let tl = std::mem::take(&mut *timeline.lock());
    figures(&mut report, &tl, &acked, &searched);
    check_points(cfg, &mut admin, &mut report, &acked).await?;
    Ok(report)
}

/// Reads back every acknowledged point and compares it with what was sent;
/// counts the collection's points; verifies every shard's replicas.
async fn check_points(
    cfg: &ChaosConfig,
    admin: &mut ShoalClient<Channel>,
    r: &mut ChaosReport,
    acked: &[Vec<Acked>],
) -> anyhow::Result<()> {
    for a in acked.iter().flatten() {
        let want = batch_vectors(a.seed, (a.ids.end - a.ids.start) as usize, cfg.dim);
        let got = admin
            .get(v1::GetRequest { collection: "chaos".into(), ids: a.ids.clone().collect(), with_vector: true })
            .await
            .context("reading back a batch")?
            .into_inner();
        r.missing += got.missing.len() as u64;
        let mut by_shard: BTreeMap<u32, Vec<u64>> = BTreeMap::new();
        for &id in &got.missing {
            by_shard.entry(shoal_proto::shard_for(id, cfg.shards)).or_default().push(id);
        }
        for (shard, ids) in by_shard {
            let of = a.ids.clone().filter(|&id| shoal_proto::shard_for(id, cfg.shards) == shard).count() as u64;
            r.lost.push(LostPart {
                stream: a.stream,
                offset: a.offset,
                first_sent_s: a.first_sent.as_secs_f64(),
                acked_s: a.acked.as_secs_f64(),
                shard,
                missing: ids.len() as u64,
                of,
                ids: ids.into_iter().take(4).collect(),
            });
        }
        for p in &got.points {
            let i = (p.id - a.ids.start) as usize;
            if want.get(i) != Some(&p.vector) {
                r.stale += 1;
            }
        }
    }
    let held = admin.describe_collection(v1::DescribeCollectionRequest { name: "chaos".into() }).await?.into_inner().points;
    r.phantoms = held as i64 - (cfg.base_points as u64 + r.acked_points) as i64 + r.missing as i64;
    let still = admin.describe_collection(v1::DescribeCollectionRequest { name: "still".into() }).await?.into_inner().points;
    if still != cfg.base_points as u64 {
        r.errors.push(format!("the collection without writes holds {still} points, not {}", cfg.base_points));
    }
    for name in COLLECTIONS {
        for shard in 0..cfg.shards {
            let v = admin.verify_shard(v1::VerifyShardRequest { collection: name.into(), shard }).await?.into_inner();
            if !v.agree {
                r.replicas_disagree += 1;
                r.errors.push(format!("{name} shard {shard}: {:?}", v.replicas));
            }
        }
    }
    Ok(())
}
