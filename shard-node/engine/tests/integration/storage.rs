//! The storage layer: alignment, full disks, the crate's dependencies.

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
    let status = Command::new("mount")
        .args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"])
        .arg(dir.path())
        .status();
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
