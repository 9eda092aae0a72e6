//! A digest of a shard's content, for telling whether two copies of it
//! (replicas, or a copy before and after a move) hold the same points.
//!
//! It covers what a reader can observe of every live point: its external
//! id, its stored vector and its payload, taken in external-id order.
//! Internal ids, graph links, tombstones and the batch log are left out on
//! purpose: two copies that agree on every point may have been built along
//! different paths (one restored from a snapshot and caught up, the other
//! written batch by batch) and still answer every read alike.
//!
//! This is a full scan, the one kind of read the write path must never do;
//! it is for operators' checks (`shoalctl shard verify`) and tests.

use heed::{RoTxn, WithoutTls};

use std::collections::HashMap;

use roaring::RoaringBitmap;

use crate::codec;
use crate::error::{Error, Result};
use crate::fields::Schema;
use crate::fields::columns::ColumnCache;
use crate::fields::postings;
use crate::fields::update::{Entries, entries};
use crate::params::IndexParams;
use crate::store::Store;

/// What [`crate::Snapshot::digest`] returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContentDigest {
    /// Live points hashed.
    pub points: u64,
    /// BLAKE3 over every live point in external-id order, the field
    /// indexes' names and types, and `index_mismatches`.
    pub blake3: [u8; 32],
    /// Entries of the field indexes that disagree with the payloads: a
    /// point's value missing from its set or column, or a set holding more
    /// ids than payloads put there. 0 on a healthy copy; anything else is
    /// damage (`shard verify` names it) that a resync repairs.
    pub index_mismatches: u64,
}

impl ContentDigest {
    /// The hash as lowercase hex, as it is shown and compared.
    pub fn hex(&self) -> String {
        blake3::Hash::from_bytes(self.blake3).to_hex().to_string()
    }
}

pub(crate) fn content_digest(store: &Store, txn: &RoTxn<'_, WithoutTls>, params: &IndexParams) -> Result<ContentDigest> {
    let (vector_bytes, per_block) = (params.vector_bytes(), params.vectors_per_block());
    let corrupt = |detail: String| Error::Corrupt { path: store.path.clone(), detail };
    let mut hasher = blake3::Hasher::new();
    let mut check = IndexCheck::new(store, txn, &mut hasher)?;
    let mut points = 0u64;
    // The id map's keys are big-endian external ids: LMDB's order is the
    // ids' numeric order, the same on every copy.
    for item in store.dbs.external.iter(txn).map_err(|e| store.err(e))? {
        let (external, internal) = item.map_err(|e| store.err(e))?;
        let internal = codec::decode_mapped_id(internal).ok_or_else(|| corrupt(format!("id map entry {external} is malformed")))?;
        let vector = crate::session::stored_vector(store, txn, vector_bytes, per_block, internal)?;
        let payload = store.dbs.payloads.get(txn, internal).map_err(|e| store.err(e))?;
        if let Some(p) = payload {
            store.check_len(p.len(), || format!("the payload of node {internal}"))?;
        }
        // Lengths go in before the bytes so that no two different points
        // hash the same stream; the id goes in big-endian, as it is stored.
        hasher.update(&external.to_be_bytes());
        hasher.update(&(vector.len() as u64).to_le_bytes());
        hasher.update(vector);
        match payload {
            None => hasher.update(&[0]),
            Some(p) => hasher.update(&[1]).update(&(p.len() as u64).to_le_bytes()).update(p),
        };
        check.point(store, txn, internal, payload)?;
        points += 1;
    }
    let index_mismatches = check.finish(store, txn)?;
    hasher.update(&index_mismatches.to_le_bytes());
    Ok(ContentDigest { points, blake3: *hasher.finalize().as_bytes(), index_mismatches })
}

/// Holds the field indexes to the payloads, point by point.
struct IndexCheck {
    schema: Schema,
    /// Every set read so far, by key.
    sets: HashMap<Vec<u8>, RoaringBitmap>,
    /// The ids the payloads put in each set.
    expected: HashMap<Vec<u8>, RoaringBitmap>,
    columns: ColumnCache,
    mismatches: u64,
}

impl IndexCheck {
    fn new(store: &Store, txn: &RoTxn<'_, WithoutTls>, hasher: &mut blake3::Hasher) -> Result<IndexCheck> {
        let schema = Schema::read(store, txn)?;
        // Names and types only: copies build an index each at its own pace.
        for def in &schema.fields {
            hasher.update(&(def.name.len() as u64).to_le_bytes()).update(def.name.as_bytes()).update(def.kind.name().as_bytes());
        }
        Ok(IndexCheck { schema, sets: HashMap::new(), expected: HashMap::new(), columns: ColumnCache::default(), mismatches: 0 })
    }

    fn point(&mut self, store: &Store, txn: &RoTxn<'_, WithoutTls>, internal: u32, payload: Option<&[u8]>) -> Result<()> {
        if self.schema.is_empty() {
            return Ok(());
        }
        let object = payload.and_then(crate::fields::value::payload_object);
        for def in self.schema.fields.iter().filter(|d| d.covers(internal)) {
            let Entries { sets, column } = entries(def, object.as_ref());
            for key in sets {
                let set = match self.sets.entry(key.clone()) {
                    std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
                    std::collections::hash_map::Entry::Vacant(e) => e.insert(postings::read(store, txn, &key)?),
                };
                if !set.contains(internal) {
                    self.mismatches += 1;
                }
                self.expected.entry(key).or_default().insert(internal);
            }
            if let Some(n) = column {
                // SAFETY: the cache is used with this one transaction.
                if unsafe { self.columns.get(store, txn, def.id, internal) }? != n {
                    self.mismatches += 1;
                }
            }
        }
        Ok(())
    }

    /// The mismatches found, with every id a set holds that the payloads
    /// did not put there (a stale one).
    fn finish(self, store: &Store, txn: &RoTxn<'_, WithoutTls>) -> Result<u64> {
        let mut mismatches = self.mismatches;
        for def in &self.schema.fields {
            for item in store.dbs.postings.prefix(txn, &def.id.to_be_bytes()).map_err(|e| store.err(e))? {
                let (key, value) = item.map_err(|e| store.err(e))?;
                let held = postings::decode(store, key, value)?;
                mismatches += match self.expected.get(key) {
                    Some(expected) => held.difference_len(expected),
                    None => held.len(),
                };
            }
        }
        Ok(mismatches)
    }
}

#[cfg(test)]
mod tests {
    use crate::fields::postings;
    use crate::{Batch, FieldType, Index, IndexOptions, IndexParams, Metric, Op, PAYLOAD_JSON, Point};

    /// An index entry lost or left behind (damage the file's own checks
    /// cannot see) shows in the digest, and a copy without it differs.
    #[test]
    fn damaged_field_indexes_show_in_the_digest() {
        let dir = tempfile::tempdir().unwrap();
        let opts = IndexOptions { build_threads: 1, durable: false, ..IndexOptions::default() };
        let index = Index::open_or_create(dir.path(), IndexParams::new(4, Metric::Euclidean), opts).unwrap();
        index.create_field_index("tags", FieldType::Keyword).unwrap();
        index.create_field_index("n", FieldType::Integer).unwrap();
        let point = |id: u64| {
            let mut payload = vec![PAYLOAD_JSON];
            payload.extend(format!(r#"{{"tags": ["t{}"], "n": {id}}}"#, id % 3).bytes());
            Op::Upsert(Point { id, vector: vec![id as f32, 1.0, 2.0, 3.0], payload: Some(payload) })
        };
        index.apply(Batch { ops: (0..30).map(point).collect(), source: None }).unwrap();
        let healthy = index.snapshot().unwrap().digest().unwrap();
        assert_eq!(healthy.index_mismatches, 0);
        let tags = index.field_indexes().unwrap();
        assert_eq!(tags.iter().map(|i| i.points).collect::<Vec<_>>(), vec![30, 30]);
        let store = &index.store;
        let schema = crate::fields::Schema::read(store, &store.env.read_txn().unwrap()).unwrap();
        let id = schema.get("tags").unwrap().id;
        let key = postings::keyword_key(id, "t1");
        let mut wtxn = store.env.write_txn().unwrap();
        let mut set = postings::read(store, &wtxn, &key).unwrap();
        let first = set.min().unwrap();
        set.remove(first);
        set.insert(10_000);
        store.dbs.postings.put(&mut wtxn, &key, &postings::encode(&set)).unwrap();
        wtxn.commit().unwrap();
        let damaged = index.snapshot().unwrap().digest().unwrap();
        assert_eq!(damaged.index_mismatches, 2, "one id missing, one stale");
        assert_ne!(damaged.blake3, healthy.blake3);
    }
}
