//! The sets of a field index: for each value, the internal ids holding it,
//! as serialised roaring bitmaps in the `postings` table.
//!
//! A key is the field's number (big-endian u16), the kind of set, and for
//! a value's set the value's bytes: a keyword's UTF-8, a boolean's byte,
//! or a number's ordered key (big-endian), so that one field's numbers lie
//! in one run of keys in numeric order and a range is one range scan.

use heed::RoTxn;
use roaring::{MultiOps, RoaringBitmap};

use crate::error::{Error, Result};
use crate::store::Store;

use super::value::Extracted;

/// Ids holding any value of the field (of its type or not): what
/// `is_empty` is the complement of.
pub(crate) const PRESENT: u8 = 0;
/// Ids holding a value of another type.
pub(crate) const OTHER: u8 = 1;
/// Ids holding one value (the key's rest).
pub(crate) const VALUE: u8 = 2;

/// The key of a set.
pub(crate) fn key(field: u16, set: u8, value: &[u8]) -> Vec<u8> {
    let mut k = Vec::with_capacity(3 + value.len());
    k.extend_from_slice(&field.to_be_bytes());
    k.push(set);
    k.extend_from_slice(value);
    k
}

/// The key of the set of ids holding the number whose ordered key is `n`.
pub(crate) fn number_key(field: u16, n: u64) -> [u8; 11] {
    let mut k = [0u8; 11];
    k[..2].copy_from_slice(&field.to_be_bytes());
    k[2] = VALUE;
    k[3..].copy_from_slice(&n.to_be_bytes());
    k
}

/// The keys of the value sets an extracted value belongs to.
pub(crate) fn value_keys(field: u16, value: &Extracted<'_>) -> Vec<Vec<u8>> {
    match value {
        Extracted::Absent | Extracted::Other => Vec::new(),
        Extracted::Keywords(ks) => ks.iter().map(|k| key(field, VALUE, k.as_bytes())).collect(),
        Extracted::Number(n) => vec![number_key(field, *n).to_vec()],
        Extracted::Bool(b) => vec![key(field, VALUE, &[u8::from(*b)])],
    }
}

/// The key of a keyword's set.
pub(crate) fn keyword_key(field: u16, keyword: &str) -> Vec<u8> {
    key(field, VALUE, keyword.as_bytes())
}

/// The key of a boolean's set.
pub(crate) fn bool_key(field: u16, b: bool) -> Vec<u8> {
    key(field, VALUE, &[u8::from(b)])
}

/// Decodes a stored set, checking it (the file may be damaged).
pub(crate) fn decode(store: &Store, key: &[u8], bytes: &[u8]) -> Result<RoaringBitmap> {
    store.check_len(bytes.len(), || format!("the postings set {key:?}"))?;
    RoaringBitmap::deserialize_from(bytes)
        .map_err(|e| Error::Corrupt { path: store.path.clone(), detail: format!("the postings set under key {key:?} is malformed: {e}") })
}

/// The set under `key` (empty if there is none).
pub(crate) fn read(store: &Store, txn: &RoTxn, key: &[u8]) -> Result<RoaringBitmap> {
    match store.dbs.postings.get(txn, key).map_err(|e| store.err(e))? {
        Some(bytes) => decode(store, key, bytes),
        None => Ok(RoaringBitmap::new()),
    }
}

/// How many ids the set under `key` holds, read from its header without
/// decoding its containers.
pub(crate) fn count(store: &Store, txn: &RoTxn, key: &[u8]) -> Result<u64> {
    Ok(read(store, txn, key)?.len())
}

/// The union of the value sets of `field` whose numbers' keys lie in
/// `lo..=hi`, unless the range holds more than `max_values` values: then
/// `None`, after reading only as many (a column pass is then cheaper:
/// each set is a B-tree step and a decode, each id in a column 8 bytes).
/// A point holds one number per field, so the sets are disjoint.
pub(crate) fn range_union(store: &Store, txn: &RoTxn, field: u16, lo: u64, hi: u64, max_values: usize) -> Result<Option<RoaringBitmap>> {
    if lo > hi {
        return Ok(Some(RoaringBitmap::new()));
    }
    let (from, to) = (number_key(field, lo), number_key(field, hi));
    let mut sets = Vec::new();
    for item in store.dbs.postings.range_inclusive(txn, &from, &to).map_err(|e| store.err(e))? {
        let (k, v) = item.map_err(|e| store.err(e))?;
        if sets.len() == max_values {
            return Ok(None);
        }
        sets.push(decode(store, k, v)?);
    }
    // A few small sets (a narrow range) are folded, merging their sorted
    // arrays: the merge of them all goes through a dense 8 KiB container
    // per key, allocated and cleared, which for ten sets of a hundred ids
    // in all cost twice the search's exact comparison of those ids
    // (callgrind, the PyPI set's 0.1% range). For more sets the merge is
    // cheaper (its 1% range, 100 sets: a sorted list cost 1.5x the merge).
    let total: u64 = sets.iter().map(RoaringBitmap::len).sum();
    if total <= SMALL_UNION && sets.len() <= FOLDED {
        let mut union = RoaringBitmap::new();
        for s in &sets {
            union |= s;
        }
        return Ok(Some(union));
    }
    // One merge of them all: folding them in one at a time copies the
    // growing union again for every value (quadratic in a wide range).
    Ok(Some(sets.union()))
}

/// Up to [`FOLDED`] sets of this many ids in all are folded into their
/// union rather than merged at once.
const SMALL_UNION: u64 = 4096;
const FOLDED: usize = 16;

/// At most how many values of `field` lie in `lo..=hi` when its keys are
/// whole numbers (integers, times), where consecutive numbers have
/// consecutive keys: the span from the lowest present to the highest. Two
/// seeks, where a sample can only guess.
pub(crate) fn whole_span(store: &Store, txn: &RoTxn, field: u16, lo: u64, hi: u64) -> Result<u64> {
    if lo > hi {
        return Ok(0);
    }
    let (from, to) = (number_key(field, lo), number_key(field, hi));
    let value = |k: &[u8]| k.get(3..11).and_then(|b| b.try_into().ok()).map(u64::from_be_bytes);
    let first =
        store.dbs.postings.range_inclusive(txn, &from, &to).map_err(|e| store.err(e))?.next().transpose().map_err(|e| store.err(e))?;
    let last =
        store.dbs.postings.rev_range_inclusive(txn, &from, &to).map_err(|e| store.err(e))?.next().transpose().map_err(|e| store.err(e))?;
    Ok(match (first.and_then(|(k, _)| value(k)), last.and_then(|(k, _)| value(k))) {
        (Some(a), Some(b)) if b >= a => b - a + 1,
        _ => 0,
    })
}

/// Serialises a set for storing.
pub(crate) fn encode(set: &RoaringBitmap) -> Vec<u8> {
    let mut out = Vec::with_capacity(set.serialized_size());
    // Writing into a Vec cannot fail.
    let _ = set.serialize_into(&mut out);
    out
}
