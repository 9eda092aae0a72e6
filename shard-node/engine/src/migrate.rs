//! Bringing an index written by an older format up to this one, when it is
//! opened, in the write transaction that reads its parameters: a crash
//! leaves it as it was, and a copy restored from an older snapshot opens
//! like any other.
//!
//! 7 → 8: vectors move from one value per id to blocks of
//! `codec::vectors_block_nodes` ids. Everything else is the same.

use heed::RwTxn;

use crate::error::{Error, Result};
use crate::params::IndexParams;
use crate::session;
use crate::store::Store;

/// Rewrites what differs between format `from` and the current one.
pub(crate) fn to_current(store: &Store, wtxn: &mut RwTxn<'_>, params: &IndexParams, from: u32) -> Result<()> {
    match from {
        7 => vectors_into_blocks(store, wtxn, params),
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

#[cfg(test)]
mod tests {
    use rand::rngs::StdRng;
    use rand::{Rng, SeedableRng};

    use crate::batch::{Batch, Op};
    use crate::codec;
    use crate::session::{self, SearchParams};
    use crate::{Index, IndexOptions, IndexParams, Metric};

    /// Rewrites an index of the current format as format 7 wrote it: one
    /// vector per id, none for vacuumed ids, version 7 in the parameters.
    fn write_as_format_7(index: &Index, lose_vector_of: Option<u32>) {
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

    /// An index written by format 7 (vectors keyed by id), with vacuumed
    /// ids whose vectors it deleted and reused ones, opens under format 8:
    /// every point, answer and the content digest are the same as before,
    /// the parameters say 8, and it takes further batches.
    #[test]
    fn a_format_7_index_is_migrated_when_opened() {
        let dir = tempfile::tempdir().unwrap();
        let opts = IndexOptions { build_threads: 2, durable: false, ..IndexOptions::default() };
        let dim = 24;
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
        write_as_format_7(&index, None);
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
