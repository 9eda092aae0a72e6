//! `.npy` files holding a 2-d float32 array (`<f4`, C order), mapped like
//! `.fvecs`: the `npyz` crate parses and checks the header, the rows are read
//! straight from the map (no copy of the file in memory).

use std::fs::File;
use std::path::Path;

use anyhow::{Context, Result, bail};
use memmap2::Mmap;
use npyz::WriterBuilder;

/// A mapped `.npy` matrix of `rows` × `dim` float32s.
pub struct NpyMatrix {
    map: Mmap,
    data: usize,
    rows: usize,
    dim: usize,
}

impl NpyMatrix {
    pub fn open(path: &Path) -> Result<NpyMatrix> {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        // SAFETY: an input file is not modified while it is read (as for any
        // tool that maps its input); a changed file may give wrong values, not
        // undefined behaviour beyond them.
        let map = unsafe { Mmap::map(&file) }.with_context(|| format!("mapping {}", path.display()))?;
        let mut cursor = std::io::Cursor::new(&map[..]);
        let header = npyz::NpyHeader::from_reader(&mut cursor).with_context(|| format!("{}: not a .npy file", path.display()))?;
        let data = cursor.position() as usize;
        let dtype = header.dtype().descr();
        if dtype != "'<f4'" {
            bail!("{}: dtype {dtype}, expected little-endian float32 ('<f4'); convert with arr.astype('<f4')", path.display());
        }
        if header.order() != npyz::Order::C {
            bail!("{}: Fortran order; save it with np.ascontiguousarray", path.display());
        }
        let &[rows, dim] = header.shape() else {
            bail!("{}: shape {:?}, expected 2 dimensions (vectors × components)", path.display(), header.shape());
        };
        let (rows, dim) = (rows as usize, dim as usize);
        if dim == 0 {
            bail!("{}: vectors of 0 components", path.display());
        }
        let need = rows.checked_mul(dim).and_then(|n| n.checked_mul(4)).context("shape overflows")?;
        if map.len() - data < need {
            bail!("{}: {} bytes of data, the shape {rows}×{dim} needs {need}", path.display(), map.len() - data);
        }
        Ok(NpyMatrix { map, data, rows, dim })
    }

    pub fn len(&self) -> usize {
        self.rows
    }

    pub fn is_empty(&self) -> bool {
        self.rows == 0
    }

    pub fn dim(&self) -> usize {
        self.dim
    }

    pub fn row(&self, i: usize) -> Vec<f32> {
        let at = self.data + i * self.dim * 4;
        self.map[at..at + self.dim * 4].chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
    }
}

/// Writes `rows` with npyz's own writer (the format as numpy writes it).
pub fn write(path: &Path, rows: &[Vec<f32>]) -> Result<()> {
    let dim = rows.first().map_or(0, Vec::len) as u64;
    let f = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    let mut w = npyz::WriteOptions::new().default_dtype().shape(&[rows.len() as u64, dim]).writer(f).begin_nd()?;
    for r in rows {
        w.extend(r.iter().copied())?;
    }
    w.finish()?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_the_rows_npyz_wrote() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("x.npy");
        let rows: Vec<Vec<f32>> = (0..5).map(|i| (0..3).map(|j| (i * 10 + j) as f32 + 0.5).collect()).collect();
        write(&p, &rows).unwrap();
        let m = NpyMatrix::open(&p).unwrap();
        assert_eq!((m.len(), m.dim()), (5, 3));
        for (i, r) in rows.iter().enumerate() {
            assert_eq!(&m.row(i), r);
        }
    }

    #[test]
    fn refuses_other_dtypes_and_shapes() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("f8.npy");
        let f = File::create(&p).unwrap();
        let mut w = npyz::WriteOptions::new().default_dtype().shape(&[2, 2]).writer(f).begin_nd().unwrap();
        w.extend([1.0f64, 2.0, 3.0, 4.0]).unwrap();
        w.finish().unwrap();
        let e = NpyMatrix::open(&p).err().unwrap().to_string();
        assert!(e.contains("<f8"), "{e}");
        let p = dir.path().join("1d.npy");
        let f = File::create(&p).unwrap();
        let mut w = npyz::WriteOptions::new().default_dtype().shape(&[4]).writer(f).begin_nd().unwrap();
        w.extend([1.0f32, 2.0, 3.0, 4.0]).unwrap();
        w.finish().unwrap();
        let e = NpyMatrix::open(&p).err().unwrap().to_string();
        assert!(e.contains("2 dimensions"), "{e}");
    }
}
