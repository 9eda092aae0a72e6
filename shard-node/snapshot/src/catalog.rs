//! Listing the snapshots in a store, one manifest at a time or summarised
//! per collection snapshot (every shard's manifest of one id).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

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
    let metas: Vec<_> = store.list(Some(prefix)).try_collect().await.map_err(|e| SnapshotError::store("list", prefix, e))?;
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

/// At most this many shards are named in [`CollectionSnapshot::missing`]
/// (a damaged manifest could claim billions of shards).
pub const MAX_LISTED_MISSING: usize = 1024;

/// One snapshot id of a collection, over all its shards.
///
/// A collection snapshot is taken by every shard node under the same id,
/// and each shard publishes its own manifest; there is no object for the
/// collection snapshot as a whole. It is **complete** when every shard
/// `0..shard_count` has a readable manifest. One whose node died midway
/// stays incomplete for good, and one being taken right now is incomplete
/// until its last shard publishes: the manifests alone cannot tell the two
/// apart, so [`newest_created_at_ms`](Self::newest_created_at_ms) (and
/// [`age`](Self::age)) are there to apply a grace period.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct CollectionSnapshot {
    /// Collection name.
    pub collection: String,
    /// Snapshot id.
    pub id: String,
    /// The collection's shard count as the readable manifests record it;
    /// None when no manifest is readable or they disagree (see
    /// [`shard_counts`](Self::shard_counts)).
    pub shard_count: Option<u32>,
    /// Every distinct shard count the readable manifests record, ascending:
    /// one value normally, several when they disagree, none when no
    /// manifest is readable.
    pub shard_counts: Vec<u32>,
    /// Shards with a readable manifest, ascending.
    pub shards: Vec<u32>,
    /// Shards whose manifest exists but cannot be read (damaged, another
    /// format version), with the reason, by shard.
    pub unreadable: Vec<(u32, String)>,
    /// Shards of `0..shard_count` with no manifest at all, ascending (the
    /// largest recorded count when they disagree; none when no manifest is
    /// readable), at most [`MAX_LISTED_MISSING`] of them.
    pub missing: Vec<u32>,
    /// Creation time of the oldest readable manifest, milliseconds since
    /// the epoch.
    pub oldest_created_at_ms: Option<u64>,
    /// Creation time of the newest readable manifest, milliseconds since
    /// the epoch: how recently a shard of this snapshot started.
    pub newest_created_at_ms: Option<u64>,
    /// Every shard `0..shard_count` has a readable manifest, the manifests
    /// agree on the shard count, and none is unreadable or names a shard
    /// outside the count. Only a complete snapshot restores as a whole
    /// collection.
    pub complete: bool,
}

impl CollectionSnapshot {
    /// Time since the newest readable manifest was created (zero if that is
    /// in the future); None if no manifest is readable.
    pub fn age(&self, now_ms: u64) -> Option<Duration> {
        self.newest_created_at_ms.map(|t| Duration::from_millis(now_ms.saturating_sub(t)))
    }

    /// Why the snapshot is not complete, for people; None if it is.
    pub fn why_incomplete(&self) -> Option<String> {
        if self.complete {
            return None;
        }
        let list = |v: &mut dyn Iterator<Item = u32>| v.map(|s| s.to_string()).collect::<Vec<_>>().join(", ");
        let mut why = Vec::new();
        match self.shard_counts.as_slice() {
            [] => why.push("no readable manifest".to_owned()),
            [n] => {
                if !self.missing.is_empty() {
                    why.push(format!("no manifest for shard {} of {n}", list(&mut self.missing.iter().copied())));
                }
                let outside: Vec<u32> = self.shards.iter().copied().filter(|s| s >= n).collect();
                if !outside.is_empty() {
                    why.push(format!("shard {} is outside the shard count {n}", list(&mut outside.into_iter())));
                }
            }
            counts => why.push(format!("the manifests disagree on the shard count ({})", list(&mut counts.iter().copied()))),
        }
        for (shard, reason) in &self.unreadable {
            why.push(format!("shard {shard}: {reason}"));
        }
        Some(why.join("; "))
    }

    /// Every shard with a manifest, readable or not, ascending.
    pub(crate) fn manifest_shards(&self) -> Vec<u32> {
        let all: BTreeSet<u32> = self.shards.iter().copied().chain(self.unreadable.iter().map(|(s, _)| *s)).collect();
        all.into_iter().collect()
    }
}

/// Groups listed manifests by collection and snapshot id and says of each
/// snapshot whether it is complete; sorted by collection, then id (ids
/// sort by creation time). A pure function over what [`list_snapshots`]
/// returns.
pub fn summarize(listed: &[Listed]) -> Vec<CollectionSnapshot> {
    let mut by_id: BTreeMap<(&str, &str), Vec<&Listed>> = BTreeMap::new();
    for l in listed {
        by_id.entry((&l.collection, &l.id)).or_default().push(l);
    }
    by_id.into_iter().map(|((collection, id), of_id)| summarize_one(collection, id, &of_id)).collect()
}

fn summarize_one(collection: &str, id: &str, of_id: &[&Listed]) -> CollectionSnapshot {
    let mut shards = BTreeSet::new();
    let mut unreadable = BTreeMap::new();
    let mut counts = BTreeSet::new();
    let (mut oldest, mut newest) = (None::<u64>, None::<u64>);
    for l in of_id {
        match &l.manifest {
            Ok(m) => {
                shards.insert(l.shard);
                counts.insert(m.shard_count);
                oldest = Some(oldest.map_or(m.created_at_ms, |t| t.min(m.created_at_ms)));
                newest = Some(newest.map_or(m.created_at_ms, |t| t.max(m.created_at_ms)));
            }
            Err(e) => {
                unreadable.insert(l.shard, e.to_string());
            }
        }
    }
    let shard_count = if counts.len() == 1 { counts.first().copied() } else { None };
    let missing: Vec<u32> = match counts.last() {
        Some(&n) => (0..n).filter(|s| !shards.contains(s) && !unreadable.contains_key(s)).take(MAX_LISTED_MISSING).collect(),
        None => Vec::new(),
    };
    let complete = match shard_count {
        // All of 0..n present (readable), nothing unreadable, nothing beyond n.
        Some(n) => n > 0 && unreadable.is_empty() && shards.len() == n as usize && shards.iter().all(|&s| s < n),
        None => false,
    };
    CollectionSnapshot {
        collection: collection.to_owned(),
        id: id.to_owned(),
        shard_count,
        shard_counts: counts.into_iter().collect(),
        shards: shards.into_iter().collect(),
        unreadable: unreadable.into_iter().collect(),
        missing,
        oldest_created_at_ms: oldest,
        newest_created_at_ms: newest,
        complete,
    }
}

/// The snapshots of a collection by id, oldest first, each saying whether
/// it is complete: [`list_snapshots`] then [`summarize`].
pub async fn list_collection_snapshots(store: &SnapshotStore, collection: &str) -> Result<Vec<CollectionSnapshot>> {
    Ok(summarize(&list_snapshots(store, collection, None).await?))
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::manifest::tests::sample;

    /// A readable manifest of `docs` shard `shard` of snapshot `id`.
    pub(crate) fn ok(id: &str, shard: u32, shard_count: u32, created_at_ms: u64) -> Listed {
        let m = Manifest { id: id.into(), shard, shard_count, created_at_ms, ..sample() };
        Listed { collection: "docs".into(), shard, id: id.into(), manifest: Ok(m) }
    }

    /// A manifest of a newer format version.
    pub(crate) fn unreadable(id: &str, shard: u32) -> Listed {
        let manifest = Err(SnapshotError::UnsupportedFormat { key: format!("snapshots/docs/{shard}/{id}.json"), found: 2, supported: 1 });
        Listed { collection: "docs".into(), shard, id: id.into(), manifest }
    }

    #[test]
    fn every_shard_published_is_complete() {
        let s = summarize(&[ok("a", 0, 3, 1_000), ok("a", 1, 3, 3_000), ok("a", 2, 3, 2_000)]);
        assert_eq!(
            s,
            vec![CollectionSnapshot {
                collection: "docs".into(),
                id: "a".into(),
                shard_count: Some(3),
                shard_counts: vec![3],
                shards: vec![0, 1, 2],
                unreadable: vec![],
                missing: vec![],
                oldest_created_at_ms: Some(1_000),
                newest_created_at_ms: Some(3_000),
                complete: true,
            }]
        );
        assert_eq!(s[0].why_incomplete(), None);
        assert_eq!(s[0].age(5_000), Some(Duration::from_secs(2)));
        assert_eq!(s[0].age(0), Some(Duration::ZERO), "a manifest from the future is brand new");
        let single = summarize(&[ok("b", 0, 1, 7)]);
        assert!(single[0].complete, "{single:?}");
    }

    #[test]
    fn a_shard_without_a_manifest_makes_it_incomplete() {
        let s = summarize(&[ok("a", 0, 3, 1_000), ok("a", 1, 3, 1_500)]);
        assert_eq!((s[0].shard_count, &s[0].shards[..], &s[0].missing[..]), (Some(3), &[0, 1][..], &[2][..]));
        assert!(!s[0].complete);
        assert_eq!((s[0].oldest_created_at_ms, s[0].newest_created_at_ms), (Some(1_000), Some(1_500)));
        assert_eq!(s[0].why_incomplete().as_deref(), Some("no manifest for shard 2 of 3"));
        let s = summarize(&[ok("a", 1, 4, 0)]);
        assert_eq!(s[0].missing, [0, 2, 3]);
        assert_eq!(s[0].why_incomplete().as_deref(), Some("no manifest for shard 0, 2, 3 of 4"));
    }

    #[test]
    fn disagreeing_shard_counts_are_reported_and_never_complete() {
        let s = summarize(&[ok("a", 0, 3, 0), ok("a", 1, 2, 0)]);
        assert_eq!((s[0].shard_count, &s[0].shard_counts[..]), (None, &[2, 3][..]));
        assert_eq!(s[0].missing, [2], "missing against the largest count");
        assert!(!s[0].complete);
        assert!(s[0].why_incomplete().unwrap().contains("disagree on the shard count (2, 3)"), "{:?}", s[0].why_incomplete());
        // All shards there, but two of them say 2 shards: still not complete.
        let s = summarize(&[ok("a", 0, 3, 0), ok("a", 1, 2, 0), ok("a", 2, 3, 0)]);
        assert!(!s[0].complete && s[0].missing.is_empty(), "{s:?}");
    }

    #[test]
    fn an_unreadable_manifest_is_reported_and_never_complete() {
        let s = summarize(&[ok("a", 0, 3, 10), ok("a", 1, 3, 20), unreadable("a", 2)]);
        assert_eq!((&s[0].shards[..], &s[0].missing[..]), (&[0, 1][..], &[][..]), "an unreadable manifest is not missing");
        assert_eq!(s[0].unreadable.len(), 1);
        assert_eq!(s[0].unreadable[0].0, 2);
        assert!(s[0].unreadable[0].1.contains("format version 2"), "{:?}", s[0].unreadable);
        assert!(!s[0].complete);
        assert!(s[0].why_incomplete().unwrap().starts_with("shard 2: manifest"), "{:?}", s[0].why_incomplete());
        assert_eq!(s[0].manifest_shards(), [0, 1, 2]);

        // Nothing readable: no count, no times, nothing known to be missing.
        let s = summarize(&[unreadable("b", 1)]);
        assert_eq!((s[0].shard_count, s[0].shard_counts.len(), s[0].missing.len()), (None, 0, 0));
        assert_eq!((s[0].newest_created_at_ms, s[0].age(10)), (None, None));
        assert!(!s[0].complete);
        assert!(s[0].why_incomplete().unwrap().starts_with("no readable manifest; shard 1:"), "{:?}", s[0].why_incomplete());
    }

    #[test]
    fn shards_outside_the_count_and_absurd_counts_are_not_complete() {
        let s = summarize(&[ok("a", 0, 2, 0), ok("a", 1, 2, 0), ok("a", 2, 2, 0)]);
        assert!(!s[0].complete && s[0].missing.is_empty(), "{s:?}");
        assert_eq!(s[0].why_incomplete().as_deref(), Some("shard 2 is outside the shard count 2"));
        let s = summarize(&[ok("a", 0, 0, 0)]);
        assert!(!s[0].complete, "{s:?}");
        // A damaged count does not make the listing allocate billions.
        let s = summarize(&[ok("a", 0, u32::MAX, 0)]);
        assert_eq!((s[0].missing.len(), s[0].missing[0], s[0].complete), (MAX_LISTED_MISSING, 1, false));
    }

    #[test]
    fn snapshots_are_grouped_by_collection_and_id_in_order() {
        let mut other = ok("a", 0, 1, 0);
        other.collection = "other".into();
        let s = summarize(&[ok("b", 1, 2, 0), other, ok("a", 0, 2, 0), ok("b", 0, 2, 0), ok("a", 1, 2, 0), ok("c", 0, 2, 0)]);
        let got: Vec<_> = s.iter().map(|s| (s.collection.as_str(), s.id.as_str(), s.complete)).collect();
        assert_eq!(got, [("docs", "a", true), ("docs", "b", true), ("docs", "c", false), ("other", "a", true)]);
        assert!(summarize(&[]).is_empty());
    }
}
