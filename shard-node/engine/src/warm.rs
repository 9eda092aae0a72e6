//! Bringing an index's file into the page cache, in order, when it opens.
//!
//! How a file's pages came into the page cache decides how fast searches
//! run once all of it is there: on this project's VM, an index whose pages
//! were faulted in one at a time (as the graph walk asks for them, with
//! readahead off) or written a few at a time by commits searched at 7,300
//! queries/s, and the same file dropped from the cache and read back in
//! order at 9,500 (1.30x). Reads in order let the kernel cache the file in
//! large folios (`FileHugePages` in `/proc/meminfo` grows by the file's
//! size) where single faults give 4 KiB pages scattered over physical
//! memory; see docs/engine.md, "How the page cache was filled", and the
//! figures in docs/benchmarks.md, "Page cache warm-up".
//!
//! So a file that fits the memory the caller gives it is written back,
//! dropped and read back in order before the environment maps it. The
//! caller decides the size (a shard node: a share of the machine's
//! memory); a file larger than that is left alone, as reading it would
//! only push its own pages out again (and on a network disk, the graph
//! walk's few pages are what it needs).

use std::fs::File;
use std::io::Read;
use std::os::fd::AsRawFd;
use std::path::Path;
use std::time::Instant;

/// What [`warm`] did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub(crate) enum Warmed {
    /// The file is larger than the budget, empty or missing: untouched.
    Skipped,
    /// Read back in order: this many bytes in this many seconds.
    Read { bytes: u64, seconds: f64 },
}

/// Drops `data` (an environment's `data.mdb`) from the page cache and reads
/// it back in order, if it holds at most `max_bytes`. Must run before the
/// file is mapped: the kernel keeps pages that are mapped.
pub(crate) fn warm(data: &Path, max_bytes: u64) -> std::io::Result<Warmed> {
    let len = match std::fs::metadata(data) {
        Ok(m) => m.len(),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Warmed::Skipped),
        Err(e) => return Err(e),
    };
    if len == 0 || len > max_bytes {
        return Ok(Warmed::Skipped);
    }
    let t = Instant::now();
    let mut file = File::open(data)?;
    // Dirty pages are not dropped: write them back first.
    file.sync_all()?;
    let fd = file.as_raw_fd();
    // SAFETY: a valid descriptor; offset and length 0 cover the whole file.
    let rc = unsafe { libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_DONTNEED) };
    if rc != 0 {
        return Err(std::io::Error::from_raw_os_error(rc));
    }
    // SAFETY: as above. A hint only: it widens the readahead window.
    unsafe { libc::posix_fadvise(fd, 0, 0, libc::POSIX_FADV_SEQUENTIAL) };
    let mut buf = vec![0u8; 1 << 20];
    let mut bytes = 0u64;
    loop {
        match file.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => bytes += n as u64,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(Warmed::Read { bytes, seconds: t.elapsed().as_secs_f64() })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_file_over_the_budget_or_missing_is_left_alone_and_one_within_is_read_whole() {
        let dir = tempfile::tempdir().expect("tempdir");
        let data = dir.path().join("data.mdb");
        assert_eq!(warm(&data, u64::MAX).expect("missing file"), Warmed::Skipped);
        std::fs::write(&data, vec![7u8; 3 << 20]).expect("write");
        assert_eq!(warm(&data, (3 << 20) - 1).expect("over the budget"), Warmed::Skipped);
        match warm(&data, 3 << 20).expect("within the budget") {
            Warmed::Read { bytes, .. } => assert_eq!(bytes, 3 << 20),
            other => panic!("expected a read, got {other:?}"),
        }
        assert_eq!(std::fs::read(&data).expect("read").len(), 3 << 20, "the file is unchanged");
    }
}
