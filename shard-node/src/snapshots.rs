//! Snapshots and restores of the shards a node owns: the shard host's side
//! of `shoal-snapshot` (one operation per shard at a time, progress for the
//! shard's stats, taking a shard out of service and back for a restore).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use shoal_engine::Index;
use shoal_proto::{CollectionName, ShoalError, v1};
use shoal_snapshot::{Operation, Progress, RestoreOptions, RestoreSource, SnapshotError, SnapshotOptions, SnapshotStore, SnapshotTarget};

use crate::config::SnapshotConfig;
use crate::convert::{collection_snapshot, progress_proto, snapshot_error, snapshot_info};
use crate::host::{ShardHost, ShardKey, key_of};
use crate::shard_file::{self, ShardFile};

/// A node's snapshot store and settings.
pub(crate) struct Snapshots {
    store: SnapshotStore,
    cfg: SnapshotConfig,
    running: Mutex<HashMap<ShardKey, Running>>,
}

#[derive(Clone)]
struct Running {
    id: String,
    progress: Arc<Progress>,
}

/// Marks a shard busy while an operation runs; frees it when dropped.
struct Busy<'a> {
    snapshots: &'a Snapshots,
    key: ShardKey,
}

impl Drop for Busy<'_> {
    fn drop(&mut self) {
        self.snapshots.running.lock().remove(&self.key);
    }
}

impl Snapshots {
    pub(crate) fn open(cfg: &SnapshotConfig) -> anyhow::Result<Snapshots> {
        let store = SnapshotStore::open(&cfg.url)?;
        let options =
            SnapshotOptions { zstd_level: cfg.zstd_level, chunk_size: cfg.chunk_bytes, concurrency: cfg.concurrency, ..Default::default() };
        options.validate()?;
        anyhow::ensure!(cfg.keep_last >= 1, "snapshot.keep_last must be at least 1");
        Ok(Snapshots { store, cfg: cfg.clone(), running: Mutex::new(HashMap::new()) })
    }

    /// The store's URL (without query parameters).
    pub(crate) fn url(&self) -> &str {
        self.store.url()
    }

    fn begin(&self, key: &ShardKey, op: Operation, id: &str) -> Result<(Busy<'_>, Arc<Progress>), ShoalError> {
        let mut running = self.running.lock();
        if let Some(r) = running.get(key) {
            return Err(snapshot_error(SnapshotError::Busy {
                collection: key.0.to_string(),
                shard: key.1,
                running: r.progress.report().op.name(),
            }));
        }
        let progress = Arc::new(Progress::new(op));
        running.insert(key.clone(), Running { id: id.to_owned(), progress: Arc::clone(&progress) });
        Ok((Busy { snapshots: self, key: key.clone() }, progress))
    }

    /// The operation running on a shard, if any.
    pub(crate) fn progress_of(&self, key: &ShardKey) -> Option<v1::SnapshotProgress> {
        let r = self.running.lock().get(key).cloned()?;
        Some(progress_proto(key.0.as_str(), key.1, &r.id, &r.progress.report()))
    }

    pub(crate) fn all_progress(&self) -> Vec<v1::SnapshotProgress> {
        let running: Vec<(ShardKey, Running)> = self.running.lock().iter().map(|(k, r)| (k.clone(), r.clone())).collect();
        let mut out: Vec<_> = running.iter().map(|(k, r)| progress_proto(k.0.as_str(), k.1, &r.id, &r.progress.report())).collect();
        out.sort_by(|a, b| (&a.collection, a.shard).cmp(&(&b.collection, b.shard)));
        out
    }

    fn restore_options(&self, host: &ShardHost) -> RestoreOptions {
        RestoreOptions {
            concurrency: self.cfg.concurrency,
            check_free_space: true,
            engine: host.engine_options(),
            ..RestoreOptions::default()
        }
    }
}

fn id_or_new(id: String) -> Result<String, ShoalError> {
    let id = if id.is_empty() { shoal_snapshot::new_snapshot_id() } else { id };
    shoal_snapshot::validate_id(&id).map_err(snapshot_error)?;
    Ok(id)
}

impl ShardHost {
    fn snapshots(&self) -> Result<&Snapshots, ShoalError> {
        self.snapshots.as_ref().ok_or_else(|| ShoalError::invalid("snapshots are not configured on this node (snapshot.url)"))
    }

    /// Snapshots one shard; returns when its manifest is published.
    pub async fn snapshot_shard(&self, req: v1::SnapshotShardRequest) -> Result<v1::SnapshotInfo, ShoalError> {
        let v1::SnapshotShardRequest { shard, snapshot_id, zstd_level } = req;
        let key = key_of(shard)?;
        let snaps = self.snapshots()?;
        let target = self.get(&key)?;
        let id = id_or_new(snapshot_id)?;
        let mut opts = SnapshotOptions {
            zstd_level: snaps.cfg.zstd_level,
            chunk_size: snaps.cfg.chunk_bytes,
            concurrency: snaps.cfg.concurrency,
            ..Default::default()
        };
        if zstd_level != 0 {
            opts.zstd_level =
                i32::try_from(zstd_level).map_err(|_| ShoalError::invalid(format!("zstd level {zstd_level} is out of range")))?;
        }
        let (_busy, progress) = snaps.begin(&key, Operation::Snapshot, &id)?;
        let started = Instant::now();
        let what = SnapshotTarget { collection: key.0.to_string(), shard: key.1, shard_count: target.shard_count, id: Some(id) };
        let m = shoal_snapshot::create_snapshot(&snaps.store, Arc::clone(&target.index), &what, &opts, progress)
            .await
            .map_err(|e| snapshot_error(e).context(format!("snapshot of shard {}/{}", key.0, key.1)))?;
        tracing::info!(collection = %key.0, shard = key.1, id = %m.id, bytes = m.image_bytes, uploaded = m.uploaded_bytes, "snapshot published");
        record(&key, "snapshot", m.image_bytes, started.elapsed());
        Ok(snapshot_info(&m, started.elapsed().as_millis() as u64))
    }

    /// Restores a shard from a snapshot and serves it.
    pub async fn restore_shard(&self, req: v1::RestoreShardRequest) -> Result<v1::ShardStats, ShoalError> {
        let v1::RestoreShardRequest { shard, snapshot_id, replace } = req;
        let key = key_of(shard)?;
        let snaps = self.snapshots()?;
        if snapshot_id.is_empty() {
            return Err(ShoalError::invalid("snapshot_id is missing"));
        }
        shoal_snapshot::validate_id(&snapshot_id).map_err(snapshot_error)?;
        self.check_open()?;
        if self.has(&key) && !replace {
            return Err(ShoalError::already_exists(format!(
                "shard {}/{} is on this node already; set replace to overwrite it",
                key.0, key.1
            )));
        }
        // A shard new to this node counts against its limit like a create.
        let _place = if self.has(&key) {
            None
        } else {
            let place = self.reserve(&key)?;
            if place.is_none() {
                return Err(ShoalError::unavailable(
                    format!("shard {}/{} is being created by another request", key.0, key.1),
                    Duration::from_millis(200),
                ));
            }
            place
        };
        let (_busy, progress) = snaps.begin(&key, Operation::Restore, &snapshot_id)?;
        let started = Instant::now();
        let dir = self.dir(&key);
        let staging = shoal_snapshot::sibling(&dir, "restore");
        let source = RestoreSource { collection: key.0.to_string(), shard: key.1, id: snapshot_id };
        let context = |e: ShoalError| e.context(format!("restore of shard {}/{}", key.0, key.1));
        // Everything up to here leaves the node's shards as they were.
        let m = shoal_snapshot::restore_to_staging(&snaps.store, &source, &staging, &snaps.restore_options(self), progress)
            .await
            .map_err(|e| context(snapshot_error(e)))?;
        if m.shard_count == 0 || key.1 >= m.shard_count {
            let _ = std::fs::remove_dir_all(&staging);
            return Err(context(ShoalError::invalid(format!("the snapshot says the collection has {} shards", m.shard_count))));
        }
        let written = {
            let staging = staging.clone();
            crate::host::blocking(move || {
                shard_file::write(&staging, &ShardFile::new_copy(m.shard_count))
                    .map_err(|e| ShoalError::internal(format!("writing {}: {e}", staging.display())))
            })
            .await
        };
        if let Err(e) = written {
            let _ = std::fs::remove_dir_all(&staging);
            return Err(context(e));
        }
        // The swap: the old shard (if any) leaves service, the new one
        // moves in; if the move fails, the old one comes back.
        let old = self.take_out(&key).await;
        let swapped = {
            let (staging, dir) = (staging.clone(), dir.clone());
            crate::host::blocking(move || shoal_snapshot::swap_into_place(&staging, &dir).map_err(snapshot_error)).await
        };
        if let Err(e) = swapped {
            let _ = std::fs::remove_dir_all(&staging);
            if old {
                self.reopen(&key, &dir).await.map_err(context)?;
            }
            return Err(context(e));
        }
        self.reopen(&key, &dir).await.map_err(context)?;
        tracing::info!(collection = %key.0, shard = key.1, id = %m.id, points = m.points, "shard restored from snapshot");
        record(&key, "restore", m.image_bytes, started.elapsed());
        self.stats(v1::ShardStatsRequest { shard: Some(v1::ShardId { collection: key.0.to_string(), shard: key.1 }) }).await
    }

    /// Snapshots of a collection in this node's store.
    pub async fn list_snapshots(&self, req: v1::ListSnapshotsRequest) -> Result<v1::ListSnapshotsResponse, ShoalError> {
        let v1::ListSnapshotsRequest { collection, shard } = req;
        let name = CollectionName::parse(&collection)?;
        let snaps = self.snapshots()?;
        // Completeness needs every shard's manifest, whichever were asked for.
        let listed = shoal_snapshot::list_snapshots(&snaps.store, name.as_str(), None).await.map_err(snapshot_error)?;
        let collection_snapshots = shoal_snapshot::summarize(&listed).iter().map(collection_snapshot).collect();
        let snapshots = listed
            .into_iter()
            .filter(|l| shard.is_none_or(|s| s == l.shard))
            .map(|l| match l.manifest {
                Ok(m) => snapshot_info(&m, 0),
                Err(e) => {
                    v1::SnapshotInfo { collection: l.collection, shard: l.shard, id: l.id, error: e.to_string(), ..Default::default() }
                }
            })
            .collect();
        Ok(v1::ListSnapshotsResponse { snapshots, collection_snapshots })
    }

    /// Applies retention to a collection's snapshots.
    pub async fn prune_snapshots(&self, req: v1::PruneSnapshotsRequest) -> Result<v1::PruneSnapshotsResponse, ShoalError> {
        let v1::PruneSnapshotsRequest { collection, shard, keep_last } = req;
        let name = CollectionName::parse(&collection)?;
        let snaps = self.snapshots()?;
        let keep = if keep_last == 0 { snaps.cfg.keep_last } else { keep_last };
        let grace = Duration::from_secs(snaps.cfg.gc_grace_secs);
        let r = shoal_snapshot::prune(&snaps.store, name.as_str(), shard, keep as usize, grace).await.map_err(snapshot_error)?;
        Ok(v1::PruneSnapshotsResponse {
            deleted: r.deleted_snapshots.iter().map(|(s, id)| format!("{s}/{id}")).collect(),
            kept_snapshots: r.kept_snapshots,
            deleted_chunks: r.deleted_chunks,
            deleted_bytes: r.deleted_bytes,
            referenced_chunks: r.referenced_chunks,
            young_unreferenced_chunks: r.young_unreferenced_chunks,
            chunk_pass_skipped: r.chunk_pass_skipped.unwrap_or_default(),
            deleted_incomplete: r.deleted_incomplete.iter().map(collection_snapshot).collect(),
            young_incomplete: r.young_incomplete.iter().map(collection_snapshot).collect(),
        })
    }

    /// Snapshots and restores running on this node.
    pub fn snapshot_progress(&self) -> v1::SnapshotProgressResponse {
        v1::SnapshotProgressResponse { running: self.snapshots.as_ref().map(Snapshots::all_progress).unwrap_or_default() }
    }
}

/// Removes what a restore that died left beside the shard directories of
/// `collection_dir`: staging directories, and a shard renamed aside whose
/// replacement never arrived (put back).
pub(crate) fn clean_up_after_restores(collection_dir: &Path) -> std::io::Result<()> {
    for entry in std::fs::read_dir(collection_dir)? {
        let entry = entry?;
        let name = entry.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix('.') else { continue };
        let Some((shard, what)) = rest.split_once('.') else { continue };
        if what.starts_with("restore-") {
            tracing::warn!(path = %entry.path().display(), "removing the staging directory of an interrupted restore");
            std::fs::remove_dir_all(entry.path())?;
        } else if what.starts_with("replaced-") {
            let home: PathBuf = collection_dir.join(shard);
            if home.exists() {
                std::fs::remove_dir_all(entry.path())?;
            } else {
                tracing::warn!(path = %home.display(), "putting back a shard whose restore was interrupted");
                std::fs::rename(entry.path(), &home)?;
            }
        }
    }
    Ok(())
}

/// Waits until nothing but `index` itself holds the environment (searches
/// in flight finish in milliseconds), so it can close before another
/// environment opens at its path.
pub(crate) async fn wait_for_last_user(index: Arc<Index>) {
    let deadline = Instant::now() + Duration::from_secs(30);
    while Arc::strong_count(&index) > 1 && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    drop(index);
}

/// A finished snapshot or restore in the metrics.
fn record(key: &ShardKey, operation: &'static str, bytes: u64, took: Duration) {
    let m = crate::metrics::get();
    let [c, s] = crate::metrics::labels(key);
    let labels = [c, s, opentelemetry::KeyValue::new("operation", operation)];
    m.snapshot_bytes.add(bytes, &labels);
    m.snapshot_duration.record(took.as_secs_f64(), &labels);
}
