//! Where a snapshot's time goes, piece by piece, on an existing shard
//! directory: the engine's copy alone (into a sink), BLAKE3 of the image,
//! zstd of 4 MiB chunks on all cores, and the whole pipeline to a local
//! store.
//!
//!     cargo run --release -p shoal-snapshot --example pipeline_profile -- <shard dir> [level] [base.fvecs]
//!
//! With a .fvecs file and no shard in the directory, builds one from its
//! first 100,000 vectors first.

use std::sync::Arc;
use std::time::Instant;

use shoal_engine::{CopyMode, Index, IndexOptions};
use shoal_snapshot::{Operation, Progress, SnapshotOptions, SnapshotStore, SnapshotTarget};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let dir = args.next().ok_or("usage: pipeline_profile <shard dir> [level]")?;
    let level: i32 = args.next().map_or(Ok(3), |l| l.parse())?;
    if let Some(fvecs) = args.next()
        && !std::path::Path::new(&dir).join("data.mdb").exists()
    {
        build(&dir, &fvecs)?;
    }
    let index = Arc::new(Index::open(&dir, IndexOptions::default())?);
    let mib = |b: u64| b as f64 / 1048576.0;

    let t = Instant::now();
    let info = index.copy_to(CopyMode::Plain, &mut std::io::sink())?;
    let s = t.elapsed().as_secs_f64();
    println!("copy_to(sink):        {s:.3}s  {:.0} MiB/s ({:.1} MiB)", mib(info.bytes) / s, mib(info.bytes));

    let mut image = Vec::with_capacity(info.bytes as usize);
    index.copy_to(CopyMode::Plain, &mut image)?;
    let t = Instant::now();
    let n = image.chunks(4 << 20).map(|c| blake3::hash(c).as_bytes()[0] as usize).sum::<usize>();
    let s = t.elapsed().as_secs_f64();
    println!("blake3 (1 thread):    {s:.3}s  {:.0} MiB/s ({n})", mib(info.bytes) / s);

    for threads in [1, std::thread::available_parallelism().map_or(1, usize::from)] {
        let t = Instant::now();
        let chunks: Vec<&[u8]> = image.chunks(4 << 20).collect();
        let out: usize = std::thread::scope(|sc| {
            let hs: Vec<_> = (0..threads)
                .map(|k| {
                    let chunks = &chunks;
                    sc.spawn(move || {
                        chunks.iter().skip(k).step_by(threads).map(|c| zstd::bulk::compress(c, level).map_or(0, |v| v.len())).sum::<usize>()
                    })
                })
                .collect();
            hs.into_iter().map(|h| h.join().unwrap_or(0)).sum()
        });
        let s = t.elapsed().as_secs_f64();
        println!("zstd -{level} ({threads} threads): {s:.3}s  {:.0} MiB/s -> {:.1} MiB", mib(info.bytes) / s, mib(out as u64));
    }

    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let store_dir = tempfile::tempdir()?;
    let store = SnapshotStore::open(store_dir.path().to_str().ok_or("path")?)?;
    let target = SnapshotTarget { collection: "profile".into(), shard: 0, shard_count: 1, id: None };
    let opts = SnapshotOptions { zstd_level: level, ..SnapshotOptions::default() };
    let memory = SnapshotStore::from_object_store(Arc::new(object_store::memory::InMemory::new()), "memory");
    let nosync_dir = tempfile::tempdir()?;
    let nosync = SnapshotStore::from_object_store(
        Arc::new(object_store::local::LocalFileSystem::new_with_prefix(nosync_dir.path())?),
        "files without fsync",
    );
    let mut last = None;
    for (name, store) in [("in memory", &memory), ("files, no fsync", &nosync), ("files, fsync (default)", &store)] {
        let t = Instant::now();
        let m = rt.block_on(shoal_snapshot::create_snapshot(
            store,
            Arc::clone(&index),
            &target,
            &opts,
            Arc::new(Progress::new(Operation::Snapshot)),
        ))?;
        let s = t.elapsed().as_secs_f64();
        println!("create_snapshot to {name}: {s:.3}s  {:.0} MiB/s -> {:.1} MiB", mib(m.image_bytes) / s, mib(m.stored_bytes));
        last = Some(m);
    }

    // Restore: zstd decompression alone, then the whole restore, then opening
    // and searching the result.
    let m = last.ok_or("no snapshot")?;
    let compressed: Vec<Vec<u8>> = image.chunks(4 << 20).map(|c| zstd::bulk::compress(c, level)).collect::<Result<_, _>>()?;
    let threads = std::thread::available_parallelism().map_or(1, usize::from);
    let t = Instant::now();
    std::thread::scope(|sc| {
        for k in 0..threads {
            let compressed = &compressed;
            sc.spawn(move || {
                compressed.iter().skip(k).step_by(threads).map(|c| zstd::bulk::decompress(c, 4 << 20).map_or(0, |v| v.len())).sum::<usize>()
            });
        }
    });
    let s = t.elapsed().as_secs_f64();
    println!("zstd -d ({threads} threads): {s:.3}s  {:.0} MiB/s", mib(info.bytes) / s);
    let staging = store_dir.path().join("restored");
    let source = shoal_snapshot::RestoreSource { collection: "profile".into(), shard: 0, id: m.id.clone() };
    let t = Instant::now();
    rt.block_on(shoal_snapshot::restore_to_staging(
        &store,
        &source,
        &staging,
        &shoal_snapshot::RestoreOptions::default(),
        Arc::new(Progress::new(Operation::Restore)),
    ))?;
    let s = t.elapsed().as_secs_f64();
    println!("restore_to_staging (files): {s:.3}s  {:.0} MiB/s", mib(m.image_bytes) / s);
    let t = Instant::now();
    let restored = Index::open(&staging, IndexOptions::default())?;
    let q = restored.get(0)?.map(|p| p.vector).ok_or("point 0 missing")?;
    let hits = restored.search(&q, shoal_engine::SearchParams::new(10, 64))?;
    println!("open + first search: {:.3}s ({} hits)", t.elapsed().as_secs_f64(), hits.len());
    Ok(())
}

fn build(dir: &str, fvecs: &str) -> Result<(), Box<dyn std::error::Error>> {
    let raw = std::fs::read(fvecs)?;
    let dim = i32::from_le_bytes(raw[..4].try_into()?) as usize;
    let rows: Vec<Vec<f32>> = raw
        .chunks_exact(4 * (dim + 1))
        .take(100_000)
        .map(|r| r[4..].chunks_exact(4).map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]])).collect())
        .collect();
    let index =
        Index::open_or_create(dir, shoal_engine::IndexParams::new(dim as u32, shoal_engine::Metric::Cosine), IndexOptions::default())?;
    for (b, chunk) in rows.chunks(10_000).enumerate() {
        let points = chunk.iter().enumerate().map(|(i, v)| ((b * 10_000 + i) as u64, v.clone()));
        index.apply(shoal_engine::Batch::upserts(points))?;
    }
    println!("built {} vectors in {dir}", rows.len());
    Ok(())
}
