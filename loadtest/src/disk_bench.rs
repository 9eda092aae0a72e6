//! `disk-bench`: what an incremental insert and a search cost in pages when
//! the index is not in memory (issue 8): build an index, then per mode
//! (warm, cold, cgroup) insert a batch into a fresh copy of it and run
//! single-thread searches, counting major faults, bytes read from the
//! device, pages touched (and which databases they belong to), wall time
//! and a modelled network-disk time. See `docs/network-disks.md`.

use std::collections::HashSet;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use coldio::{MemoryGroup, PageMap, Probe, Sample};

use serde_json::{Value, json};
use shoal_engine::{Batch, Index, IndexOptions, IndexParams, Metric, SearchParams};

use crate::fvecs::VecFile;
use crate::groundtruth;
use crate::memory::rss_anon;
use crate::slowfs;

/// Flags of `disk-bench`.
#[derive(clap::Args, Debug, Clone)]
pub(crate) struct Args {
    /// Base vectors (.fvecs).
    #[arg(long)]
    base: PathBuf,
    /// Query vectors (.fvecs).
    #[arg(long)]
    query: PathBuf,
    /// Exact neighbours (.ivecs); used only when the index holds the whole
    /// base file after the inserts, otherwise ground truth is computed.
    #[arg(long)]
    groundtruth: Option<PathBuf>,
    #[arg(long, default_value = "cosine")]
    metric: Metric,
    #[arg(long, default_value_t = 16)]
    m: u16,
    #[arg(long, default_value_t = 100)]
    ef_construction: u32,
    /// Build and insert threads (the calling thread included).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Vectors in the index before the inserts (default 100,000).
    #[arg(long)]
    limit: Option<usize>,
    /// Batch size of the build.
    #[arg(long, default_value_t = 10_000)]
    batch_size: usize,
    /// Vectors inserted in one batch per mode (rows after the base).
    #[arg(long, default_value_t = 1000)]
    inserts: usize,
    /// Single-thread searches per mode.
    #[arg(long, default_value_t = 1000)]
    queries: usize,
    /// Search ef.
    #[arg(long, default_value_t = 64)]
    ef: usize,
    /// LMDB readahead when measuring: off is MDB_NORDAHEAD (madvise
    /// MADV_RANDOM on the map).
    #[arg(long, default_value = "off")]
    read_ahead: OnOff,
    /// Where batches write existing nodes' changed bottom lists: `auto`,
    /// `always` (the link log) or `off` (as `index-bench`).
    #[arg(long, default_value = "auto", value_parser = ["auto", "always", "off"])]
    link_log: String,
    /// Lists the link log holds before a fold (the engine's default unless
    /// given).
    #[arg(long)]
    log_fold_lists: Option<usize>,
    /// Modes to measure, in order.
    #[arg(long, value_delimiter = ',', default_value = "warm,cold")]
    modes: Vec<Mode>,
    /// Also measure in a memory cgroup limited to this fraction of the
    /// environment's size (adds the `cgroup` mode).
    #[arg(long)]
    memory_fraction: Option<f64>,
    /// Directory for the environments (on the filesystem to measure; not
    /// tmpfs). Default: a temporary directory.
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Keep the built index (and ground truth) in `--dir` after the run.
    #[arg(long)]
    keep: bool,
    /// Reuse an index kept in `--dir` by an earlier run with the same
    /// inputs and parameters instead of building it.
    #[arg(long)]
    reuse: bool,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Internal: run one mode in this process, joining the memory cgroup at
    /// this directory, and write its result to `--child-out`.
    #[arg(long, hide = true, requires = "child_out")]
    child_cgroup: Option<PathBuf>,
    #[arg(long, hide = true)]
    child_out: Option<PathBuf>,
}

#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum OnOff {
    On,
    Off,
}

/// How the page cache stands when an operation starts.
#[derive(clap::ValueEnum, Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// The whole environment is in the page cache.
    Warm,
    /// None of it is (dropped with POSIX_FADV_DONTNEED).
    Cold,
    /// Cold, and the process runs in a memory cgroup limited to
    /// `--memory-fraction` of the environment.
    Cgroup,
}

impl Mode {
    fn name(self) -> &'static str {
        match self {
            Mode::Warm => "warm",
            Mode::Cold => "cold",
            Mode::Cgroup => "cgroup",
        }
    }
}

const K: usize = 10;

/// Everything a mode needs, loaded before any measurement.
struct Ctx {
    root: PathBuf,
    opts: IndexOptions,
    inserts: Vec<(u64, Vec<f32>)>,
    queries: Vec<Vec<f32>>,
    truth: Vec<Vec<u32>>,
    ef: usize,
}

impl Ctx {
    fn base_env(&self) -> PathBuf {
        self.root.join("base")
    }

    fn run_env(&self) -> PathBuf {
        self.root.join("run")
    }
}

pub(crate) fn run(a: Args) -> Result<()> {
    if a.threads == 0 || a.batch_size == 0 || a.inserts == 0 || a.queries == 0 {
        bail!("--threads, --batch-size, --inserts and --queries must be at least 1");
    }
    if let Some(f) = a.memory_fraction
        && !(f > 0.0 && f <= 1.0)
    {
        bail!("--memory-fraction must be in (0, 1], got {f}");
    }
    if a.reuse && a.dir.is_none() {
        bail!("--reuse needs --dir (where an earlier run with --keep left its index)");
    }
    let base = VecFile::open(&a.base)?;
    let query = VecFile::open(&a.query)?;
    if base.dim() != query.dim() {
        bail!("base has dimension {}, queries {}", base.dim(), query.dim());
    }
    if base.len() <= a.inserts {
        bail!("{} has {} vectors; need more than --inserts {}", a.base.display(), base.len(), a.inserts);
    }
    let n = a.limit.unwrap_or(100_000).min(base.len() - a.inserts);
    let params = IndexParams::new(base.dim() as u32, a.metric).with_m(a.m).with_ef_construction(a.ef_construction);
    let link_log = crate::index_bench::link_log_setting(&a.link_log, a.log_fold_lists);
    let opts = IndexOptions { build_threads: a.threads, read_ahead: a.read_ahead == OnOff::On, link_log, ..IndexOptions::default() };

    // The working directory: `--dir/shoal-disk-bench` (kept and reused by
    // name) or a temporary one.
    let _tmp;
    let root = match &a.dir {
        Some(d) => d.join("shoal-disk-bench"),
        None => {
            // Named like the kept one, so that the cgroup child finds it
            // through `--dir`.
            _tmp = tempfile::tempdir().context("creating a temporary directory")?;
            _tmp.path().join("shoal-disk-bench")
        }
    };
    std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;

    let inserts = (n..n + a.inserts).map(|i| Ok((i as u64, base.f32_row(i)?))).collect::<Result<Vec<_>>>()?;
    let queries: Vec<Vec<f32>> = (0..a.queries.min(query.len())).map(|i| query.f32_row(i)).collect::<Result<_>>()?;
    let identity = json!({"base": a.base.canonicalize().unwrap_or(a.base.clone()), "vectors": n, "dim": base.dim(),
                          "metric": a.metric.name(), "m": a.m, "ef_construction": a.ef_construction,
                          "link_log": format!("{link_log:?}")});

    if let Some(group) = &a.child_cgroup {
        // The measurement child of the cgroup mode: the index and ground
        // truth are there; everything it reads is already in memory.
        let truth = load_truth(&root, n + a.inserts, queries.len())?.context("the parent left no ground truth for the cgroup child")?;
        let ctx = Ctx { root, opts, inserts, queries, truth, ef: a.ef };
        let result = measure(&ctx, Mode::Cgroup, Some(group))?;
        let out = a.child_out.as_ref().context("--child-out is required with --child-cgroup")?;
        std::fs::write(out, serde_json::to_string(&result)?).with_context(|| format!("writing {}", out.display()))?;
        return Ok(());
    }

    let truth = match load_truth(&root, n + a.inserts, queries.len())? {
        Some(t) if a.reuse => t,
        _ => {
            let t = match (&a.groundtruth, n + a.inserts == base.len()) {
                (Some(g), true) => read_truth(g, queries.len())?,
                _ => {
                    eprintln!("computing exact top-{K} over {} vectors for {} queries...", n + a.inserts, queries.len());
                    groundtruth::exact(&base, n + a.inserts, &queries, a.metric, K)?
                }
            };
            store_truth(&root, n + a.inserts, &t)?;
            t
        }
    };

    let ctx = Ctx { root: root.clone(), opts: opts.clone(), inserts, queries, truth, ef: a.ef };
    let build = build_or_reuse(&a, &ctx, &base, n, params, &identity)?;
    let data = ctx.base_env().join("data.mdb");
    let env_bytes = std::fs::metadata(&data).with_context(|| format!("reading {}", data.display()))?.len();
    let db_pages = serde_json::to_value(PageMap::read(&data, None)?.totals())?;

    let mut modes = a.modes.clone();
    if a.memory_fraction.is_some() && !modes.contains(&Mode::Cgroup) {
        modes.push(Mode::Cgroup);
    }
    let mut runs = Vec::new();
    let mut skipped = Vec::new();
    for mode in modes {
        eprintln!("== {}", mode.name());
        let result = match mode {
            Mode::Cgroup => match a.memory_fraction {
                None => {
                    skipped.push(json!({"mode": "cgroup", "reason": "no --memory-fraction given"}));
                    continue;
                }
                Some(f) => match run_in_cgroup(&root, (env_bytes as f64 * f) as u64)? {
                    Ok(r) => r,
                    Err(reason) => {
                        eprintln!("skipped cgroup mode: {reason}");
                        skipped.push(json!({"mode": "cgroup", "reason": reason}));
                        continue;
                    }
                },
            },
            Mode::Warm | Mode::Cold => measure(&ctx, mode, None)?,
        };
        print_mode(&result);
        runs.push(result);
    }
    std::fs::remove_dir_all(ctx.run_env()).ok();

    let out = json!({
        "lib": "shoal",
        "params": {"m": a.m, "ef_construction": a.ef_construction, "threads": a.threads, "metric": a.metric.name(),
                   "batch_size": a.batch_size, "read_ahead": a.read_ahead == OnOff::On, "ef": a.ef, "k": K,
                   "inserts": a.inserts, "queries": ctx.queries.len(), "memory_fraction": a.memory_fraction,
                   "dir": root.parent().map(Path::to_owned)},
        "build": build,
        "env_bytes": env_bytes,
        "db_pages": db_pages,
        "runs": runs,
        "skipped": skipped,
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&out)?).with_context(|| format!("writing {}", p.display()))?;
    }
    if a.dir.is_some() && !a.keep {
        std::fs::remove_dir_all(&root).with_context(|| format!("removing {}", root.display()))?;
    }
    Ok(())
}

/// Builds the base index in `root/base`, or reuses it when `--reuse` and
/// it was built from the same inputs.
fn build_or_reuse(a: &Args, ctx: &Ctx, base: &VecFile, n: usize, params: IndexParams, identity: &Value) -> Result<Value> {
    let dir = ctx.base_env();
    let stamp = ctx.root.join("base.json");
    if a.reuse
        && let Ok(text) = std::fs::read_to_string(&stamp)
        && let Ok(prev) = serde_json::from_str::<Value>(&text)
        && prev["identity"] == *identity
        && dir.join("data.mdb").exists()
        // An index of an older on-disk format is rebuilt, not reused.
        && Index::open(&dir, ctx.opts.clone()).is_ok()
    {
        eprintln!("reusing the index in {}", dir.display());
        let mut build = prev["build"].clone();
        build["reused"] = json!(true);
        return Ok(build);
    }
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    let index = Index::open_or_create(&dir, params, ctx.opts.clone())?;
    let t0 = Instant::now();
    let mut start = 0;
    while start < n {
        let end = (start + a.batch_size).min(n);
        let points = (start..end).map(|i| Ok((i as u64, base.f32_row(i)?))).collect::<Result<Vec<_>>>()?;
        index.apply(Batch::upserts(points)).with_context(|| format!("batch {start}..{end}"))?;
        eprint!("\rbuilt {end}/{n} in {:.1}s", t0.elapsed().as_secs_f64());
        start = end;
    }
    eprintln!();
    let secs = t0.elapsed().as_secs_f64();
    let stats = index.stats()?;
    drop(index);
    let build = json!({"vectors": n, "seconds": round(secs, 3), "disk_bytes": stats.disk_bytes, "reused": false});
    std::fs::write(&stamp, serde_json::to_string_pretty(&json!({"identity": identity, "build": build}))?)
        .with_context(|| format!("writing {}", stamp.display()))?;
    Ok(build)
}

fn truth_path(root: &Path, vectors: usize) -> PathBuf {
    root.join(format!("truth-{vectors}.json"))
}

fn load_truth(root: &Path, vectors: usize, queries: usize) -> Result<Option<Vec<Vec<u32>>>> {
    let p = truth_path(root, vectors);
    let Ok(text) = std::fs::read_to_string(&p) else { return Ok(None) };
    let t: Vec<Vec<u32>> = serde_json::from_str(&text).with_context(|| format!("parsing {}", p.display()))?;
    Ok((t.len() == queries).then_some(t))
}

fn store_truth(root: &Path, vectors: usize, truth: &[Vec<u32>]) -> Result<()> {
    let p = truth_path(root, vectors);
    std::fs::write(&p, serde_json::to_string(truth)?).with_context(|| format!("writing {}", p.display()))
}

fn read_truth(path: &Path, queries: usize) -> Result<Vec<Vec<u32>>> {
    let g = VecFile::open(path)?;
    if g.len() < queries || g.dim() < K {
        bail!("{} has {} rows of {} ids; need {queries} rows of at least {K}", path.display(), g.len(), g.dim());
    }
    (0..queries).map(|i| Ok(g.i32_row(i)?[..K].iter().map(|&x| x as u32).collect())).collect()
}

/// Copies the base index to `run/` (so that every mode inserts into the
/// same index) and brings the page cache to the mode's state.
fn fresh_copy(ctx: &Ctx) -> Result<PathBuf> {
    let run = ctx.run_env();
    if run.exists() {
        std::fs::remove_dir_all(&run).with_context(|| format!("removing {}", run.display()))?;
    }
    std::fs::create_dir_all(&run).with_context(|| format!("creating {}", run.display()))?;
    let data = run.join("data.mdb");
    let src = ctx.base_env().join("data.mdb");
    std::fs::copy(&src, &data).with_context(|| format!("copying {} to {}", src.display(), data.display()))?;
    Ok(data)
}

/// Empties the page cache of `data` or fails saying why it could not.
fn drop_cold(data: &Path) -> Result<()> {
    if coldio::mapped_by_this_process(data)? {
        bail!("{} is still mapped by this process (an environment was not closed); its pages cannot be dropped", data.display());
    }
    let out = coldio::drop_pages(data)?;
    if !out.emptied() {
        bail!(
            "posix_fadvise(DONTNEED) left {} of {} pages of {} in the page cache: the filesystem does not drop them \
             (tmpfs?) or another process maps the file; use --dir on a disk-backed filesystem",
            out.resident_after,
            out.total_pages,
            data.display()
        );
    }
    Ok(())
}

fn set_cache(data: &Path, mode: Mode) -> Result<()> {
    match mode {
        Mode::Warm => {
            let r = coldio::warm(data)?;
            if r.resident() < r.total() {
                eprintln!("warning: only {} of {} pages of {} stayed resident after reading it", r.resident(), r.total(), data.display());
            }
            Ok(())
        }
        Mode::Cold | Mode::Cgroup => drop_cold(data),
    }
}

/// A [`Probe`] plus the counters of a slowfs the environment sits on.
struct Op {
    probe: Probe,
    dir: PathBuf,
    slowfs: Option<(u64, u64)>,
}

impl Op {
    fn start(data: &Path) -> Result<Op> {
        let dir = data.parent().context("data.mdb has no directory")?.to_owned();
        let slowfs = slowfs::counters_above(&dir);
        Ok(Op { probe: Probe::start(data)?, dir, slowfs })
    }

    /// The sample, and the reads and bytes the slowfs served meanwhile.
    fn finish(self) -> Result<(Sample, Option<(u64, u64)>)> {
        let sample = self.probe.finish()?;
        let after = slowfs::counters_above(&self.dir);
        let delta = self.slowfs.zip(after).map(|(b, a)| (a.0.saturating_sub(b.0), a.1.saturating_sub(b.1)));
        Ok((sample, delta))
    }
}

fn sample_json((s, slow): &(Sample, Option<(u64, u64)>), per: Option<(&str, usize)>, map: Option<&PageMap>) -> Result<Value> {
    let mut v = serde_json::to_value(s)?;
    if let Some((reads, bytes)) = slow {
        // What reached the (simulated) device: faults the page cache
        // could not serve, readahead included.
        v["slowfs_reads"] = json!(reads);
        v["slowfs_read_bytes"] = json!(bytes);
    }
    if let Some((key, n)) = per {
        v[key] = serde_json::to_value(s.per(n))?;
    }
    if let Some(map) = map {
        v["pages_by_db"] = serde_json::to_value(map.attribute(&s.touched))?;
    }
    Ok(v)
}

/// One mode: insert into a fresh copy, close, then search it.
fn measure(ctx: &Ctx, mode: Mode, join: Option<&Path>) -> Result<Value> {
    let data = fresh_copy(ctx)?;
    let run = ctx.run_env();
    let before_insert = PageMap::read(&data, None)?;
    set_cache(&data, mode)?;
    if let Some(group) = join {
        MemoryGroup::join(group)?;
    }

    let probe = Op::start(&data)?;
    let index = Index::open(&run, ctx.opts.clone()).with_context(|| format!("opening {}", run.display()))?;
    let open = probe.finish()?;
    let probe = Op::start(&data)?;
    index.apply(Batch::upserts(ctx.inserts.clone())).context("inserting the batch")?;
    let insert = probe.finish()?;
    let rss_after_insert = rss_anon();
    drop(index);

    let before_search = PageMap::read(&data, None)?;
    set_cache(&data, mode)?;
    let index = Index::open(&run, ctx.opts.clone()).with_context(|| format!("reopening {}", run.display()))?;
    let sp = SearchParams::new(K, ctx.ef.max(K));
    let probe = Op::start(&data)?;
    let mut hits = 0usize;
    for (q, truth) in ctx.queries.iter().zip(&ctx.truth) {
        let got = index.search(q, sp)?;
        let truth: HashSet<u32> = truth.iter().copied().collect();
        hits += got.iter().filter(|h| u32::try_from(h.id).is_ok_and(|id| truth.contains(&id))).count();
    }
    let search = probe.finish()?;
    let rss_after_search = rss_anon();
    drop(index);
    let recall = hits as f64 / (K * ctx.queries.len()) as f64;

    let mut search_json = sample_json(&search, Some(("per_query", ctx.queries.len())), Some(&before_search))?;
    search_json["recall"] = json!(round(recall, 4));
    Ok(json!({
        "mode": mode.name(),
        "open": sample_json(&open, None, None)?,
        "insert": sample_json(&insert, Some(("per_vector", ctx.inserts.len())), Some(&before_insert))?,
        "search": search_json,
        // The process's own memory, which a cgroup's limit counts too.
        "rss_anon_bytes": {"after_insert": rss_after_insert, "after_search": rss_after_search},
    }))
}

/// Runs the cgroup mode in a child process placed in a fresh memory group
/// limited to `limit` bytes. `Ok(Err(reason))` when cgroups are not
/// available here or the child failed in the group (e.g. killed for memory).
fn run_in_cgroup(root: &Path, limit: u64) -> Result<std::result::Result<Value, String>> {
    let name = format!("shoal-disk-bench-{}", std::process::id());
    let group = match MemoryGroup::create(&name, limit) {
        Ok(g) => g,
        Err(e) => return Ok(Err(format!("memory cgroup not available: {e}"))),
    };
    eprintln!("memory cgroup {} limited to {:.1} MiB", group.path().display(), limit as f64 / 1048576.0);
    let out = root.join("cgroup-result.json");
    std::fs::remove_file(&out).ok();
    // The same command line, plus the child flags; the child reuses the
    // index and ground truth this process left in `root`.
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if !args.iter().any(|a| a == "--dir") {
        args.push("--dir".into());
        args.push(root.parent().context("the working directory has no parent")?.display().to_string());
    }
    if !args.iter().any(|a| a == "--reuse") {
        args.push("--reuse".into());
    }
    args.extend(["--child-cgroup".into(), group.path().display().to_string()]);
    args.extend(["--child-out".into(), out.display().to_string()]);
    let exe = std::env::current_exe().context("finding this executable")?;
    let status = Command::new(&exe).args(&args).status().with_context(|| format!("running {}", exe.display()))?;
    let stats = group.stats().ok();
    drop(group);
    if !status.success() {
        let hint = if status.signal() == Some(libc::SIGKILL) {
            " (SIGKILL: the OOM killer; the process's own memory does not fit in the limit)"
        } else {
            ""
        };
        return Ok(Err(format!(
            "the measurement in the cgroup failed: {status}{hint}; group counters: {}",
            serde_json::to_string(&stats)?
        )));
    }
    let text = std::fs::read_to_string(&out).with_context(|| format!("reading {}", out.display()))?;
    let mut result: Value = serde_json::from_str(&text).with_context(|| format!("parsing {}", out.display()))?;
    result["cgroup"] = serde_json::to_value(stats)?;
    std::fs::remove_file(&out).ok();
    Ok(Ok(result))
}

fn print_mode(r: &Value) {
    let f = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
    let i = &r["insert"];
    let s = &r["search"];
    eprintln!(
        "{:<6} insert: {:.0} ms, {:.1} faults/vector, {:.0} KiB read/vector, {:.1} pages/vector; \
         search: {:.3} ms/query, {:.1} faults/query, {:.0} KiB read/query, {:.1} pages/query, recall {:.4}",
        r["mode"].as_str().unwrap_or("?"),
        f(&i["wall_ms"]),
        f(&i["per_vector"]["major_faults"]),
        f(&i["per_vector"]["read_bytes"]) / 1024.0,
        f(&i["per_vector"]["pages_touched"]),
        f(&s["per_query"]["wall_ms"]),
        f(&s["per_query"]["major_faults"]),
        f(&s["per_query"]["read_bytes"]) / 1024.0,
        f(&s["per_query"]["pages_touched"]),
        f(&s["recall"]),
    );
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}
