//! A sparse map from the offsets of one [`CHUNK`]-id range to `u32`s: the
//! unit the link log's index (`links_log::LogIndex`) shares between its
//! versions.
//!
//! The index used a dense `[u32; 1024]` per chunk, and a batch's changed
//! lists lie all over the id space (a 1k-point batch changes ~12,700 lists
//! of a 1M-point index, in every chunk), so every chunk existed: 4 bytes
//! per id of the whole index in each version, two versions while a batch
//! writes, where the log holds only a few batches' lists. Here a chunk
//! holds a bitmap of its ids and their values in id order: 184 bytes plus
//! 4 per entry, so the index grows with the log, not with the index
//! (`docs/scale.md`, "The link log's index by entries"). A lookup is a bit
//! test and a rank (one popcount), on the path of every list a walk reads
//! while the log holds lists.
//!
//! Written here rather than taken from a crate: what the index needs is a
//! cheap clone of one small chunk (for `Arc::make_mut`) with an O(1)
//! lookup, and a general sparse-set or roaring crate brings neither the
//! values nor the fixed size.

use std::ops::Range;

/// Ids per chunk.
pub(crate) const CHUNK: usize = 1024;
const WORDS: usize = CHUNK / 64;

/// The entries of one chunk of ids: offset `i` (below [`CHUNK`]) maps to
/// a value if bit `i` is set, and the values are kept in offset order.
#[derive(Clone, Default, Debug)]
pub(crate) struct SparseChunk {
    bits: [u64; WORDS],
    /// Set bits in the words before each word.
    before: [u16; WORDS],
    values: Vec<u32>,
}

impl SparseChunk {
    /// Entries at offsets below `i` (`i` up to [`CHUNK`]).
    #[inline]
    fn rank(&self, i: usize) -> usize {
        if i >= CHUNK {
            return self.values.len();
        }
        let (w, b) = (i / 64, i % 64);
        self.before[w] as usize + (self.bits[w] & ((1u64 << b) - 1)).count_ones() as usize
    }

    /// The value at offset `i`, if it has one.
    #[inline]
    pub(crate) fn get(&self, i: usize) -> Option<u32> {
        let word = *self.bits.get(i / 64)?;
        (word >> (i % 64) & 1 == 1).then(|| self.values[self.rank(i)])
    }

    /// Sets offset `i` (below [`CHUNK`]) to `value`.
    pub(crate) fn set(&mut self, i: usize, value: u32) {
        assert!(i < CHUNK, "offset {i} outside a chunk");
        let r = self.rank(i);
        let (w, bit) = (i / 64, 1u64 << (i % 64));
        if self.bits[w] & bit != 0 {
            self.values[r] = value;
            return;
        }
        self.bits[w] |= bit;
        self.values.insert(r, value);
        self.before[w + 1..].iter_mut().for_each(|b| *b += 1);
    }

    /// Drops the entries at the offsets of `range` (clamped to the chunk).
    pub(crate) fn clear(&mut self, range: Range<usize>) {
        let (lo, hi) = (range.start.min(CHUNK), range.end.min(CHUNK));
        if lo >= hi {
            return;
        }
        let (rlo, rhi) = (self.rank(lo), self.rank(hi));
        if rlo == rhi {
            return;
        }
        self.values.drain(rlo..rhi);
        for (w, word) in self.bits.iter_mut().enumerate() {
            let (start, end) = (w * 64, w * 64 + 64);
            if end <= lo || start >= hi {
                continue;
            }
            let from = lo.max(start) - start;
            let to = hi.min(end) - start;
            let mask = if to - from == 64 { u64::MAX } else { ((1u64 << (to - from)) - 1) << from };
            *word &= !mask;
        }
        let mut seen = 0u16;
        for (b, word) in self.before.iter_mut().zip(&self.bits) {
            *b = seen;
            seen += word.count_ones() as u16;
        }
    }

    /// True if no offset has a value.
    pub(crate) fn is_empty(&self) -> bool {
        self.values.is_empty()
    }

    /// True if some offset of `range` has a value.
    pub(crate) fn any_in(&self, range: Range<usize>) -> bool {
        let (lo, hi) = (range.start.min(CHUNK), range.end.min(CHUNK));
        lo < hi && self.rank(lo) != self.rank(hi)
    }

    /// Every entry, by ascending offset.
    pub(crate) fn iter(&self) -> impl Iterator<Item = (usize, u32)> + '_ {
        let offsets = self.bits.iter().enumerate().flat_map(|(w, &word)| {
            let mut rest = word;
            std::iter::from_fn(move || {
                (rest != 0).then(|| {
                    let b = rest.trailing_zeros() as usize;
                    rest &= rest - 1;
                    w * 64 + b
                })
            })
        });
        offsets.zip(self.values.iter().copied())
    }

    /// The values, by ascending offset, to change in place.
    pub(crate) fn values_mut(&mut self) -> &mut [u32] {
        &mut self.values
    }

    /// Memory the chunk takes.
    pub(crate) fn bytes(&self) -> usize {
        std::mem::size_of::<Self>() + self.values.capacity() * 4
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use proptest::prelude::*;

    use super::*;

    #[derive(Clone, Debug)]
    enum Op {
        Set(usize, u32),
        Clear(usize, usize),
    }

    fn op() -> impl Strategy<Value = Op> {
        // Offsets cluster in a few words half the time, so sets overwrite
        // and clears cut words in the middle.
        let offset = prop_oneof![0..CHUNK, 60usize..70, 1000usize..CHUNK];
        prop_oneof![
            3 => (offset.clone(), any::<u32>()).prop_map(|(i, v)| Op::Set(i, v)),
            1 => (0..CHUNK + 10, 0usize..300).prop_map(|(lo, len)| Op::Clear(lo, lo + len)),
        ]
    }

    proptest! {
        #[test]
        fn a_chunk_behaves_like_a_sorted_map(ops in proptest::collection::vec(op(), 0..200)) {
            let mut chunk = SparseChunk::default();
            let mut model = BTreeMap::new();
            for op in ops {
                match op {
                    Op::Set(i, v) => {
                        chunk.set(i, v);
                        model.insert(i, v);
                    }
                    Op::Clear(lo, hi) => {
                        prop_assert_eq!(chunk.any_in(lo..hi), model.range(lo..hi).next().is_some());
                        chunk.clear(lo..hi);
                        model.retain(|i, _| !(lo..hi).contains(i));
                    }
                }
                prop_assert_eq!(chunk.iter().collect::<Vec<_>>(), model.iter().map(|(i, v)| (*i, *v)).collect::<Vec<_>>());
                prop_assert_eq!(chunk.is_empty(), model.is_empty());
            }
            for i in 0..CHUNK + 64 {
                prop_assert_eq!(chunk.get(i), model.get(&i).copied(), "offset {}", i);
            }
        }
    }

    #[test]
    fn a_whole_word_and_the_whole_chunk_clear() {
        let mut chunk = SparseChunk::default();
        (0..CHUNK).for_each(|i| chunk.set(i, i as u32));
        chunk.clear(64..128);
        assert_eq!(chunk.iter().count(), CHUNK - 64);
        assert_eq!((chunk.get(63), chunk.get(64), chunk.get(128)), (Some(63), None, Some(128)));
        chunk.clear(0..CHUNK);
        assert!(chunk.is_empty());
        assert!(chunk.bytes() < 5 * CHUNK, "a full chunk stays near the dense size");
    }
}
