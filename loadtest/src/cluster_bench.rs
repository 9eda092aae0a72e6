//! `cluster-bench`: ingest rate and search latency of the embedded cluster
//! (coordinator + shard nodes over loopback gRPC) on a vector file.

use std::collections::HashSet;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Result, bail};
use hdrhistogram::Histogram;
use serde_json::json;
use shoal_ops::embedded::{EmbeddedCluster, EmbeddedConfig};
use shoal_proto::v1;

use crate::fvecs::VecFile;
use crate::groundtruth;

/// Flags of `cluster-bench`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    #[arg(long)]
    base: PathBuf,
    #[arg(long)]
    query: PathBuf,
    #[arg(long)]
    groundtruth: Option<PathBuf>,
    #[arg(long, default_value = "cosine")]
    metric: String,
    #[arg(long)]
    limit: Option<usize>,
    #[arg(long, default_value_t = 3)]
    shard_nodes: usize,
    #[arg(long, default_value_t = 3)]
    shards: u32,
    /// Points per ingest batch.
    #[arg(long, default_value_t = 1000)]
    batch_size: usize,
    /// Concurrent ingest streams (each its own source).
    #[arg(long, default_value_t = 3)]
    streams: usize,
    #[arg(long, default_value_t = 1000)]
    queries: usize,
    /// Search ef per shard (0: the coordinator's default).
    #[arg(long, default_value_t = 0)]
    ef: u32,
    /// Build threads per shard node.
    #[arg(long, default_value_t = 0)]
    build_threads: usize,
    /// Each node's background scrub, bytes per second (0: off; default:
    /// the node's own).
    #[arg(long)]
    scrub_bytes_per_second: Option<u64>,
    #[arg(long)]
    dir: Option<PathBuf>,
    #[arg(long)]
    json: Option<PathBuf>,
}

const K: usize = 10;

pub(crate) fn run(a: Args) -> Result<()> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(run_async(a))
}

async fn run_async(a: Args) -> Result<()> {
    let base = VecFile::open(&a.base)?;
    let query = VecFile::open(&a.query)?;
    let n = a.limit.unwrap_or(base.len()).min(base.len());
    let metric = match a.metric.as_str() {
        "cosine" => v1::Metric::Cosine,
        "dot" => v1::Metric::Dot,
        "euclidean" => v1::Metric::Euclidean,
        m => bail!("unknown metric {m}"),
    };
    let queries: Vec<Vec<f32>> = (0..a.queries.min(query.len())).map(|i| query.f32_row(i)).collect::<Result<_>>()?;
    let truth: Vec<Vec<u32>> = match (&a.groundtruth, a.limit) {
        (Some(g), None) => {
            let g = VecFile::open(g)?;
            (0..queries.len()).map(|i| Ok(g.i32_row(i)?[..K].iter().map(|&x| x as u32).collect())).collect::<Result<_>>()?
        }
        _ => groundtruth::exact(&base, n, &queries, a.metric.parse().map_err(anyhow::Error::msg)?, K)?,
    };
    let root = match &a.dir {
        Some(d) => tempfile::tempdir_in(d)?,
        None => tempfile::tempdir()?,
    };
    let mut cfg = EmbeddedConfig::ephemeral(root.path(), a.shard_nodes);
    cfg.engine.build_threads = a.build_threads;
    if let Some(rate) = a.scrub_bytes_per_second {
        cfg.scrub.bytes_per_second = rate;
    }
    let cfg_scrub = cfg.scrub.bytes_per_second;
    let cluster = EmbeddedCluster::start(cfg).await?;
    let mut client = cluster.client().await?;
    client
        .create_collection(v1::CreateCollectionRequest {
            name: "bench".into(),
            dimension: base.dim() as u32,
            metric: metric as i32,
            shard_count: a.shards,
            index: Some(v1::IndexParams { m: 16, ef_construction: 100 }),
            ..Default::default()
        })
        .await?;

    // Ingest: `streams` concurrent streams over disjoint slices.
    let t = Instant::now();
    let per = n.div_ceil(a.streams.max(1));
    let mut tasks = Vec::new();
    for s in 0..a.streams.max(1) {
        let (lo, hi) = (s * per, ((s + 1) * per).min(n));
        let mut batches = Vec::new();
        for (o, start) in (lo..hi).step_by(a.batch_size.max(1)).enumerate() {
            let end = (start + a.batch_size).min(hi);
            let points = (start..end)
                .map(|i| Ok(v1::Point { id: i as u64, vector: base.f32_row(i)?, payload: None }))
                .collect::<Result<Vec<_>>>()?;
            batches.push(v1::IngestRequest {
                collection: "bench".into(),
                source: format!("stream-{s}"),
                offset: o as u64,
                points,
                ..Default::default()
            });
        }
        let mut c = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut acks = c.ingest(tokio_stream::iter(batches)).await?.into_inner();
            let mut n = 0u64;
            while let Some(ack) = acks.message().await? {
                n += u64::from(ack.upserted);
            }
            Ok::<u64, tonic::Status>(n)
        }));
    }
    let mut ingested = 0;
    for t in tasks {
        ingested += t.await??;
    }
    let ingest_secs = t.elapsed().as_secs_f64();
    eprintln!("ingested {ingested} vectors in {ingest_secs:.1}s = {:.0}/s", ingested as f64 / ingest_secs);

    // Search: one client, one query at a time.
    let mut lat = Histogram::<u64>::new_with_bounds(1, 60_000_000, 3)?;
    let mut hits_found = 0usize;
    let t = Instant::now();
    for (q, truth) in queries.iter().zip(&truth) {
        let s = Instant::now();
        let r = client
            .search(v1::SearchRequest { collection: "bench".into(), vector: q.clone(), k: K as u32, ef: a.ef, ..Default::default() })
            .await?
            .into_inner();
        lat.record(s.elapsed().as_micros() as u64)?;
        let truth: HashSet<u32> = truth.iter().copied().collect();
        hits_found += r.hits.iter().filter(|h| truth.contains(&(h.id as u32))).count();
    }
    let search_secs = t.elapsed().as_secs_f64();
    let recall = hits_found as f64 / (K * queries.len()) as f64;
    let ms = |q: f64| lat.value_at_quantile(q) as f64 / 1000.0;
    eprintln!(
        "search: recall@{K} {recall:.4}, {:.0} qps single client, p50 {:.2} ms p99 {:.2} ms",
        queries.len() as f64 / search_secs,
        ms(0.5),
        ms(0.99)
    );
    let out = json!({
        "lib": "shoal-cluster",
        "params": {"shard_nodes": a.shard_nodes, "shards": a.shards, "batch_size": a.batch_size, "streams": a.streams, "ef": a.ef,
                   "scrub_bytes_per_second": cfg_scrub},
        "ingest": {"vectors": ingested, "seconds": ingest_secs, "vectors_per_s": ingested as f64 / ingest_secs},
        "search": {"queries": queries.len(), "recall": recall, "qps_single_client": queries.len() as f64 / search_secs,
                   "p50_ms": ms(0.5), "p95_ms": ms(0.95), "p99_ms": ms(0.99)},
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&out)?)?;
    }
    cluster.shutdown().await?;
    Ok(())
}
