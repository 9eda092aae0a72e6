//! Profiling harness: time one batch inserted into an existing index, with
//! the time of each phase (the engine's tracing spans).
//!
//! `cargo run --release -p shoal-engine --example insert_profile -- BASE.fvecs ENV_DIR N_BASE N_ADD`
//! builds ENV_DIR from the first N_BASE rows if it does not exist, then
//! copies it and inserts the next N_ADD rows into the copy as one batch.
//! `THREADS` sets the build threads (default 2); `DURABLE=0` skips fsync;
//! `WARMUP=N` first inserts N other rows in their own batch, as a running
//! shard would have done (it fills the shared address tables).
use std::time::Instant;

use shoal_engine::{Batch, Index, IndexOptions, IndexParams, Metric};
use tracing_subscriber::fmt::format::FmtSpan;

fn rows(path: &str, from: usize, to: usize) -> Vec<(u64, Vec<f32>)> {
    let raw = std::fs::read(path).expect("read base");
    let d = i32::from_le_bytes(raw[..4].try_into().unwrap()) as usize;
    let row = 4 * (d + 1);
    (from..to)
        .map(|i| {
            let r = &raw[i * row + 4..(i + 1) * row];
            (i as u64, r.chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect())
        })
        .collect()
}

fn base_rows(path: &str) -> usize {
    let len = std::fs::metadata(path).expect("stat base").len() as usize;
    let raw = std::fs::read(path).expect("read base");
    let d = i32::from_le_bytes(raw[..4].try_into().unwrap()) as usize;
    len / (4 * (d + 1))
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let (base, dir, n, add) = (&a[1], std::path::Path::new(&a[2]), a[3].parse::<usize>().unwrap(), a[4].parse::<usize>().unwrap());
    let threads = std::env::var("THREADS").ok().and_then(|t| t.parse().ok()).unwrap_or(2);
    let durable = std::env::var("DURABLE").map_or(true, |v| v != "0");
    let opts = IndexOptions { build_threads: threads, durable, ..IndexOptions::default() };
    let params = IndexParams::new(384, Metric::Cosine);
    if !dir.exists() {
        let idx = Index::open_or_create(dir, params, opts.clone()).unwrap();
        for s in (0..n).step_by(10_000) {
            idx.apply(Batch::upserts(rows(base, s, (s + 10_000).min(n)))).unwrap();
        }
    }
    let copy = tempfile::tempdir_in(dir.parent().unwrap_or(std::path::Path::new("."))).unwrap();
    for f in ["data.mdb", "lock.mdb"] {
        std::fs::copy(dir.join(f), copy.path().join(f)).unwrap();
        // A fresh copy is dirty in the page cache; flush it now so the
        // batch's commit does not pay for it.
        std::fs::File::open(copy.path().join(f)).unwrap().sync_all().unwrap();
    }
    let idx = Index::open(copy.path(), opts).unwrap();
    let warmup = std::env::var("WARMUP").ok().and_then(|v| v.parse::<usize>().ok()).unwrap_or(0);
    if warmup > 0 {
        let last = base_rows(base) - warmup;
        idx.apply(Batch::upserts(rows(base, last, last + warmup))).unwrap();
    }
    if add == 0 {
        return;
    }
    let batch = Batch::upserts(rows(base, n, n + add));
    tracing_subscriber::fmt().with_span_events(FmtSpan::CLOSE).with_max_level(tracing::Level::DEBUG).with_target(false).init();
    let t = Instant::now();
    idx.apply(batch).unwrap();
    println!("{add} into {n}: {:.4} ms/vector", t.elapsed().as_secs_f64() * 1000.0 / add as f64);
}
