//! Backends, fixtures and seeded random data.

use std::path::Path;
use std::sync::Arc;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shoal_engine::{Batch, Index, IndexOptions, IndexParams, Metric};
use shoal_snapshot::{Operation, Progress, RestoreOptions, SnapshotOptions, SnapshotStore, TransferOptions};

/// A store to run a test against, and what keeps it alive.
pub(crate) struct Backend {
    pub(crate) name: &'static str,
    pub(crate) store: SnapshotStore,
    _dir: Option<tempfile::TempDir>,
}

/// Local files always; S3 when the test command started a server. Each
/// call gets a fresh, empty store (its own prefix in the bucket).
pub(crate) fn backends(test: &str) -> Vec<Backend> {
    let dir = tempfile::tempdir().unwrap();
    let local = SnapshotStore::open(dir.path().join("store").to_str().unwrap()).unwrap();
    let mut out = vec![Backend { name: "file", store: local, _dir: Some(dir) }];
    match s3_url(test) {
        Some(url) => out.push(Backend { name: "s3", store: SnapshotStore::open(&url).unwrap(), _dir: None }),
        None => eprintln!("SKIPPED the S3 half of {test}: SHOAL_TEST_S3_ENDPOINT is not set (ops/test.sh starts moto_server and sets it)"),
    }
    out
}

/// An `s3://` URL of a fresh prefix on the test server.
pub(crate) fn s3_url(test: &str) -> Option<String> {
    let endpoint = std::env::var("SHOAL_TEST_S3_ENDPOINT").ok().filter(|e| !e.is_empty())?;
    let bucket = std::env::var("SHOAL_TEST_S3_BUCKET").unwrap_or_else(|_| "shoal-test".into());
    let prefix = format!("{test}-{:016x}", rand::random::<u64>());
    // The test server accepts any credentials; passing them here keeps the
    // client from looking for real ones.
    Some(format!("s3://{bucket}/{prefix}?endpoint={endpoint}&region=us-east-1&access_key_id=testing&secret_access_key=testing"))
}

pub(crate) fn rng(test: &str) -> StdRng {
    let seed = std::env::var("SHOAL_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random::<u64>);
    eprintln!("{test}: seed {seed} (SHOAL_TEST_SEED={seed} replays it)");
    StdRng::seed_from_u64(seed)
}

pub(crate) fn engine_options() -> IndexOptions {
    IndexOptions { build_threads: 2, durable: false, initial_map_size: 64 << 20, ..IndexOptions::default() }
}

pub(crate) fn vector(rng: &mut StdRng, dim: usize) -> Vec<f32> {
    (0..dim).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// Upserts of ids `ids` with random vectors, tagged (job, offset).
pub(crate) fn batch(rng: &mut StdRng, dim: usize, ids: std::ops::Range<u64>, offset: u64) -> (Batch, Vec<(u64, Vec<f32>)>) {
    let points: Vec<(u64, Vec<f32>)> = ids.map(|id| (id, vector(rng, dim))).collect();
    (Batch::upserts(points.clone()).with_source("job", offset), points)
}

/// An index of `n` points in batches of 500 (offsets 0, 1, ...).
pub(crate) fn index_with(rng: &mut StdRng, dir: &Path, dim: usize, n: u64) -> Arc<Index> {
    let index = Index::open_or_create(dir, IndexParams::new(dim as u32, Metric::Euclidean), engine_options()).unwrap();
    for (i, start) in (0..n).step_by(500).enumerate() {
        index.apply(batch(rng, dim, start..(start + 500).min(n), i as u64).0).unwrap();
    }
    Arc::new(index)
}

/// Small chunks, so small test shards still have many of them.
pub(crate) fn small_chunks() -> SnapshotOptions {
    SnapshotOptions { chunk_size: 64 << 10, concurrency: 4, ..SnapshotOptions::default() }
}

pub(crate) fn restore_options() -> RestoreOptions {
    RestoreOptions {
        concurrency: 4,
        engine: engine_options(),
        transfer: TransferOptions::default(),
        check_free_space: true,
        direct_io: true,
    }
}

pub(crate) fn progress(op: Operation) -> Arc<Progress> {
    Arc::new(Progress::new(op))
}
