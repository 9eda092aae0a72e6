//! `shoalctl demo`: the main job end to end on an embedded cluster.
//! Creates a collection, ingests the shipped sample of real sentence
//! embeddings through the streaming ingest API, runs the sample's queries,
//! prints the top hits with their texts, recall@10 against exact search,
//! the ingest rate and search latency percentiles.

use std::path::PathBuf;
use std::time::Instant;

use anyhow::Context;
use hdrhistogram::Histogram;
use shoal_proto::v1;

use crate::demo_data::{self, DemoData, DemoPoint};
use crate::embedded::{EmbeddedCluster, EmbeddedConfig};

/// Options of the demo.
#[derive(clap::Args, Debug, Clone)]
pub struct DemoArgs {
    /// Data directory; wiped at the start.
    #[arg(long, default_value = "./shoal-data/demo")]
    pub data_dir: PathBuf,
    /// The sample (see ops/demo-data/README.md).
    #[arg(long)]
    pub sample: Option<PathBuf>,
    #[arg(long, default_value_t = 3)]
    pub shard_nodes: usize,
    #[arg(long, default_value_t = 3)]
    pub shards: u32,
    /// Points per ingest batch.
    #[arg(long, default_value_t = 1000)]
    pub batch_size: usize,
    /// Queries whose hits are printed.
    #[arg(long, default_value_t = 3)]
    pub show: usize,
}

const COLLECTION: &str = "pypi-demo";
const SOURCE: &str = "pypi-sample";
const K: usize = 10;

pub async fn run(args: DemoArgs) -> anyhow::Result<()> {
    let sample = args.sample.clone().unwrap_or_else(demo_data::default_path);
    let data = demo_data::load(&sample).with_context(|| format!("loading the demo sample {}", sample.display()))?;
    println!(
        "sample: {} points and {} queries, {}-d sentence embeddings of PyPI package summaries",
        data.points.len(),
        data.queries.len(),
        data.dim
    );
    if args.data_dir.exists() {
        std::fs::remove_dir_all(&args.data_dir).with_context(|| format!("wiping {}", args.data_dir.display()))?;
    }
    let cluster = EmbeddedCluster::start(EmbeddedConfig::ephemeral(&args.data_dir, args.shard_nodes)).await?;
    println!(
        "embedded cluster: coordinator {} + {} shard nodes {:?}, data in {}",
        cluster.endpoint(),
        args.shard_nodes,
        cluster.node_addrs(),
        args.data_dir.display()
    );
    let result = drive(&cluster, &data, &args).await;
    cluster.shutdown().await?;
    result
}

async fn drive(cluster: &EmbeddedCluster, data: &DemoData, args: &DemoArgs) -> anyhow::Result<()> {
    let mut client = cluster.client().await?;
    client
        .create_collection(v1::CreateCollectionRequest {
            name: COLLECTION.into(),
            dimension: data.dim as u32,
            metric: v1::Metric::Cosine as i32,
            shard_count: args.shards,
            index: Some(v1::IndexParams { m: 16, ef_construction: 100 }),
            ..Default::default()
        })
        .await?;

    // Ingest: one stream of batches tagged (source, offset).
    let batches: Vec<v1::IngestRequest> = data
        .points
        .chunks(args.batch_size.max(1))
        .enumerate()
        .map(|(offset, chunk)| v1::IngestRequest {
            collection: COLLECTION.into(),
            source: SOURCE.into(),
            offset: offset as u64,
            points: chunk.iter().map(to_point).collect(),
            ..Default::default()
        })
        .collect();
    let n_batches = batches.len();
    let t = Instant::now();
    let mut acks = client.ingest(tokio_stream::iter(batches)).await?.into_inner();
    let mut acked = 0;
    let mut upserted = 0u64;
    while let Some(ack) = acks.message().await? {
        acked += 1;
        upserted += u64::from(ack.upserted);
    }
    let ingest_secs = t.elapsed().as_secs_f64();
    anyhow::ensure!(acked == n_batches, "{acked} of {n_batches} batches acknowledged");
    println!(
        "ingested {upserted} points in {n_batches} batches in {ingest_secs:.2}s: {:.0} vectors/s (acknowledged after every shard committed)",
        upserted as f64 / ingest_secs
    );
    let offsets = client.get_offsets(v1::GetOffsetsRequest { collection: COLLECTION.into(), sources: vec![] }).await?.into_inner();
    for o in &offsets.offsets {
        println!("source {} stands at offset {} on every shard", o.source, o.offset);
    }

    // Queries: latency per search, recall against exact search.
    let mut latency = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut found = 0usize;
    for (qi, q) in data.queries.iter().enumerate() {
        let t = Instant::now();
        let resp = client
            .search(v1::SearchRequest {
                collection: COLLECTION.into(),
                vector: q.vector.clone(),
                k: K as u32,
                ef: 0,
                with_payload: qi < args.show,
                allow_partial: false,
                timeout_ms: 0,
                ..Default::default()
            })
            .await?
            .into_inner();
        latency.record(t.elapsed().as_micros() as u64)?;
        let exact = exact_top_k(&data.points, &q.vector, K);
        found += resp.hits.iter().filter(|h| exact.contains(&h.id)).count();
        if qi < args.show {
            print_hits(q, &resp.hits);
        }
    }
    let recall = found as f64 / (K * data.queries.len()) as f64;
    println!();
    println!("== summary");
    println!("points           {}", upserted);
    println!("ingest           {:.0} vectors/s ({} shards on {} nodes)", upserted as f64 / ingest_secs, args.shards, args.shard_nodes);
    println!("recall@{K}        {recall:.4} over {} queries (exact search over the sample as truth)", data.queries.len());
    println!(
        "search latency   p50 {:.2} ms   p95 {:.2} ms   p99 {:.2} ms   (single client, scatter to {} shards over gRPC)",
        latency.value_at_quantile(0.50) as f64 / 1000.0,
        latency.value_at_quantile(0.95) as f64 / 1000.0,
        latency.value_at_quantile(0.99) as f64 / 1000.0,
        args.shards
    );
    snapshot_and_restore(cluster, data, args).await
}

/// Snapshots the collection, restores one shard on a fresh node, and
/// checks that node answers exactly like the original.
async fn snapshot_and_restore(cluster: &EmbeddedCluster, data: &DemoData, args: &DemoArgs) -> anyhow::Result<()> {
    let mut client = cluster.client().await?;
    println!();
    println!("== snapshot to object storage ({})", args.data_dir.join("snapshots").display());
    let t = Instant::now();
    let made =
        client.create_snapshot(v1::CreateSnapshotRequest { collection: COLLECTION.into(), ..Default::default() }).await?.into_inner();
    let secs = t.elapsed().as_secs_f64();
    let image: u64 = made.shards.iter().map(|s| s.image_bytes).sum();
    let stored: u64 = made.shards.iter().map(|s| s.stored_bytes).sum();
    println!(
        "snapshot {}: {} shards, {:.1} MiB of data files -> {:.1} MiB stored (zstd), {secs:.2}s ({:.0} MiB/s)",
        made.snapshot_id,
        made.shards.len(),
        mib(image),
        mib(stored),
        mib(image) / secs
    );

    // A fresh node, same store: restore shard 1 there.
    let shard = 1.min(args.shards.saturating_sub(1));
    let info = client.describe_collection(v1::DescribeCollectionRequest { name: COLLECTION.into() }).await?.into_inner();
    let owner = info.shards.iter().find(|s| s.shard == shard).map(|s| s.node.clone()).context("shard has no node")?;
    let owner_i: usize = owner.strip_prefix("shard-").and_then(|n| n.parse().ok()).context("unexpected node id")?;
    let owner_addr = cluster.node_addrs()[owner_i];
    let fresh_cfg = shoal_shard_node::ShardNodeConfig {
        node_id: "fresh".into(),
        listen: "127.0.0.1:0".parse()?,
        data_dir: args.data_dir.join("fresh-node"),
        snapshot: shoal_shard_node::config::SnapshotConfig {
            url: args.data_dir.join("snapshots").to_string_lossy().into_owned(),
            ..Default::default()
        },
        ..Default::default()
    };
    let fresh = shoal_shard_node::RunningShardNode::start(&fresh_cfg).await?;
    let result = compare_restored(&made.snapshot_id, shard, owner_addr, fresh.addr, data).await;
    fresh.shutdown().await?;
    result
}

async fn compare_restored(
    id: &str,
    shard: u32,
    owner: std::net::SocketAddr,
    fresh: std::net::SocketAddr,
    data: &DemoData,
) -> anyhow::Result<()> {
    use shoal_proto::v1::shard_node_client::ShardNodeClient;
    let connect = |a: std::net::SocketAddr| async move {
        anyhow::Ok(ShardNodeClient::connect(format!("http://{a}")).await?.max_decoding_message_size(256 << 20))
    };
    let (mut old, mut new) = (connect(owner).await?, connect(fresh).await?);
    let shard_id = || Some(v1::ShardId { collection: COLLECTION.into(), shard });
    let t = Instant::now();
    let stats =
        new.restore_shard(v1::RestoreShardRequest { shard: shard_id(), snapshot_id: id.into(), replace: false }).await?.into_inner();
    let secs = t.elapsed().as_secs_f64();
    let offsets: Vec<String> = stats.offsets.iter().map(|o| format!("{}@{}", o.source, o.offset)).collect();
    println!(
        "restored shard {shard} on a fresh node in {secs:.2}s ({:.0} MiB/s of data file): {} points, offsets {}",
        mib(stats.disk_bytes) / secs,
        stats.points,
        offsets.join(" ")
    );
    let queries: Vec<v1::Vector> = data.queries.iter().map(|q| v1::Vector { values: q.vector.clone() }).collect();
    let search = |queries: Vec<v1::Vector>| v1::SearchShardRequest {
        shard: shard_id(),
        queries,
        k: K as u32,
        ef: 64,
        with_payload: true,
        ..Default::default()
    };
    let a = old.search_shard(search(queries.clone())).await?.into_inner().results;
    let b = new.search_shard(search(queries)).await?.into_inner().results;
    let same_hits = a.iter().zip(&b).filter(|(x, y)| x == y).count();
    let ids: Vec<u64> = data.points.iter().map(|p| p.id).collect();
    let get = |ids: Vec<u64>| v1::GetPointsRequest { shard: shard_id(), ids, with_vector: true };
    let pa = old.get_points(get(ids.clone())).await?.into_inner().points;
    let pb = new.get_points(get(ids)).await?.into_inner().points;
    println!(
        "fresh node vs original: {same_hits}/{} queries with identical top-{K} (ids, distances, payloads); {}/{} points identical (vectors, payloads)",
        a.len(),
        pa.iter().zip(&pb).filter(|(x, y)| x == y).count(),
        pa.len()
    );
    anyhow::ensure!(same_hits == a.len() && a.len() == b.len(), "the restored shard answers differently");
    anyhow::ensure!(pa == pb && stats.points == pa.len() as u64, "the restored shard holds other points");
    Ok(())
}

fn mib(b: u64) -> f64 {
    b as f64 / 1048576.0
}

fn to_point(p: &DemoPoint) -> v1::Point {
    let payload = serde_json::json!({ "name": p.name, "summary": p.summary }).to_string();
    v1::Point { id: p.id, vector: p.vector.clone(), payload: Some(v1::Payload { kind: Some(v1::payload::Kind::Json(payload)) }) }
}

fn print_hits(q: &DemoPoint, hits: &[v1::Hit]) {
    println!();
    println!("query: {} — {}", q.name, q.summary);
    for h in hits.iter().take(5) {
        let (name, summary) = match h.payload.as_ref().and_then(|p| p.kind.as_ref()) {
            Some(v1::payload::Kind::Json(s)) => {
                let v: serde_json::Value = serde_json::from_str(s).unwrap_or_default();
                (v["name"].as_str().unwrap_or("?").to_owned(), v["summary"].as_str().unwrap_or("").to_owned())
            }
            _ => ("?".into(), String::new()),
        };
        println!("  {:.3}  {name:<28} {}", h.distance, truncate(&summary, 90));
    }
}

fn truncate(s: &str, n: usize) -> String {
    if s.chars().count() <= n { s.to_owned() } else { format!("{}…", s.chars().take(n).collect::<String>()) }
}

/// Exact top-k by cosine (the sample's vectors are unit length).
fn exact_top_k(points: &[DemoPoint], q: &[f32], k: usize) -> Vec<u64> {
    let qn = q.iter().map(|x| x * x).sum::<f32>().sqrt().max(f32::MIN_POSITIVE);
    let mut scored: Vec<(f32, u64)> = points
        .iter()
        .map(|p| {
            let pn = p.vector.iter().map(|x| x * x).sum::<f32>().sqrt().max(f32::MIN_POSITIVE);
            let dot: f32 = p.vector.iter().zip(q).map(|(a, b)| a * b).sum();
            (-(dot / (pn * qn)), p.id)
        })
        .collect();
    scored.sort_by(|a, b| a.0.total_cmp(&b.0));
    scored.into_iter().take(k).map(|(_, id)| id).collect()
}
