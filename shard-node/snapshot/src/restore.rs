//! Restoring a snapshot: download chunks in parallel, check every one,
//! decompress into a staging directory beside the target, open the
//! environment and check it against the manifest; then the caller swaps it
//! into place with renames. Until the swap nothing outside the staging
//! directory is touched, and a failure removes the staging directory.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use futures::{StreamExt, TryStreamExt};
use shoal_engine::{Index, IndexOptions};

use crate::chunk;
use crate::error::{Result, SnapshotError, join_error};
use crate::image_file::{AlignedBuf, ImageFile};
use crate::layout;
use crate::manifest::{ChunkRef, Manifest};
use crate::objects::{TransferOptions, get_object, read_manifest};
use crate::progress::{Phase, Progress};
use crate::store_url::SnapshotStore;

/// How restores run.
#[derive(Clone, Debug)]
pub struct RestoreOptions {
    /// Chunks downloading and decompressing at once. Default 8.
    pub concurrency: usize,
    /// Refuse to start when the device has less free space than the image
    /// (a full device during the write is caught either way). Default true.
    pub check_free_space: bool,
    /// How the restored environment is opened for the check.
    pub engine: IndexOptions,
    /// Ranged downloads.
    pub transfer: TransferOptions,
    /// Write the image with direct I/O where the file system allows it
    /// (see `image_file`). Default true.
    pub direct_io: bool,
}

impl Default for RestoreOptions {
    fn default() -> Self {
        RestoreOptions {
            concurrency: 8,
            check_free_space: true,
            engine: IndexOptions::default(),
            transfer: TransferOptions::default(),
            direct_io: true,
        }
    }
}

/// What to restore.
#[derive(Clone, Debug)]
pub struct RestoreSource {
    /// Collection name.
    pub collection: String,
    /// Shard number.
    pub shard: u32,
    /// Snapshot id.
    pub id: String,
}

/// Restores a snapshot into `staging` (which must not exist; it is created,
/// and removed again on failure). On success `staging/data.mdb` is a
/// checked environment: move the directory into place with
/// [`swap_into_place`].
pub async fn restore_to_staging(
    store: &SnapshotStore,
    source: &RestoreSource,
    staging: &Path,
    opts: &RestoreOptions,
    progress: Arc<Progress>,
) -> Result<Manifest> {
    let manifest = read_manifest(&store.store, &source.collection, source.shard, &source.id).await?;
    progress.set_total(manifest.image_bytes);
    if let Some(parent) = staging.parent() {
        std::fs::create_dir_all(parent).map_err(|e| SnapshotError::io(parent, e))?;
    }
    std::fs::create_dir(staging).map_err(|e| SnapshotError::io(staging, e))?;
    let result = fill(store, &manifest, staging, opts, &progress).await;
    if result.is_err() {
        if let Err(e) = std::fs::remove_dir_all(staging) {
            tracing::warn!(path = %staging.display(), error = %e, "could not remove the staging directory of a failed restore");
        }
    } else {
        progress.set_phase(Phase::Done);
    }
    result.map(|()| manifest)
}

async fn fill(store: &SnapshotStore, m: &Manifest, staging: &Path, opts: &RestoreOptions, progress: &Arc<Progress>) -> Result<()> {
    if opts.check_free_space {
        let available = free_bytes(staging)?;
        // LMDB needs no more than the image to open it read-write.
        if available < m.image_bytes {
            return Err(SnapshotError::DiskFull { path: staging.to_owned(), needed: m.image_bytes, available });
        }
    }
    let path = staging.join("data.mdb");
    let file = Arc::new(ImageFile::create(&path, m.image_bytes, opts.direct_io).map_err(|e| with_needed(e, m.image_bytes))?);
    tracing::debug!(direct = file.is_direct(), "restore writes");
    progress.set_phase(Phase::Transferring);
    let t0 = std::time::Instant::now();
    // Owned items: futures that borrow from the iterator trip the
    // compiler's Send check (higher-ranked lifetimes) under tonic.
    let items: Vec<(usize, u64, ChunkRef)> = m.chunk_offsets().map(|(i, o, c)| (i, o, c.clone())).collect();
    // Downloads overlap freely; decompressing, hashing and writing are CPU
    // work, one chunk per core: more only adds contention (concurrent
    // writers of one file queue on its inode lock, spinning).
    let cpu = Arc::new(tokio::sync::Semaphore::new(std::thread::available_parallelism().map_or(1, usize::from)));
    let write_lock = Arc::new(std::sync::Mutex::new(()));
    futures::stream::iter(items)
        .map(|(i, offset, c)| {
            let cpu = Arc::clone(&cpu);
            let write_lock = Arc::clone(&write_lock);
            let file = Arc::clone(&file);
            let objects = Arc::clone(&store.store);
            let (id, transfer) = (m.id.clone(), opts.transfer);
            let progress = Arc::clone(progress);
            async move {
                let key = layout::chunk_key(&c.hash);
                let stored = match get_object(&objects, &key, c.stored_len, &transfer).await? {
                    None => return Err(SnapshotError::ChunkMissing { id, index: i, key: key.to_string() }),
                    Some(Err(found)) => {
                        return Err(SnapshotError::ChunkTruncated { id, index: i, key: key.to_string(), expected: c.stored_len, found });
                    }
                    Some(Ok(b)) => b,
                };
                let (raw_len, hash) = (c.raw_len, c.hash.clone());
                let permit = cpu.acquire_owned().await.map_err(|e| SnapshotError::Internal(e.to_string()))?;
                let written = tokio::task::spawn_blocking(move || {
                    let _permit = permit;
                    RAW.with_borrow_mut(|buf| {
                        // The manifest's check bounds raw_len by MAX_CHUNK_SIZE.
                        let cap = usize::try_from(raw_len)
                            .ok()
                            .and_then(|n| n.checked_add(1))
                            .ok_or_else(|| Err(format!("raw length {raw_len} is too large")))?;
                        let out = buf.bytes_mut(cap);
                        let n = chunk::decompress_checked_into(&stored, raw_len, &hash, out).map_err(Err)?;
                        // One writer at a time: writers of one file queue on
                        // its inode lock anyway, and there they spin.
                        let _one_writer = write_lock.lock();
                        file.write_at(&out[..n], offset).map_err(|e| Ok(SnapshotError::io(file.path(), e)))
                    })
                })
                .await
                .map_err(join_error)?;
                match written {
                    Ok(()) => {}
                    Err(Err(reason)) => return Err(SnapshotError::ChunkCorrupt { id, index: i, key: key.to_string(), reason }),
                    Err(Ok(e)) => return Err(e),
                }
                progress.add_done(c.raw_len);
                progress.add_chunk(c.stored_len, false);
                Ok(())
            }
        })
        .buffer_unordered(opts.concurrency.max(1))
        .try_collect::<Vec<()>>()
        .await
        .map_err(|e| with_needed(e, m.image_bytes))?;
    progress.set_phase(Phase::Finishing);
    let transferred = t0.elapsed();
    let (m2, staging2, engine) = (m.clone(), staging.to_owned(), opts.engine.clone());
    tokio::task::spawn_blocking(move || {
        file.sync().map_err(|e| SnapshotError::io(file.path(), e))?;
        let synced = t0.elapsed();
        drop(file);
        let checked = check_restored(&m2, &staging2, engine);
        // Where a slow restore spends its time: the transfer (download,
        // decompress, hash, write), the final fsync, the open and compare.
        tracing::debug!(?transferred, ?synced, total = ?t0.elapsed(), "restore phases");
        checked
    })
    .await
    .map_err(join_error)?
    .map_err(|e| with_needed(e, m.image_bytes))
}

thread_local! {
    /// Each blocking thread's decompression buffer, kept between chunks.
    static RAW: std::cell::RefCell<AlignedBuf> = std::cell::RefCell::new(AlignedBuf::default());
}

fn with_needed(mut e: SnapshotError, image_bytes: u64) -> SnapshotError {
    if let SnapshotError::DiskFull { needed, .. } = &mut e {
        *needed = image_bytes;
    }
    e
}

/// Opens the restored environment and compares it with the manifest.
fn check_restored(m: &Manifest, dir: &Path, engine: IndexOptions) -> Result<()> {
    let mismatch = |what: String| SnapshotError::Mismatch { id: m.id.clone(), what };
    let index = Index::open(dir, engine)?;
    let params = m.index.params().ok_or_else(|| mismatch("unknown metric".into()))?;
    if *index.params() != params {
        return Err(mismatch(format!("index parameters are {}, manifest says {params}", index.params())));
    }
    let stats = index.stats()?;
    if (stats.live, stats.tombstones) != (m.points, m.tombstones) {
        return Err(mismatch(format!(
            "{} points and {} tombstones, manifest says {} and {}",
            stats.live, stats.tombstones, m.points, m.tombstones
        )));
    }
    let offsets = index.offsets()?;
    if offsets != m.offset_pairs() {
        return Err(mismatch(format!("offsets are {offsets:?}, manifest says {:?}", m.offset_pairs())));
    }
    drop(index);
    // LMDB's lock file is recreated when the shard opens for real.
    let lock = dir.join("lock.mdb");
    if lock.exists() {
        std::fs::remove_file(&lock).map_err(|e| SnapshotError::io(&lock, e))?;
    }
    sync_dir(dir)
}

/// Moves a checked staging directory to `target`. If `target` exists it is
/// first renamed aside, then removed once the new one is in place; if the
/// second rename fails the old directory is put back. Both must be on one
/// file system (the staging directory is made beside the target).
pub fn swap_into_place(staging: &Path, target: &Path) -> Result<()> {
    let parent = target.parent().ok_or_else(|| SnapshotError::Invalid(format!("{} has no parent", target.display())))?;
    let aside = if target.exists() {
        let aside = sibling(target, "replaced");
        std::fs::rename(target, &aside).map_err(|e| SnapshotError::io(target, e))?;
        Some(aside)
    } else {
        None
    };
    if let Err(e) = std::fs::rename(staging, target) {
        if let Some(aside) = &aside {
            let _ = std::fs::rename(aside, target);
        }
        return Err(SnapshotError::io(staging, e));
    }
    sync_dir(parent)?;
    if let Some(aside) = aside {
        std::fs::remove_dir_all(&aside).map_err(|e| SnapshotError::io(&aside, e))?;
    }
    Ok(())
}

/// A fresh name beside `path` (`.<name>.<what>-<random>`), which the shard
/// host ignores when it looks for shards and removes at start.
pub fn sibling(path: &Path, what: &str) -> PathBuf {
    let name = path.file_name().map(|n| n.to_string_lossy().into_owned()).unwrap_or_default();
    path.with_file_name(format!(".{name}.{what}-{:08x}", rand::random::<u32>()))
}

fn sync_dir(dir: &Path) -> Result<()> {
    std::fs::File::open(dir).and_then(|d| d.sync_all()).map_err(|e| SnapshotError::io(dir, e))
}

/// Free bytes for an unprivileged writer on the device holding `path`.
fn free_bytes(path: &Path) -> Result<u64> {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(path.as_os_str().as_bytes())
        .map_err(|_| SnapshotError::Invalid(format!("{} contains a NUL byte", path.display())))?;
    // SAFETY: statvfs is plain old data; `c` is a valid NUL-terminated path
    // and `st` is written by the call before it is read.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    if unsafe { libc::statvfs(c.as_ptr(), &mut st) } != 0 {
        return Err(SnapshotError::io(path, std::io::Error::last_os_error()));
    }
    Ok(st.f_bavail as u64 * st.f_frsize as u64)
}
