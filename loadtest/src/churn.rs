//! `churn`: how an index holds up when its points are edited, deleted and
//! added round after round (issue 22). A sibling of `index-bench` with the
//! same flags and JSON conventions.
//!
//! It starts from the first `--limit` base vectors, then runs `--rounds`
//! rounds; each deletes `--delete-frac` of the live points, upserts
//! `--upsert-frac` of them with an edited vector (the point's own base
//! vector mixed 0.8 / 0.2 with another, as a re-embedded edited text lands
//! near the old one) and inserts `--insert-frac` new points (mixtures of two
//! random base vectors, so they are new and not copies). After each round it
//! measures recall@k at `--ef` against exact search over the live set,
//! single-thread QPS, the file's size and tombstones, and the same for a
//! fresh build of the same live set.
//!
//! `--plan-out` writes the rounds as JSON lines, which
//! `loadtest/peers/churn_hnswlib.py` replays on hnswlib (format in
//! loadtest/peers/README.md).

use std::collections::HashSet;
use std::io::Write as _;
use std::path::PathBuf;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::{Rng, SeedableRng};
use rayon::prelude::*;
use serde_json::json;
use shoal_engine::{Batch, Index, IndexOptions, IndexParams, Metric, Op, Point, SearchParams};

use crate::fvecs::VecFile;

/// Flags of `churn`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Base vectors (.fvecs); cosine, each row a unit vector or not.
    #[arg(long)]
    base: PathBuf,
    /// Query vectors (.fvecs).
    #[arg(long)]
    query: PathBuf,
    /// Points at the start (the first N base rows).
    #[arg(long, default_value_t = 100_000)]
    limit: usize,
    #[arg(long, default_value_t = 30)]
    rounds: usize,
    /// Share of the live points upserted with an edited vector per round.
    #[arg(long, default_value_t = 0.10)]
    upsert_frac: f64,
    /// Share of the live points deleted per round.
    #[arg(long, default_value_t = 0.03)]
    delete_frac: f64,
    /// New points per round, as a share of the live points.
    #[arg(long, default_value_t = 0.03)]
    insert_frac: f64,
    #[arg(long, default_value_t = 7)]
    seed: u64,
    #[arg(long, default_value_t = 16)]
    m: u16,
    #[arg(long, default_value_t = 100)]
    ef_construction: u32,
    /// Build threads (the calling thread included).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Search ef of the measurements.
    #[arg(long, default_value_t = 64)]
    ef: usize,
    #[arg(long, default_value_t = 10)]
    k: usize,
    /// Queries per measurement.
    #[arg(long, default_value_t = 1000)]
    queries: usize,
    /// Passes over the queries per measurement; QPS is the best pass.
    /// The first pass right after a build or a round pays for warming
    /// (at round 0, where both indexes are the same build, a single pass
    /// measured the churned index at 0.83x the fresh one).
    #[arg(long, default_value_t = 3)]
    passes: usize,
    /// Passes over the queries taken in turn on the churned index and the
    /// fresh build once both exist, in the order ABBA BAAB ..., so that
    /// the machine's drift falls on both alike; `paired_qps_ratio` is the
    /// median of the pairs' ratios. 0: none. (The one-after-the-other
    /// measurement put the churned index at 0.87x the fresh build at
    /// round 0, where the two are the same build.)
    #[arg(long, default_value_t = 8)]
    paired_passes: usize,
    /// Measure the paired passes on the page cache as the round and the
    /// fresh build left it. By default both files are first dropped from
    /// the page cache and read back in order: how a file came into the
    /// cache decides its search speed by up to 1.3x on this machine
    /// (pages faulted in one at a time against pages read in order: see
    /// docs/benchmarks.md, "Page cache warm-up"), and the two files come
    /// in differently (the churned one through many rounds of writes and a
    /// compaction).
    #[arg(long)]
    page_cache_as_left: bool,
    /// Operations per batch when a round is applied (and per batch of the
    /// builds).
    #[arg(long, default_value_t = 10_000)]
    batch_size: usize,
    /// Measure the fresh build only every K rounds (and on the last).
    #[arg(long, default_value_t = 1)]
    fresh_every: usize,
    /// Keep retired nodes as tombstones instead of reusing their slots
    /// (the engine's behaviour before issue 22, for comparison).
    #[arg(long)]
    no_reuse: bool,
    /// After each round, run vacuum steps while tombstones still linked
    /// make up at least this share of the nodes, as an idle shard node
    /// does (`engine.vacuum_ratio`; 0: never vacuum). The default is the
    /// engine's.
    #[arg(long)]
    vacuum_ratio: Option<f64>,
    /// Tombstones per vacuum step (`writer.vacuum_step`).
    #[arg(long, default_value_t = 1000)]
    vacuum_step: usize,
    /// After the vacuum, fold the link log into its blocks when it holds
    /// at least this many lists per node, as an idle shard node does
    /// (`engine.idle_fold_ratio`; 0: only batches fold). The default is
    /// the engine's.
    #[arg(long)]
    idle_fold_ratio: Option<f64>,
    /// After the vacuum, compact the file when free pages make up at
    /// least this share of it, as an idle shard node does
    /// (`engine.compact_free_ratio`; 0: never). The default is the
    /// engine's.
    #[arg(long)]
    compact_free_ratio: Option<f64>,
    /// Keep the churned index directory and the last round's fresh build
    /// afterwards (their paths are printed), to look at with `mdb_stat` or
    /// to profile searches on both (`loadtest search-bench`).
    #[arg(long)]
    keep: bool,
    /// Directory for the index environments (default: the system temp dir).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Write the rounds' operations here (JSON lines) for the peers.
    #[arg(long)]
    plan_out: Option<PathBuf>,
    /// Batches the batch log keeps (0: no log; the engine's default unless
    /// given). The log is the shard's replication state, not its index:
    /// with it, the file also holds up to `batch_log_max_bytes` of recent
    /// batches.
    #[arg(long)]
    batch_log_max_batches: Option<u64>,
    /// The batch log's bound as a multiple of the shard's own points (0:
    /// none, as before issue 22's last session; the engine's default
    /// unless given).
    #[arg(long)]
    batch_log_max_share: Option<f64>,
    /// MiB a write transaction keeps of the pages it changes before LMDB
    /// writes some out early (0: LMDB's own limit; the engine's default
    /// unless given), as `index-bench --write-memory-mib`.
    #[arg(long)]
    write_memory_mib: Option<u64>,
    /// Only write the plan (`--plan-out`), measure nothing: the peers can
    /// then run the same rounds at the same time.
    #[arg(long, requires = "plan_out")]
    plan_only: bool,
}

/// How a point's vector is made: `normalise(w·base[a] + (1−w)·base[b])`.
#[derive(Clone, Copy, Debug)]
struct Recipe {
    a: usize,
    b: usize,
    w: f32,
}

impl Recipe {
    fn row(a: usize) -> Self {
        Recipe { a, b: a, w: 1.0 }
    }

    fn vector(&self, base: &VecFile) -> Result<Vec<f32>> {
        let mut v = base.f32_row(self.a)?;
        normalise(&mut v);
        if self.w < 1.0 {
            let mut b = base.f32_row(self.b)?;
            normalise(&mut b);
            v.iter_mut().zip(&b).for_each(|(x, y)| *x = self.w * *x + (1.0 - self.w) * y);
            normalise(&mut v);
        }
        Ok(v)
    }
}

fn normalise(v: &mut [f32]) {
    let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
    if norm > 0.0 {
        v.iter_mut().for_each(|x| *x /= norm);
    }
}

/// One round's operations.
struct Round {
    deletes: Vec<u64>,
    upserts: Vec<(u64, Recipe)>,
    inserts: Vec<(u64, Recipe)>,
}

/// The live set: each id's recipe and its original base row.
struct Live {
    ids: Vec<u64>,
    recipe: std::collections::HashMap<u64, (Recipe, usize)>,
    next_id: u64,
}

impl Live {
    fn plan(&mut self, rng: &mut StdRng, a: &Args, rows: usize) -> Round {
        let n = self.ids.len();
        let count = |frac: f64| ((n as f64) * frac).round() as usize;
        self.ids.shuffle(rng);
        let (nd, nu) = (count(a.delete_frac).min(n), count(a.upsert_frac));
        let nu = nu.min(n - nd);
        let deletes: Vec<u64> = self.ids[..nd].to_vec();
        let upserts: Vec<(u64, Recipe)> = self.ids[nd..nd + nu]
            .iter()
            .map(|&id| {
                let origin = self.recipe[&id].1;
                (id, Recipe { a: origin, b: rng.random_range(0..rows), w: 0.8 })
            })
            .collect();
        let inserts: Vec<(u64, Recipe)> = (0..count(a.insert_frac))
            .map(|i| {
                (
                    self.next_id + i as u64,
                    Recipe { a: rng.random_range(0..rows), b: rng.random_range(0..rows), w: rng.random_range(0.5..1.0) },
                )
            })
            .collect();
        self.next_id += inserts.len() as u64;
        for id in &deletes {
            self.recipe.remove(id);
        }
        for &(id, r) in &upserts {
            if let Some(e) = self.recipe.get_mut(&id) {
                e.0 = r;
            }
        }
        for &(id, r) in &inserts {
            self.recipe.insert(id, (r, r.a));
        }
        self.ids.drain(..nd);
        self.ids.extend(inserts.iter().map(|(id, _)| *id));
        self.ids.sort_unstable();
        Round { deletes, upserts, inserts }
    }
}

pub(crate) fn run(a: Args) -> Result<()> {
    if a.threads == 0 || a.batch_size == 0 || a.fresh_every == 0 || a.k == 0 || a.passes == 0 {
        bail!("--threads, --batch-size, --fresh-every, --k and --passes must be at least 1");
    }
    let base = VecFile::open(&a.base)?;
    let query = VecFile::open(&a.query)?;
    if base.dim() != query.dim() {
        bail!("base has dimension {}, queries {}", base.dim(), query.dim());
    }
    if a.limit == 0 || a.limit > base.len() {
        bail!("--limit must be 1..={} (the base file's rows)", base.len());
    }
    let mut queries: Vec<Vec<f32>> = (0..a.queries.min(query.len())).map(|i| query.f32_row(i)).collect::<Result<_>>()?;
    queries.iter_mut().for_each(|q| normalise(q));
    let params = IndexParams::new(base.dim() as u32, Metric::Cosine).with_m(a.m).with_ef_construction(a.ef_construction);
    let mut opts = IndexOptions { build_threads: a.threads, reuse_retired: !a.no_reuse, ..IndexOptions::default() };
    if let Some(n) = a.batch_log_max_batches {
        opts.batch_log.max_batches = n;
    }
    opts.write_memory_bytes = crate::index_bench::write_memory_bytes(a.write_memory_mib)?;
    match a.batch_log_max_share {
        Some(r) if !(r.is_finite() && r >= 0.0) => bail!("--batch-log-max-share must be 0 or more, not {r}"),
        Some(r) => opts.batch_log.max_share = r,
        None => {}
    }
    let vacuum = match a.vacuum_ratio {
        Some(0.0) => false,
        Some(r) if r > 0.0 && r <= 1.0 => {
            opts.vacuum_ratio = r;
            true
        }
        Some(r) => bail!("--vacuum-ratio must be 0 (never) or in (0, 1], not {r}"),
        None => true,
    };
    if a.vacuum_step == 0 {
        bail!("--vacuum-step must be at least 1");
    }
    match a.idle_fold_ratio {
        Some(r) if r.is_finite() && r >= 0.0 => opts.idle_fold_ratio = r,
        Some(r) => bail!("--idle-fold-ratio must be 0 or more, not {r}"),
        None => {}
    }
    match a.compact_free_ratio {
        Some(r) if (0.0..=1.0).contains(&r) => opts.compact_free_ratio = r,
        Some(r) => bail!("--compact-free-ratio must be in [0, 1], not {r}"),
        None => {}
    }
    let root = match &a.dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            tempfile::tempdir_in(d)?
        }
        None => tempfile::tempdir()?,
    };
    let mut plan_out = match &a.plan_out {
        Some(p) => {
            let mut f = std::io::BufWriter::new(std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?);
            writeln!(
                f,
                "{}",
                json!({"format": "shoal-churn-plan/1", "limit": a.limit, "rounds": a.rounds, "seed": a.seed, "dim": base.dim()})
            )?;
            Some(f)
        }
        None => None,
    };

    let mut live = Live {
        ids: (0..a.limit as u64).collect(),
        recipe: (0..a.limit).map(|i| (i as u64, (Recipe::row(i), i))).collect(),
        next_id: a.limit as u64,
    };
    let mut rng = StdRng::seed_from_u64(a.seed);
    if a.plan_only {
        if let Some(mut f) = plan_out {
            for r in 1..=a.rounds {
                let round = live.plan(&mut rng, &a, base.len());
                write_round(&mut f, r, &round)?;
            }
            f.flush()?;
        }
        return Ok(());
    }
    let churned = root.path().join("churned");
    let mut index = Index::open_or_create(&churned, params, opts.clone())?;
    let t = Instant::now();
    let initial: Vec<(u64, Recipe)> = live.ids.iter().map(|&id| (id, live.recipe[&id].0)).collect();
    apply(&index, &base, &[], &initial, a.batch_size)?;
    eprintln!("built {} points in {:.1}s", a.limit, t.elapsed().as_secs_f64());

    let mut rounds = Vec::new();
    for r in 0..=a.rounds {
        let mut entry = json!({"round": r});
        if r > 0 {
            let round = live.plan(&mut rng, &a, base.len());
            if let Some(f) = plan_out.as_mut() {
                write_round(f, r, &round)?;
            }
            let mut changed = round.upserts.clone();
            changed.extend_from_slice(&round.inserts);
            let ops = round.deletes.len() + changed.len();
            let t = Instant::now();
            apply(&index, &base, &round.deletes, &changed, a.batch_size)?;
            let secs = t.elapsed().as_secs_f64();
            entry["ops"] = json!(ops);
            entry["apply_seconds"] = json!(round3(secs));
            entry["apply_ms_per_op"] = json!(round4(secs * 1000.0 / ops.max(1) as f64));
            let t = Instant::now();
            let mut vacuumed = 0;
            while vacuum && index.vacuum_due()? {
                let step = index.vacuum(a.vacuum_step)?;
                vacuumed += step.vacuumed;
                if step.vacuumed == 0 {
                    break;
                }
            }
            entry["vacuumed"] = json!(vacuumed);
            entry["vacuum_seconds"] = json!(round3(t.elapsed().as_secs_f64()));
            // Then, as an idle shard node does, fold the link log if it
            // holds enough lists, before the compaction gives its pages back.
            let t = Instant::now();
            let folded = match index.fold_due()? {
                true => index.fold_link_log()?.lists,
                false => 0,
            };
            entry["folded_lists"] = json!(folded);
            entry["fold_seconds"] = json!(round3(t.elapsed().as_secs_f64()));
            let (reclaimed, seconds, before) = match index.compact_due()? {
                true => {
                    let o = index.compact()?;
                    (o.bytes_before.saturating_sub(o.bytes_after), o.copy_seconds + o.swap_seconds, Some(o.bytes_before))
                }
                false => (0, 0.0, None),
            };
            // The file as the round left it, before an idle compaction
            // gave its free pages back: the most it held this round.
            entry["disk_bytes_before_compact"] = json!(before);
            entry["compacted_bytes"] = json!(reclaimed);
            entry["compact_seconds"] = json!(round3(seconds));
        }
        let vectors: Vec<(u64, Vec<f32>)> =
            live.ids.iter().map(|&id| Ok((id, live.recipe[&id].0.vector(&base)?))).collect::<Result<_>>()?;
        let truth = exact_top(&vectors, &queries, a.k);
        let m = measure(&index, &queries, &truth, &a)?;
        let stats = index.stats()?;
        entry["live"] = json!(stats.live);
        entry["tombstones"] = json!(stats.tombstones);
        entry["recall"] = json!(round4(m.recall));
        entry["qps"] = json!(round1(m.qps));
        entry["disk_bytes"] = json!(stats.disk_bytes);
        entry["used_bytes"] = json!(stats.used_bytes);
        entry["free_bytes"] = json!(stats.free_bytes);
        entry["batch_log_bytes"] = json!(stats.batch_log_bytes);
        if r == a.rounds && r > 0 {
            // The same index in a new process's state (no memo or shared
            // address tables from the rounds): tells the layout's cost on
            // searches from the cost of state the rounds left behind.
            drop(index);
            index = Index::open_or_create(&churned, params, opts.clone())?;
            let m = measure(&index, &queries, &truth, &a)?;
            entry["reopened_recall"] = json!(round4(m.recall));
            entry["reopened_qps"] = json!(round1(m.qps));
        }
        let fresh_due = r == a.rounds || r % a.fresh_every == 0;
        if fresh_due {
            let dir = root.path().join(format!("fresh-{r}"));
            let mut fresh = Index::open_or_create(&dir, params, opts.clone())?;
            let points: Vec<(u64, Recipe)> = live.ids.iter().map(|&id| (id, live.recipe[&id].0)).collect();
            let t = Instant::now();
            apply(&fresh, &base, &[], &points, a.batch_size)?;
            let build = t.elapsed().as_secs_f64();
            let fm = measure(&fresh, &queries, &truth, &a)?;
            // The churned index again, after the fresh one: the machine's
            // speed drifting between the two measurements shows here.
            entry["qps_after_fresh"] = json!(round1(measure(&index, &queries, &truth, &a)?.qps));
            if !a.page_cache_as_left {
                // Reopened with the engine's warming: each file is dropped
                // from the page cache and read back in order.
                drop(index);
                drop(fresh);
                let warm = IndexOptions { warm_max_bytes: u64::MAX, ..opts.clone() };
                index = Index::open_or_create(&churned, params, warm.clone())?;
                fresh = Index::open_or_create(&dir, params, warm)?;
            }
            let paired = paired(&index, &fresh, &queries, &a)?;
            entry["paired_qps"] = json!(paired.map(|p| round1(p.qps)));
            entry["paired_fresh_qps"] = json!(paired.map(|p| round1(p.fresh_qps)));
            entry["paired_qps_ratio"] = json!(paired.map(|p| round4(p.ratio)));
            let fs = fresh.stats()?;
            entry["fresh_recall"] = json!(round4(fm.recall));
            entry["fresh_qps"] = json!(round1(fm.qps));
            entry["fresh_disk_bytes"] = json!(fs.disk_bytes);
            entry["fresh_used_bytes"] = json!(fs.used_bytes);
            entry["fresh_free_bytes"] = json!(fs.free_bytes);
            entry["fresh_batch_log_bytes"] = json!(fs.batch_log_bytes);
            entry["fresh_build_seconds"] = json!(round3(build));
            drop(fresh);
            // `--keep` keeps the last fresh build beside the churned index,
            // to profile the two against each other.
            if !(a.keep && r == a.rounds) {
                std::fs::remove_dir_all(&dir).ok();
            }
        } else {
            for f in [
                "qps_after_fresh",
                "paired_qps",
                "paired_fresh_qps",
                "paired_qps_ratio",
                "fresh_recall",
                "fresh_qps",
                "fresh_disk_bytes",
                "fresh_used_bytes",
                "fresh_free_bytes",
                "fresh_batch_log_bytes",
                "fresh_build_seconds",
            ] {
                entry[f] = serde_json::Value::Null;
            }
        }
        print_round(&entry);
        if !entry["reopened_qps"].is_null() {
            eprintln!("  reopened: recall {} qps {}", entry["reopened_recall"], entry["reopened_qps"]);
        }
        rounds.push(entry);
    }
    if let Some(mut f) = plan_out {
        f.flush()?;
    }
    if a.keep {
        drop(index);
        let kept = root.keep();
        eprintln!("kept {} and {}", kept.join("churned").display(), kept.join(format!("fresh-{}", a.rounds)).display());
    }
    let out = json!({
        "lib": "shoal",
        "strategy": if a.no_reuse { "tombstones kept (no reuse)" } else { "retired slots reused by later inserts" },
        "params": {"m": a.m, "ef_construction": a.ef_construction, "threads": a.threads, "metric": "cosine",
                   "batch_size": a.batch_size, "ef": a.ef, "k": a.k, "passes": a.passes,
                   "paired_passes": a.paired_passes,
                   "paired_page_cache": if a.page_cache_as_left { "as left" } else { "dropped and read back in order" }},
        "limit": a.limit, "queries": queries.len(), "seed": a.seed, "batch_log": format!("{:?}", opts.batch_log),
        "fractions": {"upsert": a.upsert_frac, "delete": a.delete_frac, "insert": a.insert_frac},
        "vacuum_ratio": if vacuum { json!(opts.vacuum_ratio) } else { serde_json::Value::Null },
        "vacuum_step": a.vacuum_step,
        "write_memory_bytes": opts.write_memory_bytes,
        "idle_fold_ratio": opts.idle_fold_ratio,
        "compact_free_ratio": opts.compact_free_ratio,
        "rounds": rounds,
    });
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&out)?).with_context(|| format!("writing {}", p.display()))?;
    }
    Ok(())
}

/// One round of the plan as a JSON line (format in loadtest/peers/README.md).
fn write_round(f: &mut impl std::io::Write, r: usize, round: &Round) -> Result<()> {
    let enc = |v: &[(u64, Recipe)]| v.iter().map(|(id, x)| json!([id, x.a, x.b, x.w])).collect::<Vec<_>>();
    writeln!(f, "{}", json!({"round": r, "delete": round.deletes, "upsert": enc(&round.upserts), "insert": enc(&round.inserts)}))?;
    Ok(())
}

/// Applies deletes, then upserts (edited and new points), in batches.
fn apply(index: &Index, base: &VecFile, deletes: &[u64], upserts: &[(u64, Recipe)], batch_size: usize) -> Result<()> {
    for chunk in deletes.chunks(batch_size) {
        index.apply(Batch { ops: chunk.iter().map(|&id| Op::Delete(id)).collect(), source: None })?;
    }
    for chunk in upserts.chunks(batch_size) {
        let ops =
            chunk.iter().map(|(id, r)| Ok(Op::Upsert(Point { id: *id, vector: r.vector(base)?, payload: None }))).collect::<Result<_>>()?;
        index.apply(Batch { ops, source: None })?;
    }
    Ok(())
}

/// Exact top-k external ids per query by inner product (unit vectors).
fn exact_top(points: &[(u64, Vec<f32>)], queries: &[Vec<f32>], k: usize) -> Vec<HashSet<u64>> {
    queries
        .par_iter()
        .map(|q| {
            let mut scored: Vec<(f32, u64)> =
                points.iter().map(|(id, v)| (-v.iter().zip(q).map(|(a, b)| a * b).sum::<f32>(), *id)).collect();
            let nth = k.min(scored.len().saturating_sub(1));
            if !scored.is_empty() {
                scored.select_nth_unstable_by(nth, |a, b| a.0.total_cmp(&b.0));
            }
            scored.truncate(k);
            scored.into_iter().map(|(_, id)| id).collect()
        })
        .collect()
}

struct Measured {
    recall: f64,
    qps: f64,
}

/// Recall of the first pass (every pass answers the same) and the QPS of
/// the best of `--passes` passes.
fn measure(index: &Index, queries: &[Vec<f32>], truth: &[HashSet<u64>], a: &Args) -> Result<Measured> {
    let mut best = Measured { recall: 0.0, qps: 0.0 };
    for pass in 0..a.passes {
        let (qps, hits) = pass_over(index, queries, truth, a)?;
        if pass == 0 {
            best.recall = hits as f64 / (a.k * queries.len()).max(1) as f64;
        }
        best.qps = best.qps.max(qps);
    }
    Ok(best)
}

/// One pass over the queries: its QPS and how many true neighbours it found.
fn pass_over(index: &Index, queries: &[Vec<f32>], truth: &[HashSet<u64>], a: &Args) -> Result<(f64, usize)> {
    let sp = SearchParams::new(a.k, a.ef.max(a.k));
    let t = Instant::now();
    let mut hits = 0usize;
    for (q, want) in queries.iter().zip(truth) {
        hits += index.search(q, sp)?.iter().filter(|h| want.contains(&h.id)).count();
    }
    Ok((queries.len() as f64 / t.elapsed().as_secs_f64(), hits))
}

#[derive(Clone, Copy)]
struct Paired {
    qps: f64,
    fresh_qps: f64,
    ratio: f64,
}

/// `--paired-passes` pairs of passes, churned and fresh in turn (ABBA
/// BAAB ...): the medians of each side's passes and of the pairs' ratios.
fn paired(churned: &Index, fresh: &Index, queries: &[Vec<f32>], a: &Args) -> Result<Option<Paired>> {
    if a.paired_passes == 0 {
        return Ok(None);
    }
    // Recall is measured elsewhere; a pass here only times.
    let none: Vec<HashSet<u64>> = vec![HashSet::new(); queries.len()];
    let (mut mine, mut theirs, mut ratios) = (Vec::new(), Vec::new(), Vec::new());
    for pair in 0..a.paired_passes {
        let churned_first = matches!(pair % 4, 0 | 3);
        let (c, f) = if churned_first {
            let c = pass_over(churned, queries, &none, a)?.0;
            (c, pass_over(fresh, queries, &none, a)?.0)
        } else {
            let f = pass_over(fresh, queries, &none, a)?.0;
            (pass_over(churned, queries, &none, a)?.0, f)
        };
        mine.push(c);
        theirs.push(f);
        ratios.push(c / f);
    }
    Ok(Some(Paired { qps: median(&mut mine), fresh_qps: median(&mut theirs), ratio: median(&mut ratios) }))
}

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n % 2 == 1 { v[n / 2] } else { (v[n / 2 - 1] + v[n / 2]) / 2.0 }
}

fn print_round(e: &serde_json::Value) {
    let mib = |v: &serde_json::Value| v.as_f64().map_or("-".to_owned(), |b| format!("{:.1}", b / (1 << 20) as f64));
    let f = |v: &serde_json::Value, d: usize| v.as_f64().map_or("-".to_owned(), |x| format!("{x:.d$}"));
    eprintln!(
        "round {:>2}: live {} tombstones {} (vacuumed now {}) | recall {} (fresh {}) | qps {} (fresh {}, paired ratio {}) | disk MiB {} used {} (fresh {}) | apply {} ms/op vacuum {} s fold {} s compact {} s",
        e["round"],
        e["live"],
        e["tombstones"],
        e["vacuumed"],
        f(&e["recall"], 4),
        f(&e["fresh_recall"], 4),
        f(&e["qps"], 0),
        f(&e["fresh_qps"], 0),
        f(&e["paired_qps_ratio"], 3),
        mib(&e["disk_bytes"]),
        mib(&e["used_bytes"]),
        mib(&e["fresh_disk_bytes"]),
        f(&e["apply_ms_per_op"], 4),
        f(&e["vacuum_seconds"], 1),
        f(&e["fold_seconds"], 1),
        f(&e["compact_seconds"], 1),
    );
}

fn round1(x: f64) -> f64 {
    (x * 10.0).round() / 10.0
}

fn round3(x: f64) -> f64 {
    (x * 1000.0).round() / 1000.0
}

fn round4(x: f64) -> f64 {
    (x * 10_000.0).round() / 10_000.0
}

#[cfg(test)]
mod tests {
    use clap::Parser;
    use rand::SeedableRng;

    use crate::test_files::write_fvecs;
    use crate::{Cli, Command};

    /// The command line as a person types it: every round is measured and
    /// written, the plan holds what the rounds did, and reuse keeps the
    /// tombstones to about one round's retirements.
    #[test]
    fn churn_measures_every_round_and_writes_the_plan() {
        let dir = tempfile::tempdir().unwrap();
        let mut rng = rand::rngs::StdRng::seed_from_u64(5);
        let (base, query) = (dir.path().join("base.fvecs"), dir.path().join("query.fvecs"));
        write_fvecs(&base, 900, 8, &mut rng);
        write_fvecs(&query, 30, 8, &mut rng);
        let (json, plan) = (dir.path().join("churn.json"), dir.path().join("plan.jsonl"));
        let s = |p: &std::path::Path| p.to_string_lossy().into_owned();
        let argv = [
            "shoal-loadtest",
            "churn",
            "--base",
            &s(&base),
            "--query",
            &s(&query),
            "--limit",
            "600",
            "--rounds",
            "3",
            "--queries",
            "30",
            "--fresh-every",
            "2",
            "--json",
            &s(&json),
            "--plan-out",
            &s(&plan),
            "--dir",
            &s(dir.path()),
        ];
        let Command::Churn(args) = Cli::try_parse_from(argv).unwrap().command else { panic!("not churn") };
        super::run(args).unwrap();
        let out: serde_json::Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
        let rounds = out["rounds"].as_array().unwrap();
        assert_eq!(rounds.len(), 4, "round 0 and three rounds");
        for r in rounds {
            for f in ["recall", "qps", "disk_bytes", "tombstones", "live"] {
                assert!(r[f].is_number(), "{f} in {r}");
            }
            assert!(r["recall"].as_f64().unwrap() > 0.8, "{r}");
            // 10% upserted in the round's last batch: their old slots wait
            // for the next round's inserts.
            assert!(r["tombstones"].as_u64().unwrap() <= 61, "{r}");
        }
        assert!(rounds[2]["fresh_recall"].is_number() && rounds[3]["fresh_recall"].is_number());
        assert!(rounds[1]["fresh_recall"].is_null());
        let lines: Vec<serde_json::Value> =
            std::fs::read_to_string(&plan).unwrap().lines().map(|l| serde_json::from_str(l).unwrap()).collect();
        assert_eq!(lines.len(), 4);
        assert_eq!(lines[0]["format"], "shoal-churn-plan/1");
        assert_eq!(lines[1]["delete"].as_array().unwrap().len(), 18, "3% of 600");
        assert_eq!(lines[1]["upsert"].as_array().unwrap().len(), 60);
        assert_eq!(lines[1]["insert"].as_array().unwrap()[0][0], 600, "new ids start after the initial ones");
        assert_eq!(rounds[3]["live"], 600);
    }
}
