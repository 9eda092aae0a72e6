//! The chaos run of issue 20 (docs/replication.md, "Chaos"): separate
//! processes on loopback (an etcd of its own, coordinators, shard nodes),
//! two replicated collections (one written, one not: recall is measured
//! on the one whose data does not change), ingest streams and search
//! clients running throughout, and faults on a schedule: a shard node
//! SIGKILLed and restarted (after a short pause it rejoins; after a long
//! one its copies are repaired elsewhere first), a node SIGSTOPped for a
//! while, the controller coordinator SIGKILLed and restarted, etcd
//! restarted; node faults one at a time (only while every shard has its
//! copies in sync). At the end, from the streams' own records and a full
//! read of every point: acknowledged points missing, stale or phantom
//! points, replicas that disagree, failed and partial searches, recall and
//! p99 during faults against the quiet start, and how long ingest and
//! replicas took to recover. `shoal-loadtest chaos` runs it long; a
//! bounded run is a test.
//!
//! Every search and write goes to loopback only, bounded in count by the
//! run's duration.

use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use parking_lot::Mutex;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shoal_proto::v1;
use shoal_proto::v1::shoal_client::ShoalClient;
use tonic::transport::Channel;

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

/// What a run found.
#[derive(Debug, Default, Clone, serde::Serialize)]
pub struct ChaosReport {
    pub faults: BTreeMap<String, u64>,
    pub acked_batches: u64,
    pub acked_points: u64,
    pub missing: u64,
    pub stale: u64,
    pub phantoms: i64,
    pub replicas_disagree: u64,
    pub searches: u64,
    pub failed_searches: u64,
    pub partial_searches: u64,
    /// Searches that reached a coordinator only after its peer refused the
    /// connection (the killed controller): counted, not failed.
    pub searches_redirected: u64,
    /// Failed searches by code and message (digits left out), most first.
    pub search_failures: Vec<(String, u64)>,
    /// The first failed searches: seconds into the run, code and message.
    pub first_failures: Vec<(f64, String)>,
    /// Searches under faults that answered whole but found fewer than half
    /// of the true top 10 (a copy that lacks points would show here).
    pub low_recall_searches: u64,
    pub quiet_recall: f64,
    pub fault_recall: f64,
    pub quiet_p99_ms: f64,
    pub fault_p99_ms: f64,
    /// Per node kill: seconds until every ingest stream had a batch sent
    /// after the kill acknowledged.
    pub ingest_resume_s: Vec<f64>,
    /// Per replica on a node killed briefly: seconds from the node's
    /// restart until that copy was in sync again.
    pub rejoin_s: Vec<f64>,
    /// Per replica on a node killed for long: seconds from the kill until
    /// its shard had all its copies in sync again on the other nodes.
    pub repair_s: Vec<f64>,
    /// Per long node kill: seconds from its return (empty) until a
    /// rebalance gave it copies again.
    pub rebalance_s: Vec<f64>,
    /// Seconds the cluster took to settle after the last fault.
    pub settle_s: f64,
    pub errors: Vec<String>,
}

impl ChaosReport {
    /// What the run lost or broke: points, agreement, searches, recall,
    /// and errors of the run itself (empty: nothing).
    pub fn losses(&self) -> Vec<String> {
        let mut out = self.errors.clone();
        let mut want = |ok: bool, what: String| {
            if !ok {
                out.push(what);
            }
        };
        want(self.missing == 0, format!("{} acknowledged points missing", self.missing));
        want(self.stale == 0, format!("{} points with a stale vector", self.stale));
        want(self.phantoms == 0, format!("{} points more than written (phantoms)", self.phantoms));
        want(self.replicas_disagree == 0, format!("{} shards whose replicas disagree", self.replicas_disagree));
        want(self.failed_searches == 0, format!("{} failed searches", self.failed_searches));
        want(self.partial_searches == 0, format!("{} partial searches", self.partial_searches));
        want(
            self.fault_recall >= self.quiet_recall - 0.01,
            format!("recall {:.4} under faults, {:.4} quiet", self.fault_recall, self.quiet_recall),
        );
        out
    }

    /// [`ChaosReport::losses`] and the timing targets of issue 20 this run
    /// missed (empty: all met). Timings are for the long run on a quiet
    /// machine, not for a test.
    pub fn misses(&self) -> Vec<String> {
        let mut out = self.losses();
        let mut want = |ok: bool, what: String| {
            if !ok {
                out.push(what);
            }
        };
        want(
            self.fault_p99_ms <= 3.0 * self.quiet_p99_ms,
            format!("p99 {:.1} ms under faults, {:.1} ms quiet", self.fault_p99_ms, self.quiet_p99_ms),
        );
        let slowest = self.ingest_resume_s.iter().copied().fold(0.0, f64::max);
        want(slowest <= 1.0, format!("ingest resumed {slowest:.2} s after a SIGKILL (target 1 s)"));
        out
    }

    /// The table printed at the end of every run.
    pub fn table(&self) -> String {
        let max = |v: &[f64]| v.iter().copied().fold(0.0, f64::max);
        let median = |v: &[f64]| {
            let mut s = v.to_vec();
            s.sort_by(f64::total_cmp);
            s.get(s.len() / 2).copied().unwrap_or(0.0)
        };
        let faults: Vec<String> = self.faults.iter().map(|(k, n)| format!("{n} {k}")).collect();
        let rows = [
            ("faults", format!("{} ({})", self.faults.values().sum::<u64>(), faults.join(", ")), String::new()),
            ("acknowledged batches / points", format!("{} / {}", self.acked_batches, self.acked_points), String::new()),
            ("acknowledged points missing", self.missing.to_string(), "0".into()),
            ("stale vectors / phantoms", format!("{} / {}", self.stale, self.phantoms), "0 / 0".into()),
            ("shards whose replicas disagree", self.replicas_disagree.to_string(), "0".into()),
            ("searches (redirected to the other coordinator)", format!("{} ({})", self.searches, self.searches_redirected), String::new()),
            ("failed / partial searches", format!("{} / {}", self.failed_searches, self.partial_searches), "0 / 0".into()),
            ("recall@10 quiet → faults", format!("{:.4} → {:.4}", self.quiet_recall, self.fault_recall), "within 0.01".into()),
            ("search p99 quiet → faults", format!("{:.1} → {:.1} ms", self.quiet_p99_ms, self.fault_p99_ms), "≤ 3x".into()),
            (
                "ingest flowing again after a SIGKILL (median / max)",
                format!("{:.2} / {:.2} s over {}", median(&self.ingest_resume_s), max(&self.ingest_resume_s), self.ingest_resume_s.len()),
                "≤ 1 s".into(),
            ),
            (
                "a replica back in sync after its node's restart (median / max)",
                format!("{:.2} / {:.2} s over {}", median(&self.rejoin_s), max(&self.rejoin_s), self.rejoin_s.len()),
                String::new(),
            ),
            (
                "a replica repaired onto another node after a kill (median / max)",
                format!("{:.2} / {:.2} s over {}", median(&self.repair_s), max(&self.repair_s), self.repair_s.len()),
                String::new(),
            ),
            (
                "a repaired node holding copies again after a rebalance (median / max)",
                format!("{:.2} / {:.2} s over {}", median(&self.rebalance_s), max(&self.rebalance_s), self.rebalance_s.len()),
                String::new(),
            ),
            ("settled after the last fault", format!("{:.2} s", self.settle_s), String::new()),
        ];
        let mut out = String::from("| measured | figure | target |\n|---|---|---|\n");
        for (what, figure, target) in rows {
            out.push_str(&format!("| {what} | {figure} | {target} |\n"));
        }
        if self.low_recall_searches > 0 {
            out.push_str(&format!("\n{} searches under faults answered whole with recall below 0.5\n", self.low_recall_searches));
        }
        if !self.search_failures.is_empty() {
            out.push_str("\nfailed searches by kind:\n");
            for (kind, n) in &self.search_failures {
                out.push_str(&format!("  {n:>9}  {kind}\n"));
            }
            out.push_str("the first:\n");
            for (at, e) in &self.first_failures {
                out.push_str(&format!("  {at:>8.2} s  {e}\n"));
            }
        }
        out
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

/// One search's outcome, timed from the run's start.
struct Searched {
    at: Duration,
    took: Duration,
    ok: bool,
    partial: bool,
    redirected: bool,
    /// Of the collection whose recall is measured.
    measured: bool,
    recall: f64,
    /// A failed search's code and message, digits left out so that like
    /// failures count together.
    error: Option<String>,
}

/// One stream's acknowledged batch.
struct Acked {
    first_sent: Duration,
    acked: Duration,
    ids: std::ops::Range<u64>,
    seed: u64,
}

/// What happened when, for the figures.
#[derive(Default)]
struct Timeline {
    /// When faults started (the quiet phase ends there).
    faults_from: Option<Duration>,
    node_kills: Vec<Duration>,
    rejoin_s: Vec<f64>,
    repair_s: Vec<f64>,
    rebalance_s: Vec<f64>,
    faults: BTreeMap<String, u64>,
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

/// Coordinators in order of preference; on a refused connection, the next.
#[derive(Clone)]
struct Clients {
    clients: Vec<ShoalClient<Channel>>,
}

impl Clients {
    fn connect(endpoints: &[String]) -> anyhow::Result<Clients> {
        let mut clients = Vec::new();
        for e in endpoints {
            let channel = Channel::from_shared(e.clone())?.connect_timeout(Duration::from_millis(500)).connect_lazy();
            clients.push(ShoalClient::new(channel).max_decoding_message_size(64 << 20));
        }
        Ok(Clients { clients })
    }
}

/// A refused or broken connection (no answer from a coordinator, which
/// always sends a retry hint with UNAVAILABLE): the coordinator is gone.
fn coordinator_gone(s: &tonic::Status) -> bool {
    use tonic::Code::{Cancelled, Unavailable, Unknown};
    matches!(s.code(), Unavailable | Unknown | Cancelled) && s.metadata().get(shoal_proto::RETRY_AFTER_MS).is_none()
}

/// The request itself is wrong: sending it again cannot help.
fn request_fault(s: &tonic::Status) -> bool {
    use tonic::Code::{AlreadyExists, InvalidArgument, NotFound, PermissionDenied, Unauthenticated, Unimplemented};
    matches!(s.code(), InvalidArgument | NotFound | AlreadyExists | PermissionDenied | Unauthenticated | Unimplemented)
}

fn retry_after(s: &tonic::Status) -> Duration {
    let hint = s.metadata().get(shoal_proto::RETRY_AFTER_MS).and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(100);
    Duration::from_millis(hint).min(Duration::from_millis(250))
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
        let (cfg, cluster, etcd, timeline, admins) =
            (cfg.clone(), Arc::clone(cluster), Arc::clone(etcd), Arc::clone(&timeline), clients.clone());
        tokio::spawn(async move { run_faults(&cfg, fault_seed, &cluster, &etcd, &timeline, admins, started).await })
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

async fn ingest_stream(
    s: usize,
    clients: Clients,
    stop: Arc<std::sync::atomic::AtomicBool>,
    batch: usize,
    dim: usize,
    seed: u64,
    started: Instant,
) -> anyhow::Result<Vec<Acked>> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut acked = Vec::new();
    let mut at = 0usize;
    for offset in 1u64.. {
        if stop.load(std::sync::atomic::Ordering::Relaxed) {
            break;
        }
        let first_id = 1_000_000_000 * (s as u64 + 1) + (offset - 1) * batch as u64;
        let vseed = rng.random::<u64>();
        let points: Vec<v1::Point> = batch_vectors(vseed, batch, dim)
            .into_iter()
            .enumerate()
            .map(|(j, vector)| v1::Point { id: first_id + j as u64, vector, payload: None })
            .collect();
        let req = v1::IngestRequest { collection: "chaos".into(), source: format!("stream-{s}"), offset, points, ..Default::default() };
        let first_sent = started.elapsed();
        // Until acknowledged: the same offset again is applied at most once.
        let deadline = Instant::now() + Duration::from_secs(120);
        loop {
            let mut client = clients.clients[at % clients.clients.len()].clone();
            let sent = async {
                let mut acks = client.ingest(tokio_stream::iter(vec![req.clone()])).await?.into_inner();
                acks.message().await?.ok_or_else(|| tonic::Status::unavailable("the stream ended without an ack"))
            };
            match tokio::time::timeout(Duration::from_secs(30), sent).await {
                Ok(Ok(_ack)) => break,
                Ok(Err(e)) if request_fault(&e) => bail!("stream-{s} batch {offset}: {e:?}"),
                Ok(Err(e)) if coordinator_gone(&e) => at += 1,
                // Refused for now (a replica dropping out, etcd away):
                // the same batch again, after the hint.
                Ok(Err(e)) => tokio::time::sleep(retry_after(&e)).await,
                Err(_) => at += 1,
            }
            if Instant::now() > deadline {
                bail!("stream-{s} batch {offset} was not acknowledged within 120 s");
            }
        }
        acked.push(Acked { first_sent, acked: started.elapsed(), ids: first_id..first_id + batch as u64, seed: vseed });
    }
    Ok(acked)
}

async fn search_loop(
    clients: Clients,
    stop: Arc<std::sync::atomic::AtomicBool>,
    data: Arc<Data>,
    seed: u64,
    started: Instant,
) -> Vec<Searched> {
    let mut rng = StdRng::seed_from_u64(seed);
    let mut out = Vec::new();
    let mut at = rng.random_range(0..clients.clients.len());
    while !stop.load(std::sync::atomic::Ordering::Relaxed) {
        let (q, truth) = &data.queries[rng.random_range(0..data.queries.len())];
        // Every other search reads the collection being written; recall is
        // measured on the other (see COLLECTIONS).
        let measured = rng.random_bool(0.5);
        let collection = if measured { "still" } else { "chaos" };
        let req = v1::SearchRequest { collection: collection.into(), vector: q.clone(), k: 10, ef: 64, ..Default::default() };
        let t0 = Instant::now();
        let at_s = started.elapsed();
        let mut redirected = false;
        let mut answer = None;
        for _ in 0..clients.clients.len() {
            match clients.clients[at % clients.clients.len()].clone().search(req.clone()).await {
                Err(e) if coordinator_gone(&e) => {
                    at += 1;
                    redirected = true;
                }
                r => {
                    answer = Some(r);
                    break;
                }
            }
        }
        let took = t0.elapsed();
        let s = match answer {
            Some(Ok(r)) => {
                let r = r.into_inner();
                let found = r.hits.iter().filter(|h| truth.contains(&h.id)).count();
                Searched { at: at_s, took, ok: true, partial: r.partial, redirected, measured, recall: found as f64 / 10.0, error: None }
            }
            Some(Err(e)) => {
                let error = Some(format!("{:?}: {}", e.code(), e.message()));
                Searched { at: at_s, took, ok: false, partial: false, redirected, measured, recall: 0.0, error }
            }
            None => {
                let error = Some("no coordinator answered".to_owned());
                Searched { at: at_s, took, ok: false, partial: false, redirected, measured, recall: 0.0, error }
            }
        };
        out.push(s);
    }
    out
}

/// A failure's code and message with digits left out (ports, ids,
/// durations), so that failures of one kind count together.
fn failure_kind(error: &str) -> String {
    error.chars().filter(|c| !c.is_ascii_digit()).take(160).collect()
}

/// A shard node (by index) that holds copies and whose loss leaves every
/// shard with an in-sync copy on a node that is up, picked at random among
/// those not in `busy`; `None` if there is none (or the status cannot be
/// read).
async fn node_safe_to_lose(admin: &Clients, nodes: usize, busy: &HashSet<usize>, rng: &mut StdRng) -> Option<usize> {
    let shards: Vec<v1::ShardInfo> = all_shards(admin).await.ok()?.into_iter().map(|(_, s)| s).collect();
    let serving = |r: &v1::ReplicaInfo| r.state == "active" && !r.node_down;
    let safe: Vec<usize> = (0..nodes)
        .filter(|n| !busy.contains(n))
        .filter(|n| {
            let id = format!("shard-{n}");
            // A node without copies loses nothing when it fails.
            let holds = shards.iter().flat_map(|s| &s.replicas).any(|r| r.node == id);
            let up = shards.iter().flat_map(|s| &s.replicas).all(|r| r.node != id || !r.node_down);
            holds
                && up
                && shards.iter().all(|s| !s.replicas.iter().any(|r| r.node == id) || s.replicas.iter().any(|r| r.node != id && serving(r)))
        })
        .collect();
    (!safe.is_empty()).then(|| safe[rng.random_range(0..safe.len())])
}

/// Every shard of both collections, each with its key (`collection/shard`),
/// from the first coordinator that answers (one may be the controller
/// just killed).
async fn all_shards(admins: &Clients) -> Result<Vec<(String, v1::ShardInfo)>, String> {
    let mut last = String::from("no coordinator");
    for admin in &admins.clients {
        let mut admin = admin.clone();
        let mut shards = Vec::new();
        let mut failed = None;
        for name in COLLECTIONS {
            match admin.describe_collection(v1::DescribeCollectionRequest { name: name.into() }).await {
                Ok(info) => shards.extend(info.into_inner().shards.into_iter().map(|s| (format!("{name}/{}", s.shard), s))),
                Err(e) => {
                    failed = Some(e.to_string());
                    break;
                }
            }
        }
        match failed {
            None => return Ok(shards),
            Some(e) => last = e,
        }
    }
    Err(last)
}

/// Nodes a fault still plays out on (killed and not yet back in sync, or
/// not yet repaired elsewhere): no other node fault picks them meanwhile.
type Busy = Arc<Mutex<HashSet<usize>>>;

/// The faults, one every `fault_every`, rotating through the kinds. A node
/// fault (SIGKILL, SIGSTOP) hits a node whose every shard has another copy
/// in sync on a node that is up: with two copies, a node lost while a
/// shard's other copy is still catching up takes that shard's last copy,
/// which no replication factor of two survives. When no node is safe to
/// lose, the controller or etcd take the node fault's turn, so faults keep
/// coming. A killed node's return (rejoin, or repair and then return) is
/// awaited and timed by a task of its own, so that the next faults do not
/// wait for it.
async fn run_faults(
    cfg: &ChaosConfig,
    seed: u64,
    cluster: &Arc<Mutex<ProcessCluster>>,
    etcd: &Arc<Mutex<Etcd>>,
    timeline: &Arc<Mutex<Timeline>>,
    admins: Clients,
    started: Instant,
) -> anyhow::Result<()> {
    let mut rng = StdRng::seed_from_u64(seed);
    let end = Instant::now() + cfg.faults_for;
    let busy: Busy = Arc::default();
    let mut returns = Vec::new();
    let mut kills = 0usize;
    for i in 0.. {
        if Instant::now() >= end {
            break;
        }
        let began = Instant::now();
        let mut turn = i % 4;
        let mut node = 0;
        if turn < 2 {
            let taken = busy.lock().clone();
            match node_safe_to_lose(&admins, cfg.shard_nodes, &taken, &mut rng).await {
                Some(n) => node = n,
                None => turn = 2 + (i / 4) % 2,
            }
        }
        let kind = match turn {
            0 => {
                kills += 1;
                // Safe to lose was just read, so the shards it holds can be.
                let Ok(shards) = all_shards(&admins).await else { continue };
                let held: HashSet<String> = shards
                    .into_iter()
                    .filter(|(_, s)| s.replicas.iter().any(|r| r.node == format!("shard-{node}")))
                    .map(|(key, _)| key)
                    .collect();
                busy.lock().insert(node);
                timeline.lock().node_kills.push(started.elapsed());
                blocking(cluster, move |c| c.nodes[node].kill().map(|_| ())).await?;
                let long = kills.is_multiple_of(2);
                let pause = Duration::from_millis(rng.random_range(500..2_000));
                let back = NodeReturn {
                    node,
                    held,
                    long,
                    pause,
                    within: cfg.lease_ttl + cfg.repair_after + Duration::from_secs(150),
                    rebalance_returned: cfg.rebalance_returned,
                    factor: cfg.replication_factor as usize,
                };
                let (cluster, timeline, busy, admins) = (Arc::clone(cluster), Arc::clone(timeline), Arc::clone(&busy), admins.clone());
                returns.push(tokio::spawn(async move { back.run(cluster, timeline, busy, admins).await }));
                if long { "node SIGKILL, back after repair" } else { "node SIGKILL and restart" }
            }
            1 => {
                blocking(cluster, move |c| c.nodes[node].stop()).await?;
                tokio::time::sleep(Duration::from_millis(rng.random_range(1_000..3_000))).await;
                blocking(cluster, move |c| c.nodes[node].resume()).await?;
                "node SIGSTOP for 1-3 s"
            }
            2 => {
                let mut controller = String::new();
                for admin in &admins.clients {
                    if let Ok(s) = admin.clone().cluster_status(v1::ClusterStatusRequest {}).await {
                        controller = s.into_inner().control_plane.map(|c| c.controller).unwrap_or_default();
                        break;
                    }
                }
                blocking(cluster, move |c| {
                    let all = std::iter::once(&mut c.coordinator).chain(c.more_coordinators.iter_mut());
                    for p in all {
                        if p.id == controller {
                            p.kill()?;
                            std::thread::sleep(Duration::from_millis(500));
                            return p.restart();
                        }
                    }
                    Ok(())
                })
                .await?;
                "controller SIGKILL and restart"
            }
            _ => {
                let etcd = Arc::clone(etcd);
                tokio::task::spawn_blocking(move || {
                    let mut e = etcd.lock();
                    e.kill();
                    std::thread::sleep(Duration::from_millis(500));
                    e.spawn()
                })
                .await??;
                "etcd restart"
            }
        };
        *timeline.lock().faults.entry(kind.to_owned()).or_insert(0) += 1;
        let spent = began.elapsed();
        if spent < cfg.fault_every {
            tokio::time::sleep(cfg.fault_every - spent).await;
        }
    }
    for r in returns {
        r.await??;
    }
    Ok(())
}

/// A killed node's way back, timed. After a short pause it is restarted
/// and its copies rejoin; after a long one (past the lease and the repair
/// delay) its copies are first made again on other nodes, and it returns
/// to a cluster that no longer counts on it.
struct NodeReturn {
    node: usize,
    /// The shards (`collection/shard`) that had a copy on it when killed.
    held: HashSet<String>,
    long: bool,
    pause: Duration,
    within: Duration,
    rebalance_returned: bool,
    factor: usize,
}

impl NodeReturn {
    async fn run(
        self,
        cluster: Arc<Mutex<ProcessCluster>>,
        timeline: Arc<Mutex<Timeline>>,
        busy: Busy,
        admins: Clients,
    ) -> anyhow::Result<()> {
        let (node, id) = (self.node, format!("shard-{}", self.node));
        if self.long {
            // Each shard it held: `factor` copies in sync, none on it.
            let repaired = self
                .each_shard(&admins, |s| s.replicas.len() == self.factor && s.replicas.iter().all(|r| r.state == "active" && r.node != id))
                .await;
            timeline.lock().repair_s.extend(repaired);
            blocking(&cluster, move |c| c.nodes[node].restart()).await?;
            // Back empty: its copies live elsewhere now. As an operator
            // would (docs/runbooks/replace-a-node.md), even the shards out
            // with a rebalance, so that it holds copies again and later
            // faults on it lose something.
            let back = Instant::now();
            if self.rebalance_returned && self.rebalance(&admins, &id).await {
                timeline.lock().rebalance_s.push(back.elapsed().as_secs_f64());
            }
        } else {
            tokio::time::sleep(self.pause).await;
            blocking(&cluster, move |c| c.nodes[node].restart()).await?;
            // Each of its copies in sync again, its node counted as up.
            // Only the written collection's: the other's copies miss no
            // write while the node is down, so they have nothing to rejoin.
            let rejoined = NodeReturn { held: self.held.iter().filter(|k| k.starts_with("chaos/")).cloned().collect(), ..self }
                .each_shard(&admins, |s| s.replicas.iter().filter(|r| r.node == id).all(|r| r.state == "active" && !r.node_down))
                .await;
            timeline.lock().rejoin_s.extend(rejoined);
        }
        busy.lock().remove(&node);
        Ok(())
    }

    /// Asks for a rebalance (on the first coordinator that takes it, again
    /// every few seconds) until the node holds an active copy, within the
    /// bound.
    async fn rebalance(&self, admins: &Clients, id: &str) -> bool {
        let started = Instant::now();
        let mut asked: Option<Instant> = None;
        while started.elapsed() < self.within {
            if let Ok(shards) = all_shards(admins).await {
                if shards.iter().any(|(_, s)| s.replicas.iter().any(|r| r.node == id && r.state == "active")) {
                    return true;
                }
                if asked.is_none_or(|at| at.elapsed() > Duration::from_secs(5)) {
                    for admin in &admins.clients {
                        if admin.clone().rebalance(v1::RebalanceRequest { dry_run: false, wait: false }).await.is_ok() {
                            asked = Some(Instant::now());
                            break;
                        }
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
        false
    }

    /// Seconds until each shard it held satisfied `ok` (and did not move),
    /// for those that did within the bound: per replica, so that a shard
    /// slowed by another fault does not hide the others.
    async fn each_shard(&self, admins: &Clients, ok: impl Fn(&v1::ShardInfo) -> bool) -> Vec<f64> {
        let started = Instant::now();
        let mut waiting = self.held.clone();
        let mut took = Vec::new();
        while !waiting.is_empty() && started.elapsed() < self.within {
            if let Ok(shards) = all_shards(admins).await {
                for (key, s) in &shards {
                    if waiting.contains(key) && s.moving.is_none() && ok(s) {
                        waiting.remove(key);
                        took.push(started.elapsed().as_secs_f64());
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        took
    }
}

async fn blocking(
    cluster: &Arc<Mutex<ProcessCluster>>,
    f: impl FnOnce(&mut ProcessCluster) -> anyhow::Result<()> + Send + 'static,
) -> anyhow::Result<()> {
    let cluster = Arc::clone(cluster);
    tokio::task::spawn_blocking(move || f(&mut cluster.lock())).await?
}

/// Waits until every shard of both collections holds `factor` active
/// copies and none moves.
async fn settle(admins: &Clients, factor: usize, within: Duration) -> Result<(), String> {
    let started = Instant::now();
    let ok = |s: &v1::ShardInfo| s.moving.is_none() && s.replicas.len() == factor && s.replicas.iter().all(|r| r.state == "active");
    loop {
        let last = match all_shards(admins).await {
            Ok(shards) => shards.iter().find(|(_, s)| !ok(s)).map(|(key, s)| format!("{key}: {:?}", s.replicas)),
            Err(e) => Some(e),
        };
        let Some(last) = last else { return Ok(()) };
        if started.elapsed() >= within {
            return Err(format!("not every shard had {factor} copies in sync within {within:?}: {last}"));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn figures(r: &mut ChaosReport, tl: &Timeline, acked: &[Vec<Acked>], searched: &[Searched]) {
    r.faults = tl.faults.clone();
    r.rejoin_s = tl.rejoin_s.clone();
    r.repair_s = tl.repair_s.clone();
    r.rebalance_s = tl.rebalance_s.clone();
    let from = tl.faults_from.unwrap_or_default();
    let (quiet, faulty): (Vec<&Searched>, Vec<&Searched>) = searched.iter().partition(|s| s.at < from);
    r.searches = searched.len() as u64;
    r.failed_searches = searched.iter().filter(|s| !s.ok).count() as u64;
    r.partial_searches = searched.iter().filter(|s| s.partial).count() as u64;
    r.searches_redirected = searched.iter().filter(|s| s.redirected).count() as u64;
    let mut failures: BTreeMap<String, u64> = BTreeMap::new();
    for e in searched.iter().filter_map(|s| s.error.as_ref()) {
        *failures.entry(failure_kind(e)).or_insert(0) += 1;
    }
    r.first_failures = searched.iter().filter_map(|s| Some((s.at.as_secs_f64(), s.error.clone()?))).take(10).collect();
    r.search_failures = failures.into_iter().collect();
    r.search_failures.sort_by_key(|f| std::cmp::Reverse(f.1));
    r.search_failures.truncate(10);
    r.low_recall_searches = faulty.iter().filter(|s| s.ok && s.measured && !s.partial && s.recall < 0.5).count() as u64;
    let recall = |v: &[&Searched]| {
        let answered = || v.iter().filter(|s| s.ok && s.measured);
        answered().map(|s| s.recall).sum::<f64>() / answered().count().max(1) as f64
    };
    let p99 = |v: &[&Searched]| {
        let mut t: Vec<f64> = v.iter().map(|s| s.took.as_secs_f64() * 1e3).collect();
        t.sort_by(f64::total_cmp);
        t.get((t.len() * 99 / 100).min(t.len().saturating_sub(1))).copied().unwrap_or(0.0)
    };
    r.quiet_recall = recall(&quiet);
    r.fault_recall = recall(&faulty);
    r.quiet_p99_ms = p99(&quiet);
    r.fault_p99_ms = p99(&faulty);
    // After each kill: when every stream had a batch sent after it acknowledged.
    for &k in &tl.node_kills {
        let resumed = acked.iter().filter_map(|stream| stream.iter().find(|a| a.first_sent >= k).map(|a| a.acked.saturating_sub(k))).max();
        if let Some(d) = resumed {
            r.ingest_resume_s.push(d.as_secs_f64());
        }
    }
    r.acked_batches = acked.iter().map(Vec::len).sum::<usize>() as u64;
    r.acked_points = acked.iter().flatten().map(|a| a.ids.end - a.ids.start).sum();
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
