//! What the load goes to: coordinators by URL (requests spread over them),
//! an embedded cluster (in this process, on its own runtime), or separate
//! shard-node and coordinator processes started from a directory of
//! binaries, which the fault hooks can kill, stop, resume and restart.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use anyhow::{Context, Result, anyhow, bail, ensure};
use parking_lot::Mutex;
use serde::Serialize;
use shoal_ops::embedded::{EmbeddedCluster, EmbeddedConfig};
use shoal_ops::procs::{ClusterSpec, Launcher, Proc, ProcessCluster};
use shoal_proto::auth::{BearerKey, KeyedClient};
use shoal_proto::v1;
use shoal_proto::v1::shoal_client::ShoalClient;
use tonic::transport::Endpoint;

use super::stats::code_name;

/// Where the load goes, and the collection it uses.
#[derive(clap::Args, Debug, Clone, Serialize)]
pub(crate) struct TargetArgs {
    /// A coordinator's URL (repeat for several: requests are spread over them).
    #[arg(long = "coordinator", value_name = "URL", conflicts_with_all = ["embedded", "processes"])]
    pub(crate) coordinators: Vec<String>,
    /// Start a cluster of N shard nodes and a coordinator in this process.
    #[arg(long, value_name = "N", conflicts_with = "processes")]
    pub(crate) embedded: Option<usize>,
    /// Start separate processes from BIN_DIR (shoal-shard-node,
    /// shoal-coordinator): --shard-nodes nodes and one coordinator.
    #[arg(long, value_name = "BIN_DIR")]
    pub(crate) processes: Option<PathBuf>,
    /// Shard-node processes to start with --processes.
    #[arg(long, default_value_t = 3, value_name = "N")]
    pub(crate) shard_nodes: usize,
    /// KEY=VALUE in the environment of every started process (repeat), e.g.
    /// SHOAL_SHARD_ENGINE__DURABLE=false.
    #[arg(long = "env", value_name = "KEY=VALUE", value_parser = parse_env)]
    pub(crate) env: Vec<(String, String)>,
    /// Where a started cluster keeps its data and logs (default: a temporary
    /// directory, removed afterwards).
    #[arg(long, value_name = "DIR")]
    pub(crate) dir: Option<PathBuf>,
    /// gRPC connections to each coordinator.
    #[arg(long, default_value_t = 1)]
    pub(crate) connections: usize,
    /// TLS: with `--embedded`, every process of the cluster serves TLS
    /// (mutual between coordinator and nodes) with certificates made for
    /// the run; with `--coordinator`, give `--tls-ca`.
    #[arg(long)]
    pub(crate) tls: bool,
    /// CA certificate (PEM) of the coordinators given with `--coordinator`:
    /// speak TLS to them.
    #[arg(long, value_name = "PEM")]
    pub(crate) tls_ca: Option<PathBuf>,
    /// API key sent with every call (`authorization: Bearer <key>`), when
    /// the coordinators require keys (docs/security.md). A cluster this
    /// run starts requires none. Never written to the report.
    #[arg(long, env = "SHOAL_API_KEY", hide_env_values = true, value_name = "KEY", value_parser = |s: &str| Ok::<_, String>(ApiKey(s.to_owned())))]
    #[serde(skip)]
    pub(crate) api_key: Option<ApiKey>,
    /// The collection.
    #[arg(long, default_value = "loadtest")]
    pub(crate) collection: String,
    /// Create the collection first (always done on a started cluster).
    #[arg(long)]
    pub(crate) create: bool,
    /// Metric of the created collection (and of --exact-groundtruth).
    #[arg(long, default_value = "cosine", value_parser = ["cosine", "dot", "euclidean"])]
    pub(crate) metric: String,
    /// Shards of the created collection (0: the cluster's default).
    #[arg(long, default_value_t = 0)]
    pub(crate) shards: u32,
    /// HNSW M of the created collection (0: default).
    #[arg(long, default_value_t = 0)]
    pub(crate) m: u32,
    /// HNSW ef_construction of the created collection (0: default).
    #[arg(long, default_value_t = 0)]
    pub(crate) ef_construction: u32,
    /// A payload index of the created collection, as FIELD:TYPE (keyword,
    /// integer, float, bool, datetime); repeatable.
    #[arg(long = "index", value_name = "FIELD:TYPE", value_parser = check_index)]
    pub(crate) indexes: Vec<String>,
}

/// Kept as written (so the report shows it), checked before anything starts.
fn check_index(s: &str) -> Result<String, String> {
    shoal_ops::points::parse_index(s).map(|_| s.to_owned()).map_err(|e| format!("{e:#}"))
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    s.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())).ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))
}

/// An API key. Its `Debug` does not show it, so that printing the
/// arguments never leaks it (the report skips it too). It is checked in
/// [`Target::start`], not by clap, whose error would repeat the value.
#[derive(Clone)]
pub(crate) struct ApiKey(String);

impl std::fmt::Debug for ApiKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ApiKey(..)")
    }
}

/// Clients of the coordinators, handed out in turn.
#[derive(Clone)]
pub(crate) struct Clients {
    list: Arc<Vec<KeyedClient>>,
    next: Arc<AtomicUsize>,
}

impl Clients {
    /// One connection per URL and `connections`, over TLS when `tls_ca` is
    /// given; every call carries `key` (the interceptor shoalctl uses).
    pub(crate) async fn connect(urls: &[String], connections: usize, tls_ca: Option<&std::path::Path>, key: BearerKey) -> Result<Clients> {
        let tls = tls_ca.map(|ca| shoal_server::ClientTls::with_ca(ca).load()).transpose()?;
        let mut list = Vec::new();
        for url in urls {
            let url = match (&tls, url.contains("://")) {
                (Some(_), _) => shoal_server::tls::https(url),
                (None, true) => url.clone(),
                (None, false) => format!("http://{url}"),
            };
            for _ in 0..connections.max(1) {
                let mut endpoint = Endpoint::from_shared(url.clone()).with_context(|| format!("coordinator URL {url:?}"))?;
                if let Some(t) = &tls {
                    endpoint = endpoint.tls_config(t.clone())?;
                }
                let channel = endpoint
                    .connect_timeout(Duration::from_secs(5))
                    .tcp_nodelay(true)
                    .http2_keep_alive_interval(Duration::from_secs(5))
                    .keep_alive_timeout(Duration::from_secs(5))
                    .connect()
                    .await
                    .with_context(|| format!("connecting to {url}"))?;
                list.push(
                    ShoalClient::with_interceptor(channel, key.clone())
                        .max_decoding_message_size(256 << 20)
                        .max_encoding_message_size(256 << 20),
                );
            }
        }
        ensure!(!list.is_empty(), "no coordinator: give --coordinator URL, --embedded N or --processes BIN_DIR");
        Ok(Clients { list: Arc::new(list), next: Arc::new(AtomicUsize::new(0)) })
    }

    /// The next client in turn.
    pub(crate) fn next(&self) -> KeyedClient {
        self.list[self.next.fetch_add(1, Ordering::Relaxed) % self.list.len()].clone()
    }
}

/// A cluster this run started, to stop at the end.
enum Started {
    None,
    Embedded { stop: tokio::sync::oneshot::Sender<()>, thread: std::thread::JoinHandle<Result<()>> },
    Processes(Arc<Mutex<ProcessCluster>>),
}

/// The target of a run.
pub(crate) struct Target {
    pub(crate) clients: Clients,
    pub(crate) kind: &'static str,
    pub(crate) urls: Vec<String>,
    started: Started,
    _tmp: Option<tempfile::TempDir>,
}

impl Target {
    pub(crate) async fn start(a: &TargetArgs) -> Result<Target> {
        let dir = || -> Result<(PathBuf, Option<tempfile::TempDir>)> {
            match &a.dir {
                Some(d) => {
                    ensure!(
                        !d.read_dir().is_ok_and(|mut e| e.next().is_some()),
                        "{} holds an earlier run; remove it or choose another --dir",
                        d.display()
                    );
                    Ok((d.clone(), None))
                }
                None => {
                    let t = tempfile::tempdir()?;
                    Ok((t.path().to_owned(), Some(t)))
                }
            }
        };
        ensure!(!a.tls || a.embedded.is_some(), "--tls starts a TLS cluster with --embedded; for --coordinator give --tls-ca");
        // Before anything is started: a key that cannot be a header value
        // (not printable ASCII) would fail every call. The message never
        // repeats the key. A blank key sends no header, as in shoalctl.
        let api_key = a.api_key.as_ref().map(|k| k.0.as_str());
        let key = BearerKey::new(api_key).map_err(|e| anyhow!("--api-key: {e}"))?;
        let mut tls_ca = a.tls_ca.clone();
        let (urls, started, kind, tmp) = if let Some(n) = a.embedded {
            ensure!(n > 0, "--embedded needs at least 1 shard node");
            if !a.env.is_empty() {
                eprintln!("warning: --env applies to started processes, not to an embedded cluster");
            }
            let (path, tmp) = dir()?;
            let mut cfg = EmbeddedConfig::ephemeral(&path, n);
            if a.tls {
                let certs = shoal_ops::security::make_cluster_certs(&path.join("tls"), &[])?;
                cfg.use_tls(&path.join("tls"));
                tls_ca = Some(certs.ca);
            }
            let (url, started) = start_embedded(cfg).await?;
            (vec![url], started, "embedded", tmp)
        } else if let Some(bin) = &a.processes {
            ensure!(a.shard_nodes > 0, "--shard-nodes must be at least 1");
            for b in ["shoal-shard-node", "shoal-coordinator"] {
                ensure!(
                    bin.join(b).is_file(),
                    "{} has no {b} (build with cargo build --release -p shoal-shard-node -p shoal-coordinator)",
                    bin.display()
                );
            }
            let (path, tmp) = dir()?;
            let mut spec = ClusterSpec::new(Launcher::Binaries(bin.clone()), path, a.shard_nodes);
            spec.node_env.extend(a.env.iter().cloned());
            spec.coordinator_env.extend(a.env.iter().cloned());
            let cluster = tokio::task::spawn_blocking(move || ProcessCluster::start(&spec)).await??;
            (vec![cluster.endpoint()], Started::Processes(Arc::new(Mutex::new(cluster))), "processes", tmp)
        } else {
            ensure!(!a.coordinators.is_empty(), "no target: give --coordinator URL, --embedded N or --processes BIN_DIR");
            (a.coordinators.clone(), Started::None, "coordinators", None)
        };
        if api_key.is_some_and(|k| !k.trim().is_empty()) && !matches!(started, Started::None) {
            eprintln!("warning: --api-key is sent, but the cluster this run starts requires no key");
        }
        let clients = Clients::connect(&urls, a.connections, tls_ca.as_deref(), key).await?;
        Ok(Target { clients, kind, urls, started, _tmp: tmp })
    }

    /// Whether this run started the cluster (so it is empty).
    pub(crate) fn started_here(&self) -> bool {
        !matches!(self.started, Started::None)
    }

    /// The processes, for the fault hooks.
    pub(crate) fn processes(&self) -> Option<Arc<Mutex<ProcessCluster>>> {
        match &self.started {
            Started::Processes(p) => Some(p.clone()),
            Started::None | Started::Embedded { .. } => None,
        }
    }

    /// Creates the collection (with `--create`, or on a started cluster) or
    /// checks that it exists with dimension `dim`. True if created.
    pub(crate) async fn prepare_collection(&self, a: &TargetArgs, dim: usize) -> Result<bool> {
        let mut c = self.clients.next();
        if a.create || self.started_here() {
            let metric = match a.metric.as_str() {
                "dot" => v1::Metric::Dot,
                "euclidean" => v1::Metric::Euclidean,
                _ => v1::Metric::Cosine,
            };
            let index = (a.m > 0 || a.ef_construction > 0).then_some(v1::IndexParams { m: a.m, ef_construction: a.ef_construction });
            let field_indexes = a.indexes.iter().map(|s| shoal_ops::points::parse_index(s)).collect::<Result<_>>()?;
            c.create_collection(v1::CreateCollectionRequest {
                name: a.collection.clone(),
                dimension: dim as u32,
                metric: metric as i32,
                shard_count: a.shards,
                index,
                field_indexes,
                ..Default::default()
            })
            .await
            .map_err(|s| anyhow!("creating collection {:?}: {}: {}", a.collection, code_name(s.code()), s.message()))?;
            return Ok(true);
        }
        let info = c
            .describe_collection(v1::DescribeCollectionRequest { name: a.collection.clone() })
            .await
            .map_err(|s| anyhow!("collection {:?}: {}: {} (--create makes it)", a.collection, code_name(s.code()), s.message()))?
            .into_inner();
        ensure!(info.dimension as usize == dim, "collection {:?} holds {}-d vectors, the data has {dim}", a.collection, info.dimension);
        if !a.indexes.is_empty() {
            eprintln!("warning: --index applies to a collection the run creates; {:?} keeps the indexes it has", a.collection);
        }
        Ok(false)
    }

    /// Points in the collection, as the shards count them.
    pub(crate) async fn collection_points(&self, name: &str) -> Result<u64> {
        let info = self
            .clients
            .next()
            .describe_collection(v1::DescribeCollectionRequest { name: name.to_owned() })
            .await
            .map_err(|s| anyhow!("{}: {}", code_name(s.code()), s.message()))?
            .into_inner();
        Ok(info.points)
    }

    /// Stops what this run started.
    pub(crate) async fn shutdown(self) -> Result<()> {
        let Target { clients, started, _tmp, .. } = self;
        drop(clients);
        match started {
            Started::None => {}
            Started::Embedded { stop, thread } => {
                let _ = stop.send(());
                tokio::task::spawn_blocking(move || thread.join().map_err(|_| anyhow!("the embedded cluster panicked"))?).await??;
            }
            Started::Processes(p) => {
                // Dropping the processes kills them (resuming stopped ones first).
                tokio::task::spawn_blocking(move || drop(p)).await?;
            }
        }
        Ok(())
    }
}

/// Runs the embedded cluster on a runtime of its own, so that its work and
/// the load generator's timers do not queue behind each other's tasks.
async fn start_embedded(cfg: EmbeddedConfig) -> Result<(String, Started)> {
    let (ready_tx, ready_rx) = tokio::sync::oneshot::channel();
    let (stop, stop_rx) = tokio::sync::oneshot::channel::<()>();
    let thread = std::thread::Builder::new().name("embedded-cluster".into()).spawn(move || -> Result<()> {
        let rt = tokio::runtime::Builder::new_multi_thread().enable_all().thread_name("embedded").build()?;
        rt.block_on(async move {
            match EmbeddedCluster::start(cfg).await {
                Ok(cluster) => {
                    let _ = ready_tx.send(Ok(cluster.endpoint()));
                    let _ = stop_rx.await;
                    cluster.shutdown().await
                }
                Err(e) => {
                    let _ = ready_tx.send(Err(e));
                    Ok(())
                }
            }
        })
    })?;
    let url = ready_rx.await.map_err(|_| anyhow!("the embedded cluster did not start"))??;
    Ok((url, Started::Embedded { stop, thread }))
}

/// What a fault hook does to a process.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Signal {
    Kill,
    Stop,
    Cont,
    Restart,
}

/// Ids of the started processes: shard-0.., coordinator.
pub(crate) fn process_ids(c: &ProcessCluster) -> Vec<String> {
    c.nodes.iter().chain(std::iter::once(&c.coordinator)).map(|p| p.id.clone()).collect()
}

/// Does `signal` to process `id`; blocking (a restart waits until the
/// process serves). Returns what happened.
pub(crate) fn signal(cluster: &Mutex<ProcessCluster>, id: &str, signal: Signal) -> Result<String> {
    let mut c = cluster.lock();
    let c = &mut *c;
    let p: &mut Proc = match c.nodes.iter_mut().chain(std::iter::once(&mut c.coordinator)).find(|p| p.id == id) {
        Some(p) => p,
        None => bail!("no process {id:?}"),
    };
    let pid = p.pid();
    Ok(match signal {
        Signal::Kill => format!("SIGKILL pid {pid}; {}", p.kill()?),
        Signal::Stop => {
            p.stop()?;
            format!("SIGSTOP pid {pid}")
        }
        Signal::Cont => {
            p.resume()?;
            format!("SIGCONT pid {pid}")
        }
        Signal::Restart => {
            let started = std::time::Instant::now();
            p.restart()?;
            format!("restarted (pid {pid} -> {}), serving on {} after {:.2} s", p.pid(), p.addr, started.elapsed().as_secs_f64())
        }
    })
}

/// CPU and memory of one process over one second.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub(crate) struct ProcSample {
    /// CPU time used in the second before, as a percentage of one core.
    pub(crate) cpu_pct: f64,
    pub(crate) rss_mib: f64,
}

/// Samples every process's CPU time and RSS; `last` holds the CPU times of
/// the previous sample. Skips a process that is gone or being restarted.
pub(crate) fn sample(
    cluster: &Mutex<ProcessCluster>,
    last: &mut BTreeMap<String, (i32, Duration, std::time::Instant)>,
) -> BTreeMap<String, ProcSample> {
    let mut out = BTreeMap::new();
    let Some(c) = cluster.try_lock() else { return out };
    for p in c.nodes.iter().chain(std::iter::once(&c.coordinator)) {
        let (Ok(cpu), Ok(rss)) = (p.cpu_time(), p.rss_bytes()) else { continue };
        let now = std::time::Instant::now();
        if let Some(&(pid, cpu0, t0)) = last.get(&p.id)
            && pid == p.pid()
        {
            let pct = cpu.saturating_sub(cpu0).as_secs_f64() / now.duration_since(t0).as_secs_f64().max(1e-3) * 100.0;
            out.insert(
                p.id.clone(),
                ProcSample { cpu_pct: (pct * 10.0).round() / 10.0, rss_mib: (rss as f64 / 1_048_576.0 * 10.0).round() / 10.0 },
            );
        }
        last.insert(p.id.clone(), (p.pid(), cpu, now));
    }
    out
}
