//! A file's pages in the kernel page cache: which are resident, dropping
//! them, and reading them all in.

use std::fs::File;
use std::io::{self, Read};
use std::os::fd::AsRawFd;
use std::path::Path;

/// Adds the path and the operation to an I/O error.
pub(crate) fn context(op: &str, path: &Path, e: io::Error) -> io::Error {
    io::Error::new(e.kind(), format!("{op} {}: {e}", path.display()))
}

/// The kernel's page size (the unit of `mincore` and of the page cache).
pub fn os_page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let n = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    if n > 0 { n as usize } else { 4096 }
}

/// Which pages of a file were in the page cache at one moment.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Residency {
    /// One flag per OS page of the file, in file order.
    pub pages: Vec<bool>,
}

impl Residency {
    /// Number of resident pages.
    pub fn resident(&self) -> u64 {
        self.pages.iter().filter(|&&r| r).count() as u64
    }

    /// Number of pages in the file.
    pub fn total(&self) -> u64 {
        self.pages.len() as u64
    }

    /// Pages resident here but not in `before` (the file may have grown).
    pub fn newly_resident(&self, before: &Residency) -> Residency {
        let pages = self.pages.iter().enumerate().map(|(i, &now)| now && !before.pages.get(i).copied().unwrap_or(false)).collect();
        Residency { pages }
    }
}

/// A read-only shared mapping of a whole file, unmapped on drop.
pub(crate) struct FileMap {
    ptr: *mut libc::c_void,
    len: usize,
}

impl FileMap {
    /// Maps `file` (`len` bytes). `None` for an empty file, which cannot be mapped.
    pub(crate) fn new(file: &File, len: usize, path: &Path) -> io::Result<Option<FileMap>> {
        if len == 0 {
            return Ok(None);
        }
        // SAFETY: a fresh read-only shared mapping of a file we hold open; the
        // memory is never dereferenced through this mapping by `mincore`.
        let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0) };
        if ptr == libc::MAP_FAILED {
            return Err(context("mapping", path, io::Error::last_os_error()));
        }
        Ok(Some(FileMap { ptr, len }))
    }

    /// The mapped bytes. Reading them faults pages in like any mapping.
    pub(crate) fn bytes(&self) -> &[u8] {
        // SAFETY: the mapping is `len` readable bytes and lives as long as `self`.
        unsafe { std::slice::from_raw_parts(self.ptr.cast::<u8>(), self.len) }
    }
}

impl Drop for FileMap {
    fn drop(&mut self) {
        // SAFETY: unmapping exactly what `new` mapped.
        unsafe {
            libc::munmap(self.ptr, self.len);
        }
    }
}

/// Which pages of the file at `path` are in the page cache now.
///
/// Maps the file in a separate mapping and asks `mincore`, which reads page
/// cache state without faulting anything in.
pub fn residency(path: &Path) -> io::Result<Residency> {
    let file = File::open(path).map_err(|e| context("opening", path, e))?;
    let len = file.metadata().map_err(|e| context("reading metadata of", path, e))?.len() as usize;
    let Some(map) = FileMap::new(&file, len, path)? else {
        return Ok(Residency::default());
    };
    let page = os_page_size();
    let mut vec = vec![0u8; len.div_ceil(page)];
    // SAFETY: `map` is a live mapping of `len` bytes and `vec` has one byte per page of it.
    let rc = unsafe { libc::mincore(map.ptr, len, vec.as_mut_ptr()) };
    if rc != 0 {
        return Err(context("mincore on", path, io::Error::last_os_error()));
    }
    Ok(Residency { pages: vec.iter().map(|b| b & 1 == 1).collect() })
}

/// Writes the file's dirty pages back, then asks the kernel to drop all its
/// pages from the page cache (`POSIX_FADV_DONTNEED`), and returns what is
/// still resident after.
///
/// The kernel keeps pages that some process has mapped, and pages still
/// dirty; so close every mapping of the file (an LMDB environment) first,
/// and check the returned residency: [`DropOutcome::emptied`].
pub fn drop_pages(path: &Path) -> io::Result<DropOutcome> {
    let file = File::open(path).map_err(|e| context("opening", path, e))?;
    file.sync_all().map_err(|e| context("syncing", path, e))?;
    // SAFETY: a valid descriptor; offset 0 and length 0 mean the whole file.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(context("posix_fadvise(DONTNEED) on", path, io::Error::from_raw_os_error(rc)));
    }
    drop(file);
    let after = residency(path)?;
    Ok(DropOutcome { resident_after: after.resident(), total_pages: after.total() })
}

/// What [`drop_pages`] left behind.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct DropOutcome {
    /// Pages of the file still in the page cache right after the drop.
    pub resident_after: u64,
    /// Pages in the file.
    pub total_pages: u64,
}

impl DropOutcome {
    /// Whether the cache is (nearly) empty for the file: at most 1% of its
    /// pages, or 4 pages of a small file, stayed. On tmpfs and on files that
    /// someone maps, nearly everything stays.
    pub fn emptied(&self) -> bool {
        self.resident_after <= (self.total_pages / 100).max(4)
    }
}

/// Reads the whole file through the page cache, so that all of it is
/// resident (a warm start).
pub fn warm(path: &Path) -> io::Result<Residency> {
    let mut file = File::open(path).map_err(|e| context("opening", path, e))?;
    let mut buf = vec![0u8; 1 << 20];
    while file.read(&mut buf).map_err(|e| context("reading", path, e))? > 0 {}
    residency(path)
}

/// Whether this process has the file mapped (listed in `/proc/self/maps`),
/// e.g. because an LMDB environment on it is still open. Such pages cannot
/// be dropped.
pub fn mapped_by_this_process(path: &Path) -> io::Result<bool> {
    let canonical = path.canonicalize().map_err(|e| context("resolving", path, e))?;
    let maps = std::fs::read_to_string("/proc/self/maps").map_err(|e| context("reading", Path::new("/proc/self/maps"), e))?;
    let wanted = canonical.to_string_lossy();
    Ok(maps.lines().any(|l| l.split_whitespace().nth(5).is_some_and(|p| p == wanted)))
}

#[cfg(test)]
mod tests {
    use super::Residency;

    #[test]
    fn newly_resident_counts_only_new_pages() {
        let before = Residency { pages: vec![true, false, false] };
        let after = Residency { pages: vec![true, true, false, true] };
        assert_eq!(after.newly_resident(&before).pages, vec![false, true, false, true]);
    }
}
