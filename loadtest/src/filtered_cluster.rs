//! `filtered-bench --cluster-shards N`: the same cases through an embedded
//! cluster (a coordinator and N shards over loopback gRPC, the points
//! split by id as any collection's are), each answer set beside the one
//! the single index gave for the same query and ef, and beside the truth.
//!
//! Exact and scan plans compare every match, so a split changes nothing
//! there and the ids must be the same; a walk over a third of the points
//! at the same ef finds at least as much, so there the figure to read is
//! recall, which must not drop.

use std::collections::{BTreeMap, HashSet};
use std::time::Instant;

use anyhow::{Context, Result, ensure};
use serde_json::{Value, json};
use shoal_ops::embedded::{EmbeddedCluster, EmbeddedConfig};
use shoal_proto::v1;

use crate::fvecs::VecFile;

/// What the comparison needs of one case.
pub(crate) struct CaseRun<'a> {
    pub(crate) name: &'a str,
    pub(crate) filter: &'a shoal_engine::Filter,
    /// Per query, the true top-k among the matches.
    pub(crate) truth: &'a [Vec<u32>],
    /// Per ef (in `efs` order), per query: the single index's ids.
    pub(crate) single: Vec<Vec<Vec<u64>>>,
}

/// What the cluster run is given.
pub(crate) struct Run<'a> {
    pub(crate) shards: u32,
    pub(crate) base: &'a VecFile,
    pub(crate) n: usize,
    pub(crate) rows: &'a [Vec<u8>],
    pub(crate) indexes: &'a [(&'a str, shoal_engine::FieldType)],
    pub(crate) queries: &'a [Vec<f32>],
    pub(crate) efs: &'a [usize],
    pub(crate) k: usize,
    pub(crate) cases: &'a [CaseRun<'a>],
}

/// The cluster's run of every case, one JSON object per case.
pub(crate) fn run(r: &Run<'_>) -> Result<Value> {
    tokio::runtime::Builder::new_multi_thread().enable_all().build()?.block_on(run_async(r))
}

async fn run_async(r: &Run<'_>) -> Result<Value> {
    let Run { shards, base, n, rows, indexes, queries, efs, k, cases } = *r;
    let root = tempfile::tempdir()?;
    let cluster = EmbeddedCluster::start(EmbeddedConfig::ephemeral(root.path(), shards as usize)).await?;
    let mut c = cluster.client().await?;
    let field_indexes = indexes
        .iter()
        .map(|(f, t)| v1::FieldIndex { field: (*f).into(), r#type: shoal_filter::wire::field_type_to_proto(*t) as i32 })
        .collect();
    c.create_collection(v1::CreateCollectionRequest {
        name: "bench".into(),
        dimension: base.dim() as u32,
        metric: v1::Metric::Cosine as i32,
        shard_count: shards,
        index: Some(v1::IndexParams { m: 16, ef_construction: 100 }),
        field_indexes,
        ..Default::default()
    })
    .await?;

    let t0 = Instant::now();
    let mut batches = Vec::new();
    for (offset, start) in (0..n).step_by(1000).enumerate() {
        let points = (start..(start + 1000).min(n))
            .map(|i| {
                let json = std::str::from_utf8(&rows[i][1..]).context("a payload row is not UTF-8")?.to_owned();
                Ok(v1::Point {
                    id: i as u64,
                    vector: base.f32_row(i)?,
                    payload: Some(v1::Payload { kind: Some(v1::payload::Kind::Json(json)) }),
                })
            })
            .collect::<Result<Vec<_>>>()?;
        batches.push(v1::IngestRequest {
            collection: "bench".into(),
            source: "bench".into(),
            offset: offset as u64,
            points,
            ..Default::default()
        });
    }
    let mut acks = c.ingest(tokio_stream::iter(batches)).await?.into_inner();
    let mut upserted = 0u64;
    while let Some(ack) = acks.message().await? {
        upserted += u64::from(ack.upserted);
    }
    ensure!(upserted == n as u64, "the cluster acknowledged {upserted} of {n} points");
    let ingest_s = t0.elapsed().as_secs_f64();
    eprintln!("cluster of {shards} shards: ingested {n} points with payloads in {ingest_s:.1}s");

    for q in queries.iter().take(200) {
        c.search(v1::SearchRequest { collection: "bench".into(), vector: q.clone(), k: k as u32, ef: 64, ..Default::default() }).await?;
    }
    let mut out = Vec::new();
    for case in cases {
        let filter = shoal_filter::wire::to_proto(case.filter);
        let mut res = Vec::new();
        for (e, &ef) in efs.iter().enumerate() {
            let (mut same, mut overlap, mut hits, mut total) = (0usize, 0usize, 0usize, 0usize);
            let mut plans: BTreeMap<String, u64> = BTreeMap::new();
            let t = Instant::now();
            for (i, q) in queries.iter().enumerate() {
                let r = c
                    .search(v1::SearchRequest {
                        collection: "bench".into(),
                        vector: q.clone(),
                        k: k as u32,
                        ef: ef.max(k) as u32,
                        filter: Some(filter.clone()),
                        ..Default::default()
                    })
                    .await?
                    .into_inner();
                ensure!(!r.partial && r.shards_answered == shards, "case {}: a partial answer", case.name);
                for x in &r.explain {
                    *plans.entry(x.explain.as_ref().map(|x| x.plan.clone()).unwrap_or_default()).or_default() += 1;
                }
                let got: HashSet<u64> = r.hits.iter().map(|h| h.id).collect();
                let single: HashSet<u64> = case.single[e][i].iter().copied().collect();
                same += usize::from(got == single);
                overlap += got.intersection(&single).count();
                let truth: HashSet<u64> = case.truth[i].iter().map(|&x| u64::from(x)).collect();
                total += truth.len();
                hits += got.intersection(&truth).count();
            }
            let dt = t.elapsed().as_secs_f64();
            let single_total: usize = case.single[e].iter().map(Vec::len).sum();
            let single_hits: usize =
                case.single[e].iter().zip(case.truth).map(|(s, t)| s.iter().filter(|id| t.contains(&(**id as u32))).count()).sum();
            res.push(json!({
                "ef": ef,
                "recall": ratio(hits, total),
                "single_recall": ratio(single_hits, total),
                "same_ids": ratio(same, queries.len()),
                "overlap": ratio(overlap, single_total),
                "qps": (queries.len() as f64 / dt * 10.0).round() / 10.0,
                "plans": plans,
            }));
        }
        let line: Vec<String> = res
            .iter()
            .map(|r| {
                format!(
                    "ef{} same {:.3} recall {:.3} (one shard {:.3})",
                    r["ef"],
                    num(&r["same_ids"]),
                    num(&r["recall"]),
                    num(&r["single_recall"])
                )
            })
            .collect();
        eprintln!("{:28} {}", case.name, line.join("; "));
        out.push(json!({"name": case.name, "search": res}));
    }
    cluster.shutdown().await?;
    Ok(json!({"shards": shards, "ingest_seconds": (ingest_s * 1000.0).round() / 1000.0, "cases": out}))
}

fn ratio(a: usize, b: usize) -> f64 {
    if b == 0 { 1.0 } else { (a as f64 / b as f64 * 10_000.0).round() / 10_000.0 }
}

fn num(v: &Value) -> f64 {
    v.as_f64().unwrap_or(f64::NAN)
}
