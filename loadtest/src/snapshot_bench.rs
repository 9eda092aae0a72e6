//! `snapshot-bench`: snapshot and restore one shard through the snapshot
//! library, beside plain baselines of the same file measured in the same
//! run (`cp`, and `tar | zstd` / `zstd -d | tar` at the same level), and
//! restore time beside the time to rebuild the index from the raw vectors.
//! Ends with what a second snapshot uploads after a small ingest.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use anyhow::{Context, Result, bail};
use rand::{Rng, SeedableRng};
use serde_json::json;
use shoal_engine::{Batch, Index, IndexOptions, IndexParams, Metric, SearchParams};
use shoal_snapshot::{Operation, Progress, RestoreOptions, RestoreSource, SnapshotOptions, SnapshotStore, SnapshotTarget, TransferOptions};

use crate::fvecs::VecFile;

/// Flags of `snapshot-bench`.
#[derive(clap::Args, Debug)]
pub(crate) struct Args {
    /// Base vectors (.fvecs); without it, synthetic vectors.
    #[arg(long)]
    base: Option<PathBuf>,
    /// Vectors in the shard (the first N of --base, or N synthetic ones).
    #[arg(long, default_value_t = 100_000)]
    limit: usize,
    /// Dimension of synthetic vectors.
    #[arg(long, default_value_t = 384)]
    dim: usize,
    /// Snapshot stores to measure (a directory, file:///..., s3://...);
    /// default: a directory in --dir.
    #[arg(long)]
    store: Vec<String>,
    #[arg(long, default_value_t = 3)]
    zstd_level: i32,
    #[arg(long, default_value_t = 4096)]
    chunk_kib: usize,
    /// More chunk sizes for the incremental measurement only.
    #[arg(long, value_delimiter = ',', default_value = "256,1024")]
    incremental_chunk_kib: Vec<usize>,
    /// Points upserted before the second snapshot.
    #[arg(long, default_value_t = 100)]
    small_ingest: usize,
    /// Rounds of baseline, snapshot and restore (each snapshot into an
    /// empty prefix); medians are reported. The machine is shared, so one
    /// run can land on a noisy neighbour.
    #[arg(long, default_value_t = 3)]
    rounds: usize,
    /// Build threads (the calling thread included).
    #[arg(long, default_value_t = 2)]
    threads: usize,
    /// Work directory (default: the system temp dir).
    #[arg(long)]
    dir: Option<PathBuf>,
    #[arg(long)]
    json: Option<PathBuf>,
}

const BATCH: usize = 10_000;

pub(crate) fn run(a: Args) -> Result<()> {
    if a.limit == 0 || a.threads == 0 {
        bail!("--limit and --threads must be at least 1");
    }
    let work = match &a.dir {
        Some(d) => {
            std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
            tempfile::tempdir_in(d).with_context(|| format!("a work directory in {}", d.display()))?
        }
        None => tempfile::tempdir()?,
    };
    let (vectors, dim, what) = load(&a)?;
    println!("shard: {what}, {} vectors of {dim} dimensions", vectors.len());
    let opts = IndexOptions { build_threads: a.threads, ..IndexOptions::default() };
    let src = work.path().join("source");

    // Rebuild: the index from the raw vectors, as a node without snapshots
    // would have to.
    let t = Instant::now();
    let index = Index::open_or_create(&src, IndexParams::new(dim as u32, Metric::Cosine), opts.clone())?;
    for (b, chunk) in vectors.chunks(BATCH).enumerate() {
        let start = (b * BATCH) as u64;
        let points = chunk.iter().enumerate().map(|(i, v)| (start + i as u64, v.clone()));
        index.apply(Batch::upserts(points).with_source("bench", b as u64))?;
    }
    let build_secs = t.elapsed().as_secs_f64();
    let index = Arc::new(index);
    let file_bytes = std::fs::metadata(src.join("data.mdb"))?.len();
    let used = index.used_bytes()?;
    println!("rebuild from raw vectors: {build_secs:.1}s; data.mdb {:.1} MiB (used {:.1} MiB)", mib(file_bytes), mib(used));

    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let stores = if a.store.is_empty() { vec![work.path().join("store").to_string_lossy().into_owned()] } else { a.store.clone() };
    let mut base_runs = Vec::new();
    let mut store_runs: Vec<Vec<(f64, f64, u64)>> = vec![Vec::new(); stores.len()];
    for round in 0..a.rounds.max(1) {
        println!("\n== round {}", round + 1);
        base_runs.push(baselines(&src, work.path(), a.zstd_level)?);
        for (si, url) in stores.iter().enumerate() {
            let store = SnapshotStore::open(&in_round(url, round))?;
            let r = rt.block_on(snapshot_and_restore(&a, &store, &index, &opts, work.path(), build_secs))?;
            store_runs[si].push(r);
        }
    }
    let baseline = Baseline {
        cp_secs: median(base_runs.iter().map(|b| b.cp_secs)),
        tar_zstd_secs: median(base_runs.iter().map(|b| b.tar_zstd_secs)),
        tar_zstd_bytes: base_runs[0].tar_zstd_bytes,
        untar_secs: median(base_runs.iter().map(|b| b.untar_secs)),
    };
    let mut results = Vec::new();
    for (si, url) in stores.iter().enumerate() {
        let store = SnapshotStore::open(&in_round(url, a.rounds.max(1)))?;
        println!("\n== incremental, store {}", store.url());
        let incremental = rt.block_on(incremental(&a, &store, &index, si))?;
        let runs = &store_runs[si];
        results.push(json!({
            "store": store.url().split(':').next().unwrap_or("?"),
            "url": store.url(),
            "snapshot_secs": median(runs.iter().map(|r| r.0)),
            "restore_secs": median(runs.iter().map(|r| r.1)),
            "stored_bytes": runs[0].2,
            "snapshot_runs": runs.iter().map(|r| r.0).collect::<Vec<_>>(),
            "restore_runs": runs.iter().map(|r| r.1).collect::<Vec<_>>(),
            "incremental": incremental,
        }));
    }
    drop(index);

    println!("\n== summary (medians of {} rounds; MiB/s of data file; the page cache is warm for every line)", a.rounds.max(1));
    println!("{:<34} {:>9} {:>10} {:>10}", "", "seconds", "MiB/s", "size MiB");
    let line = |name: &str, s: f64, size: u64| println!("{name:<34} {s:>9.2} {:>10.0} {:>10.1}", mib(used) / s, mib(size));
    line("cp data.mdb", baseline.cp_secs, file_bytes);
    line(&format!("tar | zstd -{} -T0", a.zstd_level), baseline.tar_zstd_secs, baseline.tar_zstd_bytes);
    line("zstd -d | tar (restore baseline)", baseline.untar_secs, file_bytes);
    for r in &results {
        line(
            &format!("snapshot to {}", r["store"].as_str().unwrap_or("?")),
            r["snapshot_secs"].as_f64().unwrap_or(0.0),
            r["stored_bytes"].as_u64().unwrap_or(0),
        );
        line(&format!("restore from {}", r["store"].as_str().unwrap_or("?")), r["restore_secs"].as_f64().unwrap_or(0.0), used);
    }
    println!("rebuild from raw vectors           {build_secs:>9.2}");
    for r in &results {
        println!(
            "{}: snapshot throughput / tar|zstd: {:.2}x; rebuild / restore: {:.1}x",
            r["store"].as_str().unwrap_or("?"),
            baseline.tar_zstd_secs / r["snapshot_secs"].as_f64().unwrap_or(f64::NAN),
            build_secs / r["restore_secs"].as_f64().unwrap_or(f64::NAN)
        );
    }
    let out = json!({
        "shard": what, "vectors": vectors.len(), "dim": dim, "zstd_level": a.zstd_level, "chunk_kib": a.chunk_kib,
        "file_bytes": file_bytes, "used_bytes": used, "build_secs": build_secs,
        "baseline": { "cp_secs": baseline.cp_secs, "tar_zstd_secs": baseline.tar_zstd_secs,
                      "tar_zstd_bytes": baseline.tar_zstd_bytes, "untar_secs": baseline.untar_secs,
                      "tar_zstd_runs": base_runs.iter().map(|b| b.tar_zstd_secs).collect::<Vec<_>>() },
        "stores": results,
    });
    if let Some(p) = &a.json {
        std::fs::write(p, serde_json::to_vec_pretty(&out)?)?;
        println!("wrote {}", p.display());
    }
    Ok(())
}

fn load(a: &Args) -> Result<(Vec<Vec<f32>>, usize, String)> {
    match &a.base {
        Some(path) => {
            let f = VecFile::open(path)?;
            let n = a.limit.min(f.len());
            let v = (0..n).map(|i| f.f32_row(i)).collect::<Result<Vec<_>>>()?;
            Ok((v, f.dim(), format!("{} (first {n})", path.display())))
        }
        None => {
            let mut rng = rand::rngs::StdRng::seed_from_u64(7);
            let v = (0..a.limit).map(|_| (0..a.dim).map(|_| rng.random_range(-1.0f32..1.0)).collect()).collect();
            Ok((v, a.dim, "synthetic uniform vectors (seed 7)".into()))
        }
    }
}

struct Baseline {
    cp_secs: f64,
    tar_zstd_secs: f64,
    tar_zstd_bytes: u64,
    untar_secs: f64,
}

/// The same file through standard tools, same zstd level, all cores.
fn baselines(src: &Path, work: &Path, level: i32) -> Result<Baseline> {
    let sh = |script: &str| -> Result<f64> {
        settle();
        let t = Instant::now();
        let st = Command::new("sh").arg("-c").arg(script).status().with_context(|| format!("running {script}"))?;
        if !st.success() {
            bail!("{script} failed: {st}");
        }
        Ok(t.elapsed().as_secs_f64())
    };
    let (s, w) = (src.display(), work.display());
    // Warm the page cache the same way for everyone.
    sh(&format!("cat {s}/data.mdb > /dev/null"))?;
    let cp_secs = sh(&format!("cp {s}/data.mdb {w}/cp.mdb && sync {w}/cp.mdb"))?;
    std::fs::remove_file(work.join("cp.mdb"))?;
    let tar_zstd_secs = sh(&format!("tar -cf - -C {s} data.mdb | zstd -{level} -T0 -q -o {w}/image.tar.zst -f"))?;
    let tar_zstd_bytes = std::fs::metadata(work.join("image.tar.zst"))?.len();
    std::fs::create_dir_all(work.join("untar"))?;
    let untar_secs = sh(&format!("zstd -d -q -c {w}/image.tar.zst | tar -xf - -C {w}/untar && sync {w}/untar/data.mdb"))?;
    std::fs::remove_dir_all(work.join("untar"))?;
    std::fs::remove_file(work.join("image.tar.zst"))?;
    println!(
        "baselines: cp {cp_secs:.2}s; tar|zstd -{level} -T0 {tar_zstd_secs:.2}s -> {:.1} MiB; zstd -d|tar {untar_secs:.2}s",
        mib(tar_zstd_bytes)
    );
    Ok(Baseline { cp_secs, tar_zstd_secs, tar_zstd_bytes, untar_secs })
}

/// Writes back every dirty page of the machine before a timed step, so no
/// step pays for the writeback of the one before (the kernel throttles
/// writers once too much is dirty).
fn settle() {
    // SAFETY: sync has no preconditions.
    unsafe { libc::sync() };
}

/// `url` with a sub-prefix per round, so every round's snapshot starts
/// from an empty store (no chunk reuse).
fn in_round(url: &str, round: usize) -> String {
    match url.split_once('?') {
        Some((base, query)) => format!("{}/r{round}?{query}", base.trim_end_matches('/')),
        None => format!("{}/r{round}", url.trim_end_matches('/')),
    }
}

fn median(xs: impl Iterator<Item = f64>) -> f64 {
    let mut v: Vec<f64> = xs.collect();
    v.sort_by(f64::total_cmp);
    v.get(v.len() / 2).copied().unwrap_or(f64::NAN)
}

/// One full snapshot into an empty store, then a restore that ends with the
/// index open and a first search answered. (seconds, seconds, stored bytes)
async fn snapshot_and_restore(
    a: &Args,
    store: &SnapshotStore,
    index: &Arc<Index>,
    engine: &IndexOptions,
    work: &Path,
    build_secs: f64,
) -> Result<(f64, f64, u64)> {
    let snap_opts = SnapshotOptions { zstd_level: a.zstd_level, chunk_size: a.chunk_kib << 10, ..SnapshotOptions::default() };
    let target = SnapshotTarget { collection: "bench".into(), shard: 0, shard_count: 1, id: None };
    settle();
    let t = Instant::now();
    let m = shoal_snapshot::create_snapshot(store, Arc::clone(index), &target, &snap_opts, Arc::new(Progress::new(Operation::Snapshot)))
        .await?;
    let snapshot_secs = t.elapsed().as_secs_f64();
    println!(
        "snapshot to {}: {snapshot_secs:.2}s, {:.0} MiB/s; {:.1} MiB -> {:.1} MiB stored ({:.1}%) in {} chunks",
        store.url(),
        mib(m.image_bytes) / snapshot_secs,
        mib(m.image_bytes),
        mib(m.stored_bytes),
        100.0 * m.stored_bytes as f64 / m.image_bytes as f64,
        m.chunks.len(),
    );
    let staging = work.join("restore");
    let ropts = RestoreOptions { engine: engine.clone(), transfer: TransferOptions::default(), ..RestoreOptions::default() };
    let source = RestoreSource { collection: "bench".into(), shard: 0, id: m.id.clone() };
    settle();
    let t = Instant::now();
    shoal_snapshot::restore_to_staging(store, &source, &staging, &ropts, Arc::new(Progress::new(Operation::Restore))).await?;
    let restored = Index::open(&staging, engine.clone())?;
    let q: Vec<f32> = restored.get(0)?.map(|p| p.vector).unwrap_or_else(|| vec![1.0; index.params().dim as usize]);
    let hits = restored.search(&q, SearchParams::new(10, 64))?;
    let restore_secs = t.elapsed().as_secs_f64();
    anyhow::ensure!(restored.stats()?.live == m.points && !hits.is_empty(), "the restored index differs");
    drop(restored);
    std::fs::remove_dir_all(&staging)?;
    println!(
        "restore (download, check, decompress, open, first search): {restore_secs:.2}s, {:.0} MiB/s; rebuild/restore = {:.1}x",
        mib(m.image_bytes) / restore_secs,
        build_secs / restore_secs
    );
    Ok((snapshot_secs, restore_secs, m.stored_bytes))
}

/// Per chunk size: a base snapshot, a small ingest, a second snapshot.
async fn incremental(a: &Args, store: &SnapshotStore, index: &Arc<Index>, si: usize) -> Result<Vec<serde_json::Value>> {
    let mut out = Vec::new();
    let mut sizes = vec![a.chunk_kib];
    sizes.extend(a.incremental_chunk_kib.iter().copied().filter(|k| *k != a.chunk_kib));
    let dim = index.params().dim as usize;
    let mut rng = rand::rngs::StdRng::seed_from_u64(11 + si as u64);
    for (k, kib) in sizes.into_iter().enumerate() {
        let opts = SnapshotOptions { zstd_level: a.zstd_level, chunk_size: kib << 10, ..SnapshotOptions::default() };
        let target = SnapshotTarget { collection: format!("inc{kib}"), shard: 0, shard_count: 1, id: None };
        let progress = || Arc::new(Progress::new(Operation::Snapshot));
        let base = shoal_snapshot::create_snapshot(store, Arc::clone(index), &target, &opts, progress()).await?;
        let first = 10_000_000 + (si * 100 + k) as u64 * 1_000_000;
        let points = (0..a.small_ingest as u64).map(|i| (first + i, (0..dim).map(|_| rng.random_range(-1.0f32..1.0)).collect()));
        index.apply(Batch::upserts(points).with_source("small", first))?;
        let t = Instant::now();
        let second = shoal_snapshot::create_snapshot(store, Arc::clone(index), &target, &opts, progress()).await?;
        let secs = t.elapsed().as_secs_f64();
        println!(
            "{kib} KiB chunks: after {} new points, the second snapshot uploaded {} of {} chunks, {:.1} of {:.1} MiB stored ({:.1}%), in {secs:.2}s",
            a.small_ingest,
            second.uploaded_chunks,
            second.chunks.len(),
            mib(second.uploaded_bytes),
            mib(second.stored_bytes),
            100.0 * second.uploaded_bytes as f64 / second.stored_bytes as f64
        );
        out.push(json!({
            "chunk_kib": kib, "base_chunks": base.chunks.len(), "chunks": second.chunks.len(),
            "uploaded_chunks": second.uploaded_chunks, "uploaded_bytes": second.uploaded_bytes,
            "stored_bytes": second.stored_bytes, "secs": secs,
        }));
    }
    Ok(out)
}

fn mib(b: u64) -> f64 {
    b as f64 / 1048576.0
}
