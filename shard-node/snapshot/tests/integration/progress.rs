//! Progress read from another thread while a snapshot and a restore run,
//! as `shoalctl` and the shard's stats read it.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use shoal_snapshot::{
    Operation, Phase, Progress, ProgressReport, RestoreSource, SnapshotOptions, SnapshotTarget, create_snapshot, restore_to_staging,
};

use crate::common::{backends, index_with, progress, restore_options, rng};

/// Reads `p` every 100 µs on its own thread until told to stop; returns
/// every reading that differs from the one before.
fn watch(p: Arc<Progress>, stop: Arc<AtomicBool>) -> std::thread::JoinHandle<Vec<ProgressReport>> {
    std::thread::spawn(move || {
        let mut seen: Vec<ProgressReport> = Vec::new();
        while !stop.load(Ordering::Acquire) {
            let r = p.report();
            if seen.last().is_none_or(|l| (l.phase, l.bytes_done, l.chunks_done) != (r.phase, r.bytes_done, r.chunks_done)) {
                seen.push(r);
            }
            std::thread::sleep(Duration::from_micros(100));
        }
        seen
    })
}

/// A reading taken in the middle: some bytes done, not all, with a rate
/// and an estimate of the time left.
fn assert_seen_midway(seen: &[ProgressReport], what: &str) {
    let mid = seen.iter().find(|r| r.phase == Phase::Transferring && r.bytes_done > 0 && r.bytes_done < r.bytes_total);
    let Some(mid) = mid else { panic!("{what}: no reading between start and end among {seen:?}") };
    eprintln!("{what}: {} distinct readings", seen.len());
    assert!(mid.rate() > 0.0, "{what}: {mid:?}");
    assert!(mid.remaining().is_some_and(|d| d > Duration::ZERO), "{what}: {mid:?}");
    // Never backwards.
    for w in seen.windows(2) {
        assert!(w[1].bytes_done >= w[0].bytes_done && w[1].chunks_done >= w[0].chunks_done, "{what}: {w:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_is_visible_while_a_snapshot_and_a_restore_run() {
    let mut rng = rng("progress_is_visible_while_a_snapshot_and_a_restore_run");
    let dir = tempfile::tempdir().unwrap();
    let index = index_with(&mut rng, dir.path(), 64, 4000);
    // 4 KiB chunks: hundreds of them, each one progress step.
    let opts = SnapshotOptions { chunk_size: 4 << 10, concurrency: 2, compress_threads: 1, ..SnapshotOptions::default() };
    for b in backends("progress_is_visible_while_a_snapshot_and_a_restore_run") {
        let target = SnapshotTarget { collection: "docs".into(), shard: 0, shard_count: 1, id: None };
        let sp = progress(Operation::Snapshot);
        let stop = Arc::new(AtomicBool::new(false));
        let watcher = watch(Arc::clone(&sp), Arc::clone(&stop));
        let m = create_snapshot(&b.store, Arc::clone(&index), &target, &opts, Arc::clone(&sp)).await.unwrap();
        stop.store(true, Ordering::Release);
        let seen = watcher.join().unwrap();
        assert!(m.chunks.len() > 100, "{}: {} chunks", b.name, m.chunks.len());
        assert_seen_midway(&seen, &format!("{} snapshot", b.name));
        let end = sp.report();
        assert_eq!((end.phase, end.bytes_done, end.chunks_done), (Phase::Done, m.image_bytes, m.chunks.len() as u64));

        let dest = tempfile::tempdir().unwrap();
        let mut ropts = restore_options();
        ropts.concurrency = 2;
        let rp = progress(Operation::Restore);
        let stop = Arc::new(AtomicBool::new(false));
        let watcher = watch(Arc::clone(&rp), Arc::clone(&stop));
        let src = RestoreSource { collection: "docs".into(), shard: 0, id: m.id.clone() };
        restore_to_staging(&b.store, &src, &dest.path().join("s"), &ropts, Arc::clone(&rp)).await.unwrap();
        stop.store(true, Ordering::Release);
        let seen = watcher.join().unwrap();
        assert_seen_midway(&seen, &format!("{} restore", b.name));
        let end = rp.report();
        assert_eq!((end.phase, end.bytes_done, end.chunks_done), (Phase::Done, m.image_bytes, m.chunks.len() as u64));
    }
}
