//! An incremental insert from a cold page cache reads pages in proportion to
//! the batch, not to the index (issue 8): the same small batch goes into
//! indexes of two sizes, and the distinct pages of `data.mdb` it leaves
//! resident (with the cache dropped first, the pages it read or wrote) must
//! not grow with the index beyond a stated factor.
//!
//! The points lie in tight clusters of equal size, stored cluster after
//! cluster, and the batch joins one cluster; the larger index has 8x more
//! clusters. An insert that only walks the graph then reads its cluster's
//! pages and a path from the entry point: a count that does not depend on
//! the index size. Anything proportional to the index (a scan, a rewrite,
//! reading every node's record) shows up as 8x. Uniform random points would
//! not test this at these sizes: a batch's searches visit a large share of
//! a small random graph, and with 15 lists or vectors to a page nearly
//! every page, so the count is set by page saturation, not by the engine
//! (measured: 5.95x for 8x on the engine of November 2026). Real-data
//! figures are `loadtest disk-bench`'s job.
//!
//! The page cache is dropped with `posix_fadvise(POSIX_FADV_DONTNEED)` after
//! closing the index (mapped pages would stay); where that does not empty
//! it (tmpfs, some filesystems), the test says so and skips. Timing is not
//! asserted: performance targets live in `loadtest disk-bench`.

use std::fs::File;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};

use shoal_engine::{Index, IndexOptions, IndexParams, Metric};

use rand::Rng;
use rand::rngs::StdRng;
use shoal_engine::Batch;

use crate::common::{random_vector, rng};

const DIM: u32 = 64;
const BATCH: u64 = 50;
const CLUSTER: u64 = 250;
const SMALL: u64 = 5_000;
const LARGE: u64 = 40_000;
/// Allowed growth of the pages a batch reads when the index is 8x larger.
/// The graph walk itself grows 2-3x here (nodes keep links to other
/// clusters, and there are 8x more of them, whose codes lie on other
/// pages); work proportional to the index grows ~7x (the file's growth).
/// Measured over seeds 1-20: 1.86x-2.57x on 2026-11-25, 2.44x-3.04x on
/// the engine and kernel (6.18) of November 2026, with or without the
/// 1 MiB write memory (CI met 3.05x for one seed): 3.5x leaves room for
/// the walk's spread and none for a scan.
const MAX_GROWTH: f64 = 3.5;

/// Which pages of `path` are in the page cache (`mincore` on a separate
/// read-only mapping, which faults nothing in).
fn resident(path: &Path) -> Vec<bool> {
    let file = File::open(path).expect("open data.mdb");
    let len = file.metadata().expect("stat").len() as usize;
    // SAFETY: sysconf has no preconditions.
    let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) } as usize;
    // SAFETY: a fresh read-only mapping of an open file, unmapped below;
    // its memory is never read.
    let ptr = unsafe { libc::mmap(std::ptr::null_mut(), len, libc::PROT_READ, libc::MAP_SHARED, file.as_raw_fd(), 0) };
    assert_ne!(ptr, libc::MAP_FAILED, "mmap: {}", std::io::Error::last_os_error());
    let mut vec = vec![0u8; len.div_ceil(page)];
    // SAFETY: `ptr` maps `len` bytes; `vec` has a byte per page.
    let rc = unsafe { libc::mincore(ptr, len, vec.as_mut_ptr()) };
    // SAFETY: unmapping the mapping made above.
    unsafe { libc::munmap(ptr, len) };
    assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
    vec.iter().map(|b| b & 1 == 1).collect()
}

/// Writes the file back and drops its pages; false if pages stayed.
fn drop_cache(path: &Path) -> bool {
    let file = File::open(path).expect("open data.mdb");
    file.sync_all().expect("fsync");
    // SAFETY: a valid descriptor; offset and length 0 cover the file.
    let rc = unsafe { libc::posix_fadvise(file.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
    let left = resident(path).iter().filter(|&&r| r).count();
    rc == 0 && left <= 4
}

/// `ids.len()` points around `center` (noise much smaller than the
/// distance between random centres).
fn cluster_batch(rng: &mut StdRng, center: &[f32], ids: std::ops::Range<u64>) -> Batch {
    Batch::upserts(ids.map(|id| (id, center.iter().map(|c| c + rng.random_range(-0.05f32..0.05)).collect())))
}

/// Clusters a batch joins, one at a time, each from a cold cache: one
/// insert's count depends on where its cluster's pages and its path from
/// the entry point happen to lie (one seed in ten gave 3.1x alone), the
/// sum of three much less.
const TARGETS: [usize; 3] = [2, 9, 16];

/// Builds an index of `size` points in clusters of `CLUSTER`; then for each
/// of `TARGETS`, closes it, drops its pages, reopens it and inserts `BATCH`
/// more points into that cluster. Returns the pages newly resident, summed
/// over the inserts, or `None` if the cache could not be dropped here.
fn pages_read_by_batch(root: &Path, size: u64, rng: &mut StdRng) -> Option<usize> {
    let dir: PathBuf = root.join(format!("index-{size}"));
    let opts = IndexOptions { build_threads: 2, durable: false, read_ahead: false, ..IndexOptions::default() };
    let index = Index::open_or_create(&dir, IndexParams::new(DIM, Metric::Cosine), opts.clone()).expect("create");
    let centers: Vec<Vec<f32>> = (0..size / CLUSTER).map(|_| random_vector(rng, DIM as usize)).collect();
    for (c, center) in centers.iter().enumerate() {
        let start = c as u64 * CLUSTER;
        index.apply(cluster_batch(rng, center, start..start + CLUSTER)).expect("build");
    }
    drop(index);
    let data = dir.join("data.mdb");
    let mut total = 0;
    for (k, &target) in TARGETS.iter().enumerate() {
        if !drop_cache(&data) {
            eprintln!(
                "skipped: posix_fadvise(DONTNEED) does not empty the page cache for {} (tmpfs or a filesystem that keeps \
                 pages); cannot count the pages an insert reads",
                data.display()
            );
            return None;
        }
        let index = Index::open(&dir, opts.clone()).expect("reopen");
        let before = resident(&data);
        let first = size + k as u64 * BATCH;
        index.apply(cluster_batch(rng, &centers[target], first..first + BATCH)).expect("insert");
        let after = resident(&data);
        drop(index);
        let new = after.iter().enumerate().filter(|&(i, &r)| r && !before.get(i).copied().unwrap_or(false)).count();
        eprintln!("{BATCH} into cluster {target} of {size}: {new} pages newly resident of {} in the file", after.len());
        total += new;
    }
    Some(total)
}

#[test]
fn an_insert_from_a_cold_cache_reads_pages_in_proportion_to_the_batch_not_the_index() {
    // On the build's own disk: the system temp dir may be tmpfs.
    let root = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let mut rng = rng("cold_pages");
    let Some(small) = pages_read_by_batch(root.path(), SMALL, &mut rng) else { return };
    let Some(large) = pages_read_by_batch(root.path(), LARGE, &mut rng) else { return };
    let growth = large as f64 / small.max(1) as f64;
    assert!(
        growth <= MAX_GROWTH,
        "{} batches of {BATCH} read {small} pages of an index of {SMALL} and {large} of one of {LARGE}: {growth:.2}x for \
         {}x the index (at most {MAX_GROWTH}x allowed)",
        TARGETS.len(),
        LARGE / SMALL
    );
}

/// `IndexOptions::warm_max_bytes`: an index whose file fits the budget
/// opens with all of it in the page cache (read back in order), one over
/// the budget with none of it, from a cold cache either way.
#[test]
fn an_index_within_its_warm_budget_opens_with_its_file_in_the_page_cache() {
    let root = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("temp dir");
    let dir = root.path().join("index");
    let mut rng = rng("warm_on_open");
    let opts = IndexOptions { build_threads: 2, durable: false, read_ahead: false, ..IndexOptions::default() };
    let index = Index::open_or_create(&dir, IndexParams::new(DIM, Metric::Cosine), opts.clone()).expect("create");
    let center = random_vector(&mut rng, DIM as usize);
    for start in (0..8_000).step_by(2_000) {
        index.apply(cluster_batch(&mut rng, &center, start..start + 2_000)).expect("build");
    }
    drop(index);
    let data = dir.join("data.mdb");
    let len = std::fs::metadata(&data).expect("stat").len();
    for (budget, expect_all) in [(len - 1, false), (len, true)] {
        if !drop_cache(&data) {
            eprintln!("skipped: posix_fadvise(DONTNEED) does not empty the page cache for {}", data.display());
            return;
        }
        let index = Index::open(&dir, IndexOptions { warm_max_bytes: budget, ..opts.clone() }).expect("open");
        let pages = resident(&data);
        let cached = pages.iter().filter(|&&r| r).count();
        drop(index);
        eprintln!("warm budget {budget} for a file of {len} bytes: {cached} of {} pages resident after opening", pages.len());
        if expect_all {
            assert_eq!(cached, pages.len(), "a file within the budget ({len} bytes) is all in the page cache");
        } else {
            // Opening reads what it loads (tables' roots, the link log's
            // index, the retired ids), not the vectors or the graph.
            assert!(cached * 4 < pages.len(), "{cached} of {} pages resident after opening a file over the budget", pages.len());
        }
    }
}
