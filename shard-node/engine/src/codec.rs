//! Byte layouts of the values the engine stores; their keys are typed by
//! the `table` module.
//!
//! Values are little-endian (the CPU's order) so vectors can be read in
//! place.

use crate::metric::Metric;
use crate::params::IndexParams;

/// Value of the external-id map: the live internal id an external id
/// maps to, big-endian like the keys that hold internal ids.
#[inline]
pub(crate) fn mapped_id(id: u32) -> [u8; 4] {
    id.to_be_bytes()
}

/// Inverse of [`mapped_id`].
pub(crate) fn decode_mapped_id(b: &[u8]) -> Option<u32> {
    Some(u32::from_be_bytes(b.try_into().ok()?))
}

/// A vector's stored bytes: its f32s in little-endian order.
pub(crate) fn vector_bytes(v: &[f32]) -> &[u8] {
    // SAFETY: f32 has no padding and any byte pattern is a valid u8; the
    // slice covers exactly the vector's memory. shoal targets little-endian
    // platforms only (checked at compile time in lib.rs).
    unsafe { std::slice::from_raw_parts(v.as_ptr().cast::<u8>(), std::mem::size_of_val(v)) }
}

/// Flags of a node record.
pub(crate) const NODE_TOMBSTONE: u8 = 1;
/// With [`NODE_TOMBSTONE`]: the vacuum unlinked the node from the graph and
/// dropped its vector; only its code and record wait for the slot's reuse.
pub(crate) const NODE_VACUUMED: u8 = 2;

/// What the index knows about one internal id besides its vector and links.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct NodeRecord {
    /// The user's id.
    pub(crate) external: u64,
    /// Highest layer the node lives on.
    pub(crate) level: u8,
    /// [`NODE_TOMBSTONE`] once deleted or replaced by an upsert.
    pub(crate) flags: u8,
}

impl NodeRecord {
    pub(crate) const SIZE: usize = 10;

    pub(crate) fn is_tombstone(&self) -> bool {
        self.flags & NODE_TOMBSTONE != 0
    }

    pub(crate) fn is_vacuumed(&self) -> bool {
        self.flags & NODE_VACUUMED != 0
    }

    pub(crate) fn encode(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        b[..8].copy_from_slice(&self.external.to_le_bytes());
        b[8] = self.level;
        b[9] = self.flags;
        b
    }

    pub(crate) fn decode(b: &[u8]) -> Option<NodeRecord> {
        if b.len() != Self::SIZE {
            return None;
        }
        Some(NodeRecord { external: u64::from_le_bytes(b[..8].try_into().ok()?), level: b[8], flags: b[9] })
    }
}

/// Stored size of a link list with room for `capacity` neighbours: a u16
/// count, then `capacity` u32 slots. Fixed so that rewriting a list never
/// changes its size and never splits a page.
pub(crate) fn links_bytes(capacity: usize) -> usize {
    2 + 4 * capacity
}

/// Largest value LMDB keeps inside a 4 KiB leaf page with a 4-byte key;
/// anything larger goes to overflow pages of its own.
const MAX_INLINE_VALUE: usize = 2026;

/// Bottom-layer lists are stored in blocks of this many consecutive ids,
/// one LMDB value per block, sized to stay inside a leaf page. A builder or
/// a search then needs one B-tree lookup per block instead of one per node.
/// Fixed by M0 alone, so it is part of the on-disk format.
pub(crate) fn links0_block_nodes(m0: usize) -> usize {
    (MAX_INLINE_VALUE / links_bytes(m0)).max(1)
}

/// Codes are stored in blocks of this many consecutive ids, one LMDB value
/// per block in overflow pages, so a code's address is its block's address
/// plus arithmetic: the table of addresses a walk keeps is one entry per
/// block (3.2k entries at 100k points of 384-d, always in cache) instead of
/// one per id.
/// The smallest block over the inline limit that fills its pages to 97%
/// (else the best up to 64 KiB). Part of the on-disk format.
pub(crate) fn codes_block_nodes(code_bytes: usize) -> usize {
    block_nodes(code_bytes, 0.97)
}

/// Vectors are stored in blocks of this many consecutive ids, like codes:
/// one value per block in overflow pages, which a 4-byte key and one vector
/// per value fill only to 75% at 384-d (two 1,548-byte nodes to a 4 KiB
/// leaf), 1.33x the raw vectors on disk. The bar is 90%, not the codes'
/// 97%, because a point written into a reused slot rewrites its whole
/// block: at 384-d that is 5 vectors in 2 pages (93.75% full) instead of 13
/// in 5 (97.5%), so a batch of upserts into vacuumed slots copies 2 pages
/// per touched block instead of 5. Part of the on-disk format.
pub(crate) fn vectors_block_nodes(vector_bytes: usize) -> usize {
    block_nodes(vector_bytes, 0.90)
}

/// How many of a shard's codes and vectors share a stored block: the
/// format's, so here rather than in `params`.
impl IndexParams {
    pub(crate) fn codes_per_block(&self) -> u32 {
        codes_block_nodes(self.code_bytes()) as u32
    }

    pub(crate) fn vectors_per_block(&self) -> u32 {
        vectors_block_nodes(self.vector_bytes()) as u32
    }
}

/// The smallest number of `value_bytes` values over the inline limit whose
/// overflow pages they fill to `good_fill` (else the best up to 64 KiB; 1
/// if even two values pass 64 KiB).
fn block_nodes(value_bytes: usize, good_fill: f64) -> usize {
    const PAGE: usize = 4096;
    let fill = |k: usize| (k * value_bytes) as f64 / ((k * value_bytes + 16).div_ceil(PAGE) * PAGE) as f64;
    let mut best = (1, 0.0);
    for k in (2..=512usize).filter(|k| k * value_bytes > MAX_INLINE_VALUE && k * value_bytes <= 64 << 10) {
        let f = fill(k);
        if f >= good_fill {
            return k;
        }
        if f > best.1 + 1e-9 {
            best = (k, f);
        }
    }
    best.0
}

/// Most fixed-size values (vectors, codes) a leaf page of `page_size` bytes
/// can hold, rounded up: the ids this close to the newest one may share the
/// newest (still changing) leaf page. The page size is the environment's own (LMDB takes the OS page
/// size at creation and keeps it in the file), not an assumed 4 KiB.
pub(crate) fn values_per_leaf(value_bytes: usize, page_size: usize) -> usize {
    // LMDB's largest inline node (`me_nodemax`); larger values live in
    // overflow pages of their own, which are never rewritten.
    let nodemax = (((page_size.saturating_sub(16)) / 2) & !1).saturating_sub(2);
    // A leaf node is an 8-byte header, the key and the value, plus a 2-byte
    // slot in the page's index.
    if 8 + 4 + value_bytes > nodemax { 1 } else { page_size.div_ceil(value_bytes + 8 + 4 + 2) }
}

/// Encodes `ids` into a fixed-size list of `capacity` slots.
pub(crate) fn encode_links(ids: &[u32], capacity: usize, out: &mut Vec<u8>) {
    out.clear();
    out.resize(links_bytes(capacity), 0);
    write_links(ids, out);
}

/// Writes `ids` into `slot`, a list's fixed-size place in a block.
pub(crate) fn write_links(ids: &[u32], slot: &mut [u8]) {
    debug_assert!(slot.len() >= links_bytes(ids.len()));
    slot.fill(0);
    slot[..2].copy_from_slice(&(ids.len() as u16).to_le_bytes());
    for (i, id) in ids.iter().enumerate() {
        slot[2 + 4 * i..6 + 4 * i].copy_from_slice(&id.to_le_bytes());
    }
}

/// Decodes a stored link list into `out`. Returns false if the bytes are
/// not a link list (corruption).
#[inline]
pub(crate) fn decode_links(bytes: &[u8], out: &mut Vec<u32>) -> bool {
    out.clear();
    let Some(count) = bytes.get(..2) else { return false };
    let count = usize::from(u16::from_le_bytes([count[0], count[1]]));
    let Some(body) = bytes.get(2..2 + 4 * count) else { return false };
    out.extend(body.chunks_exact(4).map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]])));
    true
}

/// On-disk format version; bump on any layout change.
///
/// 2: codes (`quant`) beside the vectors.
/// 4: codes split into planes of high and low nibbles (3 was taken by the
///    unmerged `vector-blocks` layout, so that its files are never misread).
///
/// 5: codes in blocks ([`codes_block_nodes`]).
/// 7: the link log (`links_log`) and its epoch in [`State`] (6 was taken by
///    the unmerged `aligned-codes` layout). Still 7 with the shard epoch,
///    the batch log (`batch_log`, its own database) and their fields in
///    [`State`]: an index of 7 without them opens unchanged, reading as
///    epoch 1 with an empty batch log (a binary from before them refuses
///    the longer state record as malformed rather than misreading it).
/// 8: vectors in blocks ([`vectors_block_nodes`]).
/// 9: codes of 4-bit levels: the high plane of format 8's codes, without
///    the low one (`quant`).
///
/// 10: never written by a release; refused.
/// 11: every value ends in a checksum (`table::TRAILER`), which the store
///    adds when it opens an older file, before this record is read.
pub(crate) const FORMAT_VERSION: u32 = 11;

/// Meta key of the parameters.
pub(crate) const META_PARAMS: &[u8] = b"params";
/// Meta key of the mutable state.
pub(crate) const META_STATE: &[u8] = b"state";

/// Encodes the parameters with the format version in front.
pub(crate) fn encode_params(p: &IndexParams) -> Vec<u8> {
    let mut b = Vec::with_capacity(28);
    b.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
    b.extend_from_slice(&p.dim.to_le_bytes());
    b.push(p.metric.code());
    b.extend_from_slice(&p.m.to_le_bytes());
    b.extend_from_slice(&p.m0.to_le_bytes());
    b.extend_from_slice(&p.ef_construction.to_le_bytes());
    b.extend_from_slice(&p.seed.to_le_bytes());
    b
}

/// Why stored parameters could not be read.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum ParamsDecodeError {
    /// A format this build does not read.
    Version(u32),
    /// Bytes that are not parameters.
    Malformed,
}

/// The oldest format an index is migrated from when it is opened
/// (`migrate`): 7 differs from 8 only in how vectors are keyed, 8 from 9
/// only in the codes.
pub(crate) const MIGRATES_FROM: u32 = 7;

/// Decodes parameters written by this format or one it migrates from
/// (the same record), with the version they were written under.
pub(crate) fn decode_params(b: &[u8]) -> Result<(u32, IndexParams), ParamsDecodeError> {
    let version = u32::from_le_bytes(b.get(..4).ok_or(ParamsDecodeError::Malformed)?.try_into().unwrap_or_default());
    if !(MIGRATES_FROM..=FORMAT_VERSION).contains(&version) {
        return Err(ParamsDecodeError::Version(version));
    }
    if b.len() != 25 {
        return Err(ParamsDecodeError::Malformed);
    }
    let u16_at = |i: usize| u16::from_le_bytes([b[i], b[i + 1]]);
    let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
    let mut seed = [0u8; 8];
    seed.copy_from_slice(&b[17..25]);
    Ok((
        version,
        IndexParams {
            dim: u32_at(4),
            metric: Metric::from_code(b[8]).ok_or(ParamsDecodeError::Malformed)?,
            m: u16_at(9),
            m0: u16_at(11),
            ef_construction: u32_at(13),
            seed: u64::from_le_bytes(seed),
        },
    ))
}

/// The index's mutable state, rewritten by every commit.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct State {
    /// Next internal id to hand out; ids below it are all allocated.
    pub(crate) next_id: u32,
    /// Entry point of the graph and its level; `None` until the first insert.
    pub(crate) entry: Option<(u32, u8)>,
    /// Points a search can return.
    pub(crate) live: u64,
    /// Deleted or replaced nodes still kept in the graph for routing.
    pub(crate) tombstones: u64,
    /// Bumped by every commit that appends to or folds the link log; the
    /// key of the value it appended, and what pairs a reader with its
    /// version of the log's index (`links_log::LogVersions`).
    pub(crate) log_epoch: u64,
    /// The shard's epoch: how many times its ownership changed, as the
    /// control plane counts it. Writes stamped with a lower one are
    /// refused (see `Index::fence`). At least 1.
    pub(crate) shard_epoch: u64,
    /// Sequence number of the last batch applied (0: none yet); every
    /// applied batch takes the next one (see `batch_log`).
    pub(crate) last_seq: u64,
    /// First sequence number the batch log still holds; `last_seq + 1`
    /// when it holds none.
    pub(crate) log_first_seq: u64,
    /// Bytes of the batch log's values.
    pub(crate) log_bytes: u64,
    /// Tombstones the vacuum has unlinked and reclaimed (part of
    /// `tombstones`).
    pub(crate) vacuumed: u64,
}

impl Default for State {
    /// An empty index at epoch 1 with an empty batch log; also what an
    /// index written before epochs and the batch log reads as.
    fn default() -> Self {
        State {
            next_id: 0,
            entry: None,
            live: 0,
            tombstones: 0,
            log_epoch: 0,
            shard_epoch: 1,
            last_seq: 0,
            log_first_seq: 1,
            log_bytes: 0,
            vacuumed: 0,
        }
    }
}

impl State {
    /// Size of the record before epochs and the batch log (still read).
    const SIZE_V7: usize = 4 + 1 + 4 + 1 + 8 + 8 + 8;
    /// Size of the record before the vacuum (still read).
    const SIZE_V8: usize = Self::SIZE_V7 + 4 * 8;
    const SIZE: usize = Self::SIZE_V8 + 8;

    pub(crate) fn encode(&self) -> [u8; Self::SIZE] {
        let mut b = [0u8; Self::SIZE];
        b[..4].copy_from_slice(&self.next_id.to_le_bytes());
        if let Some((id, level)) = self.entry {
            b[4] = 1;
            b[5..9].copy_from_slice(&id.to_le_bytes());
            b[9] = level;
        }
        b[10..18].copy_from_slice(&self.live.to_le_bytes());
        b[18..26].copy_from_slice(&self.tombstones.to_le_bytes());
        b[26..34].copy_from_slice(&self.log_epoch.to_le_bytes());
        b[34..42].copy_from_slice(&self.shard_epoch.to_le_bytes());
        b[42..50].copy_from_slice(&self.last_seq.to_le_bytes());
        b[50..58].copy_from_slice(&self.log_first_seq.to_le_bytes());
        b[58..66].copy_from_slice(&self.log_bytes.to_le_bytes());
        b[66..74].copy_from_slice(&self.vacuumed.to_le_bytes());
        b
    }

    /// Decodes a record of either size: one written before epochs and the
    /// batch log reads as epoch 1 with an empty log.
    pub(crate) fn decode(b: &[u8]) -> Option<State> {
        if b.len() != Self::SIZE && b.len() != Self::SIZE_V8 && b.len() != Self::SIZE_V7 {
            return None;
        }
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let u64_at = |i: usize| {
            let mut a = [0u8; 8];
            a.copy_from_slice(&b[i..i + 8]);
            u64::from_le_bytes(a)
        };
        let entry = match b[4] {
            0 => None,
            1 => Some((u32_at(5), b[9])),
            _ => return None,
        };
        let mut state =
            State { next_id: u32_at(0), entry, live: u64_at(10), tombstones: u64_at(18), log_epoch: u64_at(26), ..State::default() };
        if b.len() >= Self::SIZE_V8 {
            state.shard_epoch = u64_at(34);
            state.last_seq = u64_at(42);
            state.log_first_seq = u64_at(50);
            state.log_bytes = u64_at(58);
            // The log holds `last_seq + 1 - log_first_seq` entries.
            if state.shard_epoch == 0 || state.log_first_seq == 0 || state.log_first_seq > state.last_seq.checked_add(1)? {
                return None;
            }
        }
        if b.len() == Self::SIZE {
            state.vacuumed = u64_at(66);
            if state.vacuumed > state.tombstones {
                return None;
            }
        }
        Some(state)
    }

    /// Entries the batch log holds.
    pub(crate) fn log_entries(&self) -> u64 {
        self.last_seq + 1 - self.log_first_seq
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn node_records_round_trip(external: u64, level: u8, flags: u8) {
            let r = NodeRecord { external, level, flags };
            prop_assert_eq!(r.encode().len(), NodeRecord::SIZE);
            prop_assert_eq!(NodeRecord::decode(&r.encode()), Some(r));
        }

        #[test]
        fn links_round_trip(ids in proptest::collection::vec(any::<u32>(), 0..=32)) {
            let mut bytes = Vec::new();
            encode_links(&ids, 32, &mut bytes);
            prop_assert_eq!(bytes.len(), links_bytes(32));
            let mut out = Vec::new();
            prop_assert!(decode_links(&bytes, &mut out));
            prop_assert_eq!(out, ids);
        }

        #[test]
        fn state_round_trips(
            next_id: u32,
            entry: Option<(u32, u8)>,
            live: u64,
            tombstones: u64,
            log_epoch: u64,
            shard_epoch in 1u64..,
            last_seq in 0u64..u64::MAX,
            held: u64,
            log_bytes: u64,
            vacuumed: u64,
        ) {
            let log_first_seq = last_seq + 1 - held.min(last_seq);
            let vacuumed = vacuumed.min(tombstones);
            let s = State { next_id, entry, live, tombstones, log_epoch, shard_epoch, last_seq, log_first_seq, log_bytes, vacuumed };
            prop_assert_eq!(s.encode().len(), 74);
            prop_assert_eq!(State::decode(&s.encode()), Some(s));
            // A record from before the vacuum reads as nothing vacuumed.
            prop_assert_eq!(State::decode(&s.encode()[..66]), Some(State { vacuumed: 0, ..s }));
            prop_assert_eq!(State::decode(&s.encode()), Some(s));
        }

        /// A state written before epochs and the batch log (34 bytes)
        /// reads as epoch 1 with an empty log and the rest unchanged.
        #[test]
        fn states_of_format_7_read_as_epoch_1_with_an_empty_log(
            next_id: u32,
            entry: Option<(u32, u8)>,
            live: u64,
            tombstones: u64,
            log_epoch: u64,
        ) {
            let s = State { next_id, entry, live, tombstones, log_epoch, ..State::default() };
            let old = &s.encode()[..34];
            let read = State::decode(old).unwrap();
            prop_assert_eq!(read, s);
            prop_assert_eq!((read.shard_epoch, read.last_seq, read.log_first_seq, read.log_entries()), (1, 0, 1, 0));
        }

        #[test]
        fn params_round_trip(dim in 1u32..65536, m in 2u16..256, efc in 1u32..4096, seed: u64, metric in 0usize..3) {
            let p = IndexParams { dim, metric: Metric::ALL[metric], m, m0: m * 2, ef_construction: efc, seed };
            prop_assert_eq!(decode_params(&encode_params(&p)), Ok((FORMAT_VERSION, p)));
        }
    }

    #[test]
    fn blocks_fit_a_leaf_page() {
        for m0 in [4usize, 8, 16, 32, 64, 128, 512] {
            let k = links0_block_nodes(m0);
            assert!(k >= 1);
            assert!(k == 1 || k * links_bytes(m0) <= MAX_INLINE_VALUE, "m0={m0}");
        }
        assert_eq!(links0_block_nodes(32), 15);
        assert_eq!(values_per_leaf(1536, 4096), 3);
        assert_eq!(values_per_leaf(2024, 4096), 3);
        assert_eq!(values_per_leaf(2028, 4096), 1);
        // 16 KiB pages (some ARM64 kernels) hold many more.
        assert_eq!(values_per_leaf(1536, 16384), 11);
        assert_eq!(values_per_leaf(2028, 16384), 9);
        // Format 8's codes of 384-d vectors: 392 bytes.
        assert_eq!(values_per_leaf(392, 4096), 11);
    }

    #[test]
    fn code_blocks_fill_their_pages() {
        // 384-d: format 9's 200-byte codes 20 to a page (97.7%), format
        // 8's 392-byte ones 31 to three pages.
        assert_eq!(codes_block_nodes(crate::quant::code_bytes(384)), 20);
        assert_eq!(codes_block_nodes(392), 31);
        for dim in 1..3000usize {
            let cb = crate::quant::code_bytes(dim);
            let k = codes_block_nodes(cb);
            assert!(k * cb > MAX_INLINE_VALUE || k == 1, "dim {dim}");
            assert!(k * cb <= 64 << 10 || k == 1, "dim {dim}");
        }
    }

    #[test]
    fn vector_blocks_fill_their_pages_to_90_percent() {
        // 384-d: 5 vectors in 2 pages; 768-d: 5 in 4; 1536-d: 3 in 5.
        assert_eq!(vectors_block_nodes(1536), 5);
        assert_eq!(vectors_block_nodes(3072), 5);
        assert_eq!(vectors_block_nodes(6144), 3);
        // Past 32 KiB a vector is a block of its own.
        assert_eq!(vectors_block_nodes(40_000), 1);
        for dim in 1..3000usize {
            let vb = dim * 4;
            let k = vectors_block_nodes(vb);
            assert!(k * vb > MAX_INLINE_VALUE || k == 1, "dim {dim}");
            assert!(k * vb <= 64 << 10 || k == 1, "dim {dim}");
        }
    }

    #[test]
    fn truncated_links_are_rejected() {
        let mut bytes = Vec::new();
        encode_links(&[1, 2, 3], 4, &mut bytes);
        let mut out = Vec::new();
        assert!(!decode_links(&bytes[..7], &mut out));
        assert!(!decode_links(&[], &mut out));
    }

    #[test]
    fn other_format_versions_are_named() {
        let mut b = encode_params(&IndexParams::new(4, Metric::Cosine));
        b[..4].copy_from_slice(&99u32.to_le_bytes());
        assert_eq!(decode_params(&b), Err(ParamsDecodeError::Version(99)));
        // Format 6 and older are not migrated.
        b[..4].copy_from_slice(&6u32.to_le_bytes());
        assert_eq!(decode_params(&b), Err(ParamsDecodeError::Version(6)));
        b[..4].copy_from_slice(&MIGRATES_FROM.to_le_bytes());
        assert_eq!(decode_params(&b).map(|(v, _)| v), Ok(MIGRATES_FROM));
        assert_eq!(decode_params(&[1, 0]), Err(ParamsDecodeError::Malformed));
    }
}
