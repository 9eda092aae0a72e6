//! Writing a restored image to disk.
//!
//! The image is written with direct I/O where the file system takes it,
//! straight from the decompression buffers to the device. Through the page
//! cache, the copy into freshly allocated cache pages was 60% of a
//! restore's CPU time (`perf`, 100k shard): on a virtual machine the first
//! touch of a guest page the host has not backed yet costs far more than the
//! copy itself, so writing 231 MiB took 0.25 to 0.9 s depending on which
//! pages the kernel handed out, against 0.13 to 0.16 s for direct writes of
//! the same bytes to the same disk, durable included. A restored shard then
//! starts with a cold page cache, like any shard after a restart: LMDB reads
//! the pages a search touches, and nothing else.
//!
//! Chunks that are not aligned for direct I/O (odd chunk sizes, a last
//! chunk that is not a whole number of blocks) and file systems without it
//! (tmpfs, some FUSE) go through the page cache, with write-back started
//! per chunk so that the final fsync does not write the whole image at once.

use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};

use crate::error::{Result, SnapshotError};

/// Alignment of buffer addresses, lengths and file offsets for direct
/// writes: the largest logical block size of common devices.
pub(crate) const DIRECT_ALIGN: usize = 4096;

/// The image being restored, `data.mdb` in the staging directory.
pub(crate) struct ImageFile {
    path: PathBuf,
    file: File,
    direct: Option<File>,
}

impl ImageFile {
    /// Creates the file and reserves `len` bytes for it, so a device without
    /// room fails here, before anything is written.
    pub(crate) fn create(path: &Path, len: u64, direct: bool) -> Result<ImageFile> {
        let file = File::create(path).map_err(|e| SnapshotError::io(path, e))?;
        reserve(&file, len).map_err(|e| SnapshotError::io(path, e))?;
        let direct = if direct { open_direct(path) } else { None };
        Ok(ImageFile { path: path.to_owned(), file, direct })
    }

    /// True when chunks can bypass the page cache.
    pub(crate) fn is_direct(&self) -> bool {
        self.direct.is_some()
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// Writes one chunk at `offset`.
    pub(crate) fn write_at(&self, data: &[u8], offset: u64) -> io::Result<()> {
        if let Some(direct) = &self.direct
            && aligned(data, offset)
        {
            match direct.write_all_at(data, offset) {
                // A file system can accept O_DIRECT at open and refuse it
                // per write; the page cache still works.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                other => return other,
            }
        }
        self.file.write_all_at(data, offset)?;
        start_writeback(&self.file, offset, data.len());
        Ok(())
    }

    /// Makes everything written durable (data and size, whichever path the
    /// chunks took: fsync covers the inode, not a descriptor).
    pub(crate) fn sync(&self) -> io::Result<()> {
        self.file.sync_all()
    }
}

fn aligned(data: &[u8], offset: u64) -> bool {
    (data.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN)
        && data.len().is_multiple_of(DIRECT_ALIGN)
        && offset.is_multiple_of(DIRECT_ALIGN as u64)
}

#[cfg(target_os = "linux")]
fn open_direct(path: &Path) -> Option<File> {
    use std::os::unix::fs::OpenOptionsExt;
    match std::fs::OpenOptions::new().write(true).custom_flags(libc::O_DIRECT).open(path) {
        Ok(f) => Some(f),
        Err(e) => {
            tracing::debug!(path = %path.display(), error = %e, "no direct I/O here; restoring through the page cache");
            None
        }
    }
}

#[cfg(not(target_os = "linux"))]
fn open_direct(_path: &Path) -> Option<File> {
    None
}

/// Allocates the file's blocks up front. File systems without `fallocate`
/// get a plain length instead (a full device is then caught by the write).
fn reserve(file: &File, len: u64) -> io::Result<()> {
    #[cfg(target_os = "linux")]
    if len > 0 {
        use std::os::fd::AsRawFd;
        let len = i64::try_from(len).map_err(|_| io::Error::other("image too large"))?;
        // SAFETY: plain syscall on an open descriptor.
        if unsafe { libc::fallocate(file.as_raw_fd(), 0, 0, len) } == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if !matches!(e.raw_os_error(), Some(libc::EOPNOTSUPP | libc::ENOSYS)) {
            return Err(e);
        }
    }
    file.set_len(len)
}

/// Starts writing a buffered chunk back to the device now, without waiting,
/// so the device works while the next chunks decompress.
fn start_writeback(file: &File, offset: u64, len: usize) {
    #[cfg(target_os = "linux")]
    {
        use std::os::fd::AsRawFd;
        // SAFETY: the descriptor is open for the duration of the call; the
        // call only schedules I/O. Failure is harmless (fsync still runs).
        unsafe { libc::sync_file_range(file.as_raw_fd(), offset as i64, len as i64, libc::SYNC_FILE_RANGE_WRITE) };
    }
    #[cfg(not(target_os = "linux"))]
    let _ = (file, offset, len);
}

/// A reusable buffer whose start is aligned for direct I/O.
#[derive(Default)]
pub(crate) struct AlignedBuf {
    pages: Vec<Page>,
}

#[repr(C, align(4096))]
struct Page([u8; DIRECT_ALIGN]);

impl AlignedBuf {
    /// The first `len` bytes (contents unspecified), growing the buffer if
    /// needed.
    pub(crate) fn bytes_mut(&mut self, len: usize) -> &mut [u8] {
        let pages = len.div_ceil(DIRECT_ALIGN);
        if self.pages.len() < pages {
            self.pages.resize_with(pages, || Page([0; DIRECT_ALIGN]));
        }
        // SAFETY: `pages` holds at least `len` initialised bytes laid out
        // contiguously (`Page` is a plain byte array with no padding), and
        // the slice borrows `self` mutably for its whole life.
        unsafe { std::slice::from_raw_parts_mut(self.pages.as_mut_ptr().cast::<u8>(), len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chunks_land_where_they_belong_whichever_path_they_take() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("image");
        let len = 3 * DIRECT_ALIGN as u64 + 100;
        let image = ImageFile::create(&path, len, true).unwrap();
        assert_eq!(std::fs::metadata(&path).unwrap().len(), len, "space is reserved up front");
        let mut buf = AlignedBuf::default();
        // Aligned (direct where supported), then an unaligned tail, written
        // out of order.
        let tail = vec![7u8; 100];
        image.write_at(&tail, 3 * DIRECT_ALIGN as u64).unwrap();
        let head = buf.bytes_mut(2 * DIRECT_ALIGN);
        head.fill(1);
        image.write_at(head, 0).unwrap();
        // Aligned length and offset from a misaligned address: buffered.
        let mut odd = vec![0u8; DIRECT_ALIGN + 1];
        odd[1..].fill(2);
        image.write_at(&odd[1..], 2 * DIRECT_ALIGN as u64).unwrap();
        image.sync().unwrap();
        let got = std::fs::read(&path).unwrap();
        assert_eq!(got.len() as u64, len);
        assert!(got[..2 * DIRECT_ALIGN].iter().all(|b| *b == 1));
        assert!(got[2 * DIRECT_ALIGN..3 * DIRECT_ALIGN].iter().all(|b| *b == 2));
        assert!(got[3 * DIRECT_ALIGN..].iter().all(|b| *b == 7));
    }

    #[test]
    fn aligned_buffers_are_aligned() {
        let mut buf = AlignedBuf::default();
        for len in [1, 4096, 4097, 3 << 20] {
            let b = buf.bytes_mut(len);
            assert_eq!(b.len(), len);
            assert!((b.as_ptr() as usize).is_multiple_of(DIRECT_ALIGN));
        }
    }
}
