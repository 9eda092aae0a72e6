//! Listing the snapshots in a store.

use futures::{StreamExt, TryStreamExt};
use object_store::ObjectStore;
use object_store::path::Path;

use crate::error::{Result, SnapshotError};
use crate::layout;
use crate::manifest::Manifest;
use crate::objects::read_manifest;
use crate::store_url::SnapshotStore;

/// A published snapshot, or a manifest that could not be read.
#[derive(Debug)]
pub struct Listed {
    /// Collection name.
    pub collection: String,
    /// Shard number.
    pub shard: u32,
    /// Snapshot id.
    pub id: String,
    /// The manifest, or why it is unusable (e.g. another format version).
    pub manifest: std::result::Result<Manifest, SnapshotError>,
}

/// Manifest keys under `prefix` as (collection, shard, id), sorted by
/// collection, shard, then id (ids sort by creation time).
pub(crate) async fn manifest_keys(store: &dyn ObjectStore, prefix: &Path) -> Result<Vec<(String, u32, String)>> {
    let metas: Vec<_> = store
        .list(Some(prefix))
        .try_collect()
        .await
        .map_err(|e| SnapshotError::store("list", prefix, e))?;
    let mut keys: Vec<_> = metas.iter().filter_map(|m| layout::parse_manifest_key(&m.location)).collect();
    keys.sort();
    Ok(keys)
}

/// Snapshots of a collection (of one shard if given), oldest first.
pub async fn list_snapshots(store: &SnapshotStore, collection: &str, shard: Option<u32>) -> Result<Vec<Listed>> {
    layout::validate_collection(collection)?;
    let prefix = match shard {
        Some(s) => Path::from(format!("{}/{s}", layout::collection_prefix(collection))),
        None => layout::collection_prefix(collection),
    };
    let keys = manifest_keys(store.store.as_ref(), &prefix).await?;
    let listed = futures::stream::iter(keys)
        .map(|(collection, shard, id)| async move {
            let manifest = read_manifest(&store.store, &collection, shard, &id).await;
            match manifest {
                // The store itself failing is an error of the listing.
                Err(e @ SnapshotError::Store { .. }) => Err(e),
                // Pruned since the listing.
                Err(SnapshotError::ManifestMissing { .. }) => Ok(None),
                manifest => Ok(Some(Listed { collection, shard, id, manifest })),
            }
        })
        .buffered(16)
        .try_collect::<Vec<_>>()
        .await?;
    Ok(listed.into_iter().flatten().collect())
}
