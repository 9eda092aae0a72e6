//! Each command end to end against an embedded cluster with small generated
//! data, parsed from its command line as a person would type it: the counts
//! add up, the collection holds what was acknowledged, the files exist.

use std::path::Path;

use clap::Parser;
use shoal_ops::embedded::{EmbeddedCluster, EmbeddedConfig};
use shoal_proto::v1;

use super::report::Report;
use crate::{Cli, Command};

async fn run(args: &[&str]) -> anyhow::Result<Report> {
    let argv = std::iter::once("shoal-loadtest").chain(args.iter().copied());
    match Cli::try_parse_from(argv)?.command {
        Command::Ingest(a) => super::ingest::run_report(a).await,
        Command::Query(a) => super::query::run_report(a).await,
        Command::Mixed(a) => super::mixed::run_report(a).await,
        Command::IndexBench(_)
        | Command::FilteredBench(_)
        | Command::ClusterBench(_)
        | Command::SnapshotBench(_)
        | Command::Compare(_)
        | Command::DiskBench(_)
        | Command::DiskCompare(_)
        | Command::Synth(_)
        | Command::Hardening(_)
        | Command::OtlpSink(_)
        | Command::HostNoise(_)
        | Command::Slowfs(_)
        | Command::Chaos(_)
        | Command::Churn(_)
        | Command::SearchBench(_) => anyhow::bail!("not a load command"),
    }
}

fn path(dir: &Path, name: &str) -> String {
    dir.join(name).to_string_lossy().into_owned()
}

/// The JSON file says what the returned report says; the SVG is there.
fn check_files(dir: &Path, r: &Report) {
    let json: serde_json::Value = serde_json::from_slice(&std::fs::read(dir.join("r.json")).expect("the JSON report")).unwrap();
    assert_eq!(json["command"], r.command);
    assert_eq!(json["phases"].as_array().unwrap().len(), r.phases.len());
    assert_eq!(json["phases"][0]["counts"]["ok"], r.phases[0].counts.ok);
    let svg = std::fs::read_to_string(dir.join("r.svg")).expect("the SVG chart");
    roxmltree::Document::parse(&svg).expect("well-formed SVG");
}

/// Every series: what was sent was answered or failed, per phase and
/// second by second.
fn check_counts(r: &Report) {
    for p in &r.phases {
        let c = &p.counts;
        assert_eq!(c.sent, c.ok + c.errors, "{}: {c:?}", p.name);
        assert_eq!(c.scheduled, c.sent + c.dropped, "{}: {c:?}", p.name);
        assert_eq!(c.errors, p.errors.values().sum::<u64>(), "{}", p.name);
    }
    for series in ["ingest", "query", "upsert", "delete"] {
        let ok: u64 = r.phases.iter().filter(|p| p.series == series).map(|p| p.counts.ok).sum();
        let items: u64 = r.phases.iter().filter(|p| p.series == series).map(|p| p.counts.items).sum();
        let tl_ok: u64 = r.timeline.iter().filter_map(|row| row.series.get(series)).map(|s| s.ok).sum();
        let tl_items: u64 = r.timeline.iter().filter_map(|row| row.series.get(series)).map(|s| s.items).sum();
        assert_eq!((ok, items), (tl_ok, tl_items), "{series}: the timeline adds up to the phases");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_streams_ack_every_point_into_the_collection() {
    let data = tempfile::tempdir().unwrap();
    let cluster = EmbeddedCluster::start(EmbeddedConfig::ephemeral(data.path(), 2)).await.unwrap();
    let url = cluster.endpoint();
    let out = tempfile::tempdir().unwrap();
    let (json, svg) = (path(out.path(), "r.json"), path(out.path(), "r.svg"));
    let r = run(&[
        "ingest",
        "--coordinator",
        &url,
        "--create",
        "--collection",
        "ing",
        "--shards",
        "3",
        "--points",
        "2000",
        "--dim",
        "16",
        "--streams",
        "3",
        "--batch",
        "100",
        "--source-prefix",
        "job",
        "--json",
        &json,
        "--svg",
        &svg,
    ])
    .await
    .unwrap();
    check_counts(&r);
    check_files(out.path(), &r);
    let p = &r.phases[0];
    assert_eq!((p.counts.sent, p.counts.ok, p.counts.errors, p.counts.items), (20, 20, 0, 2000), "{:?}", p.counts);
    assert!(p.latency_ms.count == 20 && p.latency_ms.max_ms > 0.0, "{:?}", p.latency_ms);
    assert_eq!(r.collection.points, Some(2000));
    // Checked from outside: the points, and each stream its own source whose
    // offsets ran from 0 (20 batches in all).
    let mut c = cluster.client().await.unwrap();
    let info = c.describe_collection(v1::DescribeCollectionRequest { name: "ing".into() }).await.unwrap().into_inner();
    assert_eq!(info.points, 2000);
    let offsets = c.get_offsets(v1::GetOffsetsRequest { collection: "ing".into(), sources: vec![] }).await.unwrap().into_inner().offsets;
    let mut names: Vec<&str> = offsets.iter().map(|o| o.source.as_str()).collect();
    names.sort_unstable();
    assert_eq!(names, ["job-0", "job-1", "job-2"]);
    assert_eq!(offsets.iter().map(|o| o.offset + 1).sum::<u64>(), 20);
    let got = c.get(v1::GetRequest { collection: "ing".into(), ids: vec![0, 999, 1999], with_vector: false }).await.unwrap().into_inner();
    assert!(got.missing.is_empty(), "{got:?}");

    // At a rate: 1500 vectors/s for 1 s sends at most the batches due by then.
    let r = run(&[
        // The same coordinator twice, two connections each: four clients in turn.
        "ingest",
        "--coordinator",
        &url,
        "--coordinator",
        &url,
        "--connections",
        "2",
        "--create",
        "--collection",
        "slow",
        "--points",
        "5000",
        "--dim",
        "16",
        "--streams",
        "2",
        "--batch",
        "100",
        "--rate",
        "1500",
        "--duration",
        "1s",
        "--no-progress",
    ])
    .await
    .unwrap();
    check_counts(&r);
    let c = &r.phases[0].counts;
    assert!(c.items <= 1500 && c.items >= 500, "{c:?}");
    assert_eq!(r.collection.points, Some(c.items));
    cluster.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_open_loop_sweep_measures_recall_on_an_embedded_cluster() {
    let out = tempfile::tempdir().unwrap();
    let (json, svg) = (path(out.path(), "r.json"), path(out.path(), "r.svg"));
    let r = run(&[
        "query",
        "--embedded",
        "2",
        "--shards",
        "2",
        "--points",
        "2000",
        "--dim",
        "16",
        "--queries",
        "50",
        "--exact-groundtruth",
        "--rate",
        "100",
        "--duration",
        "1s",
        "--ef",
        "16,64",
        "--k",
        "10",
        "--json",
        &json,
        "--svg",
        &svg,
    ])
    .await
    .unwrap();
    check_counts(&r);
    check_files(out.path(), &r);
    assert_eq!(r.preload.as_ref().map(|p| p.vectors_acked), Some(2000));
    assert_eq!(r.collection.points, Some(2000));
    assert_eq!(r.phases.iter().map(|p| p.name.as_str()).collect::<Vec<_>>(), ["ef=16", "ef=64"]);
    for p in &r.phases {
        // 100/s for 1 s: requests 0..=99 are due before the end.
        assert_eq!(p.counts.scheduled, 100, "{:?}", p.counts);
        assert_eq!((p.counts.errors, p.counts.dropped), (0, 0), "{:?}", p.errors);
        let recall = p.recall.as_ref().expect("recall with a ground truth");
        assert_eq!(recall.queries, p.counts.ok);
        assert!(recall.mean > 0.8 && recall.mean <= 1.0, "{recall:?}");
        assert!(p.params["mode"] == "open" && p.params["rate"] == 100.0);
    }
    assert!(r.phases[1].start_s >= r.phases[0].end_s);
    let svg = std::fs::read_to_string(out.path().join("r.svg")).unwrap();
    assert!(svg.contains("recall against QPS") && svg.contains("ef=64"));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn query_closed_loop_sends_exactly_its_count() {
    let r = run(&[
        "query",
        "--embedded",
        "1",
        "--points",
        "500",
        "--dim",
        "8",
        "--queries",
        "20",
        "--clients",
        "3",
        "--count",
        "60",
        "--no-progress",
    ])
    .await
    .unwrap();
    check_counts(&r);
    let p = &r.phases[0];
    assert_eq!((p.counts.sent, p.counts.ok, p.counts.late), (60, 60, 0), "{:?}", p.counts);
    assert!(p.recall.is_none());
    assert_eq!(p.params["mode"], "closed");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mixed_runs_every_kind_at_once_and_marks_its_fault() {
    let out = tempfile::tempdir().unwrap();
    let (json, svg) = (path(out.path(), "r.json"), path(out.path(), "r.svg"));
    let r = run(&[
        "mixed",
        "--embedded",
        "2",
        "--points",
        "3000",
        "--dim",
        "16",
        "--queries",
        "30",
        "--duration",
        "2s",
        "--streams",
        "2",
        "--batch",
        "100",
        "--ingest-rate",
        "500",
        "--query-rate",
        "50",
        "--upsert-rate",
        "20",
        "--delete-rate",
        "20",
        "--fault",
        "0.5s:run:echo fault-marker",
        "--json",
        &json,
        "--svg",
        &svg,
    ])
    .await
    .unwrap();
    check_counts(&r);
    check_files(out.path(), &r);
    let phase = |s: &str| r.phases.iter().find(|p| p.series == s).unwrap_or_else(|| panic!("no {s} phase"));
    let (ing, q, up, del) = (phase("ingest"), phase("query"), phase("upsert"), phase("delete"));
    for p in [ing, q, up, del] {
        assert!(p.counts.ok > 0 && p.counts.errors == 0, "{}: {:?} {:?}", p.name, p.counts, p.errors);
    }
    let preloaded = r.preload.as_ref().unwrap().vectors_acked;
    assert_eq!(preloaded, 1500);
    // Ingest at 500/s for 2 s: at most 1000 of the other 1500.
    assert!(ing.counts.items <= 1000, "{:?}", ing.counts);
    // Deletes hit distinct existing points, upserts only rewrite.
    assert_eq!(del.counts.items, del.counts.ok);
    assert_eq!(r.collection.points, Some(preloaded + ing.counts.items - del.counts.items));
    let f = &r.faults[0];
    assert!(f.ok && f.label == "run: echo fault-marker" && f.outcome.contains("fault-marker"), "{f:?}");
    assert!(f.fired_s.is_some_and(|t| (0.5..1.5).contains(&t)), "{f:?}");
    let svg = std::fs::read_to_string(out.path().join("r.svg")).unwrap();
    assert!(svg.contains("run: echo fault-marker"));
    for s in ["ingest vectors/s", "query ok/s", "upsert ok/s", "delete ok/s"] {
        assert!(svg.contains(s), "no {s}");
    }

    // Process faults need processes; refused before anything starts.
    let e = run(&["mixed", "--embedded", "1", "--duration", "1s", "--fault", "0.5s:kill:shard-0"]).await.unwrap_err();
    assert!(format!("{e:#}").contains("--processes"), "{e:#}");
}

/// A shard node stopped in the middle of an ingest: its streams fail with
/// UNAVAILABLE, are replaced, and go on once it is back; every batch is
/// accounted for (sent = acked + failed, scheduled = sent + dropped).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_goes_on_after_a_shard_node_comes_back() {
    let data = tempfile::tempdir().unwrap();
    let mut cluster = EmbeddedCluster::start(EmbeddedConfig::ephemeral(data.path(), 2)).await.unwrap();
    let url = cluster.endpoint();
    let load = tokio::spawn(async move {
        run(&[
            "ingest",
            "--coordinator",
            &url,
            "--create",
            "--collection",
            "bumpy",
            "--shards",
            "2",
            "--points",
            "20000",
            "--dim",
            "8",
            "--streams",
            "2",
            "--batch",
            "100",
            "--rate",
            "2000",
            "--duration",
            "3s",
            "--no-progress",
        ])
        .await
    });
    tokio::time::sleep(std::time::Duration::from_millis(900)).await;
    cluster.stop_node(1).await.unwrap();
    tokio::time::sleep(std::time::Duration::from_millis(700)).await;
    cluster.restart_node(1).await.unwrap();
    let r = load.await.unwrap().unwrap();
    check_counts(&r);
    let c = &r.phases[0].counts;
    // 2000/s in batches of 100 for 3 s: batches 0..60 are due, and each
    // was sent or dropped (taken by a stream that failed before sending).
    assert_eq!(c.scheduled, 60, "{c:?}");
    assert!(r.phases[0].errors.get("UNAVAILABLE").is_some_and(|&n| n > 0), "{:?} {c:?}", r.phases[0].errors);
    // Acked before the stop and again after the restart.
    let items = |t: usize| r.timeline[t].series["ingest"].items;
    assert!(items(0) > 0 && items(2) > 0, "{:?}", r.timeline);
    // A failed batch may have committed on the shard that was up.
    let points = r.collection.points.unwrap();
    assert!(points >= c.items && points <= c.sent * 100, "{points} {c:?}");
    cluster.shutdown().await.unwrap();
}

/// Against a coordinator that requires API keys (docs/security.md):
/// `--api-key` goes with every call, the collection's creation, the Ingest
/// streams and the searches; a run without a key is refused before it
/// measures anything; the key is not written to the report.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_the_api_key_goes_with_every_call_and_stays_out_of_the_report() {
    use shoal_ops::security::{key_entry_toml, new_api_key};
    let data = tempfile::tempdir().unwrap();
    let (admin, admin_hash) = new_api_key();
    let (reader, reader_hash) = new_api_key();
    let keys_file = data.path().join("keys.toml");
    let keys = [key_entry_toml("loadtest", &admin_hash, "admin", &[]), key_entry_toml("search", &reader_hash, "read", &[])];
    std::fs::write(&keys_file, keys.concat()).unwrap();
    let mut cfg = EmbeddedConfig::ephemeral(data.path().join("cluster"), 1);
    cfg.coordinator.auth.keys_file = Some(keys_file);
    let cluster = EmbeddedCluster::start(cfg).await.unwrap();
    let url = cluster.endpoint();
    let out = tempfile::tempdir().unwrap();
    let json = path(out.path(), "r.json");

    // Creating the collection needs an admin key, each Ingest stream a writer's.
    let r = run(&[
        "ingest",
        "--coordinator",
        &url,
        "--api-key",
        &admin,
        "--create",
        "--collection",
        "secured",
        "--points",
        "500",
        "--dim",
        "8",
        "--streams",
        "2",
        "--batch",
        "100",
        "--no-progress",
        "--json",
        &json,
    ])
    .await
    .unwrap();
    check_counts(&r);
    let c = &r.phases[0].counts;
    assert_eq!((c.sent, c.ok, c.errors, c.items), (5, 5, 0, 500), "{:?}", r.phases[0].errors);
    assert_eq!(r.collection.points, Some(500));
    let report = std::fs::read_to_string(&json).unwrap();
    assert!(!report.contains(&admin), "the key is in the report");

    // A reader's key is enough to search.
    let query: [&str; 14] = [
        "query",
        "--coordinator",
        &url,
        "--collection",
        "secured",
        "--points",
        "500",
        "--dim",
        "8",
        "--queries",
        "10",
        "--count",
        "30",
        "--no-progress",
    ];
    let r = run(&[&query[..], &["--api-key", &reader]].concat()).await.unwrap();
    check_counts(&r);
    let c = &r.phases[0].counts;
    assert_eq!((c.sent, c.ok, c.errors), (30, 30, 0), "{:?}", r.phases[0].errors);

    // Without a key: refused when the run checks the collection, before
    // any load is sent.
    let e = run(&query).await.unwrap_err();
    assert!(format!("{e:#}").contains("UNAUTHENTICATED"), "{e:#}");
    // A key that cannot be a header value is refused, without repeating it.
    let e = run(&[&query[..], &["--api-key", "shoal_s\u{e9}cret"]].concat()).await.unwrap_err();
    let e = format!("{e:#}");
    assert!(e.contains("--api-key: the API key must be printable ASCII") && !e.contains("cret"), "{e}");
    cluster.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_sends_each_rows_payload_into_a_collection_with_indexes() {
    let data = tempfile::tempdir().unwrap();
    let cluster = EmbeddedCluster::start(EmbeddedConfig::ephemeral(data.path().join("cluster"), 1)).await.unwrap();
    let url = cluster.endpoint();
    let payloads = data.path().join("p.jsonl");
    let rows: String = (0..300).map(|i| format!("{{\"tags\": [\"t{}\"], \"len\": {i}}}\n", i % 3)).collect();
    std::fs::write(&payloads, rows).unwrap();
    let r = run(&[
        "ingest",
        "--coordinator",
        &url,
        "--create",
        "--collection",
        "pay",
        "--index",
        "tags:keyword",
        "--index",
        "len:integer",
        "--points",
        "300",
        "--dim",
        "8",
        "--batch",
        "50",
        "--payloads",
        &payloads.to_string_lossy(),
        "--no-progress",
    ])
    .await
    .unwrap();
    check_counts(&r);
    assert_eq!(r.collection.points, Some(300));
    assert_eq!(r.config["common"]["target"]["indexes"], serde_json::json!(["tags:keyword", "len:integer"]));
    assert_eq!(r.config["common"]["data"]["payloads"], payloads.to_string_lossy().as_ref());
    let mut c = cluster.client().await.unwrap();
    let got = c.get(v1::GetRequest { collection: "pay".into(), ids: vec![7], with_vector: false }).await.unwrap().into_inner();
    let payload = got.points[0].payload.clone().and_then(|p| p.kind);
    assert_eq!(payload, Some(v1::payload::Kind::Json("{\"tags\": [\"t1\"], \"len\": 7}".into())));
    // Counted through the indexes (a field without one is refused).
    let filter =
        shoal_ops::points::read_filter(r#"{"must": [{"key": "tags", "match": "t1"}, {"key": "len", "range": {"lt": 30}}]}"#).unwrap();
    let n = c.count(v1::CountRequest { collection: "pay".into(), filter: Some(filter), ..Default::default() }).await.unwrap().into_inner();
    assert_eq!(n.count, 10);
    cluster.shutdown().await.unwrap();
}
