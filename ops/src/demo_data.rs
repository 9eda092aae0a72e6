//! The demo's shipped sample: real sentence embeddings with their texts.
//! Format and provenance: ops/demo-data/README.md.

use std::path::{Path, PathBuf};

use anyhow::{Context, anyhow, bail};

/// One sample point (or query) with its text.
pub struct DemoPoint {
    pub id: u64,
    pub vector: Vec<f32>,
    pub name: String,
    pub summary: String,
}

/// The whole sample.
pub struct DemoData {
    pub dim: usize,
    pub points: Vec<DemoPoint>,
    pub queries: Vec<DemoPoint>,
}

const MAGIC: &[u8] = b"SHOALDEMO1";
// Far above any sentence-embedding model, yet small enough that a corrupt
// header cannot make the size check below overflow.
const MAX_DIM: usize = 65_536;

/// The sample shipped in the repository.
pub fn default_path() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/demo-data/pypi-sample.bin.zst"))
}

/// Reads and decompresses a sample file.
pub fn load(path: &Path) -> anyhow::Result<DemoData> {
    let compressed = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let bytes = zstd::stream::decode_all(&compressed[..]).with_context(|| format!("decompressing {}", path.display()))?;
    parse(&bytes).with_context(|| format!("parsing {}", path.display()))
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    // The description is a closure so that the 20k-record happy path
    // formats nothing.
    fn take(&mut self, n: usize, what: impl FnOnce() -> String) -> anyhow::Result<&'a [u8]> {
        let remain = self.b.len() - self.at;
        if n > remain {
            bail!("truncated sample: {} at byte {} needs {n} bytes, {remain} remain", what(), self.at);
        }
        let s = &self.b[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    fn u32(&mut self, what: &str) -> anyhow::Result<u32> {
        let b = self.take(4, || what.to_string())?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn text(&mut self, field: &str, kind: &str, index: usize) -> anyhow::Result<String> {
        let b = self.take(2, || format!("{field} length of {kind} {index}"))?;
        let n = usize::from(u16::from_le_bytes([b[0], b[1]]));
        let b = self.take(n, || format!("{field} of {kind} {index}"))?;
        String::from_utf8(b.to_vec()).map_err(|e| anyhow!("{field} of {kind} {index} is not valid UTF-8: {e}"))
    }

    fn record(&mut self, dim: usize, kind: &str, index: usize) -> anyhow::Result<DemoPoint> {
        let b = self.take(8, || format!("id of {kind} {index}"))?;
        let mut id = [0u8; 8];
        id.copy_from_slice(b);
        let v = self.take(dim * 2, || format!("vector of {kind} {index}"))?;
        let vector: Vec<f32> = v.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect();
        // A flipped bit can make an f16 infinite or NaN, which would quietly
        // poison every distance the demo computes against it.
        if let Some(j) = vector.iter().position(|x| !x.is_finite()) {
            bail!("component {j} of the vector of {kind} {index} is not finite");
        }
        let name = self.text("name", kind, index)?;
        let summary = self.text("summary", kind, index)?;
        Ok(DemoPoint { id: u64::from_le_bytes(id), vector, name, summary })
    }

    fn records(&mut self, n: usize, dim: usize, kind: &str) -> anyhow::Result<Vec<DemoPoint>> {
        // The size check in `parse` bounds `n` by the input length, so this
        // cannot be made to allocate wildly.
        let mut out = Vec::with_capacity(n);
        for i in 0..n {
            out.push(self.record(dim, kind, i)?);
        }
        Ok(out)
    }
}

/// Parses a decompressed sample; every malformation is an error, never a
/// panic.
pub fn parse(bytes: &[u8]) -> anyhow::Result<DemoData> {
    if !bytes.starts_with(MAGIC) {
        bail!("not a shoal demo sample: bad magic (expected {:?})", String::from_utf8_lossy(MAGIC));
    }
    let mut r = Reader { b: bytes, at: MAGIC.len() };
    let n_points = r.u32("point count")? as usize;
    let n_queries = r.u32("query count")? as usize;
    let dim = r.u32("dimension")? as usize;
    if !(1..=MAX_DIM).contains(&dim) {
        bail!("sample declares dimension {dim}, outside 1..={MAX_DIM}");
    }
    // Up front, so that a header whose dimension or counts disagree with the
    // body is reported as that rather than as a cut deep inside some record.
    // Each record has at least an id, the vector and two text lengths.
    let min_record = 8 + 2 * dim as u64 + 2 + 2;
    let records = n_points as u64 + n_queries as u64;
    let body = (bytes.len() - r.at) as u64;
    if records * min_record > body {
        bail!(
            "the header declares {n_points} points and {n_queries} queries of dimension {dim}, at least {} bytes, \
             but only {body} bytes follow: the sample is truncated or its dimension or counts are wrong",
            records * min_record
        );
    }
    // A wrong dimension in the header surfaces as some odd cut or bad text a
    // few records in; the declared shape makes that readable.
    let shape = || format!("the header declares {n_points} points and {n_queries} queries of dimension {dim}");
    let points = r.records(n_points, dim, "point").with_context(shape)?;
    let queries = r.records(n_queries, dim, "query").with_context(shape)?;
    if r.at != bytes.len() {
        bail!("{} bytes after the last record: the header's dimension or counts do not match the body", bytes.len() - r.at);
    }
    Ok(DemoData { dim, points, queries })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// id, vector, name, summary
    type Record<'a> = (u64, &'a [f32], &'a [u8], &'a [u8]);

    /// The writer, as ops/demo-data/make-sample.py does it.
    fn encode(dim: u32, points: &[Record<'_>], queries: &[Record<'_>]) -> Vec<u8> {
        let mut out = MAGIC.to_vec();
        for n in [points.len() as u32, queries.len() as u32, dim] {
            out.extend(n.to_le_bytes());
        }
        for (id, v, name, summary) in points.iter().chain(queries) {
            out.extend(id.to_le_bytes());
            for x in *v {
                out.extend(half::f16::from_f32(*x).to_le_bytes());
            }
            for t in [name, summary] {
                out.extend((t.len() as u16).to_le_bytes());
                out.extend(*t);
            }
        }
        out
    }

    fn small() -> Vec<u8> {
        encode(
            3,
            &[(0, &[1.0, 0.0, 0.0], b"numpy", b"Fundamental package"), (1, &[0.0, 0.6, 0.8], b"zstd", b"")],
            &[(120_000, &[0.0, 0.0, 1.0], b"q\xc3\xa9", b"caf\xc3\xa9")],
        )
    }

    fn err(bytes: &[u8]) -> String {
        match parse(bytes) {
            Ok(_) => panic!("accepted a malformed sample"),
            Err(e) => format!("{e:#}"),
        }
    }

    #[test]
    fn the_shipped_sample_is_real_unit_length_text_embeddings() {
        let d = load(&default_path()).unwrap();
        assert_eq!((d.dim, d.points.len(), d.queries.len()), (384, 20_000, 200));
        for (i, p) in d.points.iter().enumerate() {
            assert_eq!(p.id, i as u64);
        }
        for (i, q) in d.queries.iter().enumerate() {
            assert_eq!(q.id, 120_000 + i as u64);
        }
        for p in d.points.iter().chain(&d.queries) {
            assert_eq!(p.vector.len(), 384);
            let norm = p.vector.iter().map(|x| x * x).sum::<f32>().sqrt();
            // Half precision moves the norm by under 1e-4 on this sample.
            assert!((norm - 1.0).abs() < 1e-3, "id {} has norm {norm}", p.id);
            assert!(!p.name.is_empty(), "id {} has no name", p.id);
            assert!(p.summary.len() <= 300, "id {} has a {}-byte summary", p.id, p.summary.len());
        }
    }

    #[test]
    fn a_written_sample_reads_back() {
        let d = parse(&small()).unwrap();
        assert_eq!((d.dim, d.points.len(), d.queries.len()), (3, 2, 1));
        assert_eq!((d.points[1].id, d.points[1].name.as_str(), d.points[1].summary.as_str()), (1, "zstd", ""));
        assert_eq!(d.points[1].vector, [0.0, half::f16::from_f32(0.6).to_f32(), half::f16::from_f32(0.8).to_f32()]);
        assert_eq!((d.queries[0].id, d.queries[0].name.as_str(), d.queries[0].summary.as_str()), (120_000, "qé", "café"));
    }

    #[test]
    fn every_truncation_is_an_error() {
        let b = small();
        for cut in 0..b.len() {
            let e = err(&b[..cut]);
            assert!(e.contains("magic") || e.contains("truncated"), "cut at {cut}: {e}");
        }
        // Past the header-level size check, the cut is named precisely.
        let e = err(&b[..b.len() - 1]);
        assert!(e.contains("summary of query 0"), "{e}");
    }

    #[test]
    fn malformations_are_named() {
        let good = small();
        let mut b = good.clone();
        b[0] = b'X';
        assert!(err(&b).contains("bad magic"));

        // The second point's name starts after the header (22 bytes), the
        // first record (8 + 6 + 2 + 5 + 2 + 19) and its own id, vector and
        // name length.
        let name_1 = 22 + 42 + 8 + 6 + 2;
        assert_eq!(&good[name_1..name_1 + 4], b"zstd");
        let mut b = good.clone();
        b[name_1] = 0xff;
        let e = err(&b);
        assert!(e.contains("name of point 1 is not valid UTF-8"), "{e}");
        let summary_q = good.len() - 5;
        let mut b = good.clone();
        b[summary_q] = 0xc3;
        assert!(err(&b).contains("summary of query 0 is not valid UTF-8"));

        let mut b = good.clone();
        b.push(0);
        assert!(err(&b).contains("1 bytes after the last record"));

        let mut b = good.clone();
        b[22 + 8] = 0x00;
        b[22 + 9] = 0x7c; // f16 +inf
        assert!(err(&b).contains("component 0 of the vector of point 0 is not finite"));
    }

    #[test]
    fn a_header_that_disagrees_with_the_body_is_an_error() {
        for dim in [0u32, 4, 2, MAX_DIM as u32 + 1, u32::MAX] {
            let mut b = small();
            b[18..22].copy_from_slice(&dim.to_le_bytes());
            let e = err(&b);
            assert!(e.contains("dimension"), "dim {dim}: {e}");
        }
        let mut b = small();
        b[10..14].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(err(&b).contains("truncated or its dimension or counts are wrong"));
        let mut b = small();
        b[14..18].copy_from_slice(&0u32.to_le_bytes());
        assert!(err(&b).contains("after the last record"));
    }

    #[test]
    fn a_damaged_shipped_sample_never_panics() {
        let bytes = zstd::stream::decode_all(&std::fs::read(default_path()).unwrap()[..]).unwrap();
        for cut in [0, 5, 10, 21, 22, 1000, bytes.len() / 2, bytes.len() - 1] {
            assert!(parse(&bytes[..cut]).is_err(), "truncated at {cut} accepted");
        }
        // Single-byte damage anywhere: in a vector it may still parse, in a
        // length or a text it must fail cleanly; neither may panic.
        let mut state = 0x9e37_79b9_7f4a_7c15_u64;
        for _ in 0..64 {
            state = state.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
            let at = (state >> 33) as usize % bytes.len();
            let mut b = bytes.clone();
            b[at] ^= 0xa5;
            let _ = parse(&b);
        }
        let mut b = bytes;
        let first_name_len = 22 + 8 + 384 * 2;
        b[first_name_len..first_name_len + 2].copy_from_slice(&u16::MAX.to_le_bytes());
        assert!(parse(&b).is_err());
    }
}
