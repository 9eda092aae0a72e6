//! Reading and writing single objects: chunk uploads (multipart when
//! large), whole or ranged downloads, manifests.

use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};

use crate::error::{Result, SnapshotError};
use crate::layout;
use crate::manifest::Manifest;

/// How objects move.
#[derive(Clone, Copy, Debug)]
pub struct TransferOptions {
    /// Objects larger than this are uploaded in parts (multipart upload).
    pub multipart_threshold: usize,
    /// Part size of multipart uploads (S3 wants at least 5 MiB).
    pub part_size: usize,
    /// Objects larger than this are downloaded as concurrent ranges.
    pub range_threshold: u64,
    /// Size of each range.
    pub range_size: u64,
}

impl Default for TransferOptions {
    fn default() -> Self {
        TransferOptions { multipart_threshold: 16 << 20, part_size: 8 << 20, range_threshold: 16 << 20, range_size: 8 << 20 }
    }
}

/// Uploads `data` to `key`: one PUT, or a multipart upload above the
/// threshold (aborted if it fails, so no parts linger).
pub async fn put_object(store: &Arc<dyn ObjectStore>, key: &Path, data: Bytes, t: &TransferOptions) -> Result<()> {
    if data.len() <= t.multipart_threshold {
        store.put(key, PutPayload::from(data)).await.map_err(|e| SnapshotError::store("put", key, e))?;
        return Ok(());
    }
    let upload = store.put_multipart(key).await.map_err(|e| SnapshotError::store("start multipart upload", key, e))?;
    let mut w = WriteMultipart::new_with_chunk_size(upload, t.part_size.max(5 << 20));
    w.put(data);
    w.finish().await.map_err(|e| SnapshotError::store("multipart upload", key, e))?;
    Ok(())
}

/// Downloads `key`, expected to be `expected_len` bytes. Large objects
/// come as concurrent ranges (after a HEAD that checks the size, so a
/// short object is reported as such, not as a failed range). A missing
/// object is `Ok(None)`; a size mismatch is `Err(found)` in the inner
/// result.
pub async fn get_object(
    store: &Arc<dyn ObjectStore>,
    key: &Path,
    expected_len: u64,
    t: &TransferOptions,
) -> Result<Option<std::result::Result<Bytes, u64>>> {
    let not_found = |e: &object_store::Error| matches!(e, object_store::Error::NotFound { .. });
    if expected_len > t.range_threshold && t.range_size > 0 {
        let meta = match store.head(key).await {
            Ok(m) => m,
            Err(e) if not_found(&e) => return Ok(None),
            Err(e) => return Err(SnapshotError::store("head", key, e)),
        };
        if meta.size != expected_len {
            return Ok(Some(Err(meta.size)));
        }
        let ranges = split_ranges(expected_len, t.range_size);
        let parts = match store.get_ranges(key, &ranges).await {
            Ok(p) => p,
            Err(e) if not_found(&e) => return Ok(None),
            Err(e) => return Err(SnapshotError::store("ranged get", key, e)),
        };
        let mut all = Vec::with_capacity(expected_len as usize);
        for p in parts {
            all.extend_from_slice(&p);
        }
        let found = all.len() as u64;
        return Ok(Some(if found == expected_len { Ok(Bytes::from(all)) } else { Err(found) }));
    }
    let got = match store.get(key).await {
        Ok(g) => g,
        Err(e) if not_found(&e) => return Ok(None),
        Err(e) => return Err(SnapshotError::store("get", key, e)),
    };
    let bytes = got.bytes().await.map_err(|e| SnapshotError::store("get", key, e))?;
    let found = bytes.len() as u64;
    Ok(Some(if found == expected_len { Ok(bytes) } else { Err(found) }))
}

/// `0..len` cut into ranges of `size` bytes.
pub(crate) fn split_ranges(len: u64, size: u64) -> Vec<Range<u64>> {
    (0..len.div_ceil(size)).map(|i| i * size..((i + 1) * size).min(len)).collect()
}

/// Reads and checks the manifest of one snapshot.
pub async fn read_manifest(store: &Arc<dyn ObjectStore>, collection: &str, shard: u32, id: &str) -> Result<Manifest> {
    layout::validate_collection(collection)?;
    layout::validate_id(id)?;
    let key = layout::manifest_key(collection, shard, id);
    let missing = || SnapshotError::ManifestMissing { collection: collection.to_owned(), shard, id: id.to_owned(), key: key.to_string() };
    let bytes = match store.get(&key).await {
        Ok(g) => g.bytes().await.map_err(|e| SnapshotError::store("get", &key, e))?,
        Err(object_store::Error::NotFound { .. }) => return Err(missing()),
        Err(e) => return Err(SnapshotError::store("get", &key, e)),
    };
    let m = Manifest::parse(key.as_ref(), &bytes)?;
    if m.collection != collection || m.shard != shard || m.id != id {
        return Err(SnapshotError::BadManifest {
            key: key.to_string(),
            reason: format!("it describes {}/{} snapshot {}", m.collection, m.shard, m.id),
        });
    }
    Ok(m)
}

/// True if the object exists.
pub(crate) async fn exists(store: &Arc<dyn ObjectStore>, key: &Path) -> Result<Option<u64>> {
    match store.head(key).await {
        Ok(m) => Ok(Some(m.size)),
        Err(object_store::Error::NotFound { .. }) => Ok(None),
        Err(e) => Err(SnapshotError::store("head", key, e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_cover_the_object_exactly() {
        assert_eq!(split_ranges(10, 4), vec![0..4, 4..8, 8..10]);
        assert_eq!(split_ranges(8, 4), vec![0..4, 4..8]);
        assert!(split_ranges(0, 4).is_empty());
    }
}
