//! Telemetry of real processes: one search through the coordinator is one
//! OTLP trace with a span on every shard, received by an OTLP collector in
//! this test; `/metrics` counters move with the work done.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use opentelemetry_proto::tonic::collector::metrics::v1::metrics_service_server::{MetricsService, MetricsServiceServer};
use opentelemetry_proto::tonic::collector::metrics::v1::{ExportMetricsServiceRequest, ExportMetricsServiceResponse};
use opentelemetry_proto::tonic::collector::trace::v1::trace_service_server::{TraceService, TraceServiceServer};
use opentelemetry_proto::tonic::collector::trace::v1::{ExportTraceServiceRequest, ExportTraceServiceResponse};
use opentelemetry_proto::tonic::common::v1::any_value::Value;
use shoal_proto::v1;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::check;
use crate::common::{Fixture, block_on, create, points, rng, upsert_all, vector};

/// A span as the collector received it.
#[derive(Clone, Debug)]
struct Received {
    service: String,
    name: String,
    trace: Vec<u8>,
    attributes: BTreeMap<String, String>,
}

/// An OTLP/gRPC collector that keeps the spans it is sent, and the
/// services that pushed metrics to it.
#[derive(Clone, Default)]
struct Collector(Arc<Mutex<Vec<Received>>>, Arc<Mutex<BTreeSet<String>>>);

#[tonic::async_trait]
impl MetricsService for Collector {
    async fn export(
        &self,
        r: tonic::Request<ExportMetricsServiceRequest>,
    ) -> Result<tonic::Response<ExportMetricsServiceResponse>, tonic::Status> {
        let mut got = self.1.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for rm in r.into_inner().resource_metrics {
            got.insert(service_name(rm.resource.as_ref()));
        }
        Ok(tonic::Response::new(ExportMetricsServiceResponse { partial_success: None }))
    }
}

#[tonic::async_trait]
impl TraceService for Collector {
    async fn export(
        &self,
        r: tonic::Request<ExportTraceServiceRequest>,
    ) -> Result<tonic::Response<ExportTraceServiceResponse>, tonic::Status> {
        let mut got = self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        for rs in r.into_inner().resource_spans {
            let service = service_name(rs.resource.as_ref());
            for ss in rs.scope_spans {
                for s in ss.spans {
                    let attributes =
                        s.attributes.iter().filter_map(|kv| Some((kv.key.clone(), text(kv.value.as_ref()?.value.as_ref()?)))).collect();
                    got.push(Received { service: service.clone(), name: s.name, trace: s.trace_id, attributes });
                }
            }
        }
        Ok(tonic::Response::new(ExportTraceServiceResponse { partial_success: None }))
    }
}

/// The `service.name` of an OTLP resource ("" if none).
fn service_name(resource: Option<&opentelemetry_proto::tonic::resource::v1::Resource>) -> String {
    resource
        .iter()
        .flat_map(|r| &r.attributes)
        .find(|kv| kv.key == "service.name")
        .and_then(|kv| kv.value.as_ref()?.value.as_ref())
        .map(text)
        .unwrap_or_default()
}

fn text(v: &Value) -> String {
    match v {
        Value::StringValue(s) => s.clone(),
        Value::IntValue(i) => i.to_string(),
        Value::BoolValue(b) => b.to_string(),
        Value::DoubleValue(d) => d.to_string(),
        other @ (Value::ArrayValue(_) | Value::KvlistValue(_) | Value::BytesValue(_) | Value::StringValueStrindex(_)) => {
            format!("{other:?}")
        }
    }
}

async fn start_collector() -> anyhow::Result<(SocketAddr, Collector)> {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let collector = Collector::default();
    let traces = TraceServiceServer::new(collector.clone());
    let metrics = MetricsServiceServer::new(collector.clone());
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(traces)
            .add_service(metrics)
            .serve_with_incoming(tokio_stream::wrappers::TcpListenerStream::new(listener)),
    );
    Ok((addr, collector))
}

/// With every process exporting to a collector, one search through the
/// coordinator arrives as one trace: the coordinator's search, a span per
/// shard, and each shard node's own spans under them, all with one trace id.
pub(crate) fn one_search_is_one_otlp_trace_with_a_span_per_shard() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let (addr, collector) = rt.block_on(start_collector())?;
    let endpoint = format!("http://{addr}");
    let fx = Fixture::start(3, |spec| {
        for env in [&mut spec.node_env, &mut spec.coordinator_env] {
            env.push(("OTEL_EXPORTER_OTLP_ENDPOINT".into(), endpoint.clone()));
            // Export within 100 ms instead of the default 5 s.
            env.push(("OTEL_BSP_SCHEDULE_DELAY".into(), "100".into()));
        }
    })?;
    rt.block_on(async {
        let mut client = fx.client().await?;
        let mut rng = rng("one_search_is_one_otlp_trace_with_a_span_per_shard");
        create(&mut client, "docs", 16, 3).await?;
        upsert_all(&mut client, "docs", points(&mut rng, 16, 0..300), 300).await?;
        // Only spans of the search from here on.
        tokio::time::sleep(Duration::from_millis(500)).await;
        collector.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clear();
        client.search(v1::SearchRequest { collection: "docs".into(), vector: vector(&mut rng, 16), k: 5, ..Default::default() }).await?;

        // Wait for the coordinator's search span and three shard nodes' spans.
        let deadline = Instant::now() + Duration::from_secs(15);
        let spans = loop {
            let spans = collector.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
            let coordinator_search = spans.iter().find(|s| s.service == "shoal-coordinator" && s.name == "search").cloned();
            if let Some(root) = coordinator_search {
                let in_trace: Vec<Received> = spans.into_iter().filter(|s| s.trace == root.trace).collect();
                let node_searches = in_trace.iter().filter(|s| s.service == "shoal-shard-node" && s.name == "search").count();
                if node_searches >= 3 {
                    break in_trace;
                }
            }
            check!(
                fx,
                Instant::now() < deadline,
                "the search's trace did not arrive: {:#?}",
                collector.0.lock().map(|g| g.clone()).unwrap_or_default()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        let traces: BTreeSet<&Vec<u8>> = spans.iter().map(|s| &s.trace).collect();
        check!(fx, traces.len() == 1, "{} traces", traces.len());
        let shard_spans: BTreeSet<String> = spans
            .iter()
            .filter(|s| s.service == "shoal-coordinator" && s.name == "shard")
            .filter_map(|s| s.attributes.get("shard").cloned())
            .collect();
        check!(fx, shard_spans == ["0", "1", "2"].map(String::from).into(), "coordinator shard spans: {shard_spans:?}");
        let node_shards: BTreeSet<String> = spans
            .iter()
            .filter(|s| s.service == "shoal-shard-node" && s.name == "search")
            .filter_map(|s| s.attributes.get("shard").cloned())
            .collect();
        check!(fx, node_shards == ["0", "1", "2"].map(String::from).into(), "shard node search spans: {node_shards:?}");
        let merges = spans.iter().filter(|s| s.name == "merge").count();
        check!(fx, merges == 1, "{merges} merge spans");
        let rpc_on_nodes = spans.iter().filter(|s| s.service == "shoal-shard-node" && s.name == "/shoal.v1.ShardNode/SearchShard").count();
        check!(fx, rpc_on_nodes == 3, "{rpc_on_nodes} SearchShard server spans: {spans:#?}");
        Ok(())
    })
}

/// `OTEL_METRICS_EXPORTER=none` on the shard node: its traces still reach
/// the collector but its metrics do not, while the coordinator (variable
/// unset) pushes both; `/metrics` is served either way.
pub(crate) fn otel_metrics_exporter_none_stops_the_otlp_metrics_push_only() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let (addr, collector) = rt.block_on(start_collector())?;
    let endpoint = format!("http://{addr}");
    let fx = Fixture::start(1, |spec| {
        for (env, interval) in [
            (&mut spec.node_env, "SHOAL_SHARD_TELEMETRY__METRICS_EXPORT_INTERVAL_MS"),
            (&mut spec.coordinator_env, "SHOAL_COORD_TELEMETRY__METRICS_EXPORT_INTERVAL_MS"),
        ] {
            env.push(("OTEL_EXPORTER_OTLP_ENDPOINT".into(), endpoint.clone()));
            env.push(("OTEL_BSP_SCHEDULE_DELAY".into(), "100".into()));
            env.push((interval.into(), "200".into()));
        }
        spec.node_env.push(("OTEL_METRICS_EXPORTER".into(), "none".into()));
    })?;
    rt.block_on(async {
        let mut client = fx.client().await?;
        let mut rng = rng("otel_metrics_exporter_none_stops_the_otlp_metrics_push_only");
        create(&mut client, "docs", 16, 1).await?;
        upsert_all(&mut client, "docs", points(&mut rng, 16, 0..100), 100).await?;
        client.search(v1::SearchRequest { collection: "docs".into(), vector: vector(&mut rng, 16), k: 5, ..Default::default() }).await?;
        let deadline = Instant::now() + Duration::from_secs(15);
        loop {
            let traced: BTreeSet<String> =
                collector.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).iter().map(|s| s.service.clone()).collect();
            let pushed = collector.1.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
            if traced.contains("shoal-shard-node") && pushed.contains("shoal-coordinator") {
                break;
            }
            check!(fx, Instant::now() < deadline, "spans from {traced:?}, metrics from {pushed:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // Several of its 200 ms push intervals more.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let pushed = collector.1.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        check!(fx, !pushed.contains("shoal-shard-node"), "the shard node pushed metrics with OTEL_METRICS_EXPORTER=none: {pushed:?}");
        let text = scrape(fx.cluster.nodes[0].addr).await?;
        check!(fx, sample(&text, "shoal_shard_points", &[r#"collection="docs""#]) == 100.0, "the node's /metrics:\n{text}");
        Ok(())
    })
}

/// At a sampling ratio of 0.3, 40 searches: the kept ones arrive as whole
/// traces (the coordinator's search and every shard's), and the others
/// leave no span anywhere: a shard node told the caller's trace is not
/// kept starts none of its own.
pub(crate) fn sampled_searches_are_whole_traces_and_the_others_leave_no_span() -> anyhow::Result<()> {
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let (addr, collector) = rt.block_on(start_collector())?;
    let endpoint = format!("http://{addr}");
    let fx = Fixture::start(3, |spec| {
        for (env, ratio) in [
            (&mut spec.node_env, "SHOAL_SHARD_TELEMETRY__SAMPLING_RATIO"),
            (&mut spec.coordinator_env, "SHOAL_COORD_TELEMETRY__SAMPLING_RATIO"),
        ] {
            env.push(("OTEL_EXPORTER_OTLP_ENDPOINT".into(), endpoint.clone()));
            env.push(("OTEL_BSP_SCHEDULE_DELAY".into(), "100".into()));
            env.push((ratio.into(), "0.3".into()));
        }
    })?;
    rt.block_on(async {
        let mut client = fx.client().await?;
        let mut rng = rng("sampled_searches_are_whole_traces_and_the_others_leave_no_span");
        create(&mut client, "docs", 16, 3).await?;
        upsert_all(&mut client, "docs", points(&mut rng, 16, 0..300), 300).await?;
        tokio::time::sleep(Duration::from_millis(500)).await;
        collector.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clear();
        let searches = 40;
        for _ in 0..searches {
            client
                .search(v1::SearchRequest { collection: "docs".into(), vector: vector(&mut rng, 16), k: 5, ..Default::default() })
                .await?;
        }
        // Every kept search's trace complete: three shard node searches.
        let deadline = Instant::now() + Duration::from_secs(15);
        let (kept, spans) = loop {
            tokio::time::sleep(Duration::from_millis(300)).await;
            let spans = collector.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
            let kept: BTreeSet<Vec<u8>> =
                spans.iter().filter(|s| s.service == "shoal-coordinator" && s.name == "search").map(|s| s.trace.clone()).collect();
            let whole = kept
                .iter()
                .all(|t| spans.iter().filter(|s| &s.trace == t && s.service == "shoal-shard-node" && s.name == "search").count() == 3);
            if whole || Instant::now() > deadline {
                break (kept, spans);
            }
        };
        check!(fx, !kept.is_empty() && kept.len() < searches, "{} of {searches} searches traced at a ratio of 0.3", kept.len());
        for t in &kept {
            let on_nodes = spans.iter().filter(|s| &s.trace == t && s.service == "shoal-shard-node" && s.name == "search").count();
            check!(fx, on_nodes == 3, "a kept search's trace has {on_nodes} shard node searches, not 3");
        }
        // Late spans of searches not kept would show up as traces of their own.
        tokio::time::sleep(Duration::from_millis(1000)).await;
        let spans = collector.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
        let orphans: Vec<&Received> =
            spans.iter().filter(|s| s.service == "shoal-shard-node" && s.name == "search" && !kept.contains(&s.trace)).collect();
        check!(fx, orphans.is_empty(), "{} shard node search spans outside the kept traces: {orphans:#?}", orphans.len());
        Ok(())
    })
}

/// `GET /metrics` over HTTP/1.1 on a process's gRPC port.
async fn scrape(addr: SocketAddr) -> anyhow::Result<String> {
    let mut s = tokio::net::TcpStream::connect(addr).await?;
    s.write_all(b"GET /metrics HTTP/1.1\r\nHost: shoal\r\nConnection: close\r\n\r\n").await?;
    let mut out = String::new();
    tokio::time::timeout(Duration::from_secs(10), s.read_to_string(&mut out)).await??;
    let (head, body) = out.split_once("\r\n\r\n").ok_or_else(|| anyhow::anyhow!("no HTTP response: {out}"))?;
    anyhow::ensure!(head.starts_with("HTTP/1.1 200"), "{head}");
    Ok(body.to_owned())
}

/// The sum of the samples of `name` whose labels include every one of
/// `labels` (`key="value"` strings).
fn sample(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (metric, rest) = series.split_once('{').unwrap_or((series, ""));
            (metric == name && labels.iter().all(|want| rest.contains(want))).then(|| value.parse::<f64>().ok())?
        })
        .sum()
}

/// Scraping every process before and after some work: the counters and
/// gauges say what was done, with collection and shard labels only.
pub(crate) fn metrics_move_with_the_work_done() -> anyhow::Result<()> {
    let fx = Fixture::start(2, |_| {})?;
    block_on(async {
        let mut client = fx.client().await?;
        let mut rng = rng("metrics_move_with_the_work_done");
        create(&mut client, "docs", 16, 4).await?;
        let coord = fx.cluster.coordinator.addr;
        let before = scrape(coord).await?;
        let search = r#"rpc_method="/shoal.v1.Shoal/Search""#;
        let searches_before = sample(&before, "rpc_server_call_duration_seconds_count", &[search, r#"rpc_grpc_status_code="0""#]);

        upsert_all(&mut client, "docs", points(&mut rng, 16, 0..500), 100).await?;
        for _ in 0..7 {
            client
                .search(v1::SearchRequest { collection: "docs".into(), vector: vector(&mut rng, 16), k: 3, ..Default::default() })
                .await?;
        }
        let missing =
            client.search(v1::SearchRequest { collection: "nope".into(), vector: vec![1.0; 16], k: 3, ..Default::default() }).await;
        check!(fx, missing.is_err(), "a search of a missing collection succeeded");

        let after = scrape(coord).await?;
        let searches = sample(&after, "rpc_server_call_duration_seconds_count", &[search, r#"rpc_grpc_status_code="0""#]) - searches_before;
        check!(fx, searches == 7.0, "{searches} OK searches counted:\n{after}");
        let not_found = sample(&after, "rpc_server_call_duration_seconds_count", &[search, r#"rpc_grpc_status_code="5""#]);
        check!(fx, not_found == 1.0, "{not_found} NOT_FOUND searches counted");
        check!(fx, sample(&after, "shoal_node_up", &[]) == 2.0, "shoal_node_up:\n{after}");
        check!(fx, sample(&after, "process_resident_memory_bytes", &[]) > 0.0, "no RSS:\n{after}");

        let mut upserted = 0.0;
        let mut points = 0.0;
        for node in &fx.cluster.nodes {
            let text = scrape(node.addr).await?;
            upserted += sample(&text, "shoal_shard_points_upserted_total", &[r#"collection="docs""#]);
            points += sample(&text, "shoal_shard_points", &[r#"collection="docs""#]);
            let applies = sample(&text, "rpc_server_call_duration_seconds_count", &[r#"rpc_method="/shoal.v1.ShardNode/ApplyBatch""#]);
            check!(fx, applies > 0.0, "{}: no ApplyBatch counted:\n{text}", node.id);
            check!(fx, sample(&text, "shoal_shard_commit_duration_seconds_count", &[]) > 0.0, "{}: no commits:\n{text}", node.id);
            check!(
                fx,
                sample(&text, "shoal_shard_search_duration_seconds_count", &[r#"collection="docs""#]) >= 7.0,
                "{}: searches:\n{text}",
                node.id
            );
            check!(fx, sample(&text, "shoal_shard_lmdb_map_bytes", &[]) > 0.0, "{}: no map size:\n{text}", node.id);
            check!(fx, sample(&text, "process_open_fds", &[]) > 0.0, "{}: no open files:\n{text}", node.id);
            check!(fx, sample(&text, "shoal_build_info", &[]) == 1.0, "{}: no build info:\n{text}", node.id);
            // Cardinality: every per-shard series is labelled by collection and shard, and
            // the plans counter by the plan's name, one of a fixed few.
            const PLANS: [&str; 5] = ["\"graph\"", "\"exact\"", "\"scan\"", "\"filtered_graph\"", "\"empty\""];
            for line in text.lines().filter(|l| l.starts_with("shoal_shard_")) {
                let labels = line.split_once('{').map_or("", |(_, r)| r.split_once('}').map_or("", |(l, _)| l));
                for kv in labels.split(',').filter(|s| !s.is_empty()) {
                    let (key, value) = kv.split_once('=').unwrap_or((kv, ""));
                    let bounded = key == "plan" && line.starts_with("shoal_shard_search_plans") && PLANS.contains(&value);
                    check!(
                        fx,
                        bounded
                            || ["collection", "shard", "le", "otel_scope_name", "otel_scope_version", "otel_scope_schema_url"]
                                .contains(&key),
                        "label {key} in {line}"
                    );
                }
            }
        }
        check!(fx, upserted == 500.0 && points == 500.0, "{upserted} points upserted, {points} live");
        Ok(())
    })
}

/// `shoalctl top --once` while searches and upserts run: a row per node,
/// and rates that say what the load did.
pub(crate) fn shoalctl_top_shows_the_metrics_of_each_node() -> anyhow::Result<()> {
    let fx = Fixture::start(2, |_| {})?;
    block_on(async {
        let mut client = fx.client().await?;
        let mut rng = rng("shoalctl_top_shows_the_metrics_of_each_node");
        create(&mut client, "docs", 16, 2).await?;
        upsert_all(&mut client, "docs", points(&mut rng, 16, 0..400), 200).await?;
        let endpoint = fx.cluster.endpoint();
        let top = tokio::task::spawn_blocking(move || {
            std::process::Command::new(env!("CARGO_BIN_EXE_shoalctl"))
                .args(["--endpoint", &endpoint, "top", "--once", "--interval", "1.5"])
                .output()
        });
        let load = async {
            let deadline = Instant::now() + Duration::from_millis(1_800);
            let mut n = 0u64;
            while Instant::now() < deadline {
                let q = v1::SearchRequest { collection: "docs".into(), vector: vector(&mut rng, 16), k: 3, ..Default::default() };
                client.search(q).await?;
                n += 1;
            }
            anyhow::Ok(n)
        };
        let (out, searches) = tokio::join!(top, load);
        let (out, searches) = (out??, searches?);
        let text = String::from_utf8_lossy(&out.stdout);
        check!(fx, out.status.success(), "shoalctl top failed: {}\n{text}", String::from_utf8_lossy(&out.stderr));
        eprintln!("{searches} searches while top ran:\n{text}");
        let mut points = 0.0;
        for node in ["shard-0", "shard-1"] {
            let row = text.lines().find(|l| l.starts_with(node)).unwrap_or_default();
            let fields: Vec<&str> = row.split_whitespace().collect();
            check!(fx, fields.len() == 10 && fields[1] == "up", "row of {node}: {row:?}\n{text}");
            let per_s: f64 = fields[4].parse().unwrap_or(0.0);
            check!(fx, per_s > 1.0, "{node} shows {per_s} searches/s under load\n{text}");
            points += fields[2].parse::<f64>().unwrap_or(0.0);
        }
        check!(fx, points == 400.0, "the rows hold {points} points, not 400\n{text}");
        let coord = text.lines().find(|l| l.starts_with("coordinator")).unwrap_or_default();
        let searches_per_s: f64 = coord.split_whitespace().nth(2).and_then(|v| v.parse().ok()).unwrap_or(0.0);
        check!(fx, searches_per_s > 1.0, "coordinator line: {coord:?}");
        Ok(())
    })
}

/// Exporting to a collector that is down costs spans, not requests: every
/// search succeeds, and each process still shuts down promptly on SIGTERM
/// (its last flush gives up after a few seconds).
pub(crate) fn an_unreachable_otlp_collector_stalls_nothing() -> anyhow::Result<()> {
    // A port that was free a moment ago, with nothing listening now.
    let closed = std::net::TcpListener::bind("127.0.0.1:0")?.local_addr()?;
    let endpoint = format!("http://{closed}");
    let fx = Fixture::start(2, |spec| {
        for env in [&mut spec.node_env, &mut spec.coordinator_env] {
            env.push(("OTEL_EXPORTER_OTLP_ENDPOINT".into(), endpoint.clone()));
            env.push(("OTEL_BSP_SCHEDULE_DELAY".into(), "50".into()));
        }
    })?;
    block_on(async {
        let mut client = fx.client().await?;
        let mut rng = rng("an_unreachable_otlp_collector_stalls_nothing");
        create(&mut client, "docs", 16, 2).await?;
        upsert_all(&mut client, "docs", points(&mut rng, 16, 0..300), 100).await?;
        for _ in 0..200 {
            let q = v1::SearchRequest {
                collection: "docs".into(),
                vector: vector(&mut rng, 16),
                k: 3,
                timeout_ms: 1_000,
                ..Default::default()
            };
            client.search(q).await?;
        }
        Ok(())
    })?;
    for p in fx.cluster.nodes.iter().chain(std::iter::once(&fx.cluster.coordinator)) {
        let started = Instant::now();
        let status = p.terminate()?;
        let took = started.elapsed();
        check!(fx, status.success() && took < Duration::from_secs(10), "{} ended with {status} after {took:?}", p.id);
    }
    Ok(())
}

/// `worker_threads` is the number of threads each process serves on (what
/// several processes sharing a machine's cores divide among them), and
/// `/metrics` says it; a process told 1 still serves; a number past the
/// bound stops the process before it serves, naming the setting.
pub(crate) fn worker_threads_sets_the_threads_each_process_serves_on() -> anyhow::Result<()> {
    let fx = Fixture::start(2, |spec| {
        spec.node_env_of.insert(0, vec![("SHOAL_SHARD_WORKER_THREADS".into(), "1".into())]);
        spec.coordinator_env.push(("SHOAL_COORD_WORKER_THREADS".into(), "1".into()));
    })?;
    let cores = std::thread::available_parallelism()?.get() as f64;
    block_on(async {
        let workers = "shoal_runtime_worker_threads";
        let coord = scrape(fx.cluster.coordinator.addr).await?;
        check!(fx, sample(&coord, workers, &[]) == 1.0, "coordinator told 1:\n{coord}");
        let one = scrape(fx.cluster.nodes[0].addr).await?;
        check!(fx, sample(&one, workers, &[]) == 1.0, "node told 1:\n{one}");
        let default = scrape(fx.cluster.nodes[1].addr).await?;
        check!(fx, sample(&default, workers, &[]) == cores, "node left at the default: one per core ({cores}):\n{default}");

        let mut client = fx.client().await?;
        let mut rng = rng("worker_threads_sets_the_threads_each_process_serves_on");
        create(&mut client, "docs", 16, 2).await?;
        upsert_all(&mut client, "docs", points(&mut rng, 16, 0..200), 100).await?;
        let found = client
            .search(v1::SearchRequest { collection: "docs".into(), vector: vector(&mut rng, 16), k: 5, ..Default::default() })
            .await?
            .into_inner();
        check!(fx, found.hits.len() == 5 && found.shards_answered == 2, "{found:?}");
        Ok(())
    })?;

    let refused = match Fixture::start(1, |spec| spec.node_env.push(("SHOAL_SHARD_WORKER_THREADS".into(), "5000".into()))) {
        Ok(_) => anyhow::bail!("a shard node told to run 5000 worker threads started"),
        Err(e) => format!("{e:#}"),
    };
    anyhow::ensure!(refused.contains("worker_threads must be between 0 (one per core) and 1024, got 5000"), "{refused}");
    Ok(())
}
