//! Fixtures shared by the engine's tests.

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shoal_engine::{Batch, Index, IndexOptions, IndexParams, LinkLog, Metric, Op, Point};
use tempfile::TempDir;

/// An index in its own temporary directory.
pub(crate) struct Fixture {
    pub(crate) dir: TempDir,
    pub(crate) index: Index,
}

/// Options for tests: two build threads (so the parallel path runs), no
/// fsync (durability is tested explicitly where it matters), and every
/// batch's changed lists appended to the link log, folded every few
/// hundred lists: test indexes are small, and the default would patch them
/// in place, leaving the log's read and fold paths untested.
pub(crate) fn test_options() -> IndexOptions {
    IndexOptions { build_threads: 2, durable: false, link_log: LinkLog::Always { fold_lists: 400 }, ..IndexOptions::default() }
}

impl Fixture {
    pub(crate) fn new(dim: u32, metric: Metric) -> Fixture {
        Self::with(IndexParams::new(dim, metric), test_options())
    }

    pub(crate) fn with(params: IndexParams, opts: IndexOptions) -> Fixture {
        let dir = tempfile::tempdir().expect("tempdir");
        let index = Index::open_or_create(dir.path().join("shard"), params, opts).expect("create index");
        Fixture { dir, index }
    }

    /// Closes and reopens the index, as a restarted node would.
    pub(crate) fn reopen(self, opts: IndexOptions) -> Fixture {
        let Fixture { dir, index } = self;
        drop(index);
        let index = Index::open(dir.path().join("shard"), opts).expect("reopen index");
        Fixture { dir, index }
    }
}

/// A seeded RNG; the seed is printed so a failure can be replayed with
/// `SHOAL_TEST_SEED`.
pub(crate) fn rng(test: &str) -> StdRng {
    let seed = std::env::var("SHOAL_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random::<u64>);
    eprintln!("{test}: seed {seed} (set SHOAL_TEST_SEED={seed} to replay)");
    StdRng::seed_from_u64(seed)
}

pub(crate) fn random_vector(rng: &mut StdRng, dim: usize) -> Vec<f32> {
    (0..dim).map(|_| rng.random_range(-1.0f32..1.0)).collect()
}

/// A batch upserting ids `ids` with random vectors.
pub(crate) fn random_batch(rng: &mut StdRng, dim: usize, ids: impl IntoIterator<Item = u64>) -> Batch {
    Batch {
        ops: ids.into_iter().map(|id| Op::Upsert(Point { id, vector: random_vector(rng, dim), payload: None })).collect(),
        source: None,
    }
}

/// Exact nearest neighbours by brute force: (id, distance) ascending.
pub(crate) fn brute_force(metric: Metric, points: &[(u64, Vec<f32>)], q: &[f32], k: usize) -> Vec<(u64, f32)> {
    let prep = |v: &[f32]| -> Vec<f32> {
        if metric == Metric::Cosine {
            let n = v.iter().map(|x| f64::from(*x) * f64::from(*x)).sum::<f64>().sqrt();
            v.iter().map(|x| (f64::from(*x) / n) as f32).collect()
        } else {
            v.to_vec()
        }
    };
    let q = prep(q);
    let mut d: Vec<(u64, f32)> = points
        .iter()
        .map(|(id, v)| {
            let v = prep(v);
            let dot: f32 = v.iter().zip(&q).map(|(a, b)| a * b).sum();
            let dist = match metric {
                Metric::Cosine => 1.0 - dot,
                Metric::Dot => -dot,
                Metric::Euclidean => v.iter().zip(&q).map(|(a, b)| (a - b) * (a - b)).sum::<f32>().sqrt(),
            };
            (*id, dist)
        })
        .collect();
    d.sort_by(|a, b| a.1.total_cmp(&b.1).then(a.0.cmp(&b.0)));
    d.truncate(k);
    d
}

/// Asserts that `got` is the exact top-k: same distances in order (ids may
/// swap only where distances tie).
pub(crate) fn assert_exact(got: &[shoal_engine::Hit], want: &[(u64, f32)], context: &str) {
    assert_eq!(got.len(), want.len(), "{context}: got {got:?}, want {want:?}");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert!(
            (g.distance - w.1).abs() <= 1e-4 * w.1.abs().max(1.0),
            "{context}: rank {i}: got {} at {}, want {} at {}\n got {got:?}\nwant {want:?}",
            g.id,
            g.distance,
            w.0,
            w.1
        );
    }
}

/// Runs this binary's test `name` alone in a child process with `var` set
/// to `dir`, so that the test plays the child's part (work until killed,
/// reporting each step on stdout); returns it with its stdout's lines.
pub(crate) fn spawn_child(
    name: &str,
    var: &str,
    dir: &std::path::Path,
) -> (std::process::Child, std::io::Lines<std::io::BufReader<std::process::ChildStdout>>) {
    use std::io::BufRead;
    let mut child = std::process::Command::new(std::env::current_exe().expect("current exe"))
        .args(["--exact", name, "--nocapture", "--test-threads=1"])
        .env(var, dir)
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::null())
        .spawn()
        .expect("spawning the child");
    let lines = std::io::BufReader::new(child.stdout.take().expect("piped stdout")).lines();
    (child, lines)
}
