//! Hostile bytes for every decoder of stored bytes (issue 23).
//!
//! The stable toolchain has no `cargo fuzz`, so these are proptest
//! properties in the style of `arbitrary` fuzz targets. Each target gets two
//! kinds of input: plain random bytes of random length, and valid encodings
//! damaged by a few mutations (bit flips, bytes set, extreme 2/4/8-byte words
//! written anywhere, truncation, extension, deleted and duplicated runs). The
//! mutated ones matter most: random bytes rarely get past a decoder's first
//! length check, a damaged valid record reaches every branch behind it.
//!
//! The property is the same everywhere: the decoder returns a value or
//! refuses (None / Err), never panics (overflow checks are on in test
//! builds), always returns, and never asks the allocator for much more than
//! the input's own length, whatever its length fields say (a tracking
//! allocator below measures the largest single request).
//!
//! `SHOAL_FUZZ_CASES` sets the cases per target; the soak run and the
//! results are in `docs/fuzzing.md`.

use std::alloc::{GlobalAlloc, Layout, System};
use std::cell::Cell;

use proptest::collection::vec;
use proptest::prelude::*;

use crate::batch::{Point, SourceOffset};
use crate::codec::{self, NodeRecord, State};
use crate::error::{Error, Result};
use crate::hnsw::{Scored, Scratch, greedy_closest, search_layer, select_neighbours};
use crate::links_log::{self, LogIndex};
use crate::metric::Metric;
use crate::params::IndexParams;
use crate::quant::{self, Code, OwnedCode, Query, QueryCode};
use crate::stop::Stop;
use crate::table::{Block, Epoch, ExternalId, InternalId, LevelId, LogPart, RetiredKey, Seq, TableKey};
use crate::view::Graph;
use crate::{batch_log, nibble, session};

/// Cases per target: `SHOAL_FUZZ_CASES`, else `default`.
pub(crate) fn cases(default: u32) -> u32 {
    std::env::var("SHOAL_FUZZ_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

fn config(default: u32) -> ProptestConfig {
    // No regression files: a failure prints its input and seed, and a soak
    // run must not write into the source tree.
    ProptestConfig { cases: cases(default), failure_persistence: None, ..ProptestConfig::default() }
}

// ---------------------------------------------------------------------------
// The largest allocation a decoder asks for.

/// Passes everything to the system allocator, noting the largest single
/// request of the current thread while a measurement is armed. Thread-local,
/// so tests running in parallel do not see each other's allocations.
struct Tracking;

thread_local! {
    static LARGEST: Cell<Option<usize>> = const { Cell::new(None) };
}

fn note(size: usize) {
    // `try_with`: the allocator may run while the thread's locals are
    // being torn down.
    let _ = LARGEST.try_with(|l| {
        if let Some(m) = l.get() {
            l.set(Some(m.max(size)));
        }
    });
}

// SAFETY: every call is forwarded unchanged to `System`; `note` neither
// allocates nor unwinds.
unsafe impl GlobalAlloc for Tracking {
    unsafe fn alloc(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc(layout) }
    }
    unsafe fn alloc_zeroed(&self, layout: Layout) -> *mut u8 {
        note(layout.size());
        // SAFETY: the caller's contract, passed on.
        unsafe { System.alloc_zeroed(layout) }
    }
    unsafe fn realloc(&self, ptr: *mut u8, layout: Layout, new_size: usize) -> *mut u8 {
        note(new_size);
        // SAFETY: the caller's contract, passed on.
        unsafe { System.realloc(ptr, layout, new_size) }
    }
    unsafe fn dealloc(&self, ptr: *mut u8, layout: Layout) {
        // SAFETY: the caller's contract, passed on.
        unsafe { System.dealloc(ptr, layout) }
    }
}

#[global_allocator]
static GLOBAL: Tracking = Tracking;

/// Runs `f` and returns its result with the largest single allocation it
/// made on this thread.
fn largest_allocation<T>(f: impl FnOnce() -> T) -> (T, usize) {
    LARGEST.with(|l| l.set(Some(0)));
    let r = f();
    (r, LARGEST.with(|l| l.replace(None)).unwrap_or(0))
}

// ---------------------------------------------------------------------------
// Mutations.

/// One change to a valid encoding; positions wrap around its length.
#[derive(Clone, Debug)]
pub(crate) enum Mutation {
    Flip(usize, u8),
    Set(usize, u8),
    /// A little-endian word of 2, 4 or 8 bytes: where a length, count or
    /// id lives, an extreme value tests the bounds behind it.
    Word(usize, u64, u8),
    Truncate(usize),
    Extend(Vec<u8>),
    Remove(usize, usize),
    Duplicate(usize, usize),
}

fn extreme() -> impl Strategy<Value = u64> {
    prop_oneof![
        Just(0u64),
        Just(1),
        Just(u64::from(u16::MAX)),
        Just(u64::from(u32::MAX)),
        Just(u64::from(u32::MAX) - 1),
        Just(1 << 31),
        Just(u64::MAX),
        Just(u64::MAX - 1),
        Just(1 << 63),
        any::<u64>(),
    ]
}

pub(crate) fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        3 => (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Mutation::Flip(at, bit)),
        2 => (any::<usize>(), any::<u8>()).prop_map(|(at, b)| Mutation::Set(at, b)),
        2 => (any::<usize>(), extreme(), prop_oneof![Just(2u8), Just(4), Just(8)]).prop_map(|(at, v, w)| Mutation::Word(at, v, w)),
        1 => any::<usize>().prop_map(Mutation::Truncate),
        1 => vec(any::<u8>(), 1..64).prop_map(Mutation::Extend),
        1 => (any::<usize>(), 1usize..16).prop_map(|(at, n)| Mutation::Remove(at, n)),
        1 => (any::<usize>(), 1usize..64).prop_map(|(at, n)| Mutation::Duplicate(at, n)),
    ]
}

pub(crate) fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
    let len = bytes.len();
    match m {
        Mutation::Extend(more) => bytes.extend_from_slice(more),
        Mutation::Truncate(at) => bytes.truncate(if len == 0 { 0 } else { at % len }),
        Mutation::Flip(..) | Mutation::Set(..) | Mutation::Word(..) | Mutation::Remove(..) | Mutation::Duplicate(..) if len == 0 => {}
        Mutation::Flip(at, bit) => bytes[at % len] ^= 1 << bit,
        Mutation::Set(at, b) => bytes[at % len] = *b,
        Mutation::Word(at, v, width) => {
            let at = at % len;
            let n = usize::from(*width).min(len - at);
            bytes[at..at + n].copy_from_slice(&v.to_le_bytes()[..n]);
        }
        Mutation::Remove(at, n) => {
            let at = at % len;
            bytes.drain(at..(at + n).min(len));
        }
        Mutation::Duplicate(at, n) => {
            let at = at % len;
            let run = bytes[at..(at + n).min(len)].to_vec();
            bytes.splice(at..at, run);
        }
    }
}

/// Random bytes, or `valid` encodings after 0 to 4 mutations (0: the
/// valid encoding itself, so every target also checks that good records
/// decode).
pub(crate) fn hostile<S: Strategy<Value = Vec<u8>>>(valid: S) -> impl Strategy<Value = Vec<u8>> {
    prop_oneof![
        1 => vec(any::<u8>(), 0..256),
        4 => (valid, vec(mutation(), 0..4)).prop_map(|(mut b, ms)| {
            for m in &ms {
                apply(&mut b, m);
            }
            b
        }),
    ]
}

/// Allocation allowed for decoding `input_len` bytes: a small multiple of
/// the input (decoded structs are larger than their encoding) plus slack.
fn allowed(input_len: usize) -> usize {
    8 * input_len + 4096
}

// ---------------------------------------------------------------------------
// Valid encodings.

fn valid_params() -> impl Strategy<Value = IndexParams> {
    (1u32..4096, 2u16..=256, 1u32..=4096, any::<u64>(), 0usize..3).prop_flat_map(|(dim, m, efc, seed, metric)| {
        (m..=512u16.min(m.saturating_mul(4))).prop_map(move |m0| IndexParams {
            dim,
            metric: Metric::ALL[metric],
            m,
            m0,
            ef_construction: efc,
            seed,
        })
    })
}

fn valid_state() -> impl Strategy<Value = Vec<u8>> {
    (
        any::<u32>(),
        any::<Option<(u32, u8)>>(),
        any::<u64>(),
        any::<u64>(),
        any::<u64>(),
        1u64..,
        0u64..u64::MAX,
        any::<u64>(),
        any::<bool>(),
    )
        .prop_map(|(next_id, entry, live, tombstones, log_epoch, shard_epoch, last_seq, held, old)| {
            let log_first_seq = last_seq + 1 - held.min(last_seq);
            let s =
                State { next_id, entry, live, tombstones, log_epoch, shard_epoch, last_seq, log_first_seq, log_bytes: held, vacuumed: 0 };
            // Both record sizes are on disk in the field.
            if old { s.encode()[..34].to_vec() } else { s.encode().to_vec() }
        })
}

fn links(capacity: usize) -> impl Strategy<Value = Vec<u32>> {
    vec(prop_oneof![0u32..5000, any::<u32>()], 0..=capacity)
}

/// A block of `k` link lists of `capacity` slots, as `links0` stores it.
fn valid_link_block(capacity: usize, k: usize) -> impl Strategy<Value = Vec<u8>> {
    vec(links(capacity), k).prop_map(move |lists| {
        let lb = codec::links_bytes(capacity);
        let mut block = vec![0u8; lb * lists.len()];
        for (slot, ids) in block.chunks_exact_mut(lb).zip(&lists) {
            codec::write_links(ids, slot);
        }
        block
    })
}

fn vector(dim: usize) -> impl Strategy<Value = Vec<f32>> {
    vec(prop_oneof![4 => -1e3f32..1e3, 1 => any::<f32>()], dim)
}

/// A block of `k` codes of `dim`-dimensional vectors.
fn valid_code_block(dim: usize, k: usize) -> impl Strategy<Value = Vec<u8>> {
    vec(vector(dim), k).prop_map(|vs| {
        let mut out = Vec::new();
        for v in &vs {
            quant::encode(v, &mut out);
        }
        out
    })
}

fn valid_log_value(capacity: usize, next_id: u32) -> impl Strategy<Value = Vec<u8>> {
    (proptest::collection::btree_set(0..next_id.max(1), 0..20), vec(links(capacity), 20), 0usize..600).prop_map(
        move |(ids, lists, min_bytes)| {
            let mut out = Vec::new();
            let lists: Vec<(u32, &[u32])> = ids.iter().zip(&lists).map(|(&id, l)| (id, l.as_slice())).collect();
            if links_log::write_value(lists.iter().copied(), capacity, &mut out).is_err() {
                unreachable!("writing to a Vec cannot fail");
            }
            out.resize(links_log::value_bytes(lists.len(), capacity, min_bytes), 0);
            out
        },
    )
}

fn valid_batch_log_entry(dim: usize) -> impl Strategy<Value = Vec<u8>> {
    let point = (any::<u64>(), proptest::option::of(vector(dim)), proptest::option::of(vec(any::<u8>(), 0..24)));
    let source = proptest::option::of(("[a-z0-9-]{1,16}", any::<u64>()).prop_map(|(source, offset)| SourceOffset { source, offset }));
    (source, vec(any::<u64>(), 0..6), vec(point, 0..6)).prop_map(move |(source, deletes, points)| {
        let mut out = Vec::new();
        batch_log::encode(&mut out, source.as_ref(), &deletes, points.iter().map(|(id, v, p)| (*id, v.as_deref(), p.as_deref())), dim);
        out
    })
}

/// Same points, deletes and source, floats compared by their bits.
fn same_entry(a: &crate::LogEntry, b: &crate::LogEntry) -> bool {
    let bits = |p: &Point| (p.id, p.vector.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), p.payload.clone());
    a.seq == b.seq
        && a.source == b.source
        && a.deletes == b.deletes
        && a.points.len() == b.points.len()
        && a.points.iter().zip(&b.points).all(|(x, y)| bits(x) == bits(y))
}

// ---------------------------------------------------------------------------
// A graph made of hostile data, for the walks.

#[derive(Debug)]
struct FakeData {
    n: u32,
    dim: usize,
    codes: Vec<Vec<u8>>,
    /// Per level (0..=2), per node.
    links: Vec<Vec<Vec<u32>>>,
    tombstones: Vec<bool>,
}

struct FakeGraph<'g>(&'g FakeData);

impl FakeGraph<'_> {
    fn corrupt(id: u32) -> Error {
        Error::Corrupt { path: "fake".into(), detail: format!("node {id} does not exist") }
    }
}

impl<'g> Graph<'g> for FakeGraph<'g> {
    fn code(&mut self, id: u32) -> Result<Code<'g>> {
        let bytes = self.0.codes.get(id as usize).ok_or_else(|| Self::corrupt(id))?;
        Code::from_bytes(bytes, self.0.dim).ok_or_else(|| Self::corrupt(id))
    }

    fn links(&mut self, id: u32, level: u8, out: &mut Vec<u32>) -> Result<()> {
        let list = self.0.links.get(usize::from(level)).and_then(|l| l.get(id as usize)).ok_or_else(|| Self::corrupt(id))?;
        out.clear();
        out.extend_from_slice(list);
        Ok(())
    }

    fn is_tombstone(&mut self, id: u32) -> Result<bool> {
        self.0.tombstones.get(id as usize).copied().ok_or_else(|| Self::corrupt(id))
    }
}

fn fake_graph() -> impl Strategy<Value = FakeData> {
    (1u32..48, 1usize..24).prop_flat_map(|(n, dim)| {
        let cb = quant::code_bytes(dim);
        // Mostly ids inside the graph (so walks go somewhere), some past it,
        // a few anywhere in the u32 range.
        let id = prop_oneof![12 => 0..n, 2 => n..n + 100, 1 => any::<u32>()];
        let lists = vec(vec(vec(id, 0..12), n as usize), 3);
        // Codes: real ones, and raw bytes (NaN and infinite scales included).
        let code = prop_oneof![valid_code_block(dim, 1), vec(any::<u8>(), cb)];
        (Just(n), Just(dim), vec(code, n as usize), lists, vec(any::<bool>(), n as usize))
            .prop_map(|(n, dim, codes, links, tombstones)| FakeData { n, dim, codes, links, tombstones })
    })
}

// ---------------------------------------------------------------------------
// The targets.

proptest! {
    #![proptest_config(config(2000))]

    /// Keys: internal ids and block numbers (u32 BE), external ids, link
    /// log epochs and batch sequence numbers (u64 BE), (level, id),
    /// (kind, id) and (sequence number, part) pairs; and the u32 and u64
    /// BE values (the id map's
    /// internal ids, sources' offsets).
    #[test]
    fn fuzz_id_keys(b in hostile(prop_oneof![
        any::<u32>().prop_map(|i| InternalId::encode(i).to_vec()),
        any::<u64>().prop_map(|i| Seq::encode(i).to_vec()),
        any::<(u8, u32)>().prop_map(|k| LevelId::encode(k).to_vec()),
        any::<(u64, u32)>().prop_map(|k| LogPart::encode(k).to_vec()),
    ])) {
        prop_assert_eq!(InternalId::decode(&b).is_some(), b.len() == 4);
        prop_assert_eq!(Block::decode(&b).is_some(), b.len() == 4);
        prop_assert_eq!(codec::decode_mapped_id(&b).is_some(), b.len() == 4);
        for decoded in [ExternalId::decode(&b), Epoch::decode(&b), Seq::decode(&b), session::decode_offset(&b)] {
            prop_assert_eq!(decoded.is_some(), b.len() == 8);
        }
        prop_assert_eq!(LevelId::decode(&b).is_some(), b.len() == 5);
        prop_assert_eq!(RetiredKey::decode(&b).is_some(), b.len() == 5 && b[0] < 2);
        prop_assert_eq!(LogPart::decode(&b).is_some(), b.len() == 12);
        if let Some(key) = LogPart::decode(&b) {
            prop_assert_eq!(&LogPart::encode(key)[..], &b[..]);
        }
        if let Some(id) = InternalId::decode(&b) {
            prop_assert_eq!(&InternalId::encode(id)[..], &b[..]);
        }
        if let Some(key) = RetiredKey::decode(&b) {
            prop_assert_eq!(&RetiredKey::encode(key)[..], &b[..]);
        }
    }

    /// `nodes` values.
    #[test]
    fn fuzz_node_records(b in hostile((any::<u64>(), any::<u8>(), any::<u8>()).prop_map(|(external, level, flags)| NodeRecord { external, level, flags }.encode().to_vec()))) {
        match NodeRecord::decode(&b) {
            Some(r) => prop_assert_eq!(&r.encode()[..], &b[..]),
            None => prop_assert_ne!(b.len(), NodeRecord::SIZE),
        }
    }

    /// `links0` blocks and `links_up` values, split into lists the way the
    /// view reads them (a block of the wrong length is refused whole).
    #[test]
    fn fuzz_link_blocks(
        (capacity, k, b) in (2usize..=64, 1usize..=16).prop_flat_map(|(c, k)| (Just(c), Just(k), hostile(valid_link_block(c, k))))
    ) {
        let lb = codec::links_bytes(capacity);
        let mut out = Vec::new();
        let ((), largest) = largest_allocation(|| {
            if b.len() == lb * k {
                for slot in b.chunks_exact(lb) {
                    if codec::decode_links(slot, &mut out) {
                        assert!(out.len() <= capacity);
                    }
                }
            }
            // The same bytes as one list of any capacity.
            codec::decode_links(&b, &mut out);
        });
        prop_assert!(largest <= allowed(b.len()), "{} bytes allocated for {} bytes", largest, b.len());
        if codec::decode_links(&b, &mut out) {
            prop_assert!(2 + 4 * out.len() <= b.len());
        }
    }

    /// `codes` blocks, split into codes the way the view reads them, and
    /// every distance the walks compute on them.
    #[test]
    fn fuzz_code_blocks(
        (dim, k, b, q) in (1usize..40, 1usize..8).prop_flat_map(|(dim, k)| (Just(dim), Just(k), hostile(valid_code_block(dim, k)), vector(dim)))
    ) {
        let cb = quant::code_bytes(dim);
        let query = OwnedCode::new(&q);
        // The view's check: whole codes, at most a block of them.
        if b.len() % cb == 0 && b.len() / cb <= k {
            let codes: Vec<Code<'_>> = b.chunks_exact(cb).filter_map(|c| Code::from_bytes(c, dim)).collect();
            prop_assert_eq!(codes.len(), b.len() / cb);
            for &c in &codes {
                for metric in Metric::ALL {
                    // Garbage in, garbage out (NaN included), but no panic.
                    let _ = metric.code_distance(query.code(), c);
                    let _ = metric.code_distance(c, c);
                    let _ = QueryCode::new(&q).distance(metric, c);
                }
            }
        }
        // The kernels on raw planes: exact for any bytes.
        let half = nibble::plane_bytes(dim);
        if b.len() >= 2 * half {
            let (x, y) = b.split_at(half);
            prop_assert_eq!(nibble::sums(x, &y[..half]), nibble::sums_scalar(x, &y[..half]));
        }
    }

    /// The `params` record. Whatever decodes and validates must give sizes
    /// the engine can compute with.
    #[test]
    fn fuzz_params_records(b in hostile(valid_params().prop_map(|p| codec::encode_params(&p)))) {
        if let Ok((_, p)) = codec::decode_params(&b)
            && p.validate().is_ok()
        {
            // The version may be one that is migrated from; the rest is
            // the same record.
            prop_assert_eq!(&codec::encode_params(&p)[4..], &b[4..]);
            let _ = (p.code_bytes(), p.codes_per_block(), p.vector_bytes(), p.vectors_per_block(), p.level_scale());
            let _ = codec::links0_block_nodes(p.max_links(0));
            for page in [4096, 16384, 65536] {
                let _ = codec::values_per_leaf(p.vector_bytes(), page);
            }
        }
    }

    /// The `state` record, both sizes.
    #[test]
    fn fuzz_state_records(b in hostile(valid_state())) {
        if let Some(s) = State::decode(&b) {
            // Entries held: no overflow for any accepted record.
            let _ = s.log_entries();
            prop_assert_eq!(State::decode(&s.encode()), Some(s));
        }
    }

    /// `links0_log` values: the count against the length, the ids against
    /// the index, and records looked up by number (numbers may be damaged
    /// too).
    #[test]
    fn fuzz_link_log_values(
        (capacity, next_id, b, record) in (2usize..=64, 1u32..(1 << 20)).prop_flat_map(|(c, n)| (Just(c), Just(n), hostile(valid_log_value(c, n)), prop_oneof![0usize..32, any::<usize>()]))
    ) {
        let lb = codec::links_bytes(capacity);
        let (ids, largest) = largest_allocation(|| links_log::value_ids(&b, lb, next_id));
        prop_assert!(largest <= allowed(b.len()), "{} bytes allocated for {} bytes", largest, b.len());
        let parsed = links_log::Value::parse(&b, lb);
        prop_assert_eq!(parsed.is_some(), links_log::records(&b, lb).is_some());
        if let Some(value) = parsed {
            let mut out = Vec::new();
            for r in (0..value.len()).chain([record, value.len(), usize::MAX]) {
                match value.list(r) {
                    Some(list) => {
                        prop_assert!(r < value.len());
                        prop_assert_eq!(list.len(), lb);
                        let _ = codec::decode_links(list, &mut out);
                    }
                    None => prop_assert!(r >= value.len()),
                }
            }
        }
        if let Ok(ids) = ids {
            let index = LogIndex::default().with_value(7, ids.iter().copied());
            for (record, &id) in ids.iter().enumerate() {
                prop_assert_eq!(index.get(id), Some((0, record)));
            }
        }
    }

    /// `batch_log` values, read with the index's dimension (and a wrong one).
    #[test]
    fn fuzz_batch_log_entries(
        (dim, b, wrong) in (1usize..12).prop_flat_map(|d| (Just(d), hostile(valid_batch_log_entry(d)), any::<bool>()))
    ) {
        let read_dim = if wrong { dim + 1 } else { dim };
        let (entry, largest) = largest_allocation(|| batch_log::decode(3, &b, read_dim));
        prop_assert!(largest <= allowed(b.len()), "{} bytes allocated for {} bytes", largest, b.len());
        if let Some(d) = entry {
            let mut again = Vec::new();
            let e = &d.entry;
            let points = e.points.iter().enumerate().map(|(i, p)| {
                (p.id, (!d.by_reference.contains(&i)).then_some(p.vector.as_slice()), p.payload.as_deref())
            });
            batch_log::encode(&mut again, e.source.as_ref(), &e.deletes, points, read_dim);
            let back = batch_log::decode(3, &again, read_dim);
            prop_assert!(
                back.as_ref().is_some_and(|back| same_entry(&back.entry, e) && back.by_reference == d.by_reference),
                "{:?} vs {:?}", back, d
            );
        }
    }

    /// The first two pages of `data.mdb`, checked before LMDB maps it.
    #[test]
    fn fuzz_lmdb_meta_pages(
        (b, len) in (prop_oneof![Just(4096usize), Just(16384)], 2u64..100_000, 1u64..1 << 40, 0u64..4096)
            .prop_flat_map(|(page, last, txn, spare)| {
                let len = (last + 1) * page as u64 + spare;
                (hostile(Just(crate::store::meta::sample(page, last, txn))), prop_oneof![Just(len), any::<u64>()])
            })
    ) {
        let (result, largest) = largest_allocation(|| crate::store::meta::check(&b, len));
        prop_assert!(largest <= allowed(b.len()));
        let _ = result;
    }

    /// The HNSW walks and the neighbour heuristic over a graph whose links
    /// point anywhere (cycles, self-links, past the end) and whose codes
    /// are garbage: they end, with results or a corruption error.
    #[test]
    fn fuzz_hnsw_walks_over_hostile_graphs(
        g in fake_graph(),
        entry in any::<u32>(),
        top in 0u8..=2,
        ef in 1usize..64,
        skip in any::<bool>(),
        metric in 0usize..3,
        q in vector(23),
    ) {
        let entry = entry % g.n;
        let query = QueryCode::new(&q[..g.dim]);
        let metric = Metric::ALL[metric];
        let mut graph = FakeGraph(&g);
        let mut scratch = Scratch::new();
        let mut out = Vec::new();
        let stop = Stop::never();
        let result = (|| -> Result<()> {
            let mut best = Scored { dist: query.distance(metric, graph.code(entry)?), id: entry };
            for level in (1..=top).rev() {
                best = greedy_closest(&mut graph, &mut scratch, metric, &query, best, level, &stop)?;
            }
            search_layer(&mut graph, &mut scratch, metric, &query, &[best], ef, 0, skip, &mut out, &stop)?;
            let mut chosen = Vec::new();
            select_neighbours(&mut graph, metric, &out, 4, &mut chosen)?;
            Ok(())
        })();
        if let Err(e) = &result {
            prop_assert!(matches!(e, Error::Corrupt { .. }), "not a corruption error: {}", e);
        } else {
            prop_assert!(out.len() <= ef);
            prop_assert!(out.iter().all(|s| s.id < g.n));
            let mut ids: Vec<u32> = out.iter().map(|s| s.id).collect();
            ids.sort_unstable();
            ids.dedup();
            prop_assert_eq!(ids.len(), out.len(), "a result came back twice");
        }
    }
}
