//! `index-bench`: build an index from a vector file, then measure recall and
//! single-thread QPS per `ef`, and the cost of incremental inserts.
//! Same flags and JSON shape as `../shared/peers/bench.py` and hannoy-bench.

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, Result, bail};
use serde_json::json;
use shoal_engine::{Batch, BatchLogRetention, Index, IndexOptions, IndexParams, LinkLog, Metric, Rescore, SearchParams};

use crate::fvecs::VecFile;
use crate::groundtruth;
use crate::memory::{PeakSampler, release_free_memory};
use crate::written;

mod incremental;

/// Flags of `index-bench`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Base vectors (.fvecs).
    #[arg(long)]
    base: PathBuf,
    /// Query vectors (.fvecs).
    #[arg(long)]
    query: PathBuf,
    /// Exact neighbours of each query (.ivecs); ignored with --limit.
    #[arg(long)]
    groundtruth: Option<PathBuf>,
    #[arg(long, default_value = "cosine")]
    metric: Metric,
    #[arg(long, default_value_t = 16)]
    m: u16,
    #[arg(long, default_value_t = 100)]
    ef_construction: u32,
    /// Build threads (the calling thread included).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Comma-separated search ef values.
    #[arg(long, default_value = "16,32,64,128,256", value_delimiter = ',')]
    ef: Vec<usize>,
    /// Also search on this many threads at once (each runs every query),
    /// the engine's throughput to hold a cluster's against (`qps_threads`).
    #[arg(long, default_value_t = 1)]
    search_threads: usize,
    #[arg(long, default_value_t = 10_000)]
    batch_size: usize,
    /// Use only the first N base vectors (exact ground truth is computed).
    #[arg(long)]
    limit: Option<usize>,
    /// Number of queries to run.
    #[arg(long, default_value_t = 1000)]
    queries: usize,
    /// Skip the 1k-into-10k/30k/100k insert measurements.
    #[arg(long)]
    no_incremental: bool,
    /// After the searches, compact the built index as a shard node does
    /// once the shard is at rest, and report the file before and after.
    #[arg(long)]
    compact: bool,
    /// Index sizes the incremental inserts go into (those that leave room
    /// for the inserted vectors in the base file).
    #[arg(long, default_value = "10000,30000,100000", value_delimiter = ',')]
    incremental_sizes: Vec<usize>,
    /// Vectors per incremental insert (one batch).
    #[arg(long, default_value_t = 1000)]
    incremental_batch: usize,
    /// Close and reopen each incremental index before its measured batch,
    /// so the batch's memory is not mixed with what the build's larger
    /// batches left in LMDB's page pool (LMDB keeps freed dirty pages for
    /// reuse). The first batch after a reopen also refills the shared
    /// address tables, so its time is not the steady-state time.
    #[arg(long)]
    reopen_before_insert: bool,
    /// `IndexOptions::warm_max_bytes` of every open (0: none, the engine's
    /// default); with `--reopen-before-insert`, the incremental indexes
    /// are dropped from the page cache and read back in order before
    /// their measured batches (docs/engine.md, "How the page cache was
    /// filled").
    #[arg(long, default_value_t = 0)]
    warm_max_bytes: u64,
    /// Measured batches per index size. Each goes into the index the one
    /// before it left (so the index grows by a batch each time); the
    /// median is reported. More than one steadies the figure on a noisy
    /// machine; 1 is the peers' protocol.
    #[arg(long, default_value_t = 1)]
    incremental_repeats: usize,
    /// Build every incremental size first, then send each round's batch
    /// to every size in turn, and report each size's per-round ratio to
    /// the first size's batch time (`ratio_to_first`). Each size's memory
    /// is then not its own, so no `peak_rss_anon_bytes` is given.
    #[arg(long)]
    incremental_interleave: bool,
    /// Before the measured batches, fold each incremental index's link
    /// log as a shard node does while its writer is idle
    /// (`Index::fold_due`, one `fold_link_log_step` after another): the
    /// state a shard is in when batches come after a pause. Without it
    /// the batches find the log the build's last batches left.
    #[arg(long)]
    incremental_idle_fold: bool,
    /// Directory for the index environments (default: the system temp dir).
    #[arg(long)]
    dir: Option<PathBuf>,
    /// Write the results as JSON here.
    #[arg(long)]
    json: Option<PathBuf>,
    /// Search candidates re-scored with exact vectors: `all`, or `kN` for
    /// the best max(k × N, 20) (the engine's default is `k2`).
    #[arg(long, default_value = "k2", value_parser = parse_rescore)]
    rescore: Rescore,
    /// Where batches write the changed bottom lists of existing nodes:
    /// `auto` (the engine's default), `always` (to the link log), `off`
    /// (patched into their blocks every batch).
    #[arg(long, default_value = "auto", value_parser = ["auto", "always", "off"])]
    link_log: String,
    /// Lists the link log holds before a batch folds it (the engine's
    /// default unless given).
    #[arg(long)]
    log_fold_lists: Option<usize>,
    /// Batches the batch log keeps (0: no log; the engine's default
    /// unless given).
    #[arg(long)]
    batch_log_max_batches: Option<u64>,
    /// Bytes the batch log keeps (the engine's default unless given).
    #[arg(long)]
    batch_log_max_bytes: Option<u64>,
    /// MiB a write transaction keeps of the pages it changes before LMDB
    /// writes some out early (0: LMDB's own limit; the engine's default
    /// unless given).
    #[arg(long)]
    write_memory_mib: Option<u64>,
}

/// The write memory of `--write-memory-mib` in bytes (the engine's
/// default without it); shared with `churn`.
pub(crate) fn write_memory_bytes(mib: Option<u64>) -> Result<u64> {
    match mib {
        None => Ok(IndexOptions::default().write_memory_bytes),
        Some(m) => m.checked_mul(1 << 20).ok_or_else(|| anyhow::anyhow!("--write-memory-mib {m} is more bytes than fit in 64 bits")),
    }
}

/// The engine's batch log retention from the flags.
fn batch_log(a: &Args) -> BatchLogRetention {
    let d = BatchLogRetention::default();
    BatchLogRetention {
        max_batches: a.batch_log_max_batches.unwrap_or(d.max_batches),
        max_bytes: a.batch_log_max_bytes.unwrap_or(d.max_bytes),
        ..d
    }
}

fn link_log(a: &Args) -> LinkLog {
    link_log_setting(&a.link_log, a.log_fold_lists)
}

/// The engine's link log setting from `--link-log` and `--log-fold-lists`.
pub(crate) fn link_log_setting(mode: &str, fold_lists: Option<usize>) -> LinkLog {
    let fold_lists = fold_lists.or(LinkLog::default().fold_lists()).unwrap_or(0);
    match mode {
        "off" => LinkLog::Off,
        "always" => LinkLog::Always { fold_lists },
        _ => LinkLog::Auto { fold_lists },
    }
}

pub(crate) fn parse_rescore(s: &str) -> Result<Rescore, String> {
    match s {
        "all" => Ok(Rescore::All),
        _ => s
            .strip_prefix('k')
            .and_then(|n| n.parse::<u16>().ok())
            .filter(|&n| n > 0)
            .map(Rescore::TopK)
            .ok_or_else(|| format!("--rescore takes `all` or `kN` (N ≥ 1), not {s:?}")),
    }
}

const K: usize = 10;

pub(crate) fn run(a: Args) -> Result<()> {
    if a.threads == 0 || a.batch_size == 0 {
        bail!("--threads and --batch-size must be at least 1");
    }
    let base = VecFile::open(&a.base)?;
    let query = VecFile::open(&a.query)?;
    if base.dim() != query.dim() {
        bail!("base has dimension {}, queries {}", base.dim(), query.dim());
    }
    let n = a.limit.unwrap_or(base.len()).min(base.len());
    let queries: Vec<Vec<f32>> = (0..a.queries.min(query.len())).map(|i| query.f32_row(i)).collect::<Result<_>>()?;
    let truth: Vec<Vec<u32>> = match (&a.groundtruth, a.limit) {
        (Some(g), None) => {
            let g = VecFile::open(g)?;
            if g.len() < queries.len() || g.dim() < K {
                bail!("ground truth has {} rows of {} ids; need {} rows of at least {K}", g.len(), g.dim(), queries.len());
            }
            (0..queries.len()).map(|i| Ok(g.i32_row(i)?[..K].iter().map(|&x| x as u32).collect())).collect::<Result<_>>()?
        }
        _ => {
            eprintln!("computing exact top-{K} over {n} vectors for {} queries...", queries.len());
            groundtruth::exact(&base, n, &queries, a.metric, K)?
        }
    };
    let params = IndexParams::new(base.dim() as u32, a.metric).with_m(a.m).with_ef_construction(a.ef_construction);
    let opts = IndexOptions {
        build_threads: a.threads,
        rescore: a.rescore,
        link_log: link_log(&a),
        batch_log: batch_log(&a),
        warm_max_bytes: a.warm_max_bytes,
        write_memory_bytes: write_memory_bytes(a.write_memory_mib)?,
        ..IndexOptions::default()
    };
    let root = match &a.dir {
        Some(d) => {
            std::fs::create_dir_all(d)?;
            tempfile::tempdir_in(d)?
        }
        None => tempfile::tempdir()?,
    };

    // Build.
    let dir = root.path().join("full");
    let index = Index::open_or_create(&dir, params, opts.clone())?;
    let mut batch_peaks = Vec::new();
    let written_before = (written::by_process(), written::by_device(&dir));
    let t0 = Instant::now();
    let mut start = 0;
    while start < n {
        let end = (start + a.batch_size).min(n);
        let sampler = PeakSampler::start();
        index.apply(read_batch(&base, start, end)?).with_context(|| format!("batch {start}..{end}"))?;
        batch_peaks.push(json!({"index_before": start, "batch": end - start, "peak_rss_anon_bytes": sampler.finish()}));
        eprint!("\rbuilt {end}/{n} in {:.1}s", t0.elapsed().as_secs_f64());
        start = end;
    }
    let secs = t0.elapsed().as_secs_f64();
    // Saturating: a counter unreadable at the end reads as 0.
    let wrote = (
        written::by_process().saturating_sub(written_before.0),
        written::by_device(&dir).zip(written_before.1).map(|(after, before)| after.saturating_sub(before)),
    );
    eprintln!();
    let build_peak = batch_peaks.iter().filter_map(|b| b["peak_rss_anon_bytes"].as_u64()).max().unwrap_or(0);
    let stats = index.stats()?;

    // Search, single-threaded.
    let mut search = Vec::new();
    for &ef in &a.ef {
        let sp = SearchParams::new(K, ef.max(K));
        let t = Instant::now();
        let mut hits = 0usize;
        for (q, truth) in queries.iter().zip(&truth) {
            let got = index.search(q, sp)?;
            let truth: HashSet<u32> = truth.iter().copied().collect();
            hits += got.iter().filter(|h| truth.contains(&(h.id as u32))).count();
        }
        let dt = t.elapsed().as_secs_f64();
        let recall = hits as f64 / (K * queries.len()) as f64;
        let qps = queries.len() as f64 / dt;
        let mut entry = json!({"ef": ef, "recall": round(recall, 4), "qps": round(qps, 1)});
        if a.search_threads > 1 {
            let t = Instant::now();
            std::thread::scope(|scope| {
                let runs: Vec<_> =
                    (0..a.search_threads).map(|_| scope.spawn(|| queries.iter().try_for_each(|q| index.search(q, sp).map(drop)))).collect();
                runs.into_iter()
                    .try_for_each(|r| r.join().map_err(|_| anyhow::anyhow!("a search thread panicked"))?.map_err(anyhow::Error::from))
            })?;
            let qps_threads = (a.search_threads * queries.len()) as f64 / t.elapsed().as_secs_f64();
            eprintln!("ef={ef:<4} recall@{K}={recall:.4} qps={qps:.0} qps on {} threads={qps_threads:.0}", a.search_threads);
            entry["qps_threads"] = json!(round(qps_threads, 1));
            entry["search_threads"] = json!(a.search_threads);
        } else {
            eprintln!("ef={ef:<4} recall@{K}={recall:.4} qps={qps:.0}");
        }
        search.push(entry);
    }
    let compacted = if a.compact {
        // At rest a shard node's writer folds the link log (while it is
        // due) before it compacts, so the copy leaves the folded lists out.
        let mut fold_steps = 0u64;
        while index.fold_due()? {
            index.fold_link_log_step()?;
            fold_steps += 1;
        }
        let c = index.compact()?;
        eprintln!(
            "compacted after {fold_steps} idle fold steps: {} MiB -> {} MiB ({:.2}x raw) in {:.1} s (searches waited {:.3} s)",
            c.bytes_before >> 20,
            c.bytes_after >> 20,
            c.bytes_after as f64 / (n * base.dim() * 4) as f64,
            c.copy_seconds,
            c.swap_seconds
        );
        json!({"fold_steps_before": fold_steps, "bytes_before": c.bytes_before, "bytes_after": c.bytes_after,
               "copy_seconds": round(c.copy_seconds, 3), "swap_seconds": round(c.swap_seconds, 4)})
    } else {
        serde_json::Value::Null
    };
    let unaligned = index.snapshot()?.unaligned_vectors();
    let scrub = scrub_pass(&index)?;
    drop(index);

    // Incremental inserts.
    let incremental = if a.no_incremental {
        Vec::new()
    } else {
        incremental::run(&incremental::Plan {
            base: &base,
            params,
            opts: opts.clone(),
            root: root.path(),
            sizes: &a.incremental_sizes,
            added: a.incremental_batch,
            repeats: a.incremental_repeats.max(1),
            batch_size: a.batch_size,
            reopen: a.reopen_before_insert,
            interleave: a.incremental_interleave,
            idle_fold: a.incremental_idle_fold,
        })?
    };

    let raw = (n * base.dim() * 4) as u64;
    let out = json!({
        "lib": "shoal",
        "params": {"m": a.m, "ef_construction": a.ef_construction, "threads": a.threads, "metric": a.metric.name(),
                   "batch_size": a.batch_size, "rescore": format!("{:?}", a.rescore),
                   "link_log": format!("{:?}", link_log(&a)), "batch_log": format!("{:?}", batch_log(&a)),
                   "write_memory_bytes": opts.write_memory_bytes},
        "build": {"vectors": n, "seconds": round(secs, 3), "vectors_per_s": round(n as f64 / secs, 1),
                  "disk_bytes": stats.disk_bytes, "used_bytes": stats.used_bytes, "raw_bytes": raw,
                  "free_bytes": stats.free_bytes, "table_bytes": stats.table_bytes.iter().map(|(k, v)| ((*k).to_owned(), json!(v))).collect::<serde_json::Map<_, _>>(),
                  "batch_log_entries": stats.batch_log_entries, "batch_log_bytes": stats.batch_log_bytes,
                  "peak_rss_anon_bytes": build_peak,
                  "written_bytes": wrote.0, "device_written_bytes": wrote.1,
                  "batches": batch_peaks, "max_level": stats.max_level, "unaligned_vectors": unaligned,
                  "compacted": compacted},
        "search": search,
        "scrub": scrub,
        "incremental": incremental,
        "warm_max_bytes": a.warm_max_bytes,
    });
    println!("{}", serde_json::to_string_pretty(&out)?);
    print_summary(&out);
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_string_pretty(&out)?).with_context(|| format!("writing {}", p.display()))?;
    }
    release_free_memory();
    Ok(())
}

/// One unpaced pass of the checksum scrub over the built index, in the
/// steps a shard node takes: what checking every stored value costs when
/// the file is in the page cache.
fn scrub_pass(index: &Index) -> Result<serde_json::Value> {
    let (mut cursor, mut bytes, mut values) = (shoal_engine::ScrubCursor::default(), 0u64, 0u64);
    let t = Instant::now();
    loop {
        let step = index.scrub(&cursor, 1 << 20)?;
        bytes += step.bytes;
        values += step.values;
        if step.pass_done {
            break;
        }
        cursor = step.next;
    }
    let secs = t.elapsed().as_secs_f64();
    let mb_per_s = bytes as f64 / (1 << 20) as f64 / secs;
    eprintln!("scrub: {} MiB, {values} values in {secs:.2} s = {mb_per_s:.0} MiB/s", bytes >> 20);
    Ok(json!({"bytes": bytes, "values": values, "seconds": round(secs, 3), "mib_per_s": round(mb_per_s, 1)}))
}

fn read_batch(base: &VecFile, start: usize, end: usize) -> Result<Batch> {
    let points = (start..end).map(|i| Ok((i as u64, base.f32_row(i)?))).collect::<Result<Vec<_>>>()?;
    Ok(Batch::upserts(points))
}

fn round(x: f64, digits: i32) -> f64 {
    let f = 10f64.powi(digits);
    (x * f).round() / f
}

fn print_summary(out: &serde_json::Value) {
    let b = &out["build"];
    eprintln!(
        "build: {} vectors in {:.1}s = {:.0}/s; disk {:.1} MiB ({:.2}x raw); peak RssAnon {:.1} MiB; wrote {:.0} MiB (the device {:.0} MiB)",
        b["vectors"],
        b["seconds"].as_f64().unwrap_or(0.0),
        b["vectors_per_s"].as_f64().unwrap_or(0.0),
        b["disk_bytes"].as_f64().unwrap_or(0.0) / (1 << 20) as f64,
        b["disk_bytes"].as_f64().unwrap_or(0.0) / b["raw_bytes"].as_f64().unwrap_or(1.0),
        b["peak_rss_anon_bytes"].as_f64().unwrap_or(0.0) / (1 << 20) as f64,
        b["written_bytes"].as_f64().unwrap_or(0.0) / (1 << 20) as f64,
        b["device_written_bytes"].as_f64().unwrap_or(0.0) / (1 << 20) as f64,
    );
}

/// Where the index of a run lives (for callers that keep it).
#[allow(dead_code)]
pub(crate) fn env_dir(root: &Path) -> PathBuf {
    root.join("full")
}

/// Folds what the batches left in the link log, as a shard node's idle
/// writer does, a step (one commit) at a time, and times the steps: the
/// fold's cost at the index's size, and the memory its commits take.
fn idle_fold(idx: &Index) -> Result<serde_json::Value> {
    let lists = idx.stats()?.link_log_lists;
    if lists == 0 {
        return Ok(serde_json::Value::Null);
    }
    let sampler = PeakSampler::start();
    let started = Instant::now();
    let (mut steps, mut blocks, mut slowest) = (0u64, 0u64, 0f64);
    loop {
        let t = Instant::now();
        let step = idx.fold_link_log_step()?;
        slowest = slowest.max(t.elapsed().as_secs_f64());
        steps += 1;
        blocks += step.blocks;
        if step.ended {
            break;
        }
    }
    let seconds = started.elapsed().as_secs_f64();
    let peak = sampler.finish();
    eprintln!(
        "idle fold: {lists} lists, {blocks} blocks in {steps} steps, {seconds:.2} s (slowest step {slowest:.3} s), peak RssAnon {} MiB",
        peak >> 20
    );
    Ok(json!({"lists": lists, "blocks": blocks, "steps": steps, "seconds": round(seconds, 3),
              "max_step_seconds": round(slowest, 3), "peak_rss_anon_bytes": peak}))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn write_memory_flags_convert_to_bytes_or_fail_clearly() {
        assert_eq!(write_memory_bytes(None).unwrap(), IndexOptions::default().write_memory_bytes);
        assert_eq!(write_memory_bytes(Some(0)).unwrap(), 0);
        assert_eq!(write_memory_bytes(Some(4)).unwrap(), 4 << 20);
        let err = write_memory_bytes(Some(u64::MAX >> 10)).unwrap_err().to_string();
        assert!(err.contains("--write-memory-mib"), "{err}");
    }
}
