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
            deletes: Vec::new(),
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
    let offsets = client
        .get_offsets(v1::GetOffsetsRequest { collection: COLLECTION.into(), sources: vec![] })
        .await?
        .into_inner();
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
    Ok(())
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
