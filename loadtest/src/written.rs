//! Bytes written, by this process and by the disk under a directory: the
//! cost of a setting that makes LMDB write pages early (a spill) shows here
//! and not in the time a build takes on a fast local disk.

use std::os::unix::fs::MetadataExt;
use std::path::Path;

/// Bytes this process has passed to write calls (`wchar` in
/// `/proc/self/io`). `write_bytes` beside it is no measure of pages: on
/// kernels with large page-cache folios one dirtied 4 KiB page counts as
/// the whole folio.
pub(crate) fn by_process() -> u64 {
    let io = std::fs::read_to_string("/proc/self/io").unwrap_or_default();
    io.lines().find_map(|l| l.strip_prefix("wchar:")).and_then(|v| v.trim().parse().ok()).unwrap_or(0)
}

/// Bytes the block device holding `dir` has written since boot
/// (`/sys/dev/block/MAJ:MIN/stat`, sectors of 512 bytes), journal and
/// every other writer on it included: a figure for a machine with nothing
/// else writing. None where the file system has no block device (tmpfs).
pub(crate) fn by_device(dir: &Path) -> Option<u64> {
    let dev = std::fs::metadata(dir).ok()?.dev();
    let (major, minor) = (libc::major(dev), libc::minor(dev));
    let stat = std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/stat")).ok()?;
    let sectors: u64 = stat.split_whitespace().nth(6)?.parse().ok()?;
    Some(sectors * 512)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Counts that cannot move would make a setting look free.
    #[test]
    fn a_write_moves_the_process_count() {
        let dir = tempfile::tempdir().unwrap();
        let before = by_process();
        std::fs::write(dir.path().join("f"), vec![7u8; 1 << 16]).unwrap();
        assert!(by_process() - before >= 1 << 16);
    }
}
