//! A restore onto a device without room fails with DiskFull and leaves the
//! shard that was there intact. Needs root (mounts a small tmpfs); skips
//! with a printed reason otherwise.

use std::path::PathBuf;
use std::process::Command;

use shoal_engine::Index;
use shoal_snapshot::*;

use crate::common::*;

struct Mount(tempfile::TempDir);

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(self.0.path()).status();
    }
}

fn small_filesystem(bytes: u64) -> Option<Mount> {
    let dir = tempfile::tempdir().ok()?;
    let status = Command::new("mount").args(["-t", "tmpfs", "-o", &format!("size={bytes}"), "tmpfs"]).arg(dir.path()).status();
    match status {
        Ok(s) if s.success() => Some(Mount(dir)),
        other => {
            eprintln!("SKIPPED disk-full restore test: cannot mount a tmpfs here ({other:?}); run as root to include it");
            None
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_full_disk_fails_the_restore_and_keeps_the_existing_shard() {
    let Some(mount) = small_filesystem(3 << 20) else { return };
    let mut rng = rng("a_full_disk_fails_the_restore_and_keeps_the_existing_shard");
    let src_dir = tempfile::tempdir().unwrap();
    let source = index_with(&mut rng, src_dir.path(), 128, 5000);
    let store_dir = tempfile::tempdir().unwrap();
    let store = SnapshotStore::open(store_dir.path().to_str().unwrap()).unwrap();
    let target = SnapshotTarget { collection: "docs".into(), shard: 0, shard_count: 1, id: None };
    let m = create_snapshot(&store, source, &target, &small_chunks(), progress(Operation::Snapshot)).await.unwrap();
    assert!(m.image_bytes > 3 << 20, "the image ({} bytes) must not fit", m.image_bytes);

    let existing: PathBuf = mount.0.path().join("0");
    drop(index_with(&mut rng, &existing, 128, 300));
    for check_first in [true, false] {
        let mut opts = restore_options();
        opts.check_free_space = check_first;
        let staging = sibling(&existing, "restore");
        let src = RestoreSource { collection: "docs".into(), shard: 0, id: m.id.clone() };
        let err = restore_to_staging(&store, &src, &staging, &opts, progress(Operation::Restore)).await.unwrap_err();
        eprintln!("check_free_space={check_first}: {err}");
        let SnapshotError::DiskFull { needed, available, .. } = err else { panic!("expected DiskFull, got {err:?}") };
        assert_eq!(needed, m.image_bytes);
        assert!(!check_first || available < needed);
        assert!(!staging.exists(), "the staging directory must be removed");
        let still = Index::open(&existing, engine_options()).unwrap();
        assert_eq!(still.stats().unwrap().live, 300);
    }
}
