//! `search-bench`: searches an index directory that already exists, pass
//! after pass, so two indexes (a churned one and a fresh build of the same
//! points, kept by `churn --keep`) can be timed and profiled (`perf record
//! -p`) in the same run without the build in the samples.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context, Result, bail};
use serde_json::json;
use shoal_engine::{Index, IndexOptions, SearchParams};

use crate::fvecs::VecFile;

/// Flags of `search-bench`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Index directories to search, in turn each pass (their own params
    /// are read from the files).
    #[arg(long = "index", required = true)]
    indexes: Vec<PathBuf>,
    /// Query vectors (.fvecs).
    #[arg(long)]
    query: PathBuf,
    #[arg(long, default_value_t = 64)]
    ef: usize,
    #[arg(long, default_value_t = 10)]
    k: usize,
    /// Queries per pass (the first N rows).
    #[arg(long, default_value_t = 1000)]
    queries: usize,
    /// Passes; each index is searched once per pass, the order turning
    /// every pass, so drift in the machine's speed falls on all of them.
    #[arg(long, default_value_t = 5)]
    passes: usize,
    /// Fold each index's link log into its blocks first, as an idle shard
    /// node does (this changes the directory).
    #[arg(long)]
    fold: bool,
    /// Open each index with `IndexOptions::warm_max_bytes` at this (0:
    /// the engine's default, no warming): a file up to it is dropped from
    /// the page cache and read back in order first.
    #[arg(long, default_value_t = 0)]
    warm_max_bytes: u64,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
}

pub(crate) fn run(a: Args) -> Result<()> {
    if a.passes == 0 || a.queries == 0 || a.k == 0 {
        bail!("--passes, --queries and --k must be at least 1");
    }
    let file = VecFile::open(&a.query)?;
    let queries: Vec<Vec<f32>> = (0..a.queries.min(file.len())).map(|i| file.f32_row(i)).collect::<Result<_>>()?;
    let opts = IndexOptions { warm_max_bytes: a.warm_max_bytes, ..IndexOptions::default() };
    let indexes: Vec<Index> = a
        .indexes
        .iter()
        .map(|p| Index::open(p, opts.clone()).with_context(|| format!("opening {}", p.display())))
        .collect::<Result<_>>()?;
    if a.fold {
        for (index, path) in indexes.iter().zip(&a.indexes) {
            let t = Instant::now();
            let o = index.fold_link_log()?;
            eprintln!("{}: folded {} lists into {} blocks in {:.2}s", path.display(), o.lists, o.blocks, t.elapsed().as_secs_f64());
        }
    }
    let sp = SearchParams::new(a.k, a.ef.max(a.k));
    let mut qps: Vec<Vec<f64>> = vec![Vec::new(); indexes.len()];
    for pass in 0..a.passes {
        for turn in 0..indexes.len() {
            let i = (pass + turn) % indexes.len();
            let t = Instant::now();
            for q in &queries {
                std::hint::black_box(indexes[i].search(q, sp)?);
            }
            qps[i].push(queries.len() as f64 / t.elapsed().max(Duration::from_nanos(1)).as_secs_f64());
        }
    }
    let mut out = Vec::new();
    for ((path, runs), index) in a.indexes.iter().zip(&qps).zip(&indexes) {
        let stats = index.stats()?;
        let best = runs.iter().copied().fold(0.0, f64::max);
        let mut sorted = runs.clone();
        sorted.sort_by(f64::total_cmp);
        let median = sorted[sorted.len() / 2];
        eprintln!(
            "{}: best {best:.0} median {median:.0} queries/s ({}); {} live, {} tombstones, {} lists in the link log",
            path.display(),
            runs.iter().map(|q| format!("{q:.0}")).collect::<Vec<_>>().join(" "),
            stats.live,
            stats.tombstones,
            stats.link_log_lists,
        );
        out.push(json!({
            "index": path, "qps": runs, "best_qps": best, "median_qps": median,
            "live": stats.live, "tombstones": stats.tombstones, "link_log_lists": stats.link_log_lists,
        }));
    }
    if let Some(p) = &a.json {
        let doc =
            json!({"ef": a.ef, "k": a.k, "queries": queries.len(), "passes": a.passes, "warm_max_bytes": a.warm_max_bytes, "indexes": out});
        std::fs::write(p, serde_json::to_string_pretty(&doc)?).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}
