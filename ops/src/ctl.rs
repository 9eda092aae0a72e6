//! `shoalctl status` and `shoalctl collections`: operator views of a
//! running cluster through the public API.

use shoal_proto::v1;
use shoal_proto::v1::shoal_client::ShoalClient;
use tonic::transport::Channel;

pub async fn connect(endpoint: &str) -> anyhow::Result<ShoalClient<Channel>> {
    ShoalClient::connect(endpoint.to_owned()).await.map_err(|e| anyhow::anyhow!("cannot reach the coordinator at {endpoint}: {e}"))
}

fn metric_name(m: i32) -> &'static str {
    match v1::Metric::try_from(m) {
        Ok(v1::Metric::Cosine) => "cosine",
        Ok(v1::Metric::Dot) => "dot",
        Ok(v1::Metric::Euclidean) => "euclidean",
        _ => "?",
    }
}

pub fn parse_metric(s: &str) -> anyhow::Result<v1::Metric> {
    match s.to_ascii_lowercase().as_str() {
        "cosine" => Ok(v1::Metric::Cosine),
        "dot" => Ok(v1::Metric::Dot),
        "euclidean" | "l2" => Ok(v1::Metric::Euclidean),
        other => anyhow::bail!("unknown metric {other:?} (cosine, dot, euclidean)"),
    }
}

pub async fn status(endpoint: &str) -> anyhow::Result<()> {
    let s = connect(endpoint).await?.cluster_status(v1::ClusterStatusRequest {}).await?.into_inner();
    println!("{:<12} {:<28} {:<10} shards", "node", "address", "state");
    for n in &s.nodes {
        println!("{:<12} {:<28} {:<10} {}", n.id, n.address, if n.available { "up" } else { "DOWN" }, n.shards);
    }
    println!();
    for c in &s.collections {
        print_collection(c);
    }
    if s.collections.is_empty() {
        println!("no collections");
    }
    Ok(())
}

pub fn print_collection(c: &v1::CollectionInfo) {
    let (m, efc) = c.index.map_or((0, 0), |i| (i.m, i.ef_construction));
    println!(
        "collection {}: dim {} {} M={m} ef_construction={efc}, {} shards, {} points",
        c.name,
        c.dimension,
        metric_name(c.metric),
        c.shard_count,
        c.points
    );
    for s in &c.shards {
        println!(
            "  shard {:<3} node {:<10} {:<5} points {:<10} tombstones {:<8} disk {:.1} MiB",
            s.shard,
            s.node,
            if s.available { "up" } else { "DOWN" },
            s.points,
            s.tombstones,
            s.disk_bytes as f64 / 1048576.0
        );
    }
}
