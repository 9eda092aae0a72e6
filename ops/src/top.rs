//! `shoalctl top`: a live view of a cluster from its processes' `/metrics`:
//! per node, the rates and latencies of the last interval, queue depths,
//! points and memory. The coordinator names the nodes (ClusterStatus);
//! every process is scraped over HTTP/1.1 on its gRPC port.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use shoal_proto::v1;

use crate::ctl;

/// A sample's labels, as (name, value).
type Labels = Vec<(String, String)>;

/// One scrape: every sample, by metric name, with its labels.
#[derive(Clone, Debug, Default)]
pub struct Scrape {
    samples: BTreeMap<String, Vec<(Labels, f64)>>,
}

impl Scrape {
    /// Parses the Prometheus text format (the subset shoal's exporter
    /// writes: no timestamps, no escaped quotes in label values).
    pub fn parse(text: &str) -> Scrape {
        let mut samples: BTreeMap<String, Vec<(Labels, f64)>> = BTreeMap::new();
        for line in text.lines().filter(|l| !l.starts_with('#') && !l.trim().is_empty()) {
            let Some((series, value)) = line.rsplit_once(' ') else { continue };
            let Ok(value) = value.parse::<f64>() else { continue };
            let (name, labels) = match series.split_once('{') {
                Some((name, rest)) => (name, parse_labels(rest.trim_end_matches('}'))),
                None => (series, Vec::new()),
            };
            samples.entry(name.to_owned()).or_default().push((labels, value));
        }
        Scrape { samples }
    }

    /// The sum of `name`'s samples whose labels include all of `want`.
    pub fn sum(&self, name: &str, want: &[(&str, &str)]) -> f64 {
        self.matching(name, want).map(|(_, v)| v).sum()
    }

    fn matching<'s>(&'s self, name: &str, want: &'s [(&str, &str)]) -> impl Iterator<Item = (&'s [(String, String)], f64)> + 's {
        self.samples
            .get(name)
            .into_iter()
            .flatten()
            .filter(move |(labels, _)| want.iter().all(|(k, v)| labels.iter().any(|(lk, lv)| lk == k && lv == v)))
            .map(|(l, v)| (l.as_slice(), *v))
    }

    /// A histogram's cumulative bucket counts by upper bound, summed over
    /// the series matching `want`.
    fn buckets(&self, name: &str, want: &[(&str, &str)]) -> Vec<(f64, f64)> {
        let mut by_le: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
        for (labels, v) in self.matching(&format!("{name}_bucket"), want) {
            let Some(le) = labels.iter().find(|(k, _)| k == "le").map(|(_, v)| v.as_str()) else { continue };
            let bound = if le == "+Inf" { f64::INFINITY } else { le.parse().unwrap_or(f64::INFINITY) };
            let e = by_le.entry(bound.to_bits()).or_insert((bound, 0.0));
            e.1 += v;
        }
        let mut out: Vec<(f64, f64)> = by_le.into_values().collect();
        out.sort_by(|a, b| a.0.total_cmp(&b.0));
        out
    }
}

fn parse_labels(s: &str) -> Labels {
    let mut out = Vec::new();
    let mut rest = s;
    while let Some((key, after)) = rest.split_once("=\"") {
        let Some((value, tail)) = after.split_once('"') else { break };
        out.push((key.trim_start_matches(',').trim().to_owned(), value.to_owned()));
        rest = tail;
    }
    out
}

/// The `q` quantile of what a histogram counted between two scrapes, as the
/// upper bound of the bucket it falls in (what Prometheus's
/// `histogram_quantile` interpolates within). None when nothing was counted.
pub fn quantile_between(before: &Scrape, after: &Scrape, name: &str, want: &[(&str, &str)], q: f64) -> Option<f64> {
    let old: BTreeMap<u64, f64> = before.buckets(name, want).into_iter().map(|(b, c)| (b.to_bits(), c)).collect();
    let delta: Vec<(f64, f64)> =
        after.buckets(name, want).into_iter().map(|(b, c)| (b, c - old.get(&b.to_bits()).copied().unwrap_or(0.0))).collect();
    let total = delta.last()?.1;
    if total <= 0.0 {
        return None;
    }
    let rank = q * total;
    delta.iter().find(|(_, c)| *c >= rank).map(|(b, _)| *b)
}

/// The per-second rate of a counter between two scrapes.
pub fn rate(before: &Scrape, after: &Scrape, name: &str, want: &[(&str, &str)], over: Duration) -> f64 {
    ((after.sum(name, want) - before.sum(name, want)) / over.as_secs_f64().max(1e-9)).max(0.0)
}

/// `GET /metrics` on `addr` (host:port).
pub async fn scrape(addr: &str) -> anyhow::Result<Scrape> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut s = tokio::time::timeout(Duration::from_secs(2), tokio::net::TcpStream::connect(addr)).await??;
    s.write_all(format!("GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n").as_bytes()).await?;
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(5), s.read_to_string(&mut out)).await??;
    let (head, body) = out.split_once("\r\n\r\n").ok_or_else(|| anyhow::anyhow!("{addr}: not an HTTP response"))?;
    anyhow::ensure!(head.starts_with("HTTP/1.1 200"), "{addr}: {}", head.lines().next().unwrap_or_default());
    Ok(Scrape::parse(body))
}

/// One row of the view.
#[derive(Clone, Debug, PartialEq)]
pub struct NodeRow {
    pub node: String,
    pub up: bool,
    pub points: f64,
    pub upserts_per_s: f64,
    pub searches_per_s: f64,
    pub search_p99_ms: Option<f64>,
    pub commit_p99_ms: Option<f64>,
    pub queue_depth: f64,
    pub rss_mib: f64,
    pub open_files: f64,
}

/// The coordinator's line of the view.
#[derive(Clone, Debug, PartialEq)]
pub struct CoordinatorRow {
    pub searches_per_s: f64,
    pub search_p99_ms: Option<f64>,
    pub errors_per_s: f64,
    pub rss_mib: f64,
}

const SEARCH_RPCS: [&str; 2] = ["/shoal.v1.Shoal/Search", "/shoal.v1.Shoal/SearchBatch"];

/// The coordinator's figures between two scrapes.
pub fn coordinator_row(before: &Scrape, after: &Scrape, over: Duration) -> CoordinatorRow {
    let calls = "rpc_server_call_duration_seconds";
    let count = "rpc_server_call_duration_seconds_count";
    let searches: f64 = SEARCH_RPCS.iter().map(|m| rate(before, after, count, &[("rpc_method", m)], over)).sum();
    let all = rate(before, after, count, &[], over);
    let ok = rate(before, after, count, &[("rpc_grpc_status_code", "0")], over);
    // The busier search RPC's p99 stands for both.
    let p99 = SEARCH_RPCS
        .iter()
        .filter_map(|m| quantile_between(before, after, calls, &[("rpc_method", m), ("rpc_grpc_status_code", "0")], 0.99))
        .reduce(f64::max);
    CoordinatorRow {
        searches_per_s: searches,
        search_p99_ms: p99.map(|s| s * 1000.0),
        errors_per_s: (all - ok).max(0.0),
        rss_mib: after.sum("process_resident_memory_bytes", &[]) / 1_048_576.0,
    }
}

/// A shard node's figures between two scrapes.
pub fn node_row(node: &str, up: bool, before: &Scrape, after: &Scrape, over: Duration) -> NodeRow {
    NodeRow {
        node: node.to_owned(),
        up,
        points: after.sum("shoal_shard_points", &[]),
        upserts_per_s: rate(before, after, "shoal_shard_points_upserted_total", &[], over),
        searches_per_s: rate(before, after, "shoal_shard_search_duration_seconds_count", &[], over),
        search_p99_ms: quantile_between(before, after, "shoal_shard_search_duration_seconds", &[], 0.99).map(|s| s * 1000.0),
        commit_p99_ms: quantile_between(before, after, "shoal_shard_commit_duration_seconds", &[], 0.99).map(|s| s * 1000.0),
        queue_depth: after.sum("shoal_shard_queue_depth", &[]),
        rss_mib: after.sum("process_resident_memory_bytes", &[]) / 1_048_576.0,
        open_files: after.sum("process_open_fds", &[]),
    }
}

fn ms(v: Option<f64>) -> String {
    v.map_or_else(|| "-".to_owned(), |v| if v.is_infinite() { ">60000".to_owned() } else { format!("{v:.1}") })
}

/// The view as text.
pub fn render(endpoint: &str, coord: &CoordinatorRow, nodes: &[NodeRow], over: Duration) -> String {
    let mut out = format!("shoal top: {endpoint}  (rates over the last {:.1} s; p99 is a bucket's upper bound)\n\n", over.as_secs_f64());
    out.push_str(&format!(
        "coordinator  searches/s {:>9.1}  p99 ms {:>8}  errors/s {:>7.1}  RSS MiB {:>7.1}\n\n",
        coord.searches_per_s,
        ms(coord.search_p99_ms),
        coord.errors_per_s,
        coord.rss_mib
    ));
    out.push_str(&format!(
        "{:<12} {:<5} {:>11} {:>11} {:>11} {:>11} {:>11} {:>6} {:>8} {:>6}\n",
        "node", "state", "points", "upserts/s", "searches/s", "search p99", "commit p99", "queue", "RSS MiB", "files"
    ));
    for n in nodes {
        out.push_str(&format!(
            "{:<12} {:<5} {:>11.0} {:>11.1} {:>11.1} {:>11} {:>11} {:>6.0} {:>8.1} {:>6.0}\n",
            n.node,
            if n.up { "up" } else { "DOWN" },
            n.points,
            n.upserts_per_s,
            n.searches_per_s,
            ms(n.search_p99_ms),
            ms(n.commit_p99_ms),
            n.queue_depth,
            n.rss_mib,
            n.open_files
        ));
    }
    out
}

/// Where a `shoalctl` endpoint URL points, as host:port.
fn host_port(endpoint: &str) -> String {
    let rest = endpoint.split_once("://").map_or(endpoint, |(_, r)| r);
    rest.trim_end_matches('/').to_owned()
}

/// Scrapes everything twice, `interval` apart, and returns the view; with
/// `refresh`, keeps redrawing until Ctrl-C.
pub async fn run(endpoint: &str, interval: Duration, refresh: bool) -> anyhow::Result<()> {
    let mut client = ctl::connect(endpoint).await?;
    let coord_addr = host_port(endpoint);
    let mut last: Option<(Instant, Scrape, BTreeMap<String, Scrape>)> = None;
    loop {
        let status = client.cluster_status(v1::ClusterStatusRequest {}).await?.into_inner();
        let started = Instant::now();
        let coord = scrape(&coord_addr).await?;
        let mut nodes = BTreeMap::new();
        for n in &status.nodes {
            if let Ok(s) = scrape(&host_port(&n.address)).await {
                nodes.insert(n.id.clone(), s);
            }
        }
        if let Some((at, prev_coord, prev_nodes)) = &last {
            let over = started.duration_since(*at);
            let rows: Vec<NodeRow> = status
                .nodes
                .iter()
                .map(|n| {
                    let empty = Scrape::default();
                    let before = prev_nodes.get(&n.id).unwrap_or(&empty);
                    let after = nodes.get(&n.id).unwrap_or(&empty);
                    node_row(&n.id, n.available, before, after, over)
                })
                .collect();
            let view = render(endpoint, &coordinator_row(prev_coord, &coord, over), &rows, over);
            if refresh {
                // Clear the screen and go home before redrawing.
                print!("\x1b[2J\x1b[H{view}");
            } else {
                print!("{view}");
                return Ok(());
            }
        }
        last = Some((started, coord, nodes));
        tokio::select! {
            _ = tokio::time::sleep(interval) => {}
            _ = tokio::signal::ctrl_c() => return Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const BEFORE: &str = r#"# TYPE x histogram
lat_bucket{m="a",le="0.001"} 10
lat_bucket{m="a",le="0.01"} 10
lat_bucket{m="a",le="+Inf"} 10
lat_count{m="a"} 10
hits_total{collection="docs",shard="0"} 5
"#;
    const AFTER: &str = r#"lat_bucket{m="a",le="0.001"} 100
lat_bucket{m="a",le="0.01"} 109
lat_bucket{m="a",le="+Inf"} 110
lat_count{m="a"} 110
hits_total{collection="docs",shard="0"} 25
hits_total{collection="docs",shard="1"} 10
"#;

    #[test]
    fn rates_and_quantiles_come_from_the_difference_of_two_scrapes() {
        let (b, a) = (Scrape::parse(BEFORE), Scrape::parse(AFTER));
        assert_eq!(a.sum("hits_total", &[("collection", "docs")]), 35.0);
        assert_eq!(a.sum("hits_total", &[("shard", "1")]), 10.0);
        assert_eq!(rate(&b, &a, "hits_total", &[], Duration::from_secs(2)), 15.0);
        // 100 new observations: 90 under 1 ms, 9 under 10 ms, 1 above.
        assert_eq!(quantile_between(&b, &a, "lat", &[("m", "a")], 0.5), Some(0.001));
        assert_eq!(quantile_between(&b, &a, "lat", &[("m", "a")], 0.95), Some(0.01));
        assert_eq!(quantile_between(&b, &a, "lat", &[("m", "a")], 0.999), Some(f64::INFINITY));
        assert_eq!(quantile_between(&a, &a, "lat", &[("m", "a")], 0.99), None);
    }

    #[test]
    fn the_view_has_a_row_per_node() {
        let row = |node: &str, up| NodeRow {
            node: node.into(),
            up,
            points: 1000.0,
            upserts_per_s: 2.5,
            searches_per_s: 10.0,
            search_p99_ms: Some(2.5),
            commit_p99_ms: None,
            queue_depth: 0.0,
            rss_mib: 12.0,
            open_files: 30.0,
        };
        let coord = CoordinatorRow { searches_per_s: 30.0, search_p99_ms: Some(5.0), errors_per_s: 0.0, rss_mib: 9.0 };
        let view = render("http://x:1", &coord, &[row("shard-0", true), row("shard-1", false)], Duration::from_secs(2));
        assert!(view.contains("shard-0      up"), "{view}");
        assert!(view.contains("shard-1      DOWN"), "{view}");
        assert!(view.contains("searches/s      30.0"), "{view}");
        assert_eq!(host_port("http://127.0.0.1:7700/"), "127.0.0.1:7700");
    }
}
