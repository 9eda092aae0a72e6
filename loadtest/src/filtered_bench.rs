//! `filtered-bench`: the shared filter cases on a dataset folder (made by
//! `../shared/datasets/pypi/make.sh`): per case its selectivity, the plan
//! each shard search chose, recall@10 and single-thread QPS at each ef.
//! Same flags and JSON shape as `../shared/peers/filtered_bench.py`, so
//! the peers' figures sit beside these.
//!
//! The index is built twice from the same points and payloads: with the
//! payload indexes of the peers' runs (keyword `tags`, integer `rand` and
//! `len`, declared on the empty shard) and without, for the build time
//! and file size the indexes cost.

use std::collections::{BTreeMap, HashSet};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde_json::{Value, json};
use shoal_engine::{
    Batch, FieldType, Filter, Index, IndexOptions, IndexParams, Metric, Op, PAYLOAD_JSON, PlannerOptions, Point, Rescore, SearchParams,
    Stop, Where,
};

use crate::fvecs::VecFile;
use crate::memory::PeakSampler;

const K: usize = 10;

/// The payload indexes of the shared runs.
const INDEXES: [(&str, FieldType); 3] = [("tags", FieldType::Keyword), ("rand", FieldType::Integer), ("len", FieldType::Integer)];

/// Flags of `filtered-bench`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Dataset folder: base.fvecs, query.fvecs, payload.jsonl, filters.json,
    /// `groundtruth-<case>.ivecs` (and groundtruth.ivecs for the unfiltered
    /// reference).
    #[arg(long)]
    dir: PathBuf,
    /// Query vectors (default DIR/query.fvecs).
    #[arg(long)]
    queries: Option<PathBuf>,
    /// Folder of `groundtruth-<case>.ivecs` (default DIR).
    #[arg(long)]
    groundtruth_dir: Option<PathBuf>,
    /// Case list (default GROUNDTRUTH_DIR/filters.json).
    #[arg(long)]
    cases: Option<PathBuf>,
    /// Comma-separated case names to run (default all).
    #[arg(long, value_delimiter = ',')]
    only: Vec<String>,
    #[arg(long, default_value_t = 16)]
    m: u16,
    #[arg(long, default_value_t = 100)]
    ef_construction: u32,
    /// Build threads.
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Comma-separated search ef values.
    #[arg(long, default_value = "64,128", value_delimiter = ',')]
    ef: Vec<usize>,
    /// Use only the first N base rows (selectivities and ground truth are
    /// then computed here, exactly).
    #[arg(long)]
    limit: Option<usize>,
    /// Queries to run.
    #[arg(long, default_value_t = 1000)]
    max_queries: usize,
    #[arg(long, default_value_t = 10_000)]
    batch_size: usize,
    /// Matches up to which a shard compares every matching point by its
    /// exact vector (the engine's default unless given).
    #[arg(long)]
    exact_max: Option<u64>,
    /// Matches up to which it compares their codes (default: the engine's).
    #[arg(long)]
    scan_max: Option<u64>,
    /// Candidates per result a scan re-scores (default: the engine's).
    #[arg(long)]
    scan_rescore: Option<usize>,
    /// Scan rather than walk while matches × share ≤ this × ef (default:
    /// the engine's).
    #[arg(long)]
    scan_per_ef: Option<f64>,
    /// Walk candidates re-scored with exact vectors: `all`, or `kN` for
    /// the best max(k × N, 20) (the engine's default is `k2`).
    #[arg(long, default_value = "k2", value_parser = crate::index_bench::parse_rescore)]
    rescore: Rescore,
    /// Skip the build without payload indexes.
    #[arg(long)]
    no_baseline: bool,
    /// Where the index environments go (default: the system temp dir).
    #[arg(long)]
    index_dir: Option<PathBuf>,
    /// Keep the index with payload indexes in this folder, and search the
    /// one already there instead of building again (for profiling the
    /// searches; no baseline is built then).
    #[arg(long)]
    reuse: Option<PathBuf>,
    /// Also run every case through an embedded cluster of this many
    /// shards (loopback gRPC) and compare its ids with the single index's.
    #[arg(long)]
    cluster_shards: Option<u32>,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

struct Case {
    name: String,
    filter_json: Value,
    filter: Filter,
    /// Base rows matching, ascending.
    matches: Vec<u32>,
    /// Per query, the true top-10 among the matches (fewer if fewer match).
    truth: Vec<Vec<u32>>,
}

pub(crate) fn run(a: Args) -> Result<()> {
    let base = VecFile::open(&a.dir.join("base.fvecs"))?;
    let queries_path = a.queries.clone().unwrap_or_else(|| a.dir.join("query.fvecs"));
    let query = VecFile::open(&queries_path)?;
    if base.dim() != query.dim() {
        bail!("base has dimension {}, queries {}", base.dim(), query.dim());
    }
    let n = a.limit.unwrap_or(base.len()).min(base.len());
    let queries: Vec<Vec<f32>> = (0..a.max_queries.min(query.len())).map(|i| query.f32_row(i)).collect::<Result<_>>()?;
    let rows = read_payloads(&a.dir.join("payload.jsonl"), n)?;
    let gt_dir = a.groundtruth_dir.clone().unwrap_or_else(|| a.dir.clone());
    let cases_path = a.cases.clone().unwrap_or_else(|| gt_dir.join("filters.json"));
    let cases = read_cases(&a, &cases_path, &gt_dir, &base, n, &queries, &rows)?;

    let params = IndexParams::new(base.dim() as u32, Metric::Cosine).with_m(a.m).with_ef_construction(a.ef_construction);
    let d = PlannerOptions::default();
    let planner = PlannerOptions {
        exact_max: a.exact_max.unwrap_or(d.exact_max),
        scan_max: a.scan_max.unwrap_or(d.scan_max),
        scan_rescore: a.scan_rescore.unwrap_or(d.scan_rescore),
        scan_per_ef: a.scan_per_ef.unwrap_or(d.scan_per_ef),
    };
    let planner_json = json!({"exact_max": planner.exact_max, "scan_max": planner.scan_max,
                              "scan_rescore": planner.scan_rescore, "scan_per_ef": planner.scan_per_ef,
                              "rescore": format!("{:?}", a.rescore)});
    let opts = IndexOptions { build_threads: a.threads, planner, rescore: a.rescore, ..IndexOptions::default() };
    let root = match &a.index_dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            tempfile::tempdir_in(d)?
        }
        None => tempfile::tempdir()?,
    };
    if let Some(keep) = &a.reuse
        && keep.join("data.mdb").exists()
    {
        let index = Index::open(keep, opts)?;
        let (out_cases, single) = search_cases(&a, &index, &cases, &queries, n)?;
        let cluster = through_cluster(&a, &base, n, &rows, &queries, &cases, single)?;
        let out = json!({"lib": "shoal", "reused": keep, "params": {"planner": planner_json}, "cases": out_cases, "cluster": cluster});
        return write_out(&a, &out);
    }
    let baseline = if a.no_baseline || a.reuse.is_some() {
        Value::Null
    } else {
        let (index, build) = build(&root.path().join("plain"), params, opts.clone(), &base, n, &rows, false, a.batch_size)?;
        let unfiltered = unfiltered(&a, &index, &queries, n)?;
        json!({"build": build, "unfiltered": unfiltered})
    };
    let dir = a.reuse.clone().unwrap_or_else(|| root.path().join("indexed"));
    let (index, build) = build(&dir, params, opts, &base, n, &rows, true, a.batch_size)?;
    let (out_cases, single) = search_cases(&a, &index, &cases, &queries, n)?;
    drop(index);
    let cluster = through_cluster(&a, &base, n, &rows, &queries, &cases, single)?;
    let out = json!({
        "lib": "shoal",
        "params": {"m": a.m, "ef_construction": a.ef_construction, "threads": a.threads, "metric": "cosine", "base": n,
                   "queries": queries.len(), "limit": a.limit, "queries_file": queries_path, "cases_file": cases_path,
                   "batch_size": a.batch_size,
                   "planner": planner_json},
        "build": build,
        "baseline": baseline,
        "cases": out_cases,
        "cluster": cluster,
    });
    write_out(&a, &out)
}

/// With `--cluster-shards`, every case again through a cluster.
fn through_cluster(
    a: &Args,
    base: &VecFile,
    n: usize,
    rows: &[Vec<u8>],
    queries: &[Vec<f32>],
    cases: &[Case],
    single: FoundIds,
) -> Result<Value> {
    let Some(shards) = a.cluster_shards else { return Ok(Value::Null) };
    let runs = cases
        .iter()
        .zip(single)
        .map(|(c, single)| crate::filtered_cluster::CaseRun { name: &c.name, filter: &c.filter, truth: &c.truth, single })
        .collect::<Vec<_>>();
    crate::filtered_cluster::run(&crate::filtered_cluster::Run {
        shards,
        base,
        n,
        rows,
        indexes: &INDEXES,
        queries,
        efs: &a.ef,
        k: K,
        cases: &runs,
    })
}

fn write_out(a: &Args, out: &Value) -> Result<()> {
    println!("{}", serde_json::to_string_pretty(out)?);
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(out)?).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

/// Ids found per case, per ef, per query.
type FoundIds = Vec<Vec<Vec<Vec<u64>>>>;

/// Every case at every ef: recall, QPS and the plans the searches ran;
/// and the ids found.
fn search_cases(a: &Args, index: &Index, cases: &[Case], queries: &[Vec<f32>], n: usize) -> Result<(Vec<Value>, FoundIds)> {
    // A pass of unfiltered searches first, so that no case pays for
    // faulting the index's pages in (a reused index opens cold).
    for q in queries.iter().take(200) {
        index.search(q, SearchParams::new(K, 64))?;
    }
    let mut out_cases = Vec::new();
    let mut ids = Vec::new();
    for case in cases {
        let mut case_ids = Vec::new();
        let count = index.count(Where::new(&case.filter))?;
        if count != case.matches.len() as u64 {
            bail!("case {}: shoal counts {count} matches, the payload {}", case.name, case.matches.len());
        }
        let mut res = Vec::new();
        for &ef in &a.ef {
            let sp = SearchParams::new(K, ef.max(K));
            let (mut hits, mut total, mut violations, mut compared) = (0usize, 0usize, 0usize, 0u64);
            let mut plans: BTreeMap<&'static str, u64> = BTreeMap::new();
            let t = Instant::now();
            let mut found = Vec::with_capacity(queries.len());
            for q in queries {
                found.push(index.search_where(q, sp, Where::new(&case.filter), &Stop::never())?);
            }
            let dt = t.elapsed().as_secs_f64();
            case_ids.push(found.iter().map(|f| f.hits.iter().map(|h| h.id).collect()).collect());
            for (f, truth) in found.iter().zip(&case.truth) {
                let truth: HashSet<u32> = truth.iter().copied().collect();
                total += truth.len();
                hits += f.hits.iter().filter(|h| truth.contains(&(h.id as u32))).count();
                violations += f.hits.iter().filter(|h| case.matches.binary_search(&(h.id as u32)).is_err()).count();
                *plans.entry(f.explain.plan.name()).or_default() += 1;
                compared += f.explain.compared;
            }
            let recall = if total == 0 { 1.0 } else { hits as f64 / total as f64 };
            let mut r = json!({"ef": ef, "recall": round(recall, 4), "qps": round(queries.len() as f64 / dt, 1),
                               "plans": plans, "compared_per_query": compared / queries.len().max(1) as u64});
            if violations > 0 {
                r["violations"] = json!(violations);
            }
            res.push(r);
        }
        let selectivity = case.matches.len() as f64 / n as f64;
        let line: Vec<String> = res
            .iter()
            .map(|r| {
                format!(
                    "{:.3}@{:.0}qps({})",
                    r["recall"].as_f64().unwrap_or(0.0),
                    r["qps"].as_f64().unwrap_or(0.0),
                    plan_names(&r["plans"])
                )
            })
            .collect();
        eprintln!("{:28} {:7.3}%  search:{}", case.name, 100.0 * selectivity, line.join(" "));
        out_cases.push(json!({"name": case.name, "filter": case.filter_json, "selectivity": round(selectivity, 6),
                              "matches": case.matches.len(), "search": res}));
        ids.push(case_ids);
    }
    Ok((out_cases, ids))
}

fn plan_names(plans: &Value) -> String {
    plans.as_object().map(|m| m.keys().cloned().collect::<Vec<_>>().join("+")).unwrap_or_default()
}

/// Builds an index of the first `n` rows with their payloads, declaring
/// the shared payload indexes on the empty shard if `indexed`.
#[allow(clippy::too_many_arguments)]
fn build(
    dir: &Path,
    params: IndexParams,
    opts: IndexOptions,
    base: &VecFile,
    n: usize,
    rows: &[Vec<u8>],
    indexed: bool,
    batch_size: usize,
) -> Result<(Index, Value)> {
    let index = Index::open_or_create(dir, params, opts)?;
    if indexed {
        for (field, kind) in INDEXES {
            index.create_field_index(field, kind)?;
        }
    }
    let sampler = PeakSampler::start();
    let t0 = Instant::now();
    for start in (0..n).step_by(batch_size.max(1)) {
        let end = (start + batch_size).min(n);
        let ops = (start..end)
            .map(|i| Ok(Op::Upsert(Point { id: i as u64, vector: base.f32_row(i)?, payload: Some(rows[i].clone()) })))
            .collect::<Result<Vec<_>>>()?;
        index.apply(Batch { ops, source: None }).with_context(|| format!("batch {start}..{end}"))?;
        eprint!("\rbuilt {end}/{n} ({}) in {:.1}s", if indexed { "with payload indexes" } else { "without" }, t0.elapsed().as_secs_f64());
    }
    let secs = t0.elapsed().as_secs_f64();
    eprintln!();
    let stats = index.stats()?;
    let indexes = index.field_indexes()?;
    let build = json!({"vectors": n, "seconds": round(secs, 3), "vectors_per_s": round(n as f64 / secs, 1),
                       "disk_bytes": stats.disk_bytes, "raw_bytes": (n * base.dim() * 4) as u64,
                       "peak_rss_anon_bytes": sampler.finish(),
                       "table_bytes": stats.table_bytes.iter().map(|(k, v)| ((*k).to_owned(), json!(v))).collect::<serde_json::Map<_, _>>(),
                       "payload_index_points": indexes.iter().map(|i| (i.field.clone(), json!(i.points))).collect::<serde_json::Map<_, _>>()});
    Ok((index, build))
}

/// Recall and QPS without a filter, the reference for each ef.
fn unfiltered(a: &Args, index: &Index, queries: &[Vec<f32>], n: usize) -> Result<Value> {
    let path = a.dir.join("groundtruth.ivecs");
    if a.limit.is_some_and(|l| l < n.max(1)) || !path.exists() || a.queries.is_some() {
        return Ok(Value::Null);
    }
    let g = VecFile::open(&path)?;
    let mut out = Vec::new();
    for &ef in &a.ef {
        let sp = SearchParams::new(K, ef.max(K));
        let t = Instant::now();
        let mut hits = 0;
        for (i, q) in queries.iter().enumerate() {
            let truth: HashSet<u32> = g.i32_row(i)?[..K].iter().map(|&x| x as u32).collect();
            hits += index.search(q, sp)?.iter().filter(|h| truth.contains(&(h.id as u32))).count();
        }
        let dt = t.elapsed().as_secs_f64();
        out.push(
            json!({"ef": ef, "recall": round(hits as f64 / (K * queries.len()) as f64, 4), "qps": round(queries.len() as f64 / dt, 1)}),
        );
    }
    Ok(json!(out))
}

/// Each row's payload as the shard node stores a JSON payload.
fn read_payloads(path: &Path, n: usize) -> Result<Vec<Vec<u8>>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut rows = Vec::with_capacity(n);
    for (i, line) in text.lines().take(n).enumerate() {
        let v: Value = serde_json::from_str(line).with_context(|| format!("{}: line {}", path.display(), i + 1))?;
        if v.get("id").and_then(Value::as_u64) != Some(i as u64) {
            bail!("{}: line {} is not row {i}", path.display(), i + 1);
        }
        let mut stored = vec![PAYLOAD_JSON];
        stored.extend_from_slice(line.as_bytes());
        rows.push(stored);
    }
    if rows.len() < n {
        bail!("{} has {} rows, the base {n}", path.display(), rows.len());
    }
    Ok(rows)
}

fn read_cases(a: &Args, path: &Path, gt_dir: &Path, base: &VecFile, n: usize, queries: &[Vec<f32>], rows: &[Vec<u8>]) -> Result<Vec<Case>> {
    let list: Vec<Value> = serde_json::from_str(&std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?)?;
    let objects: Vec<Value> = rows.iter().map(|r| serde_json::from_slice(&r[1..])).collect::<Result<_, _>>()?;
    let mut out = Vec::new();
    for c in list {
        let name = c["name"].as_str().context("a case without a name")?.to_owned();
        if !a.only.is_empty() && !a.only.contains(&name) {
            continue;
        }
        let filter_json = c["filter"].clone();
        let filter = shoal_engine::parse_filter(&filter_json.to_string()).map_err(|e| anyhow::anyhow!("case {name}: {e}"))?;
        let matches: Vec<u32> = (0..n as u32).filter(|&i| case_matches(&filter_json, &objects[i as usize])).collect();
        let file = gt_dir.join(format!("groundtruth-{name}.ivecs"));
        let truth = if a.limit.is_none() && file.exists() {
            let g = VecFile::open(&file)?;
            (0..queries.len())
                .map(|i| Ok(g.i32_row(i)?.iter().take(K).filter(|&&x| x >= 0).map(|&x| x as u32).collect()))
                .collect::<Result<_>>()?
        } else {
            eprintln!("case {name}: exact filtered top-{K} over {} matching rows...", matches.len());
            crate::groundtruth::exact_among(base, &matches, queries, Metric::Cosine, K)?
        };
        out.push(Case { name, filter_json, filter, matches, truth });
    }
    Ok(out)
}

/// The case language's meaning on one payload, as `filters.py` computes
/// it (independently of the engine): ranges on numbers, `match`/`any` on
/// a list's members or a scalar's value.
fn case_matches(f: &Value, row: &Value) -> bool {
    let list = |k: &str| f.get(k).and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    let cond = |c: &Value| -> bool {
        let Some(key) = c.get("key").and_then(Value::as_str) else { return case_matches(c, row) };
        let v = &row[key];
        if let Some(r) = c.get("range") {
            let Some(x) = v.as_f64() else { return false };
            let b = |op: &str| r.get(op).and_then(Value::as_f64);
            return b("gt").is_none_or(|y| x > y)
                && b("gte").is_none_or(|y| x >= y)
                && b("lt").is_none_or(|y| x < y)
                && b("lte").is_none_or(|y| x <= y);
        }
        let wanted: Vec<&Value> = match c.get("match") {
            Some(m) => vec![m],
            None => c.get("any").and_then(Value::as_array).map(|a| a.iter().collect()).unwrap_or_default(),
        };
        match v.as_array() {
            Some(items) => wanted.iter().any(|w| items.contains(w)),
            None => wanted.contains(&v),
        }
    };
    list("must").iter().all(cond) && (list("should").is_empty() || list("should").iter().any(cond)) && !list("must_not").iter().any(cond)
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_case_language_means_what_filters_py_computes() {
        let row = json!({"tags": ["api", "web"], "rand": 40, "len": 55});
        let yes = [
            json!({"must": [{"key": "tags", "match": "api"}]}),
            json!({"must": [{"key": "rand", "range": {"lt": 41}}, {"key": "len", "range": {"gte": 49, "lt": 62}}]}),
            json!({"must": [{"key": "tags", "any": ["aws", "web"]}]}),
            json!({"must_not": [{"key": "tags", "match": "python"}]}),
            json!({"should": [{"key": "rand", "match": 40}, {"key": "tags", "match": "x"}]}),
        ];
        let no = [
            json!({"must": [{"key": "tags", "match": "python"}]}),
            json!({"must": [{"key": "rand", "range": {"gte": 41}}]}),
            json!({"must": [{"key": "missing", "range": {"lt": 5}}]}),
            json!({"must_not": [{"must": [{"key": "tags", "match": "web"}]}]}),
        ];
        for f in &yes {
            assert!(case_matches(f, &row), "{f}");
        }
        for f in &no {
            assert!(!case_matches(f, &row), "{f}");
        }
    }
}
