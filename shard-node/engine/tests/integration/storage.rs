//! The storage layer: alignment, full disks, the crate's dependencies.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::Command;

use shoal_engine::{Error, Index, IndexOptions, IndexParams, Metric, SearchParams};

use crate::common::{Fixture, random_batch, random_vector, rng, test_options};

#[test]
fn vectors_are_read_in_place_without_copies() {
    let mut rng = rng("vectors_are_read_in_place_without_copies");
    for dim in [1u32, 3, 8, 100, 384, 1536] {
        let fx = Fixture::new(dim, Metric::Euclidean);
        for b in 0..3u64 {
            fx.index.apply(random_batch(&mut rng, dim as usize, b * 300..b * 300 + 300)).unwrap();
        }
        let mut snap = fx.index.snapshot().unwrap();
        for _ in 0..20 {
            snap.search(&random_vector(&mut rng, dim as usize), SearchParams::new(10, 50)).unwrap();
        }
        assert_eq!(snap.unaligned_vectors(), 0, "dim {dim}: LMDB placed vectors off a 4-byte boundary");
    }
}

#[test]
fn the_engine_does_not_depend_on_tokio() {
    let out = Command::new(env!("CARGO"))
        .args(["tree", "-p", "shoal-engine", "-e", "normal", "--prefix", "none", "--offline"])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .output()
        .expect("run cargo tree");
    assert!(out.status.success(), "cargo tree failed: {}", String::from_utf8_lossy(&out.stderr));
    let tree = String::from_utf8_lossy(&out.stdout);
    assert!(tree.contains("heed"), "unexpected cargo tree output:\n{tree}");
    assert!(!tree.lines().any(|l| l.starts_with("tokio ")), "the engine must stay synchronous:\n{tree}");
}

/// Mounts a small tmpfs; None (with the reason printed) where that is not
/// allowed, e.g. without root.
fn small_filesystem(bytes: u64) -> Option<(tempfile::TempDir, Unmount)> {
    let dir = tempfile::tempdir().ok()?;
    let status = Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"]).arg(dir.path()).status();
    match status {
        Ok(s) if s.success() => {
            let path = dir.path().to_owned();
            Some((dir, Unmount(path)))
        }
        other => {
            eprintln!("SKIPPED disk-full test: cannot mount a tmpfs here ({other:?}); run as root to include it");
            None
        }
    }
}

struct Unmount(std::path::PathBuf);

impl Drop for Unmount {
    fn drop(&mut self) {
        // Lazy: the mount goes as soon as nothing uses it, even if a file
        // handle is still being closed.
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn a_full_disk_fails_the_batch_and_keeps_every_commit() {
    let Some((dir, _mount)) = small_filesystem(3 << 20) else { return };
    let mut rng = rng("a_full_disk_fails_the_batch_and_keeps_every_commit");
    let path = dir.path().join("shard");
    let opts = IndexOptions { durable: true, initial_map_size: 64 << 20, ..test_options() };
    let index = Index::open_or_create(&path, IndexParams::new(128, Metric::Cosine), opts.clone()).unwrap();
    let mut committed = 0u64;
    let mut failure = None;
    for b in 0..100u64 {
        match index.apply(random_batch(&mut rng, 128, b * 500..b * 500 + 500).with_source("job", b)) {
            Ok(_) => committed += 500,
            Err(e) => {
                failure = Some(e);
                break;
            }
        }
    }
    let err = failure.expect("3 MiB should fill up");
    assert!(matches!(err, Error::DiskFull { .. }), "expected DiskFull, got {err}");
    assert!(committed > 0);
    assert_eq!(index.stats().unwrap().live, committed);
    drop(index);
    let index = Index::open(&path, opts).unwrap();
    assert_eq!(index.stats().unwrap().live, committed);
    assert_eq!(index.offset("job").unwrap(), Some(committed / 500 - 1));
    for id in [0, committed - 1] {
        assert!(index.get(id).unwrap().is_some(), "committed point {id} lost");
    }
    let hits = index.search(&random_vector(&mut rng, 128), SearchParams::new(10, 64)).unwrap();
    assert_eq!(hits.len(), 10);
}

/// Writes a plain file into `dir` until the file system refuses with
/// ENOSPC; returns it, so that deleting it frees the space again.
fn fill(dir: &Path) -> PathBuf {
    let path = dir.join("filler");
    let mut file = std::fs::File::create(&path).unwrap();
    let chunk = vec![0x5a_u8; 64 << 10];
    loop {
        if let Err(e) = file.write_all(&chunk) {
            assert_eq!(e.raw_os_error(), Some(libc::ENOSPC), "filling {}: {e}", dir.display());
            return path;
        }
    }
}

/// Bytes an unprivileged writer may still use on the file system of `path`.
fn free_bytes(path: &Path) -> u64 {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes()).unwrap();
    // SAFETY: statvfs only writes into `st`, and `c` is a valid C string.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    assert_eq!(unsafe { libc::statvfs(c.as_ptr(), &mut st) }, 0, "statvfs {}", path.display());
    #[allow(clippy::unnecessary_cast)] // u32 on some targets
    let free = (st.f_bavail as u64) * (st.f_frsize as u64);
    free
}

/// Creating an index on a full disk must fail with `DiskFull`, not die of
/// SIGBUS (LMDB grows its lock file sparsely and then writes it through a
/// memory map), and must take back everything it made; the index that was
/// already there keeps working.
#[test]
fn a_full_disk_refuses_a_new_index_and_leaves_nothing_behind() {
    let Some((dir, _mount)) = small_filesystem(4 << 20) else { return };
    let mut rng = rng("a_full_disk_refuses_a_new_index_and_leaves_nothing_behind");
    let params = IndexParams::new(16, Metric::Cosine);
    let opts = IndexOptions { initial_map_size: 16 << 20, ..test_options() };
    let existing = dir.path().join("existing");
    let index = Index::open_or_create(&existing, params, opts.clone()).unwrap();
    index.apply(random_batch(&mut rng, 16, 0..200)).unwrap();
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    let filler = fill(dir.path());
    let full = std::fs::metadata(&filler).unwrap().len();

    // 64 readers take a lock file of two pages: with three pages free LMDB
    // gets as far as writing its data file before the device is full.
    let new_opts = IndexOptions { max_readers: 64, ..opts.clone() };
    let nested = dir.path().join("a");
    for slack in [0, 4 << 10, 12 << 10] {
        std::fs::OpenOptions::new().write(true).open(&filler).unwrap().set_len(full - slack).unwrap();
        let free = free_bytes(dir.path());
        for path in [dir.path().join("new"), nested.join("b"), empty.clone()] {
            match Index::open_or_create(&path, params, new_opts.clone()) {
                Err(Error::DiskFull { .. }) => {}
                Err(other) => panic!("{} with {slack} bytes free: expected DiskFull, got {other}", path.display()),
                Ok(_) => panic!("{}: created an index with {slack} bytes free", path.display()),
            }
            assert_eq!(free_bytes(dir.path()), free, "{}: the refused create kept space", path.display());
        }
        assert!(!dir.path().join("new").exists(), "the new directory was left behind");
        assert!(!nested.exists(), "the new parent directory was left behind");
        let left: Vec<_> = std::fs::read_dir(&empty).unwrap().map(|e| e.unwrap().file_name()).collect();
        assert!(left.is_empty(), "files left in the directory that existed: {left:?}");
    }

    // Many readers at once: their slots lie past the lock file's first page.
    let query = random_vector(&mut rng, 16);
    let mut snapshots: Vec<_> = (0..100).map(|_| index.snapshot().unwrap()).collect();
    for s in &mut snapshots {
        assert_eq!(s.search(&query, SearchParams::new(5, 32)).unwrap().len(), 5);
    }
    drop(snapshots);
    drop(index);
    let index = Index::open(&existing, opts).unwrap();
    assert_eq!(index.search(&query, SearchParams::new(5, 32)).unwrap().len(), 5);
    std::fs::remove_file(filler).unwrap();
    index.apply(random_batch(&mut rng, 16, 200..300)).unwrap();
    assert_eq!(index.stats().unwrap().live, 300);
}

/// Names the child process of `too_many_open_files_is_its_own_error`
/// (the directory it works in).
const OPEN_FILE_LIMIT_CHILD: &str = "SHOAL_TEST_OPEN_FILE_LIMIT_CHILD";

/// Opening an index without a file descriptor to spare fails with
/// `OpenFileLimit` and leaves nothing behind, whichever of its files could
/// not be opened. It runs in a child process with a low limit: the tests
/// of this process run in threads that share the limit.
#[test]
fn too_many_open_files_is_its_own_error() {
    if let Some(dir) = std::env::var_os(OPEN_FILE_LIMIT_CHILD) {
        open_file_limit_child(Path::new(&dir));
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "storage::too_many_open_files_is_its_own_error", "--nocapture", "--test-threads=1"])
        .env(OPEN_FILE_LIMIT_CHILD, dir.path())
        .output()
        .unwrap();
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(out.status.success(), "child failed ({}):\n{stdout}\n{stderr}", out.status);
    assert!(stdout.contains("open-file-limit child: done"), "the child ran no test:\n{stdout}\n{stderr}");
}

fn open_file_limit_child(dir: &Path) {
    let mut limit = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: getrlimit/setrlimit only read and write `limit`.
    assert_eq!(unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) }, 0);
    limit.rlim_cur = limit.rlim_cur.min(128);
    assert_eq!(unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &limit) }, 0);

    let params = IndexParams::new(4, Metric::Euclidean);
    let opts = IndexOptions { build_threads: 1, ..test_options() };
    let existing = dir.join("existing");
    Index::open_or_create(&existing, params, opts.clone())
        .unwrap()
        .apply(shoal_engine::Batch::upserts([(1, vec![1.0, 0.0, 0.0, 0.0])]))
        .unwrap();
    let mut held = Vec::new();
    loop {
        match std::fs::File::open("/dev/null") {
            Ok(f) => held.push(f),
            Err(e) => {
                assert_eq!(e.raw_os_error(), Some(libc::EMFILE), "{e}");
                break;
            }
        }
    }
    // An existing index is refused, and kept.
    match Index::open(&existing, opts.clone()) {
        Err(Error::OpenFileLimit { .. }) => {}
        Err(other) => panic!("expected OpenFileLimit, got {other}"),
        Ok(_) => panic!("opened an index without a descriptor to spare"),
    }
    assert!(existing.join("data.mdb").exists(), "the existing index was removed");
    // With one more descriptor to spare each time, a new index fails at a
    // later file (the engine's own open of the lock file, then LMDB's),
    // until it has enough.
    let mut refused = 0;
    let created = loop {
        let path = dir.join(format!("new-{refused}"));
        match Index::open_or_create(&path, params, opts.clone()) {
            Ok(index) => break index,
            Err(Error::OpenFileLimit { .. }) => {
                assert!(!path.exists(), "{} was left behind", path.display());
                refused += 1;
            }
            Err(other) => panic!("{refused} spare descriptors: expected OpenFileLimit, got {other}"),
        }
        assert!(held.pop().is_some() && refused < 10, "still refused with {refused} descriptors to spare");
    };
    assert!(refused >= 3, "only {refused} opens were refused: the engine's and LMDB's files were not all tried");
    drop(created);
    drop(held);
    let index = Index::open(&existing, opts).unwrap();
    assert_eq!(index.search(&[1.0, 0.0, 0.0, 0.0], SearchParams::new(1, 8)).unwrap()[0].id, 1);
    println!("open-file-limit child: done ({refused} refused)");
}
