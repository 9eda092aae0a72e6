//! hannoy-cold: the LMDB-based peer hannoy (Meilisearch's HNSW) measured like
//! `shoal-loadtest disk-bench`: build an index, then per mode (warm, cold,
//! cgroup) insert a batch into a fresh copy in one write transaction plus a
//! `build`, close the environment, and run single-thread searches; the same
//! counters (`coldio`) and the same JSON shape, with `"lib": "hannoy"`.
//!
//! A copy of `../shared/peers/hannoy-bench` (same build: one write
//! transaction and one `build::<16, 32>` per batch, rng seed 42, cosine).
//! Flags are `disk-bench`'s; run `hannoy-cold --help`.

use std::collections::HashSet;
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Instant;

use anyhow::{bail, Context, Result};
use clap::Parser;
use coldio::{MemoryGroup, PageMap, Probe, Sample};
use hannoy::distances::Cosine;
use hannoy::{Database, Reader, Writer};
use heed::{CommitOrAbort, EnvFlags, EnvOpenOptions};
use rand::rngs::StdRng;
use rand::SeedableRng;
use rayon::prelude::*;
use serde_json::{json, Value};

/// Flags, as `shoal-loadtest disk-bench` takes them.
#[derive(Parser, Debug)]
#[command(name = "hannoy-cold", about = "hannoy's cold-cache insert and search costs, measured like shoal's disk-bench")]
struct Args {
    #[arg(long)]
    base: PathBuf,
    #[arg(long)]
    query: PathBuf,
    /// Exact neighbours (.ivecs); used only when the index holds the whole
    /// base file after the inserts, otherwise ground truth is computed.
    #[arg(long)]
    groundtruth: Option<PathBuf>,
    /// Only cosine is compiled in.
    #[arg(long, default_value = "cosine")]
    metric: String,
    /// Only 16 (M0 = 32) is compiled in.
    #[arg(long, default_value_t = 16)]
    m: usize,
    #[arg(long, default_value_t = 100)]
    ef_construction: usize,
    #[arg(long, default_value_t = 2)]
    threads: usize,
    #[arg(long)]
    limit: Option<usize>,
    #[arg(long, default_value_t = 10_000)]
    batch_size: usize,
    #[arg(long, default_value_t = 1000)]
    inserts: usize,
    #[arg(long, default_value_t = 1000)]
    queries: usize,
    #[arg(long, default_value_t = 64)]
    ef: usize,
    /// off: MDB_NORDAHEAD (madvise MADV_RANDOM on the map). hannoy-bench
    /// and Meilisearch open with readahead on (LMDB's default).
    #[arg(long, default_value = "on", value_parser = ["on", "off"])]
    read_ahead: String,
    #[arg(long, value_delimiter = ',', default_value = "warm,cold", value_parser = ["warm", "cold", "cgroup"])]
    modes: Vec<String>,
    #[arg(long)]
    memory_fraction: Option<f64>,
    #[arg(long)]
    dir: Option<PathBuf>,
    #[arg(long)]
    keep: bool,
    #[arg(long)]
    reuse: bool,
    #[arg(long)]
    json: Option<PathBuf>,
    #[arg(long, hide = true, requires = "child_out")]
    child_cgroup: Option<PathBuf>,
    #[arg(long, hide = true)]
    child_out: Option<PathBuf>,
}

const K: usize = 10;
const MAP_SIZE: usize = 64 << 30;

/// A mapped .fvecs/.ivecs file.
struct VecFile {
    bytes: Vec<u8>,
    dim: usize,
    rows: usize,
}

impl VecFile {
    fn open(path: &Path) -> Result<VecFile> {
        let bytes = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
        let dim = bytes.get(..4).map(|b| i32::from_le_bytes([b[0], b[1], b[2], b[3]])).unwrap_or(0);
        if dim <= 0 {
            bail!("{}: not a vector file (first row declares dimension {dim})", path.display());
        }
        let row = 4 * (dim as usize + 1);
        if bytes.len() % row != 0 {
            bail!("{}: {} bytes is not a whole number of {row}-byte rows", path.display(), bytes.len());
        }
        Ok(VecFile { rows: bytes.len() / row, dim: dim as usize, bytes })
    }

    fn row<T>(&self, i: usize, conv: impl Fn([u8; 4]) -> T) -> Vec<T> {
        let row = 4 * (self.dim + 1);
        self.bytes[i * row + 4..(i + 1) * row].chunks_exact(4).map(|c| conv([c[0], c[1], c[2], c[3]])).collect()
    }

    fn f32_row(&self, i: usize) -> Vec<f32> {
        self.row(i, f32::from_le_bytes)
    }
}

struct Ctx {
    root: PathBuf,
    read_ahead: bool,
    efc: usize,
    first_id: u32,
    inserts: Vec<Vec<f32>>,
    queries: Vec<Vec<f32>>,
    truth: Vec<Vec<u32>>,
    ef: usize,
}

fn open_env(dir: &Path, read_ahead: bool) -> Result<heed::Env> {
    let mut opts = EnvOpenOptions::new();
    opts.map_size(MAP_SIZE);
    if !read_ahead {
        // SAFETY: a valid LMDB flag.
        unsafe { opts.flags(EnvFlags::NO_READ_AHEAD) };
    }
    // SAFETY: the environment is only used by this process, through heed.
    unsafe { opts.open(dir) }.with_context(|| format!("opening the environment in {}", dir.display()))
}

fn database(env: &heed::Env) -> Result<Database<'_, Cosine>> {
    let wtxn = env.write_txn()?;
    Ok(env
        .create_databases_and_commit(wtxn, |dbo, wtxn| -> heed::Result<_> {
            dbo.create_database(wtxn, None).map(CommitOrAbort::<_, ()>::Commit)
        })?
        .unwrap_commit())
}

/// One write transaction and one `build` per `batch` vectors, as hannoy-bench.
fn add(env: &heed::Env, db: Database<Cosine>, vecs: &[Vec<f32>], first_id: u32, batch: usize, efc: usize) -> Result<()> {
    let dim = vecs.first().map_or(0, Vec::len);
    let mut rng = StdRng::seed_from_u64(42);
    for (b, chunk) in vecs.chunks(batch).enumerate() {
        let mut wtxn = env.write_txn()?;
        let writer = Writer::new(db, 0, dim);
        for (i, v) in chunk.iter().enumerate() {
            writer.add_item(&mut wtxn, first_id + (b * batch + i) as u32, v)?;
        }
        writer.builder(&mut rng).ef_construction(efc).build::<16, 32>(&mut wtxn)?;
        wtxn.commit()?;
    }
    Ok(())
}

/// Splits hannoy's single database by the key's mode byte
/// (index u16, mode u8, item u32, layer u8).
fn hannoy_classifier(_db: &str, key: &[u8]) -> Option<String> {
    let name = match key.get(2)? {
        0 => "metadata",
        1 => "updated",
        2 => "links",
        3 => "items",
        _ => return None,
    };
    Some(name.to_owned())
}

fn page_map(data: &Path) -> Result<PageMap> {
    Ok(PageMap::read(data, Some(&hannoy_classifier))?)
}

fn main() -> Result<()> {
    let a = Args::parse();
    if a.metric != "cosine" || a.m != 16 {
        bail!("hannoy-cold compiles in cosine and M = 16 only (got --metric {} --m {})", a.metric, a.m);
    }
    if a.threads == 0 || a.batch_size == 0 || a.inserts == 0 || a.queries == 0 {
        bail!("--threads, --batch-size, --inserts and --queries must be at least 1");
    }
    if let Some(f) = a.memory_fraction {
        if !(f > 0.0 && f <= 1.0) {
            bail!("--memory-fraction must be in (0, 1], got {f}");
        }
    }
    if a.reuse && a.dir.is_none() {
        bail!("--reuse needs --dir");
    }
    rayon::ThreadPoolBuilder::new().num_threads(a.threads).build_global().context("starting the thread pool")?;
    let base = VecFile::open(&a.base)?;
    let query = VecFile::open(&a.query)?;
    if base.dim != query.dim {
        bail!("base has dimension {}, queries {}", base.dim, query.dim);
    }
    if base.rows <= a.inserts {
        bail!("{} has {} vectors; need more than --inserts {}", a.base.display(), base.rows, a.inserts);
    }
    let n = a.limit.unwrap_or(100_000).min(base.rows - a.inserts);
    let _tmp;
    let root = match &a.dir {
        Some(d) => d.join("hannoy-cold"),
        None => {
            _tmp = tempfile::tempdir()?;
            _tmp.path().join("hannoy-cold")
        }
    };
    std::fs::create_dir_all(&root).with_context(|| format!("creating {}", root.display()))?;
    let inserts: Vec<Vec<f32>> = (n..n + a.inserts).map(|i| base.f32_row(i)).collect();
    let queries: Vec<Vec<f32>> = (0..a.queries.min(query.rows)).map(|i| query.f32_row(i)).collect();
    let truth_file = root.join(format!("truth-{}.json", n + a.inserts));
    let cached_truth = std::fs::read_to_string(&truth_file)
        .ok()
        .and_then(|t| serde_json::from_str::<Vec<Vec<u32>>>(&t).ok())
        .filter(|t| t.len() == queries.len());
    let mut ctx = Ctx {
        root: root.clone(),
        read_ahead: a.read_ahead == "on",
        efc: a.ef_construction,
        first_id: n as u32,
        inserts,
        queries,
        truth: Vec::new(),
        ef: a.ef,
    };

    if let Some(group) = &a.child_cgroup {
        ctx.truth = cached_truth.context("the parent left no ground truth for the cgroup child")?;
        drop(base);
        let result = measure(&ctx, "cgroup", Some(group))?;
        let out = a.child_out.as_ref().context("--child-out is required with --child-cgroup")?;
        std::fs::write(out, serde_json::to_string(&result)?).with_context(|| format!("writing {}", out.display()))?;
        return Ok(());
    }

    ctx.truth = match cached_truth {
        Some(t) if a.reuse => t,
        _ => {
            let t = match (&a.groundtruth, n + a.inserts == base.rows) {
                (Some(g), true) => {
                    let g = VecFile::open(g)?;
                    if g.rows < ctx.queries.len() || g.dim < K {
                        bail!("ground truth has {} rows of {} ids", g.rows, g.dim);
                    }
                    (0..ctx.queries.len()).map(|i| g.row(i, |b| i32::from_le_bytes(b) as u32)[..K].to_vec()).collect()
                }
                _ => {
                    eprintln!("computing exact top-{K} over {} vectors for {} queries...", n + a.inserts, ctx.queries.len());
                    exact(&base, n + a.inserts, &ctx.queries)
                }
            };
            std::fs::write(&truth_file, serde_json::to_string(&t)?).with_context(|| format!("writing {}", truth_file.display()))?;
            t
        }
    };

    let identity = json!({"base": a.base.canonicalize().unwrap_or(a.base.clone()), "vectors": n, "dim": base.dim,
                          "ef_construction": a.ef_construction, "batch_size": a.batch_size});
    let build = build_or_reuse(&a, &ctx, &base, n, &identity)?;
    drop(base);
    let data = root.join("base").join("data.mdb");
    let env_bytes = std::fs::metadata(&data).with_context(|| format!("reading {}", data.display()))?.len();
    let db_pages = serde_json::to_value(page_map(&data)?.totals())?;

    let mut modes = a.modes.clone();
    if a.memory_fraction.is_some() && !modes.iter().any(|m| m == "cgroup") {
        modes.push("cgroup".into());
    }
    let mut runs = Vec::new();
    let mut skipped = Vec::new();
    for mode in modes {
        eprintln!("== {mode}");
        let result = if mode == "cgroup" {
            let Some(f) = a.memory_fraction else {
                skipped.push(json!({"mode": "cgroup", "reason": "no --memory-fraction given"}));
                continue;
            };
            match run_in_cgroup(&root, (env_bytes as f64 * f) as u64)? {
                Ok(r) => r,
                Err(reason) => {
                    eprintln!("skipped cgroup mode: {reason}");
                    skipped.push(json!({"mode": "cgroup", "reason": reason}));
                    continue;
                }
            }
        } else {
            measure(&ctx, &mode, None)?
        };
        print_mode(&result);
        runs.push(result);
    }
    std::fs::remove_dir_all(root.join("run")).ok();
    let out = json!({
        "lib": "hannoy",
        "params": {"m": 16, "ef_construction": a.ef_construction, "threads": a.threads, "metric": "cosine",
                   "batch_size": a.batch_size, "read_ahead": ctx.read_ahead, "ef": a.ef, "k": K,
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

/// Exact cosine top-k ids of the first `n` base rows for each query.
fn exact(base: &VecFile, n: usize, queries: &[Vec<f32>]) -> Vec<Vec<u32>> {
    let unit = |mut v: Vec<f32>| {
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt().max(f32::MIN_POSITIVE);
        v.iter_mut().for_each(|x| *x /= norm);
        v
    };
    let rows: Vec<Vec<f32>> = (0..n).map(|i| unit(base.f32_row(i))).collect();
    queries
        .par_iter()
        .map(|q| {
            let q = unit(q.clone());
            let mut s: Vec<(f32, u32)> =
                rows.iter().enumerate().map(|(i, r)| (-r.iter().zip(&q).map(|(a, b)| a * b).sum::<f32>(), i as u32)).collect();
            let nth = K.min(s.len() - 1);
            s.select_nth_unstable_by(nth, |a, b| a.0.total_cmp(&b.0));
            s.truncate(K);
            s.sort_by(|a, b| a.0.total_cmp(&b.0));
            s.iter().map(|x| x.1).collect::<Vec<u32>>()
        })
        .collect()
}

fn build_or_reuse(a: &Args, ctx: &Ctx, base: &VecFile, n: usize, identity: &Value) -> Result<Value> {
    let dir = ctx.root.join("base");
    let stamp = ctx.root.join("base.json");
    if a.reuse {
        if let Some(prev) = std::fs::read_to_string(&stamp).ok().and_then(|t| serde_json::from_str::<Value>(&t).ok()) {
            if prev["identity"] == *identity && dir.join("data.mdb").exists() {
                eprintln!("reusing the index in {}", dir.display());
                let mut build = prev["build"].clone();
                build["reused"] = json!(true);
                return Ok(build);
            }
        }
    }
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("removing {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let vecs: Vec<Vec<f32>> = (0..n).map(|i| base.f32_row(i)).collect();
    let t0 = Instant::now();
    let env = open_env(&dir, true)?;
    let db = database(&env)?;
    add(&env, db, &vecs, 0, a.batch_size, a.ef_construction)?;
    let secs = t0.elapsed().as_secs_f64();
    drop(env);
    eprintln!("built {n} in {secs:.1}s");
    let disk = std::fs::metadata(dir.join("data.mdb")).map(|m| m.len()).unwrap_or(0);
    let build = json!({"vectors": n, "seconds": (secs * 1000.0).round() / 1000.0, "disk_bytes": disk, "reused": false});
    std::fs::write(&stamp, serde_json::to_string_pretty(&json!({"identity": identity, "build": build}))?)
        .with_context(|| format!("writing {}", stamp.display()))?;
    Ok(build)
}

fn fresh_copy(ctx: &Ctx) -> Result<PathBuf> {
    let run = ctx.root.join("run");
    if run.exists() {
        std::fs::remove_dir_all(&run).with_context(|| format!("removing {}", run.display()))?;
    }
    std::fs::create_dir_all(&run).with_context(|| format!("creating {}", run.display()))?;
    let data = run.join("data.mdb");
    let src = ctx.root.join("base").join("data.mdb");
    std::fs::copy(&src, &data).with_context(|| format!("copying {} to {}", src.display(), data.display()))?;
    Ok(data)
}

fn set_cache(data: &Path, mode: &str) -> Result<()> {
    if mode == "warm" {
        coldio::warm(data)?;
        return Ok(());
    }
    if coldio::mapped_by_this_process(data)? {
        bail!("{} is still mapped by this process; its pages cannot be dropped", data.display());
    }
    let out = coldio::drop_pages(data)?;
    if !out.emptied() {
        bail!(
            "posix_fadvise(DONTNEED) left {} of {} pages of {} in the page cache (tmpfs, or another process maps it); \
             use --dir on a disk-backed filesystem",
            out.resident_after,
            out.total_pages,
            data.display()
        );
    }
    Ok(())
}

fn sample_json(s: &Sample, per: Option<(&str, usize)>, map: Option<&PageMap>) -> Result<Value> {
    let mut v = serde_json::to_value(s)?;
    if let Some((key, n)) = per {
        v[key] = serde_json::to_value(s.per(n))?;
    }
    if let Some(map) = map {
        v["pages_by_db"] = serde_json::to_value(map.attribute(&s.touched))?;
    }
    Ok(v)
}

fn rss_anon() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| s.lines().find_map(|l| l.strip_prefix("RssAnon:")).and_then(|v| v.split_whitespace().next()?.parse().ok()))
        .map_or(0, |kb: u64| kb * 1024)
}

fn measure(ctx: &Ctx, mode: &str, join: Option<&Path>) -> Result<Value> {
    let data = fresh_copy(ctx)?;
    let run = ctx.root.join("run");
    let before_insert = page_map(&data)?;
    set_cache(&data, mode)?;
    if let Some(group) = join {
        MemoryGroup::join(group)?;
    }

    let probe = Probe::start(&data)?;
    let env = open_env(&run, ctx.read_ahead)?;
    let db = database(&env)?;
    let open = probe.finish()?;
    let probe = Probe::start(&data)?;
    add(&env, db, &ctx.inserts, ctx.first_id, ctx.inserts.len(), ctx.efc)?;
    let insert = probe.finish()?;
    let rss_after_insert = rss_anon();
    drop(env);

    let before_search = page_map(&data)?;
    set_cache(&data, mode)?;
    let env = open_env(&run, ctx.read_ahead)?;
    let db = database(&env)?;
    let probe = Probe::start(&data)?;
    let mut hits = 0usize;
    {
        let rtxn = env.read_txn()?;
        let reader = Reader::<Cosine>::open(&rtxn, 0, db)?;
        for (q, truth) in ctx.queries.iter().zip(&ctx.truth) {
            let got = reader.nns(K).ef_search(ctx.ef.max(K)).by_vector(&rtxn, q)?.into_nns();
            let truth: HashSet<u32> = truth.iter().copied().collect();
            hits += got.iter().filter(|(id, _)| truth.contains(id)).count();
        }
    }
    let search = probe.finish()?;
    let rss_after_search = rss_anon();
    drop(env);
    let recall = hits as f64 / (K * ctx.queries.len()) as f64;
    let mut search_json = sample_json(&search, Some(("per_query", ctx.queries.len())), Some(&before_search))?;
    search_json["recall"] = json!((recall * 1e4).round() / 1e4);
    Ok(json!({
        "mode": mode,
        "open": sample_json(&open, None, None)?,
        "insert": sample_json(&insert, Some(("per_vector", ctx.inserts.len())), Some(&before_insert))?,
        "search": search_json,
        "rss_anon_bytes": {"after_insert": rss_after_insert, "after_search": rss_after_search},
    }))
}

fn run_in_cgroup(root: &Path, limit: u64) -> Result<std::result::Result<Value, String>> {
    let group = match MemoryGroup::create(&format!("hannoy-cold-{}", std::process::id()), limit) {
        Ok(g) => g,
        Err(e) => return Ok(Err(format!("memory cgroup not available: {e}"))),
    };
    eprintln!("memory cgroup {} limited to {:.1} MiB", group.path().display(), limit as f64 / 1048576.0);
    let out = root.join("cgroup-result.json");
    std::fs::remove_file(&out).ok();
    let mut args: Vec<String> = std::env::args().skip(1).collect();
    if !args.iter().any(|a| a == "--dir") {
        args.push("--dir".into());
        args.push(root.parent().context("the working directory has no parent")?.display().to_string());
    }
    if !args.iter().any(|a| a == "--reuse") {
        args.push("--reuse".into());
    }
    args.extend(["--child-cgroup".into(), group.path().display().to_string(), "--child-out".into(), out.display().to_string()]);
    let exe = std::env::current_exe().context("finding this executable")?;
    let status = Command::new(&exe).args(&args).status().with_context(|| format!("running {}", exe.display()))?;
    let stats = group.stats().ok();
    drop(group);
    if !status.success() {
        let hint = if status.signal() == Some(9) { " (SIGKILL: the OOM killer)" } else { "" };
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
    let (i, s) = (&r["insert"], &r["search"]);
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
