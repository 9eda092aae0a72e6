//! Hostile bytes for everything a restore or a listing reads from the
//! object store (issue 23): manifests, object keys, and the stored chunks.
//!
//! Same method as the engine's `fuzz_tests` (proptest, random bytes and
//! mutated valid encodings; see `docs/fuzzing.md`). Manifests are JSON, so
//! besides byte-level damage they also get structural damage: a field
//! removed, set to an extreme number, or given another type; that is what
//! reaches `Manifest::check` rather than failing in the JSON parser.
//! Property: an error or a value, never a panic, and a manifest that passes
//! is consistent enough to restore from (its chunks add up, its offsets
//! stay inside the image, its chunks are small enough to buffer).

use proptest::collection::vec;
use proptest::prelude::*;
use serde_json::Value;

use crate::catalog::{Listed, MAX_LISTED_MISSING, summarize};
use crate::chunk;
use crate::error::SnapshotError;
use crate::layout;
use crate::manifest::{ChunkRef, CompressionDoc, FORMAT, FORMAT_VERSION, MAX_CHUNK_SIZE, Manifest, OffsetDoc, ParamsDoc};

/// Cases per target: `SHOAL_FUZZ_CASES`, else `default`.
fn config(default: u32) -> ProptestConfig {
    let cases = std::env::var("SHOAL_FUZZ_CASES").ok().and_then(|s| s.parse().ok()).unwrap_or(default);
    // No regression files: a soak run must not write into the source tree.
    ProptestConfig { cases, failure_persistence: None, ..ProptestConfig::default() }
}

/// One byte-level change; positions wrap around the input's length.
#[derive(Clone, Debug)]
enum Mutation {
    Flip(usize, u8),
    Set(usize, u8),
    Word(usize, u64, u8),
    Truncate(usize),
    Extend(Vec<u8>),
    Remove(usize, usize),
    Duplicate(usize, usize),
}

fn extreme() -> impl Strategy<Value = u64> {
    prop_oneof![Just(0u64), Just(1), Just(u64::from(u32::MAX)), Just(1 << 31), Just(u64::MAX), Just(1 << 63), any::<u64>()]
}

fn mutation() -> impl Strategy<Value = Mutation> {
    prop_oneof![
        3 => (any::<usize>(), 0u8..8).prop_map(|(at, bit)| Mutation::Flip(at, bit)),
        2 => (any::<usize>(), any::<u8>()).prop_map(|(at, b)| Mutation::Set(at, b)),
        2 => (any::<usize>(), extreme(), prop_oneof![Just(1u8), Just(2), Just(4), Just(8)]).prop_map(|(at, v, w)| Mutation::Word(at, v, w)),
        1 => any::<usize>().prop_map(Mutation::Truncate),
        1 => vec(any::<u8>(), 1..32).prop_map(Mutation::Extend),
        1 => (any::<usize>(), 1usize..16).prop_map(|(at, n)| Mutation::Remove(at, n)),
        1 => (any::<usize>(), 1usize..32).prop_map(|(at, n)| Mutation::Duplicate(at, n)),
    ]
}

fn apply(bytes: &mut Vec<u8>, m: &Mutation) {
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

/// Random bytes, or `valid` after 0 to 4 mutations.
fn hostile<S: Strategy<Value = Vec<u8>>>(valid: S) -> impl Strategy<Value = Vec<u8>> {
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

// ---------------------------------------------------------------------------
// Manifests.

fn hex64() -> impl Strategy<Value = String> {
    "[0-9a-f]{64}"
}

/// A manifest that passes its own check.
fn valid_manifest() -> impl Strategy<Value = Manifest> {
    let chunks = (1u64..=(64 << 20), 0usize..6, 1u64..=(64 << 20)).prop_flat_map(|(chunk_size, full, last)| {
        let last = last.min(chunk_size);
        (Just(chunk_size), vec((hex64(), 1u64..=chunk_size), full), hex64(), Just(last), 1u64..1000).prop_map(
            |(chunk_size, full, last_hash, last, last_stored)| {
                let mut chunks: Vec<ChunkRef> =
                    full.into_iter().map(|(hash, stored)| ChunkRef { hash, raw_len: chunk_size, stored_len: stored }).collect();
                chunks.push(ChunkRef { hash: last_hash, raw_len: last, stored_len: last_stored.min(last) });
                (chunk_size, chunks)
            },
        )
    });
    (chunks, "[a-z][a-z0-9_-]{0,20}", 0u32..64, any::<u64>(), 0usize..3, vec(("[a-z]{1,8}", any::<u64>()), 0..3)).prop_map(
        |((chunk_size, chunks), collection, shard, ms, metric, offsets)| {
            let p = shoal_engine::IndexParams::new(8, shoal_engine::Metric::ALL[metric]);
            Manifest {
                format: FORMAT.into(),
                format_version: FORMAT_VERSION,
                id: "20260101T000000.000Z-abcd".into(),
                collection,
                shard,
                shard_count: shard + 1,
                created_at: "20260101T000000.000Z".into(),
                created_at_ms: ms,
                index: ParamsDoc::of(&p),
                txn_id: 7,
                points: 10,
                tombstones: 0,
                offsets: offsets.into_iter().map(|(source, offset)| OffsetDoc { source, offset }).collect(),
                copy_mode: "plain".into(),
                compression: CompressionDoc { codec: "zstd".into(), level: 3 },
                chunk_size,
                image_bytes: chunks.iter().map(|c| c.raw_len).sum(),
                stored_bytes: chunks.iter().map(|c| c.stored_len).sum(),
                uploaded_chunks: 1,
                uploaded_bytes: 1,
                chunks,
            }
        },
    )
}

/// A JSON value for a field: extreme numbers, other types.
fn hostile_json() -> impl Strategy<Value = Value> {
    prop_oneof![
        extreme().prop_map(Value::from),
        any::<i64>().prop_map(Value::from),
        Just(serde_json::json!(-1)),
        Just(serde_json::json!(1e300)),
        Just(serde_json::json!(0.5)),
        Just(Value::Null),
        Just(serde_json::json!("")),
        Just(serde_json::json!("zstd")),
        Just(serde_json::json!([])),
        Just(serde_json::json!({})),
        Just(serde_json::json!(true)),
    ]
}

/// Structural damage to a manifest's JSON: fields (of the top level, of the
/// index parameters, of the compression, of a chunk) removed or replaced.
#[derive(Clone, Debug)]
enum JsonDamage {
    Remove(usize),
    Replace(usize, Value),
}

fn damage_json(m: &Manifest, damage: &[JsonDamage]) -> Vec<u8> {
    let mut v = match serde_json::to_value(m) {
        Ok(v) => v,
        Err(e) => unreachable!("a manifest serialises: {e}"),
    };
    for d in damage {
        // Every object in the document, and its keys, in a stable order.
        let mut paths: Vec<(Vec<String>, String)> = Vec::new();
        fn walk(v: &Value, at: &mut Vec<String>, out: &mut Vec<(Vec<String>, String)>) {
            match v {
                Value::Object(o) => {
                    for (k, child) in o {
                        out.push((at.clone(), k.clone()));
                        at.push(k.clone());
                        walk(child, at, out);
                        at.pop();
                    }
                }
                Value::Array(a) => {
                    for (i, child) in a.iter().enumerate() {
                        at.push(i.to_string());
                        walk(child, at, out);
                        at.pop();
                    }
                }
                Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => {}
            }
        }
        walk(&v, &mut Vec::new(), &mut paths);
        let (i, replacement) = match d {
            JsonDamage::Remove(i) => (*i, None),
            JsonDamage::Replace(i, r) => (*i, Some(r.clone())),
        };
        let Some((parent, key)) = paths.get(i % paths.len().max(1)).cloned() else { continue };
        let mut node = &mut v;
        for step in &parent {
            node = match node {
                Value::Object(o) => o.get_mut(step.as_str()).unwrap_or_else(|| unreachable!("walked above")),
                Value::Array(a) => a.get_mut(step.parse::<usize>().unwrap_or_default()).unwrap_or_else(|| unreachable!("walked above")),
                Value::Null | Value::Bool(_) | Value::Number(_) | Value::String(_) => unreachable!("walked above"),
            };
        }
        if let Value::Object(o) = node {
            match replacement {
                None => {
                    o.remove(&key);
                }
                Some(r) => {
                    o.insert(key, r);
                }
            }
        }
    }
    serde_json::to_vec(&v).unwrap_or_default()
}

fn json_damage() -> impl Strategy<Value = JsonDamage> {
    prop_oneof![
        1 => any::<usize>().prop_map(JsonDamage::Remove),
        4 => (any::<usize>(), hostile_json()).prop_map(|(i, v)| JsonDamage::Replace(i, v)),
    ]
}

/// What a manifest that parses must guarantee to a restore.
fn assert_restorable(m: &Manifest) -> Result<(), TestCaseError> {
    prop_assert!(m.chunk_size >= 1 && m.chunk_size <= MAX_CHUNK_SIZE);
    prop_assert!(m.index.params().is_some());
    let mut raw = 0u64;
    for (i, offset, c) in m.chunk_offsets() {
        prop_assert_eq!(offset, raw, "chunk {} is not where the ones before it end", i);
        prop_assert!(c.raw_len >= 1 && c.raw_len <= m.chunk_size);
        prop_assert!(c.stored_len >= 1 && c.stored_len as usize <= zstd::zstd_safe::compress_bound(c.raw_len as usize));
        prop_assert_eq!(layout::chunk_key(&c.hash).as_ref().len(), "chunks/".len() + 64);
        raw += c.raw_len;
    }
    prop_assert_eq!(raw, m.image_bytes);
    Ok(())
}

fn bad_manifest(e: &SnapshotError) -> bool {
    matches!(e, SnapshotError::BadManifest { .. } | SnapshotError::UnsupportedFormat { .. })
}

// ---------------------------------------------------------------------------
// Chunks.

/// Raw chunk contents: runs and noise, so frames hold every block kind.
fn raw_chunk() -> impl Strategy<Value = Vec<u8>> {
    vec((any::<u8>(), 1usize..300, any::<bool>()), 0..24).prop_map(|runs| {
        let mut out = Vec::new();
        let mut x = 0x9e37_79b9u32;
        for (b, n, noise) in runs {
            for _ in 0..n {
                x ^= x << 13;
                x ^= x >> 17;
                x ^= x << 5;
                out.push(if noise { x as u8 } else { b });
            }
        }
        out
    })
}

proptest! {
    #![proptest_config(config(1000))]

    /// Manifest bytes damaged anywhere.
    #[test]
    fn fuzz_manifest_bytes(b in hostile(valid_manifest().prop_map(|m| m.to_json()))) {
        match Manifest::parse("snapshots/docs/0/x.json", &b) {
            Ok(m) => assert_restorable(&m)?,
            Err(e) => prop_assert!(bad_manifest(&e), "{}", e),
        }
    }

    /// Manifests with fields removed, given extreme numbers or other types.
    #[test]
    fn fuzz_manifest_fields(m in valid_manifest(), damage in vec(json_damage(), 1..4)) {
        let b = damage_json(&m, &damage);
        match Manifest::parse("snapshots/docs/0/x.json", &b) {
            Ok(m) => assert_restorable(&m)?,
            Err(e) => prop_assert!(bad_manifest(&e), "{}", e),
        }
    }

    /// A stored chunk (one zstd frame) damaged, checked against a raw length
    /// near or far from the real one, into the buffer a restore gives it
    /// (`raw_len + 1`, bounded by the manifest's check). Decompression is
    /// single-shot into that buffer, so a frame that declares more content,
    /// or holds more, fails instead of allocating.
    #[test]
    fn fuzz_chunk_frames(
        raw in raw_chunk(),
        level in 1i32..6,
        damage in vec(mutation(), 0..4),
        claimed in prop_oneof![3 => Just(None), 1 => (0u64..70_000).prop_map(Some), 1 => extreme().prop_map(Some)],
    ) {
        let Ok(mut stored) = chunk::compress(&raw, level) else {
            return Err(TestCaseError::fail("compression failed"));
        };
        for m in &damage {
            apply(&mut stored, m);
        }
        let raw_len = claimed.unwrap_or(raw.len() as u64);
        let hash = chunk::hash(&raw);
        // What a restore does: a manifest that passed its check bounds
        // the buffer; anything larger is refused before this point.
        let cap = usize::try_from(raw_len.min(MAX_CHUNK_SIZE)).unwrap_or_default().min(1 << 20) + 1;
        let mut out = vec![0u8; cap];
        match chunk::decompress_checked_into(&stored, raw_len, &hash, &mut out) {
            Ok(n) => {
                prop_assert_eq!(n as u64, raw_len);
                prop_assert_eq!(&out[..n], &raw[..]);
            }
            Err(reason) => prop_assert!(!reason.is_empty()),
        }
        if damage.is_empty() && claimed.is_none() {
            prop_assert_eq!(chunk::decompress_checked(&stored, raw_len, &hash), Ok(raw.clone()));
        }
    }

    /// Object keys from a listing (anyone who can write to the bucket
    /// chooses them), ids and collection names.
    #[test]
    fn fuzz_object_keys(
        key in prop_oneof![
            "snapshots/[a-z0-9_-]{0,12}/[0-9+-]{0,12}/[A-Za-z0-9._-]{0,20}(\\.json)?",
            "[ -~]{0,80}",
            any::<String>(),
        ]
    ) {
        let path = object_store::path::Path::from(key.as_str());
        if let Some((collection, shard, id)) = layout::parse_manifest_key(&path) {
            prop_assert!(!collection.contains('/') && !id.contains('/'));
            let _ = shard;
        }
        let _ = layout::validate_id(&key);
        let _ = layout::validate_collection(&key);
    }

    /// Listings of manifests whose counts and shards are anything.
    #[test]
    fn fuzz_listing_summaries(
        entries in vec((0u32..4, any::<u32>(), prop_oneof![0u32..8, any::<u32>()], any::<u64>(), any::<bool>()), 0..12)
    ) {
        let listed: Vec<Listed> = entries
            .iter()
            .map(|&(id, shard, shard_count, created_at_ms, readable)| {
                let manifest = if readable {
                    let base = crate::manifest::tests::sample();
                    Ok(Manifest { id: id.to_string(), shard, shard_count, created_at_ms, ..base })
                } else {
                    Err(SnapshotError::BadManifest { key: format!("snapshots/docs/{shard}/{id}.json"), reason: "damaged".into() })
                };
                Listed { collection: "docs".into(), shard, id: id.to_string(), manifest }
            })
            .collect();
        for s in summarize(&listed) {
            prop_assert!(s.missing.len() <= MAX_LISTED_MISSING);
            let _ = (s.why_incomplete(), s.age(u64::MAX), s.age(0), s.manifest_shards());
        }
    }
}
