//! Numeric fields' values by id, for checking a range on one point.
//!
//! A walk through the graph asks "is this point in the range?" of every
//! node it meets. Answered from the value sets, a wide range would first
//! have to merge thousands of them; from a column it is one load. Values
//! are ordered keys (`value::ord_i64`, `value::ord_f64`), little-endian,
//! [`PER_BLOCK`] ids to a block keyed by (field, block); 0 is no value
//! (no number JSON holds has that key, and `i64::MIN` is not indexed).

use heed::{RoTxn, RwTxn};

use crate::cache::RawPtr;
use crate::error::{Error, Result};
use crate::store::Store;

/// Ids per block: 8,000 bytes, two pages.
pub(crate) const PER_BLOCK: u32 = 1000;
const BLOCK_BYTES: usize = PER_BLOCK as usize * 8;

pub(crate) fn block_key(field: u16, block: u32) -> [u8; 6] {
    let mut k = [0u8; 6];
    k[..2].copy_from_slice(&field.to_be_bytes());
    k[2..].copy_from_slice(&block.to_be_bytes());
    k
}

/// Where the column blocks read through one transaction are, by field,
/// kept for as long as the transaction (a read session keeps one): a
/// walk's checks and a range's samples touch most blocks of a column, and
/// finding each through the B-tree again for every search cost more than
/// the search's own comparisons when few points match.
#[derive(Default)]
pub(crate) struct ColumnCache {
    fields: Vec<(u16, Vec<RawPtr>)>,
}

impl ColumnCache {
    /// `id`'s value key in `field`'s column, 0 if it has none.
    ///
    /// # Safety
    /// Every call on one cache must pass the same, still open, `txn`.
    #[inline]
    pub(crate) unsafe fn get(&mut self, store: &Store, txn: &RoTxn, field: u16, id: u32) -> Result<u64> {
        let (block, slot) = ((id / PER_BLOCK) as usize, (id % PER_BLOCK) as usize);
        let i = match self.fields.iter().position(|(f, _)| *f == field) {
            Some(i) => i,
            None => {
                self.fields.push((field, Vec::new()));
                self.fields.len() - 1
            }
        };
        let blocks = &mut self.fields[i].1;
        let start = match blocks.get(block).and_then(|p| p.get()) {
            Some(p) => p,
            None => match fetch(store, txn, field, block)? {
                Some(p) => {
                    if blocks.len() <= block {
                        blocks.resize(block + 1, RawPtr::default());
                    }
                    blocks[block] = RawPtr::new(p);
                    p
                }
                None => return Ok(0),
            },
        };
        // SAFETY: `start` points at a block of BLOCK_BYTES (checked by
        // `fetch`) in a page of `txn`, which is still open (the contract).
        let v = unsafe { std::slice::from_raw_parts(start.add(slot * 8), 8) };
        Ok(u64::from_le_bytes([v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]]))
    }
}

#[cold]
fn fetch(store: &Store, txn: &RoTxn, field: u16, block: usize) -> Result<Option<*const u8>> {
    let key = block_key(field, block as u32);
    let found = store.dbs.field_columns.get(txn, &key).map_err(|e| store.err(e))?;
    let Some(bytes) = found else { return Ok(None) };
    if bytes.len() != BLOCK_BYTES {
        return Err(Error::Corrupt {
            path: store.path.clone(),
            detail: format!("column block {block} of field index {field} has {} bytes, not {BLOCK_BYTES}", bytes.len()),
        });
    }
    Ok(Some(bytes.as_ptr()))
}

/// The ids whose value key in `field`'s column lies in `lo..=hi`: one
/// pass over the column in order (eight bytes an id), which for a range
/// over many values costs less than merging their sets.
pub(crate) fn ids_in_range(store: &Store, txn: &RoTxn, field: u16, lo: u64, hi: u64) -> Result<Vec<u32>> {
    let mut ids = Vec::new();
    for item in store.dbs.field_columns.prefix(txn, &field.to_be_bytes()).map_err(|e| store.err(e))? {
        let (key, bytes) = item.map_err(|e| store.err(e))?;
        let block = match key.get(2..6) {
            Some(b) if bytes.len() == BLOCK_BYTES && key.len() == 6 => u32::from_be_bytes([b[0], b[1], b[2], b[3]]),
            _ => {
                return Err(Error::Corrupt {
                    path: store.path.clone(),
                    detail: format!("a column block of field index {field} has a {}-byte key and {} bytes", key.len(), bytes.len()),
                });
            }
        };
        let first = block.saturating_mul(PER_BLOCK);
        // Eight values at a time into a mask (the compiler makes it vector
        // compares), then only the ids in the range: the pass is over
        // every id, the pushes over the matches.
        let span = hi.wrapping_sub(lo);
        for (c, chunk) in bytes.chunks_exact(64).enumerate() {
            let mut mask = 0u32;
            for (j, v) in chunk.chunks_exact(8).enumerate() {
                let v = u64::from_le_bytes([v[0], v[1], v[2], v[3], v[4], v[5], v[6], v[7]]);
                mask |= u32::from(v.wrapping_sub(lo) <= span) << j;
            }
            while mask != 0 {
                ids.push(first + (c * 8) as u32 + mask.trailing_zeros());
                mask &= mask - 1;
            }
        }
    }
    // Blocks come in key order, so ids ascend.
    Ok(ids)
}

/// Writes `values` (id, key; sorted by id) into `field`'s column, each
/// block read, patched and written once.
pub(crate) fn patch(store: &Store, wtxn: &mut RwTxn<'_>, field: u16, values: &[(u32, u64)]) -> heed::Result<()> {
    let mut i = 0;
    let mut block = vec![0u8; BLOCK_BYTES];
    while i < values.len() {
        let no = values[i].0 / PER_BLOCK;
        let key = block_key(field, no);
        match store.dbs.field_columns.get(wtxn, &key)? {
            Some(old) if old.len() == BLOCK_BYTES => block.copy_from_slice(old),
            // A damaged block is rewritten from what the payloads say as
            // far as this batch goes; `shard verify` names what is left.
            Some(_) | None => block.fill(0),
        }
        while i < values.len() && values[i].0 / PER_BLOCK == no {
            let at = (values[i].0 % PER_BLOCK) as usize * 8;
            block[at..at + 8].copy_from_slice(&values[i].1.to_le_bytes());
            i += 1;
        }
        if block.iter().all(|&b| b == 0) {
            store.dbs.field_columns.delete(wtxn, &key)?;
        } else {
            store.dbs.field_columns.put(wtxn, &key, &block)?;
        }
    }
    Ok(())
}
