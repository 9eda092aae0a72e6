//! Taking a snapshot: the engine's copy streams into chunks on a blocking
//! thread; the async side hashes, skips chunks the store has, compresses
//! and uploads the others concurrently; the manifest goes last.
//!
//! Nothing is staged on local disk: at most `concurrency` chunks are in the
//! channel and as many in flight, so memory is bounded by about
//! `3 × concurrency × chunk_size`.

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use object_store::{ObjectStore, ObjectStoreExt, PutPayload};
use shoal_engine::{CopyMode, Index};
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;

use crate::chunk::{self, ChunkWriter, RawChunk};
use crate::error::{Result, SnapshotError, join_error};
use crate::layout;
use crate::manifest::{ChunkRef, CompressionDoc, FORMAT, FORMAT_VERSION, Manifest, OffsetDoc, ParamsDoc};
use crate::objects::{TransferOptions, exists, put_object};
use crate::progress::{Phase, Progress};
use crate::store_url::SnapshotStore;

/// How snapshots are taken.
#[derive(Clone, Debug)]
pub struct SnapshotOptions {
    /// zstd level, 1 (fast) to 22 (small). Default 3.
    pub zstd_level: i32,
    /// Raw bytes per chunk. Smaller chunks make incremental snapshots
    /// smaller and mean more objects. Default 4 MiB.
    pub chunk_size: usize,
    /// Chunks uploading at once. Default 8.
    pub concurrency: usize,
    /// Chunks compressing at once (CPU threads). Default: the CPU count.
    pub compress_threads: usize,
    /// LMDB copy mode. `Plain` keeps page numbers, so unchanged regions
    /// give the same chunks from one snapshot to the next; `Compact`
    /// renumbers pages and defeats chunk reuse. Default `Plain`.
    pub copy_mode: CopyMode,
    /// Multipart uploads.
    pub transfer: TransferOptions,
}

impl Default for SnapshotOptions {
    fn default() -> Self {
        SnapshotOptions {
            zstd_level: 3,
            chunk_size: 4 << 20,
            concurrency: 8,
            compress_threads: std::thread::available_parallelism().map_or(1, usize::from),
            copy_mode: CopyMode::Plain,
            transfer: TransferOptions::default(),
        }
    }
}

impl SnapshotOptions {
    /// Checks the settings.
    pub fn validate(&self) -> Result<()> {
        let bad = |m: String| Err(SnapshotError::Invalid(m));
        if !(1..=22).contains(&self.zstd_level) {
            return bad(format!("zstd level must be 1 to 22, got {}", self.zstd_level));
        }
        if !(4096..=crate::MAX_CHUNK_SIZE as usize).contains(&self.chunk_size) {
            return bad(format!("chunk size must be 4 KiB to 1 GiB, got {}", self.chunk_size));
        }
        if self.concurrency == 0 || self.compress_threads == 0 {
            return bad("concurrency and compress_threads must be at least 1".into());
        }
        Ok(())
    }
}

/// Which shard a snapshot is of.
#[derive(Clone, Debug)]
pub struct SnapshotTarget {
    /// Collection name.
    pub collection: String,
    /// Shard number.
    pub shard: u32,
    /// Shards of the collection (recorded for restores).
    pub shard_count: u32,
    /// None: a new id from the clock.
    pub id: Option<String>,
}

struct Stored {
    index: usize,
    chunk: ChunkRef,
    reused: bool,
}

/// Snapshots `index` into `store` and returns the published manifest.
/// Ingest and searches on the index go on meanwhile; the snapshot is the
/// state of one commit. On error nothing is published (chunks already
/// uploaded stay until a prune removes them).
pub async fn create_snapshot(
    store: &SnapshotStore,
    index: Arc<Index>,
    target: &SnapshotTarget,
    opts: &SnapshotOptions,
    progress: Arc<Progress>,
) -> Result<Manifest> {
    opts.validate()?;
    layout::validate_collection(&target.collection)?;
    let id = match &target.id {
        Some(id) => id.clone(),
        None => layout::new_snapshot_id(),
    };
    layout::validate_id(&id)?;
    let objects = &store.store;
    let manifest_key = layout::manifest_key(&target.collection, target.shard, &id);
    if exists(objects, &manifest_key).await?.is_some() {
        return Err(SnapshotError::AlreadyExists { collection: target.collection.clone(), shard: target.shard, id });
    }
    let started_ms = now_ms();
    // Tells a concurrent prune that chunks are being added (see prune.rs).
    let marker = layout::inflight_key(&target.collection, target.shard, &id);
    let marker_body = format!("{{\"id\":\"{id}\",\"started_at_ms\":{started_ms}}}");
    objects.put(&marker, PutPayload::from(Bytes::from(marker_body))).await.map_err(|e| SnapshotError::store("put", &marker, e))?;
    let result = upload(objects, index, target, &id, started_ms, opts, &progress).await;
    if let Err(e) = objects.delete(&marker).await {
        tracing::warn!(key = %marker, error = %e, "could not remove the in-flight marker; the next prune will");
    }
    let manifest = result?;
    progress.set_phase(Phase::Done);
    Ok(manifest)
}

#[allow(clippy::too_many_arguments)]
async fn upload(
    objects: &Arc<dyn ObjectStore>,
    index: Arc<Index>,
    target: &SnapshotTarget,
    id: &str,
    started_ms: u64,
    opts: &SnapshotOptions,
    progress: &Arc<Progress>,
) -> Result<Manifest> {
    let (tx, rx) = mpsc::channel::<RawChunk>(opts.concurrency);
    let copy_progress = Arc::clone(progress);
    let (chunk_size, mode) = (opts.chunk_size, opts.copy_mode);
    progress.set_phase(Phase::Transferring);
    let copy = tokio::task::spawn_blocking(move || -> Result<_> {
        copy_progress.set_total(index.used_bytes()?);
        let mut w = ChunkWriter::new(tx, chunk_size, copy_progress);
        let info = index.copy_to(mode, &mut w)?;
        let n = w.finish().map_err(|e| SnapshotError::io(index.path().join("data.mdb"), e))?;
        Ok((info, n))
    });

    let cpu = Arc::new(Semaphore::new(opts.compress_threads));
    let uploaded: Result<Vec<Stored>> = ReceiverStream::new(rx)
        .map(|raw| store_chunk(Arc::clone(objects), raw, opts.clone(), Arc::clone(&cpu), Arc::clone(progress)))
        .buffer_unordered(opts.concurrency)
        .try_collect()
        .await;
    // If an upload failed, the receiver is gone by now, so the copy stops
    // at its next chunk; wait for it either way.
    let copied = copy.await.map_err(join_error)?;
    let mut stored = uploaded?;
    let (info, n) = copied?;
    stored.sort_by_key(|s| s.index);
    if stored.len() != n || stored.iter().enumerate().any(|(i, s)| s.index != i) {
        return Err(SnapshotError::Internal(format!("{} of {n} chunks stored", stored.len())));
    }

    progress.set_phase(Phase::Finishing);
    // A prune that ran since a reused chunk was seen may have deleted it
    // (it was unreferenced then). Check again right before publishing.
    let reused: HashSet<String> = stored.iter().filter(|s| s.reused).map(|s| s.chunk.hash.clone()).collect();
    futures::stream::iter(reused)
        .map(|h| {
            let objects = Arc::clone(objects);
            async move {
                let key = layout::chunk_key(&h);
                match exists(&objects, &key).await? {
                    Some(_) => Ok(()),
                    None => Err(SnapshotError::ChunkVanished { key: key.to_string() }),
                }
            }
        })
        .buffer_unordered(opts.concurrency)
        .try_collect::<Vec<()>>()
        .await?;

    let chunks: Vec<ChunkRef> = stored.iter().map(|s| s.chunk.clone()).collect();
    let fresh = stored.iter().filter(|s| !s.reused);
    let manifest = Manifest {
        format: FORMAT.into(),
        format_version: FORMAT_VERSION,
        id: id.to_owned(),
        collection: target.collection.clone(),
        shard: target.shard,
        shard_count: target.shard_count,
        created_at: layout::utc_stamp(started_ms),
        created_at_ms: started_ms,
        index: ParamsDoc::of(&info.params),
        txn_id: info.txn_id,
        points: info.live,
        tombstones: info.tombstones,
        offsets: info.offsets.into_iter().map(|(source, offset)| OffsetDoc { source, offset }).collect(),
        copy_mode: match opts.copy_mode {
            CopyMode::Plain => "plain",
            CopyMode::Compact => "compact",
        }
        .into(),
        compression: CompressionDoc { codec: "zstd".into(), level: opts.zstd_level },
        chunk_size: opts.chunk_size as u64,
        image_bytes: info.bytes,
        stored_bytes: chunks.iter().map(|c| c.stored_len).sum(),
        uploaded_chunks: fresh.clone().count() as u64,
        uploaded_bytes: fresh.map(|s| s.chunk.stored_len).sum(),
        chunks,
    };
    let key = layout::manifest_key(&target.collection, target.shard, id);
    // The publish: a snapshot exists from this moment on.
    objects.put(&key, PutPayload::from(manifest.to_json())).await.map_err(|e| SnapshotError::store("put", &key, e))?;
    Ok(manifest)
}

/// Hashes a chunk; uploads it compressed unless the store has it.
async fn store_chunk(
    objects: Arc<dyn ObjectStore>,
    raw: RawChunk,
    opts: SnapshotOptions,
    cpu: Arc<Semaphore>,
    progress: Arc<Progress>,
) -> Result<Stored> {
    let objects = &objects;
    let RawChunk { index, data } = raw;
    let raw_len = data.len() as u64;
    let permit = cpu.acquire().await.map_err(|e| SnapshotError::Internal(e.to_string()))?;
    let (data, hash) = tokio::task::spawn_blocking(move || {
        let h = chunk::hash(&data);
        (data, h)
    })
    .await
    .map_err(join_error)?;
    drop(permit);
    let key = layout::chunk_key(&hash);
    if let Some(stored_len) = exists(objects, &key).await? {
        progress.add_chunk(0, true);
        return Ok(Stored { index, chunk: ChunkRef { hash, raw_len, stored_len }, reused: true });
    }
    let level = opts.zstd_level;
    let permit = cpu.acquire().await.map_err(|e| SnapshotError::Internal(e.to_string()))?;
    let compressed = tokio::task::spawn_blocking(move || chunk::compress(&data, level))
        .await
        .map_err(join_error)?
        .map_err(|e| SnapshotError::Internal(format!("zstd failed: {e}")))?;
    drop(permit);
    let stored_len = compressed.len() as u64;
    put_object(objects, &key, Bytes::from(compressed), &opts.transfer).await?;
    progress.add_chunk(stored_len, false);
    Ok(Stored { index, chunk: ChunkRef { hash, raw_len, stored_len }, reused: false })
}

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).map_or(0, |d| d.as_millis() as u64)
}
