//! The demo's shipped sample: real sentence embeddings with their texts.
//! Format and provenance: ops/demo-data/README.md.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};

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

/// The sample shipped in the repository.
pub fn default_path() -> PathBuf {
    PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/demo-data/pypi-sample.bin.zst"))
}

/// Reads and decompresses a sample file.
pub fn load(path: &Path) -> anyhow::Result<DemoData> {
    let compressed = std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
    let bytes = zstd::stream::decode_all(&compressed[..]).with_context(|| format!("decompressing {}", path.display()))?;
    parse(&bytes)
}

struct Reader<'a> {
    b: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize, what: &str) -> anyhow::Result<&'a [u8]> {
        let end = self.at.checked_add(n).filter(|&e| e <= self.b.len());
        let Some(end) = end else { bail!("truncated sample: {what} at byte {} needs {n} bytes", self.at) };
        let s = &self.b[self.at..end];
        self.at = end;
        Ok(s)
    }

    fn u16(&mut self, what: &str) -> anyhow::Result<u16> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, what: &str) -> anyhow::Result<u32> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn text(&mut self, what: &str) -> anyhow::Result<String> {
        let n = self.u16(what)? as usize;
        let b = self.take(n, what)?;
        String::from_utf8(b.to_vec()).with_context(|| format!("{what} is not UTF-8"))
    }

    fn record(&mut self, dim: usize) -> anyhow::Result<DemoPoint> {
        let b = self.take(8, "id")?;
        let mut id = [0u8; 8];
        id.copy_from_slice(b);
        let v = self.take(dim * 2, "vector")?;
        let vector = v.chunks_exact(2).map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32()).collect();
        Ok(DemoPoint { id: u64::from_le_bytes(id), vector, name: self.text("name")?, summary: self.text("summary")? })
    }
}

/// Parses a decompressed sample; every malformation is an error, never a
/// panic.
pub fn parse(bytes: &[u8]) -> anyhow::Result<DemoData> {
    let mut r = Reader { b: bytes, at: 0 };
    if r.take(MAGIC.len(), "magic").ok() != Some(MAGIC) {
        bail!("not a shoal demo sample (bad magic)");
    }
    let points = r.u32("point count")? as usize;
    let queries = r.u32("query count")? as usize;
    let dim = r.u32("dimension")? as usize;
    if dim == 0 || dim > 65_536 {
        bail!("sample declares dimension {dim}");
    }
    let mut read = |n: usize| (0..n).map(|_| r.record(dim)).collect::<anyhow::Result<Vec<_>>>();
    let points = read(points)?;
    let queries = read(queries)?;
    if r.at != bytes.len() {
        bail!("{} bytes of garbage after the last record", bytes.len() - r.at);
    }
    Ok(DemoData { dim, points, queries })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_shipped_sample_is_real_unit_length_text_embeddings() {
        let d = load(&default_path()).unwrap();
        assert_eq!((d.dim, d.points.len(), d.queries.len()), (384, 20_000, 200));
        for (i, p) in d.points.iter().enumerate() {
            assert_eq!(p.id, i as u64);
        }
        for p in d.points.iter().chain(&d.queries) {
            let norm = p.vector.iter().map(|x| x * x).sum::<f32>().sqrt();
            assert!((norm - 1.0).abs() < 1e-2, "id {} has norm {norm}", p.id);
            assert!(!p.name.is_empty());
        }
        assert!(d.queries.iter().all(|q| q.id >= 120_000));
    }

    #[test]
    fn damaged_samples_are_errors_not_panics() {
        let bytes = zstd::stream::decode_all(&std::fs::read(default_path()).unwrap()[..]).unwrap();
        for cut in [0, 5, 10, 21, 22, 1000, bytes.len() - 1] {
            assert!(parse(&bytes[..cut]).is_err(), "truncated at {cut} accepted");
        }
        let mut bad = bytes.clone();
        bad[0] = b'X';
        assert!(parse(&bad).err().expect("bad magic accepted").to_string().contains("magic"));
        let mut extra = bytes.clone();
        extra.push(0);
        assert!(parse(&extra).is_err());
        // A name that is not UTF-8: the first record's name starts after the
        // header (22 bytes), the id (8) and the vector (384 × 2) and its length (2).
        let mut latin = bytes;
        latin[22 + 8 + 768 + 2] = 0xff;
        assert!(parse(&latin).err().expect("bad UTF-8 accepted").to_string().contains("UTF-8"));
    }
}
