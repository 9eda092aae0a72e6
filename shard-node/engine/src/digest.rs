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

use crate::codec;
use crate::error::{Error, Result};
use crate::params::IndexParams;
use crate::store::Store;

/// What [`crate::Snapshot::digest`] returns.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ContentDigest {
    /// Live points hashed.
    pub points: u64,
    /// BLAKE3 over every live point in external-id order.
    pub blake3: [u8; 32],
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
        points += 1;
    }
    Ok(ContentDigest { points, blake3: *hasher.finalize().as_bytes() })
}
