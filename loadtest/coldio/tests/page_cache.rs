//! The page-cache primitives against a real file on the build's disk
//! (`CARGO_TARGET_TMPDIR`; the system temp dir may be tmpfs, where nothing
//! can be dropped).

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::PathBuf;

use coldio::{drop_pages, mapped_by_this_process, os_page_size, residency, warm};

fn file_of(pages: usize) -> (tempfile::TempDir, PathBuf) {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let path = dir.path().join("f");
    let mut f = File::create(&path).expect("create");
    f.write_all(&vec![7u8; pages * os_page_size()]).expect("write");
    f.sync_all().expect("sync");
    (dir, path)
}

#[test]
fn dropping_empties_the_cache_and_warming_fills_it() {
    let (_dir, path) = file_of(256);
    let warmed = warm(&path).expect("warm");
    assert_eq!((warmed.total(), warmed.resident()), (256, 256));
    let out = drop_pages(&path).expect("drop");
    if !out.emptied() {
        eprintln!("skipped: posix_fadvise(DONTNEED) left {} of 256 pages resident on this filesystem", out.resident_after);
        return;
    }
    assert_eq!(residency(&path).expect("mincore").resident(), out.resident_after);
    // One read with readahead off brings back that page only.
    let mut f = File::open(&path).expect("open");
    // SAFETY: a valid descriptor.
    unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_RANDOM) };
    let mut one = vec![0u8; os_page_size()];
    f.read_exact(&mut one).expect("read");
    let after = residency(&path).expect("mincore");
    assert!(after.pages[0]);
    assert!(after.resident() <= 4, "{} pages resident after reading one", after.resident());
}

#[test]
fn pages_someone_maps_are_not_dropped_and_the_mapping_is_seen() {
    let (_dir, path) = file_of(64);
    assert!(!mapped_by_this_process(&path).expect("maps"));
    let f = File::open(&path).expect("open");
    let len = 64 * os_page_size();
    // SAFETY: a read-only mapping of a file we hold open; unmapped below.
    let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, f.as_raw_fd(), 0) };
    assert_ne!(ptr, libc::MAP_FAILED);
    // Touch every page, so that each is mapped by this process.
    // SAFETY: `ptr` maps `len` readable bytes.
    let bytes = unsafe { std::slice::from_raw_parts(ptr.cast::<u8>(), len) };
    let sum: u64 = bytes.iter().step_by(os_page_size()).map(|&b| u64::from(b)).sum();
    assert_eq!(sum, 7 * 64);
    assert!(mapped_by_this_process(&path).expect("maps"));
    let out = drop_pages(&path).expect("drop");
    assert!(!out.emptied(), "mapped pages were dropped: {out:?}");
    // SAFETY: unmapping what was mapped above.
    unsafe { libc::munmap(ptr, len) };
    assert!(!mapped_by_this_process(&path).expect("maps"));
}
