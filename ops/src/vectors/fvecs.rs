//! Memory-mapped `.fvecs` / `.ivecs` files (the TEXMEX format: each row is a
//! little-endian i32 dimension followed by that many 4-byte values).
//!
//! Mapping instead of reading keeps the input out of the process's anonymous
//! memory, so the builder's own `RssAnon` is what the benchmark reports.

use std::fs::File;
use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use memmap2::Mmap;

/// A mapped vector file.
pub struct VecFile {
    map: Mmap,
    dim: usize,
    rows: usize,
    path: PathBuf,
}

impl VecFile {
    pub fn open(path: &Path) -> Result<VecFile> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        // SAFETY: an input file is not modified while it is read (as for any
        // tool that maps its input).
        let map = unsafe { Mmap::map(&file) }.with_context(|| format!("mapping {}", path.display()))?;
        if map.len() < 4 {
            bail!("{} is too short to be a vector file", path.display());
        }
        let dim = i32::from_le_bytes([map[0], map[1], map[2], map[3]]);
        if dim <= 0 || dim > 1 << 20 {
            bail!("{}: first row declares dimension {dim}", path.display());
        }
        let dim = dim as usize;
        let row = 4 * (dim + 1);
        if map.len() % row != 0 {
            bail!("{}: {} bytes is not a whole number of {row}-byte rows", path.display(), map.len());
        }
        let rows = map.len() / row;
        Ok(VecFile { map, dim, rows, path: path.to_owned() })
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    pub fn len(&self) -> usize {
        self.rows
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    fn raw(&self, i: usize) -> Result<&[u8]> {
        let row = 4 * (self.dim + 1);
        let r = &self.map[i * row..(i + 1) * row];
        let d = i32::from_le_bytes([r[0], r[1], r[2], r[3]]);
        if d as usize != self.dim {
            bail!("{}: row {i} declares dimension {d}, the file's first row {}", self.path.display(), self.dim);
        }
        Ok(&r[4..])
    }

    /// Row `i` as f32s.
    pub fn f32_row(&self, i: usize) -> Result<Vec<f32>> {
        Ok(self.raw(i)?.chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }

    /// Row `i` as i32s.
    pub fn i32_row(&self, i: usize) -> Result<Vec<i32>> {
        Ok(self.raw(i)?.chunks_exact(4).map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect())
    }
}
