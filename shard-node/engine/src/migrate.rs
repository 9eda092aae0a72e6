//! Bringing an index written by an older format up to this one, when it is
//! opened, in the write transaction that reads its parameters: a crash
//! leaves it as it was, and a copy restored from an older snapshot opens
//! like any other.
//!
//! 7 → 8: vectors move from one value per id to blocks of
//! `codec::vectors_block_nodes` ids. Everything else is the same.
//!
//! 8 → 9: each code keeps its header and its plane of high nibbles, which
//! are its 4-bit levels (`quant`); the plane of low nibbles goes, and the
//! codes are packed again into blocks of `codec::codes_block_nodes` of the
//! shorter size. Everything else is the same.
//!
//! 9 → 11: every value gains a checksum trailer, which `store` adds to any
//! environment without its mark before anything reads it, whatever the
//! format; nothing is left to do here.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;

use heed::RwTxn;

use crate::codec;
use crate::error::{Error, Result};
use crate::params::IndexParams;
use crate::session;
use crate::store::Store;

/// Rewrites what differs between format `from` and the current one.
pub(crate) fn to_current(store: &Store, wtxn: &mut RwTxn<'_>, params: &IndexParams, from: u32) -> Result<()> {
    match from {
        7 => {
            vectors_into_blocks(store, wtxn, params)?;
            codes_to_four_bits(store, wtxn, params)
        }
        8 => codes_to_four_bits(store, wtxn, params),
        // The trailers were added when the store opened.
        9 => Ok(()),
        _ => Err(Error::UnsupportedFormat { path: store.path.clone(), found: from, supported: crate::codec::FORMAT_VERSION }),
    }
}

/// Packs the per-id vectors into blocks, in place: block `b` holds ids
/// `k·b .. k·b + k`, all at or above `b`, so writing blocks in ascending
/// order only ever overwrites ids already packed. A vacuumed id (format 7
/// deleted its vector) is left zero: nothing reads a vacuumed slot before a
/// point reuses it. Any other id without a vector is damage, reported
/// before anything is committed.
fn vectors_into_blocks(store: &Store, wtxn: &mut RwTxn<'_>, params: &IndexParams) -> Result<()> {
    let next_id = session::read_state(store, wtxn)?.next_id;
    let (per_block, bytes) = (params.vectors_per_block(), params.vector_bytes());
    let table = store.dbs.vectors;
    let err = |e| store.err(e);
    let mut block = Vec::with_capacity(per_block as usize * bytes);
    let blocks = next_id.div_ceil(per_block);
    for b in 0..blocks {
        block.clear();
        let first = b * per_block;
        for id in first..(first + per_block).min(next_id) {
            match table.get(wtxn, id).map_err(err)? {
                Some(v) if v.len() == bytes => block.extend_from_slice(v),
                None if session::read_node(store, wtxn, id)?.is_vacuumed() => block.resize(block.len() + bytes, 0),
                None => {
                    return Err(Error::Corrupt {
                        path: store.path.clone(),
                        detail: format!("node {id} is not vacuumed but has no vector (migrating from format 7)"),
                    });
                }
                Some(v) => {
                    return Err(Error::Corrupt {
                        path: store.path.clone(),
                        detail: format!("vector of node {id} has {} bytes, expected {bytes} (migrating from format 7)", v.len()),
                    });
                }
            }
        }
        table.put(wtxn, b, &block).map_err(err)?;
    }
    // What is left under the old keys: ids past the last block number.
    for id in blocks..next_id {
        table.delete(wtxn, id).map_err(err)?;
    }
    Ok(())
}

/// Bytes of a format-8 code of a `dim`-dimensional vector: the header and
/// two planes.
fn format_8_code_bytes(dim: usize) -> usize {
    crate::quant::code_bytes(dim) + crate::nibble::plane_bytes(dim)
}

/// Rewrites the codes of format 8 as those of format 9, in place, in
/// ascending block order. A new block can hold fewer codes than an old one
/// (block sizes are chosen for page fill, not monotone in the code size),
/// so an old block is kept in memory from before its key is overwritten
/// until its last code has moved: a few blocks, never the table.
fn codes_to_four_bits(store: &Store, wtxn: &mut RwTxn<'_>, params: &IndexParams) -> Result<()> {
    let next_id = session::read_state(store, wtxn)?.next_id;
    let dim = params.dim as usize;
    let (old_bytes, new_bytes) = (format_8_code_bytes(dim), params.code_bytes());
    let old_per = codec::codes_block_nodes(old_bytes) as u32;
    let new_per = params.codes_per_block();
    let table = store.dbs.codes;
    let err = |e| store.err(e);
    let corrupt = |detail: String| Error::Corrupt { path: store.path.clone(), detail };
    let old_blocks = next_id.div_ceil(old_per);
    // Old blocks read and not yet used up, by key.
    let mut held: BTreeMap<u32, Vec<u8>> = BTreeMap::new();
    // Holds old block `key` unless it already is: the key must not have
    // been overwritten yet.
    let hold = |held: &mut BTreeMap<u32, Vec<u8>>, wtxn: &RwTxn<'_>, key: u32| -> Result<()> {
        if let Entry::Vacant(slot) = held.entry(key) {
            let old = table.get(wtxn, key).map_err(err)?;
            slot.insert(old.ok_or_else(|| corrupt(format!("code block {key} is missing (migrating from format 8)")))?.to_vec());
        }
        Ok(())
    };
    let mut block = Vec::with_capacity(new_per as usize * new_bytes);
    let new_blocks = next_id.div_ceil(new_per);
    for b in 0..new_blocks {
        // Key `b` is overwritten below.
        if b < old_blocks {
            hold(&mut held, wtxn, b)?;
        }
        block.clear();
        let first = b * new_per;
        for id in first..(first + new_per).min(next_id) {
            let key = id / old_per;
            // Held already, or above every key written so far.
            hold(&mut held, wtxn, key)?;
            let old = held.get(&key).map_or(&[][..], Vec::as_slice);
            let at = (id % old_per) as usize * old_bytes;
            let code = old.get(at..at + new_bytes).filter(|_| old.len() >= at + old_bytes).ok_or_else(|| {
                corrupt(format!("code block {key} has {} bytes, too few for node {id} (migrating from format 8)", old.len()))
            })?;
            block.extend_from_slice(code);
            // Done with an old block once its last id has moved.
            if id % old_per == old_per - 1 {
                held.remove(&key);
            }
        }
        table.put(wtxn, b, &block).map_err(err)?;
    }
    // What is left under keys past the last new block.
    for key in new_blocks..old_blocks {
        table.delete(wtxn, key).map_err(err)?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use super::format_8_code_bytes;
    use crate::batch::{Batch, Op};
    use crate::codec;
    use crate::session::{self, SearchParams};
    use crate::{Index, IndexOptions, IndexParams, Metric};

    /// The code format 8 wrote for the prepared vector `v`: its `i8`
    /// components split into a plane of high nibbles and one of low ones.
    fn format_8_code(v: &[f32]) -> Vec<u8> {
        let max = v.iter().fold(0f32, |m, x| m.max(x.abs()));
        let scale = if max > 0.0 { max / 127.0 } else { 0.0 };
        let norm2 = v.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>() as f32;
        let mut out = Vec::new();
        out.extend_from_slice(&scale.to_le_bytes());
        out.extend_from_slice(&norm2.to_le_bytes());
        let inv = if scale > 0.0 { 1.0 / scale } else { 0.0 };
        let q = |j: usize| v.get(j).map_or(0, |&x| (x * inv).round().clamp(-127.0, 127.0) as i8);
        let half = crate::nibble::plane_bytes(v.len());
        let high = |q: i8| ((q >> 4) + 8) as u8;
        let low = |q: i8| (q as u8) & 15;
        out.extend((0..half).map(|j| high(q(j)) | (high(q(j + half)) << 4)));
        out.extend((0..half).map(|j| low(q(j)) | (low(q(j + half)) << 4)));
        out
    }

    /// Rewrites an index of the current format as format 8 wrote it:
    /// codes of both planes, in format 8's blocks, version 8 in the
    /// parameters.
    fn write_as_format_8(index: &Index) {
        let store = &index.store;
        let params = *index.params();
        let (per_block, bytes) = (params.vectors_per_block(), params.vector_bytes());
        let old_per = codec::codes_block_nodes(format_8_code_bytes(params.dim as usize)) as u32;
        let mut wtxn = store.env.write_txn().unwrap();
        let next_id = session::read_state(store, &wtxn).unwrap().next_id;
        let mut codes = Vec::new();
        for id in 0..next_id {
            let block = store.dbs.vectors.get(&wtxn, id / per_block).unwrap().unwrap();
            let at = (id % per_block) as usize * bytes;
            let v: Vec<f32> = block[at..at + bytes].chunks_exact(4).map(|c| f32::from_le_bytes(c.try_into().unwrap())).collect();
            codes.push(format_8_code(&v));
        }
        store.dbs.codes.clear(&mut wtxn).unwrap();
        for (b, chunk) in codes.chunks(old_per as usize).enumerate() {
            store.dbs.codes.put(&mut wtxn, b as u32, &chunk.concat()).unwrap();
        }
        let mut record = codec::encode_params(&params);
        record[..4].copy_from_slice(&8u32.to_le_bytes());
        store.dbs.meta.put(&mut wtxn, codec::META_PARAMS, &record).unwrap();
        wtxn.commit().unwrap();
    }

    /// Rewrites an index of the current format as format 7 wrote it: format
    /// 8's codes, one vector per id, none for vacuumed ids, version 7 in
    /// the parameters.
    fn write_as_format_7(index: &Index, lose_vector_of: Option<u32>) {
        write_as_format_8(index);
        let store = &index.store;
        let params = *index.params();
        let (per_block, bytes) = (params.vectors_per_block(), params.vector_bytes());
        let mut wtxn = store.env.write_txn().unwrap();
        let state = session::read_state(store, &wtxn).unwrap();
        let mut vectors = Vec::new();
        for id in 0..state.next_id {
            let block = store.dbs.vectors.get(&wtxn, id / per_block).unwrap().unwrap();
            let at = (id % per_block) as usize * bytes;
            let vacuumed = session::read_node(store, &wtxn, id).unwrap().is_vacuumed();
            let lost = lose_vector_of == Some(id);
            vectors.push((!vacuumed && !lost).then(|| block[at..at + bytes].to_vec()));
        }
        store.dbs.vectors.clear(&mut wtxn).unwrap();
        for (id, v) in vectors.iter().enumerate() {
            if let Some(v) = v {
                store.dbs.vectors.put(&mut wtxn, id as u32, v).unwrap();
            }
        }
        let mut record = codec::encode_params(&params);
        record[..4].copy_from_slice(&7u32.to_le_bytes());
        store.dbs.meta.put(&mut wtxn, codec::META_PARAMS, &record).unwrap();
        wtxn.commit().unwrap();
    }

    /// An index written by an older format, with vacuumed ids (whose
    /// vectors format 7 deleted) and reused ones, opens under the current
    /// one: every point, answer and the content digest are the same as
    /// before, the parameters say the current version, and it takes
    /// further batches.
    fn an_old_index_is_migrated_when_opened(dim: u32, write_as_old: fn(&Index)) {
        let dir = tempfile::tempdir().unwrap();
        let opts = IndexOptions { build_threads: 2, durable: false, ..IndexOptions::default() };
        let params = IndexParams::new(dim, Metric::Cosine);
        let vector = |i: u64| -> Vec<f32> {
            let mut rng = StdRng::seed_from_u64(i);
            (0..dim).map(|_| rng.random_range(-1.0..1.0)).collect()
        };
        let index = Index::open_or_create(dir.path(), params, opts.clone()).unwrap();
        index.apply(Batch::upserts((0..700).map(|i| (i, vector(i))))).unwrap();
        index.apply(Batch { ops: (0..700).step_by(3).map(Op::Delete).collect(), source: None }).unwrap();
        while index.vacuum(64).unwrap().vacuumed > 0 {}
        // Some new points take vacuumed slots; the last block stays partial.
        index.apply(Batch::upserts((1000..1061).map(|i| (i, vector(i))))).unwrap();
        assert!(index.stats().unwrap().vacuumed > 0, "some slots must still be vacuumed");
        let live: Vec<u64> = (0..700).filter(|i| i % 3 != 0).chain(1000..1061).collect();
        let queries: Vec<Vec<f32>> = (0..20).map(|i| vector(i * 37 + 5)).collect();
        let answers = |index: &Index| {
            let hits: Vec<_> = queries.iter().map(|q| index.search(q, SearchParams::new(10, 64)).unwrap()).collect();
            let points: Vec<_> = live.iter().map(|&id| index.get(id).unwrap().unwrap().vector).collect();
            (hits, points, index.snapshot().unwrap().digest().unwrap())
        };
        let before = answers(&index);
        write_as_old(&index);
        drop(index);

        let index = Index::open(dir.path(), opts.clone()).unwrap();
        assert_eq!(answers(&index), before);
        {
            let txn = index.store.env.read_txn().unwrap();
            let stored = index.store.dbs.meta.get(&txn, codec::META_PARAMS).unwrap().unwrap();
            assert_eq!(codec::decode_params(stored).unwrap(), (codec::FORMAT_VERSION, params));
        }
        index.apply(Batch::upserts((2000..2100).map(|i| (i, vector(i))))).unwrap();
        for i in (2000..2100).step_by(9) {
            assert_eq!(index.search(&vector(i), SearchParams::new(1, 64)).unwrap()[0].id, i);
        }
        drop(index);
        let index = Index::open(dir.path(), opts).unwrap();
        assert_eq!(index.stats().unwrap().live, live.len() as u64 + 100);
    }

    #[test]
    fn a_format_7_index_is_migrated_when_opened() {
        // 24-d: a block of format 9's codes holds more than one of format 8's.
        an_old_index_is_migrated_when_opened(24, |index| write_as_format_7(index, None));
    }

    #[test]
    fn a_format_8_index_is_migrated_when_opened() {
        // 116-d: a block of format 9's codes holds fewer (61) than one of
        // format 8's (65), so old blocks are overwritten before they are
        // used up.
        assert!(codec::codes_block_nodes(crate::quant::code_bytes(116)) < codec::codes_block_nodes(format_8_code_bytes(116)));
        an_old_index_is_migrated_when_opened(116, write_as_format_8);
    }

    /// A live point without its vector in a format-7 file is damage: the
    /// open reports it, commits nothing, and says so again next time.
    #[test]
    fn a_format_7_index_missing_a_live_vector_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        let opts = IndexOptions { build_threads: 1, durable: false, ..IndexOptions::default() };
        let index = Index::open_or_create(dir.path(), IndexParams::new(8, Metric::Euclidean), opts.clone()).unwrap();
        index.apply(Batch::upserts((0..40).map(|i| (i, (0..8).map(|j| (i * 8 + j) as f32).collect())))).unwrap();
        write_as_format_7(&index, Some(17));
        drop(index);
        for attempt in 0..2 {
            match Index::open(dir.path(), opts.clone()) {
                Err(crate::Error::Corrupt { detail, .. }) => {
                    assert!(detail.contains("node 17 is not vacuumed but has no vector"), "{detail}")
                }
                other => panic!("open {attempt}: expected a corruption error, got {:?}", other.map(|_| ())),
            }
        }
    }
}
