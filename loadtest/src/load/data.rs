//! What the load is made of: base vectors (an `.fvecs` or `.npy` file, or
//! generated from a seed, any row on demand), their payloads, query vectors,
//! and the ground truth for recall.

use std::io::BufRead;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use anyhow::{Context, Result, bail, ensure};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde::Serialize;
use shoal_proto::v1;

use super::npy::NpyMatrix;
use super::recall;
use crate::fvecs::VecFile;

/// Flags that choose the vectors.
#[derive(clap::Args, Debug, Clone, Serialize)]
pub(crate) struct DataArgs {
    /// Base vectors: .fvecs, or .npy (2-d float32). Without it, vectors are
    /// generated (--points, --dim, --seed). Point ids are row numbers.
    #[arg(long, value_name = "FILE")]
    pub(crate) base: Option<PathBuf>,
    /// Use only the first N base vectors.
    #[arg(long, value_name = "N")]
    pub(crate) limit: Option<usize>,
    /// Payloads: JSON Lines, line i the JSON object sent with base row i
    /// (on ingest, preload and upsert). Without it, points have none.
    #[arg(long, value_name = "FILE.jsonl")]
    pub(crate) payloads: Option<PathBuf>,
    /// Generated vectors: how many.
    #[arg(long, default_value_t = 100_000)]
    pub(crate) points: usize,
    /// Generated vectors: components (also the dimension --create uses).
    #[arg(long, default_value_t = 128)]
    pub(crate) dim: usize,
    /// Seed of the generated vectors and of the random ids of upserts and
    /// deletes.
    #[arg(long, default_value_t = 1)]
    pub(crate) seed: u64,
    /// Query vectors: .fvecs or .npy. Without it, queries are generated
    /// around the same clusters as the generated base.
    #[arg(long, value_name = "FILE")]
    pub(crate) query: Option<PathBuf>,
    /// How many queries to use (the first N of --query, or generated).
    #[arg(long, default_value_t = 1000)]
    pub(crate) queries: usize,
    /// Ground truth (.ivecs): row i lists query i's nearest base ids,
    /// nearest first. Recall@k compares the answer with its first k.
    #[arg(long, value_name = "FILE.ivecs")]
    pub(crate) groundtruth: Option<PathBuf>,
    /// Compute the ground truth by brute force over the base vectors in use
    /// (for generated data, or a --limit that the file's truth does not fit).
    #[arg(long, conflicts_with = "groundtruth")]
    pub(crate) exact_groundtruth: bool,
}

/// Generated vectors: Gaussian clusters, each row from its own seeded
/// stream, so any row can be made again without storing it.
pub(crate) struct Generator {
    seed: u64,
    centres: Vec<Vec<f32>>,
}

const CENTRES: usize = 64;
const SPREAD: f32 = 0.35;
/// Streams of rows: the base, and the queries.
const BASE: u64 = 0;
const QUERIES: u64 = 1;

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

fn gauss(rng: &mut StdRng) -> f32 {
    // Box–Muller (one of the pair).
    let (u, v): (f32, f32) = (rng.random_range(f32::EPSILON..1.0), rng.random());
    (-2.0 * u.ln()).sqrt() * (std::f32::consts::TAU * v).cos()
}

impl Generator {
    pub(crate) fn new(dim: usize, seed: u64) -> Generator {
        let mut rng = StdRng::seed_from_u64(splitmix(seed ^ 0xc0ffee));
        let centres = (0..CENTRES).map(|_| (0..dim).map(|_| gauss(&mut rng)).collect()).collect();
        Generator { seed, centres }
    }

    fn row(&self, stream: u64, i: u64) -> Vec<f32> {
        let mut rng = StdRng::seed_from_u64(splitmix(splitmix(self.seed ^ (stream << 56)) ^ i));
        let c = &self.centres[rng.random_range(0..self.centres.len())];
        c.iter().map(|x| x + SPREAD * gauss(&mut rng)).collect()
    }
}

enum Source {
    Fvecs(VecFile),
    Npy(NpyMatrix),
    Generated(Generator),
}

/// `len` vectors of `dim` components, read or made by row number.
pub(crate) struct Vectors {
    source: Source,
    len: usize,
    dim: usize,
}

impl Vectors {
    /// A file by its extension: `.npy`, else `.fvecs`.
    fn open(path: &Path) -> Result<Vectors> {
        let npy = path.extension().is_some_and(|e| e.eq_ignore_ascii_case("npy"));
        Ok(if npy {
            let m = NpyMatrix::open(path)?;
            Vectors { len: m.len(), dim: m.dim(), source: Source::Npy(m) }
        } else {
            let f = VecFile::open(path)?;
            Vectors { len: f.len(), dim: f.dim(), source: Source::Fvecs(f) }
        })
    }

    pub(crate) fn generated(dim: usize, seed: u64, len: usize) -> Vectors {
        Vectors { source: Source::Generated(Generator::new(dim, seed)), len, dim }
    }

    pub(crate) fn len(&self) -> usize {
        self.len
    }

    pub(crate) fn dim(&self) -> usize {
        self.dim
    }

    pub(crate) fn row(&self, i: usize) -> Result<Vec<f32>> {
        ensure!(i < self.len, "row {i} of {}", self.len);
        Ok(match &self.source {
            Source::Fvecs(f) => f.f32_row(i)?,
            Source::Npy(m) => m.row(i),
            Source::Generated(g) => g.row(BASE, i as u64),
        })
    }
}

/// Base (and its payloads), queries and ground truth of a run.
pub(crate) struct Data {
    pub(crate) base: Vectors,
    /// Row i's payload, as written in the file.
    payloads: Option<Vec<String>>,
    pub(crate) queries: Vec<Vec<f32>>,
    /// Per query: the ids of its nearest base vectors, nearest first.
    pub(crate) truth: Option<Vec<Vec<u64>>>,
}

impl Data {
    /// Opens or generates the base; queries (and their truth) only if
    /// `queries`; `k` is what recall will be computed at.
    pub(crate) fn load(a: &DataArgs, queries: bool, metric: shoal_engine::Metric, k: usize) -> Result<Arc<Data>> {
        let query_file = match (&a.query, queries) {
            (Some(p), true) => Some(Vectors::open(p)?),
            (Some(_) | None, _) => None,
        };
        let mut base = match &a.base {
            Some(p) => Vectors::open(p)?,
            None => {
                // Queries from a file against generated vectors (or an
                // existing collection): the file says the dimension.
                let dim = query_file.as_ref().map_or(a.dim, |q| q.dim);
                ensure!(dim > 0 && a.points > 0, "--dim and --points must be at least 1");
                Vectors::generated(dim, a.seed, a.points)
            }
        };
        if let Some(l) = a.limit {
            base.len = base.len.min(l);
        }
        ensure!(base.len > 0, "no base vectors");
        let payloads = a.payloads.as_deref().map(|p| read_payloads(p, base.len)).transpose()?;
        if !queries {
            return Ok(Arc::new(Data { base, payloads, queries: Vec::new(), truth: None }));
        }
        let qs: Vec<Vec<f32>> = match (query_file, &base.source) {
            (Some(q), _) => {
                ensure!(q.dim == base.dim, "{}-d queries for {}-d base vectors", q.dim, base.dim);
                (0..a.queries.min(q.len)).map(|i| q.row(i)).collect::<Result<_>>()?
            }
            (None, Source::Generated(g)) => (0..a.queries as u64).map(|i| g.row(QUERIES, i)).collect(),
            (None, Source::Fvecs(_) | Source::Npy(_)) => bail!("--base needs --query (queries are generated only with generated vectors)"),
        };
        ensure!(!qs.is_empty(), "no queries");
        let truth = if a.exact_groundtruth {
            eprintln!("computing the exact ground truth of {} queries over {} vectors ...", qs.len(), base.len);
            let rows: Vec<Vec<f32>> = (0..base.len).map(|i| base.row(i)).collect::<Result<_>>()?;
            Some(recall::exact_truth(&rows, &qs, metric, k))
        } else if let Some(p) = &a.groundtruth {
            let g = VecFile::open(p)?;
            ensure!(g.len() >= qs.len(), "{}: {} rows for {} queries", p.display(), g.len(), qs.len());
            ensure!(g.dim() >= k, "{}: {} neighbours per query, fewer than k = {k}", p.display(), g.dim());
            if a.limit.is_some() {
                eprintln!(
                    "warning: --groundtruth was computed over the whole base, not the first --limit vectors; --exact-groundtruth fits"
                );
            }
            let rows = (0..qs.len()).map(|i| Ok(g.i32_row(i)?.iter().map(|&x| x as u64).collect())).collect::<Result<_>>()?;
            Some(rows)
        } else {
            None
        };
        Ok(Arc::new(Data { base, payloads, queries: qs, truth }))
    }

    /// The payload of base row `i`, if there are payloads.
    pub(crate) fn payload(&self, i: usize) -> Option<v1::Payload> {
        let text = self.payloads.as_ref()?[i].clone();
        Some(v1::Payload { kind: Some(v1::payload::Kind::Json(text)) })
    }

    /// The truth of query `q`, if there is one.
    pub(crate) fn truth_of(&self, q: usize) -> Option<&[u64]> {
        self.truth.as_ref().map(|t| t[q].as_slice())
    }
}

/// The first `n` lines of a JSON Lines file. Each is checked here, as a
/// bad one would otherwise fail every batch it went in, far into a run.
fn read_payloads(path: &Path, n: usize) -> Result<Vec<String>> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let mut rows = Vec::with_capacity(n);
    for (i, line) in std::io::BufReader::new(file).lines().take(n).enumerate() {
        let line = line.with_context(|| format!("{} line {}", path.display(), i + 1))?;
        serde_json::from_str::<serde_json::Map<String, serde_json::Value>>(&line)
            .with_context(|| format!("{} line {}: not a JSON object", path.display(), i + 1))?;
        rows.push(line);
    }
    ensure!(rows.len() == n, "{}: {} payloads for {n} base rows", path.display(), rows.len());
    Ok(rows)
}

/// `--metric` as the engine names it (for the exact ground truth).
pub(crate) fn engine_metric(name: &str) -> Result<shoal_engine::Metric> {
    name.parse().map_err(anyhow::Error::msg).with_context(|| format!("metric {name:?}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> DataArgs {
        DataArgs {
            base: None,
            limit: None,
            payloads: None,
            points: 300,
            dim: 8,
            seed: 3,
            query: None,
            queries: 20,
            groundtruth: None,
            exact_groundtruth: true,
        }
    }

    #[test]
    fn generated_rows_are_repeatable_and_seeded() {
        let a = Vectors::generated(16, 1, 100);
        let b = Vectors::generated(16, 1, 100);
        let c = Vectors::generated(16, 2, 100);
        assert_eq!(a.row(42).unwrap(), b.row(42).unwrap());
        assert_ne!(a.row(42).unwrap(), a.row(43).unwrap());
        assert_ne!(a.row(42).unwrap(), c.row(42).unwrap());
        assert_eq!(a.row(0).unwrap().len(), 16);
        assert!(a.row(100).is_err());
    }

    #[test]
    fn files_are_read_by_extension_and_limited() {
        let dir = tempfile::tempdir().unwrap();
        let rows: Vec<Vec<f32>> = (0..6).map(|i| vec![i as f32, 1.0, 2.0]).collect();
        let npy = dir.path().join("b.npy");
        shoal_ops::vectors::npy::write(&npy, &rows).unwrap();
        let fvecs = dir.path().join("b.fvecs");
        let mut bytes = Vec::new();
        for r in &rows {
            bytes.extend(3i32.to_le_bytes());
            r.iter().for_each(|x| bytes.extend(x.to_le_bytes()));
        }
        std::fs::write(&fvecs, bytes).unwrap();
        for p in [npy, fvecs] {
            let a = DataArgs { base: Some(p.clone()), limit: Some(4), query: Some(p), queries: 2, exact_groundtruth: true, ..args() };
            let d = Data::load(&a, true, shoal_engine::Metric::Euclidean, 1).unwrap();
            assert_eq!((d.base.len(), d.base.dim()), (4, 3));
            assert_eq!(d.base.row(3).unwrap(), rows[3]);
            assert_eq!(d.queries, rows[..2].to_vec());
            // Each query is a base row: its own nearest neighbour.
            assert_eq!(d.truth, Some(vec![vec![0], vec![1]]));
        }
    }

    #[test]
    fn a_query_file_without_a_base_sets_the_dimension() {
        let dir = tempfile::tempdir().unwrap();
        let q = dir.path().join("q.npy");
        shoal_ops::vectors::npy::write(&q, &[vec![1.0, 2.0, 3.0, 4.0, 5.0]]).unwrap();
        let d =
            Data::load(&DataArgs { query: Some(q), exact_groundtruth: false, ..args() }, true, shoal_engine::Metric::Cosine, 1).unwrap();
        assert_eq!((d.base.dim(), d.queries.len()), (5, 1));
    }

    #[test]
    fn generated_queries_come_with_exact_truth_when_asked() {
        let d = Data::load(&args(), true, shoal_engine::Metric::Cosine, 10).unwrap();
        assert_eq!(d.queries.len(), 20);
        let t = d.truth.as_ref().unwrap();
        assert_eq!(t.len(), 20);
        assert!(t.iter().all(|r| r.len() == 10 && r.iter().all(|&id| id < 300)));
        let d = Data::load(&DataArgs { exact_groundtruth: false, ..args() }, true, shoal_engine::Metric::Cosine, 10).unwrap();
        assert!(d.truth.is_none());
    }

    #[test]
    fn payloads_are_read_per_row_and_checked() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("p.jsonl");
        let read = |text: &str, n: usize| {
            std::fs::write(&p, text).unwrap();
            read_payloads(&p, n).map_err(|e| format!("{e:#}"))
        };
        // Rows past those in use are not read.
        let rows = read("{\"tags\": [\"web\"], \"len\": 5}\r\n{\"rand\": 1}\nnot json\n", 2).unwrap();
        assert_eq!(rows, ["{\"tags\": [\"web\"], \"len\": 5}", "{\"rand\": 1}"]);
        let e = read("{}\n[1, 2]\n{}\n", 3).unwrap_err();
        assert!(e.contains("p.jsonl line 2: not a JSON object"), "{e}");
        let e = read("{}\n\n", 2).unwrap_err();
        assert!(e.contains("p.jsonl line 2: not a JSON object"), "{e}");
        let e = read("{}\n{}\n", 3).unwrap_err();
        assert!(e.contains("p.jsonl: 2 payloads for 3 base rows"), "{e}");
        // Through --payloads and --limit: row i's line, as written.
        std::fs::write(&p, "{\"a\": 0}\n{\"a\": 1}\n").unwrap();
        let d =
            Data::load(&DataArgs { payloads: Some(p.clone()), limit: Some(2), ..args() }, false, shoal_engine::Metric::Cosine, 1).unwrap();
        assert_eq!(d.payload(1).and_then(|p| p.kind), Some(v1::payload::Kind::Json("{\"a\": 1}".into())));
        assert!(Data::load(&args(), false, shoal_engine::Metric::Cosine, 1).unwrap().payload(0).is_none());
    }
}
