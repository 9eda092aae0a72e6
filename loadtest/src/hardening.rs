//! `hardening`: the hostile operator's measurements of issue 17, against
//! separate processes started from a directory of release binaries, so the
//! same run can measure an older build beside this one:
//!
//! - `cancel`: a SearchBatch far too big for its deadline; when each node
//!   stops computing after the deadline, and its memory before and after;
//! - `hung`: one node stopped with SIGSTOP; how long ClusterStatus, an
//!   Upsert and an Ingest take;
//! - `idle`: sockets that connect and say nothing; how many stay open;
//! - `disk-full`: a node on a full 64 MiB tmpfs asked to create a shard
//!   (needs root); what the caller gets and whether the node lives;
//! - `shards`: many 1024-shard collections; open files and memory per
//!   shard, what the create that does not fit gets, and memory after
//!   dropping them.
//!
//! Settings for the processes go in `--env KEY=VALUE` (each process reads
//! its own prefix, `SHOAL_SHARD_` or `SHOAL_COORD_`).

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context, Result};
use clap::Parser;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::{Value, json};
use shoal_ops::procs::{ClusterSpec, Launcher, Proc, ProcessCluster};
use shoal_proto::v1;
use shoal_proto::v1::shoal_client::ShoalClient;
use tonic::transport::Channel;

#[derive(Parser, Debug)]
pub(crate) struct Args {
    /// Directory holding `shoal-shard-node` and `shoal-coordinator`.
    #[arg(long)]
    bin_dir: PathBuf,
    /// Comma-separated: cancel, hung, idle, disk-full, shards.
    #[arg(long, default_value = "cancel,hung,idle,disk-full,shards")]
    scenarios: String,
    /// Points in the collection the searches run on.
    #[arg(long, default_value_t = 100_000)]
    points: u64,
    #[arg(long, default_value_t = 128)]
    dim: usize,
    /// Queries and k of the SearchBatch that outlives its deadline.
    #[arg(long, default_value_t = 1024)]
    queries: usize,
    #[arg(long, default_value_t = 10_000)]
    k: u32,
    /// Its deadline.
    #[arg(long, default_value_t = 2_000)]
    timeout_ms: u32,
    /// 1024-shard collections the `shards` scenario creates (3 nodes).
    #[arg(long, default_value_t = 4)]
    shard_collections: usize,
    /// Idle sockets the `idle` scenario opens.
    #[arg(long, default_value_t = 500)]
    sockets: usize,
    /// KEY=VALUE for every process's environment (repeat).
    #[arg(long = "env", value_parser = parse_env)]
    env: Vec<(String, String)>,
    /// Where clusters live (default: a temporary directory).
    #[arg(long)]
    dir: Option<PathBuf>,
    #[arg(long)]
    json: Option<PathBuf>,
    #[arg(long, default_value_t = 7)]
    seed: u64,
}

fn parse_env(s: &str) -> Result<(String, String), String> {
    s.split_once('=').map(|(k, v)| (k.to_owned(), v.to_owned())).ok_or_else(|| format!("expected KEY=VALUE, got {s:?}"))
}

pub(crate) fn run(a: Args) -> Result<()> {
    let tmp = tempfile::tempdir()?;
    let base = a.dir.clone().unwrap_or_else(|| tmp.path().to_owned());
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let mut out = serde_json::Map::new();
    out.insert("bin_dir".into(), json!(a.bin_dir));
    for s in a.scenarios.split(',').map(str::trim).filter(|s| !s.is_empty()) {
        let dir = base.join(s);
        if dir.read_dir().is_ok_and(|mut d| d.next().is_some()) {
            anyhow::bail!("{} holds an earlier run; remove it or choose another --dir", dir.display());
        }
        eprintln!("== {s}");
        let r = match s {
            "cancel" => rt.block_on(cancel(&a, &dir)),
            "hung" => rt.block_on(hung(&a, &dir)),
            "idle" => rt.block_on(idle(&a, &dir)),
            "disk-full" => rt.block_on(disk_full(&a, &dir)),
            "shards" => rt.block_on(shards(&a, &dir)),
            other => anyhow::bail!("unknown scenario {other:?}"),
        };
        let v = r.unwrap_or_else(|e| json!({ "error": format!("{e:#}") }));
        println!("{s}: {}", serde_json::to_string_pretty(&v)?);
        out.insert(s.to_owned(), v);
    }
    if let Some(path) = &a.json {
        std::fs::write(path, serde_json::to_vec_pretty(&Value::Object(out))?)?;
    }
    Ok(())
}

fn spec(a: &Args, dir: &Path, nodes: usize) -> ClusterSpec {
    let mut spec = ClusterSpec::new(Launcher::Binaries(a.bin_dir.clone()), dir, nodes);
    spec.node_env.extend(a.env.iter().cloned());
    spec.coordinator_env.extend(a.env.iter().cloned());
    spec
}

async fn client(c: &ProcessCluster) -> Result<ShoalClient<Channel>> {
    Ok(ShoalClient::connect(c.endpoint()).await?.max_decoding_message_size(1 << 30).max_encoding_message_size(1 << 30))
}

fn random_points(rng: &mut StdRng, dim: usize, ids: std::ops::Range<u64>) -> Vec<v1::Point> {
    ids.map(|id| v1::Point { id, vector: (0..dim).map(|_| rng.random_range(-1.0f32..1.0)).collect(), payload: None }).collect()
}

async fn fill(client: &mut ShoalClient<Channel>, name: &str, a: &Args, rng: &mut StdRng) -> Result<Duration> {
    let started = Instant::now();
    let mut id = 0;
    while id < a.points {
        let end = (id + 5_000).min(a.points);
        let pts = random_points(rng, a.dim, id..end);
        client.upsert(v1::UpsertRequest { collection: name.into(), points: pts }).await?;
        id = end;
    }
    Ok(started.elapsed())
}

fn mib(b: u64) -> f64 {
    b as f64 / 1_048_576.0
}

/// When each node's CPU time stops growing (less than 5 ms in a 50 ms
/// window), counted from `from`, and the most anonymous memory each held
/// meanwhile; gives up after `limit`.
async fn settle_times(nodes: &[Proc], from: Instant, limit: Duration) -> Result<(Vec<Option<Duration>>, Vec<u64>)> {
    let mut settled = vec![None; nodes.len()];
    let mut peak: Vec<u64> = nodes.iter().map(Proc::rss_anon_bytes).collect::<Result<_>>()?;
    let mut last: Vec<Duration> = nodes.iter().map(Proc::cpu_time).collect::<Result<_>>()?;
    while settled.iter().any(Option::is_none) && from.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(50)).await;
        for (i, n) in nodes.iter().enumerate() {
            let now = n.cpu_time()?;
            peak[i] = peak[i].max(n.rss_anon_bytes()?);
            if settled[i].is_none() && now.saturating_sub(last[i]) < Duration::from_millis(5) {
                settled[i] = Some(from.elapsed().saturating_sub(Duration::from_millis(50)));
            }
            last[i] = now;
        }
    }
    Ok((settled, peak))
}

async fn cancel(a: &Args, dir: &Path) -> Result<Value> {
    let cluster = ProcessCluster::start(&spec(a, dir, 3))?;
    let mut c = client(&cluster).await?;
    let mut rng = StdRng::seed_from_u64(a.seed);
    c.create_collection(v1::CreateCollectionRequest {
        name: "docs".into(),
        dimension: a.dim as u32,
        metric: v1::Metric::Cosine as i32,
        shard_count: 3,
        index: None,
        ..Default::default()
    })
    .await?;
    let ingest = fill(&mut c, "docs", a, &mut rng).await?;
    let queries: Vec<v1::Vector> =
        (0..a.queries).map(|_| v1::Vector { values: (0..a.dim).map(|_| rng.random_range(-1.0f32..1.0)).collect() }).collect();
    // Warm up with a small search.
    c.search_batch(v1::SearchBatchRequest { collection: "docs".into(), queries: queries[..4].to_vec(), k: 10, ..Default::default() })
        .await?;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let rss_before: Vec<u64> = cluster.nodes.iter().map(Proc::rss_bytes).collect::<Result<_>>()?;
    let anon_before: Vec<u64> = cluster.nodes.iter().map(Proc::rss_anon_bytes).collect::<Result<_>>()?;
    let req = v1::SearchBatchRequest { collection: "docs".into(), queries, k: a.k, timeout_ms: a.timeout_ms, ..Default::default() };
    let started = Instant::now();
    let answer = c.search_batch(req).await;
    let answered = started.elapsed();
    let deadline = started + Duration::from_millis(u64::from(a.timeout_ms));
    let code = match &answer {
        Ok(_) => "OK".to_owned(),
        Err(s) => format!("{:?}: {}", s.code(), s.message()),
    };
    eprintln!("answer after {answered:?}: {code}");
    let (settled, peak_anon) = settle_times(&cluster.nodes, deadline.min(Instant::now()), Duration::from_secs(180)).await?;
    tokio::time::sleep(Duration::from_secs(1)).await;
    let rss_after: Vec<u64> = cluster.nodes.iter().map(Proc::rss_bytes).collect::<Result<_>>()?;
    let anon_after: Vec<u64> = cluster.nodes.iter().map(Proc::rss_anon_bytes).collect::<Result<_>>()?;
    let nodes: Vec<Value> = (0..cluster.nodes.len())
        .map(|i| {
            json!({
                "stopped_ms_after_deadline": settled[i].map(|d| d.as_millis() as u64),
                "rss_before_mib": mib(rss_before[i]),
                "rss_after_mib": mib(rss_after[i]),
                "rss_ratio": rss_after[i] as f64 / rss_before[i].max(1) as f64,
                "anon_before_mib": mib(anon_before[i]),
                "anon_after_mib": mib(anon_after[i]),
                "anon_ratio": anon_after[i] as f64 / anon_before[i].max(1) as f64,
                "anon_peak_after_deadline_mib": mib(peak_anon[i]),
            })
        })
        .collect();
    Ok(json!({
        "points": a.points, "dim": a.dim, "queries": a.queries, "k": a.k, "timeout_ms": a.timeout_ms,
        "ingest_s": ingest.as_secs_f64(),
        "answer_ms": answered.as_millis() as u64,
        "answer": code,
        "nodes": nodes,
    }))
}

async fn timed<T, E: std::fmt::Debug>(f: impl std::future::Future<Output = Result<T, E>>) -> (Duration, String) {
    let started = Instant::now();
    let r = f.await;
    let took = started.elapsed();
    (
        took,
        match r {
            Ok(_) => "OK".into(),
            Err(e) => format!("{e:?}").chars().take(300).collect(),
        },
    )
}

async fn hung(a: &Args, dir: &Path) -> Result<Value> {
    let cluster = ProcessCluster::start(&spec(a, dir, 3))?;
    let mut c = client(&cluster).await?;
    let mut rng = StdRng::seed_from_u64(a.seed);
    c.create_collection(v1::CreateCollectionRequest {
        name: "docs".into(),
        dimension: 16,
        metric: v1::Metric::Cosine as i32,
        shard_count: 3,
        index: None,
        ..Default::default()
    })
    .await?;
    c.upsert(v1::UpsertRequest { collection: "docs".into(), points: random_points(&mut rng, 16, 0..300) }).await?;
    cluster.nodes[2].stop()?;
    // The signal is delivered asynchronously; let it land.
    tokio::time::sleep(Duration::from_millis(200)).await;
    let mut out = serde_json::Map::new();
    // Status first: nothing has noticed the stop yet (the worst case).
    let started = Instant::now();
    let status = c.clone().cluster_status(v1::ClusterStatusRequest {}).await;
    let took = started.elapsed();
    let seen: Vec<String> = match &status {
        Ok(s) => s.get_ref().nodes.iter().map(|n| format!("{} {}", n.id, if n.available { "up" } else { "DOWN" })).collect(),
        Err(e) => vec![format!("{e:?}")],
    };
    out.insert("cluster_status".into(), json!({ "ms": took.as_millis() as u64, "nodes": seen }));
    let pts = random_points(&mut rng, 16, 1_000..1_030);
    let (t, r) = timed(c.clone().upsert(v1::UpsertRequest { collection: "docs".into(), points: pts })).await;
    out.insert("upsert_right_after_status".into(), json!({ "ms": t.as_millis() as u64, "result": r }));
    let pts = random_points(&mut rng, 16, 2_000..2_030);
    let (t, r) = timed(c.clone().upsert(v1::UpsertRequest { collection: "docs".into(), points: pts })).await;
    out.insert("upsert_later".into(), json!({ "ms": t.as_millis() as u64, "result": r }));
    let batch = v1::IngestRequest {
        collection: "docs".into(),
        source: "job".into(),
        offset: 0,
        points: random_points(&mut rng, 16, 3_000..3_010),
        ..Default::default()
    };
    let mut ic = c.clone();
    let (t, r) = timed(async move {
        let mut acks = ic.ingest(tokio_stream::iter(vec![batch])).await?.into_inner();
        acks.message().await
    })
    .await;
    out.insert("ingest".into(), json!({ "ms": t.as_millis() as u64, "result": r }));
    let q = v1::SearchRequest { collection: "docs".into(), vector: vec![1.0; 16], k: 5, ..Default::default() };
    let (t, r) = timed(c.clone().search(q)).await;
    out.insert("search".into(), json!({ "ms": t.as_millis() as u64, "result": r }));
    cluster.nodes[2].resume()?;
    Ok(Value::Object(out))
}

async fn idle(a: &Args, dir: &Path) -> Result<Value> {
    let cluster = ProcessCluster::start(&spec(a, dir, 1))?;
    let node = &cluster.nodes[0];
    tokio::time::sleep(Duration::from_millis(500)).await;
    let files_before = node.open_files()?;
    let mut socks = Vec::new();
    for _ in 0..a.sockets {
        socks.push(tokio::net::TcpStream::connect(node.addr).await?);
    }
    let mut samples = Vec::new();
    for secs in [1u64, 5, 10] {
        let since = Duration::from_secs(secs);
        tokio::time::sleep(since.saturating_sub(samples.last().map_or(Duration::ZERO, |(s, _)| Duration::from_secs(*s)))).await;
        let open = node.open_files()?.saturating_sub(files_before);
        samples.push((secs, open));
    }
    drop(socks);
    Ok(json!({
        "sockets": a.sockets,
        "node_files_before": files_before,
        "held_by_node_after_s": samples.iter().map(|(s, n)| json!({ "s": s, "open": n })).collect::<Vec<_>>(),
    }))
}

async fn disk_full(a: &Args, dir: &Path) -> Result<Value> {
    let small = dir.join("small");
    std::fs::create_dir_all(&small)?;
    let status = std::process::Command::new("mount").args(["-t", "tmpfs", "-o", "size=64m", "tmpfs"]).arg(&small).status()?;
    anyhow::ensure!(status.success(), "cannot mount a tmpfs (needs root)");
    let _unmount = Unmount(small.clone());
    let mut s = spec(a, dir, 1);
    s.node_dirs.insert(0, small.join("node"));
    let cluster = ProcessCluster::start(&s)?;
    let mut c = client(&cluster).await?;
    let mut rng = StdRng::seed_from_u64(a.seed);
    c.create_collection(v1::CreateCollectionRequest {
        name: "big".into(),
        dimension: 1024,
        metric: v1::Metric::Cosine as i32,
        shard_count: 1,
        index: None,
        ..Default::default()
    })
    .await?;
    let mut acked = 0;
    let mut full = String::new();
    for b in 0..1000u64 {
        match c.upsert(v1::UpsertRequest { collection: "big".into(), points: random_points(&mut rng, 1024, b * 256..b * 256 + 256) }).await
        {
            Ok(_) => acked += 256,
            Err(e) => {
                full = format!("{:?}: {}", e.code(), e.message());
                break;
            }
        }
    }
    let create = c
        .create_collection(v1::CreateCollectionRequest {
            name: "small".into(),
            dimension: 8,
            metric: v1::Metric::Cosine as i32,
            shard_count: 1,
            index: None,
            ..Default::default()
        })
        .await;
    tokio::time::sleep(Duration::from_millis(500)).await;
    let exited = cluster.nodes[0].exited()?;
    let left: Vec<String> = std::fs::read_dir(small.join("node/shards"))?
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    Ok(json!({
        "points_before_full": acked,
        "full_batch": full,
        "create": match &create { Ok(_) => "OK".to_owned(), Err(e) => format!("{:?}: {}", e.code(), e.message()) },
        "node_exit": exited.map(|s| s.to_string()),
        "collections_on_disk": left,
    }))
}

struct Unmount(PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        let _ = std::process::Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

async fn shards(a: &Args, dir: &Path) -> Result<Value> {
    let cluster = ProcessCluster::start(&spec(a, dir, 3))?;
    let mut c = client(&cluster).await?;
    let sample = |cluster: &ProcessCluster| -> Result<Vec<(usize, u64)>> {
        cluster.nodes.iter().map(|n| Ok((n.open_files()?, n.rss_bytes()?))).collect()
    };
    let before = sample(&cluster)?;
    let mut created = 0;
    let mut refusal = String::new();
    let started = Instant::now();
    for i in 0..a.shard_collections {
        let r = c
            .create_collection(v1::CreateCollectionRequest {
                name: format!("c{i}"),
                dimension: 16,
                metric: v1::Metric::Cosine as i32,
                shard_count: 1024,
                index: None,
                ..Default::default()
            })
            .await;
        match r {
            Ok(_) => created += 1,
            Err(e) => {
                refusal = format!("{:?}: {}", e.code(), e.message());
                break;
            }
        }
    }
    let create_s = started.elapsed().as_secs_f64();
    let full = sample(&cluster)?;
    let listed = c.list_collections(v1::ListCollectionsRequest {}).await?.into_inner().collections.len();
    for i in 0..listed {
        c.drop_collection(v1::DropCollectionRequest { name: format!("c{i}") }).await.context("drop")?;
    }
    tokio::time::sleep(Duration::from_secs(2)).await;
    let after = sample(&cluster)?;
    let shards_per_node = (created * 1024) as f64 / 3.0;
    let nodes: Vec<Value> = (0..3)
        .map(|i| {
            json!({
                "files": [before[i].0, full[i].0, after[i].0],
                "rss_mib": [mib(before[i].1), mib(full[i].1), mib(after[i].1)],
                "files_per_shard": (full[i].0 - before[i].0) as f64 / shards_per_node.max(1.0),
                "kib_per_shard": (full[i].1.saturating_sub(before[i].1)) as f64 / 1024.0 / shards_per_node.max(1.0),
            })
        })
        .collect();
    Ok(json!({
        "collections_created": created,
        "create_s": create_s,
        "refused_create": refusal,
        "nodes_before_full_after_drop": nodes,
    }))
}
