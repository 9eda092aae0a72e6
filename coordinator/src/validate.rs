//! Checks done once, where a request enters the cluster: a request that
//! passes them cannot fail on a shard for a reason the caller could fix,
//! so a batch never half-applies because of bad input.

use std::fmt::Display;

use shoal_proto::v1;

use shoal_control::model::{CollectionSpec, Metric};

use crate::error::{Error, Result};

/// Request limits (configurable in `[coordinator.limits]`).
#[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct Limits {
    /// Points plus deletes in one batch or write.
    pub max_batch_ops: usize,
    pub max_payload_bytes: usize,
    pub max_k: u32,
    pub max_ef: u32,
    /// Query vectors in one SearchBatch.
    pub max_queries: usize,
    /// Ids in one Get.
    pub max_get_ids: usize,
    /// Bytes of a source name.
    pub max_source_bytes: usize,
    /// Shards one collection may have.
    pub max_shards_per_collection: u32,
    /// Hits one search may ask for: queries × k. Bounds the memory a search
    /// takes on every node and the size of its answer.
    pub max_hits: u64,
}

impl Default for Limits {
    fn default() -> Self {
        Limits {
            max_batch_ops: 100_000,
            max_payload_bytes: 64 << 10,
            max_k: 10_000,
            max_ef: 100_000,
            max_queries: 1_024,
            max_get_ids: 10_000,
            max_source_bytes: 255,
            max_shards_per_collection: 1024,
            max_hits: 1_000_000,
        }
    }
}

/// A vector for a collection of this spec.
pub fn vector(v: &[f32], spec: &CollectionSpec, what: impl Display) -> Result<()> {
    if v.is_empty() {
        return Err(Error::Invalid(format!("{what}: vector is empty")));
    }
    if v.len() != spec.dimension as usize {
        return Err(Error::Invalid(format!("{what}: vector has dimension {}, the collection expects {}", v.len(), spec.dimension)));
    }
    if let Some((i, x)) = v.iter().enumerate().find(|(_, x)| !x.is_finite()) {
        return Err(Error::Invalid(format!("{what}: component {i} is {x}; every component must be finite")));
    }
    let norm_sq: f64 = v.iter().map(|&x| f64::from(x) * f64::from(x)).sum();
    if spec.metric == Metric::Cosine && norm_sq.sqrt() < f64::from(f32::MIN_POSITIVE) {
        return Err(Error::Invalid(format!("{what}: a zero vector has no direction under the cosine metric")));
    }
    // Euclidean: |a - b|² ≤ 4 max(|a|², |b|²) must stay finite too.
    let limit = if spec.metric == Metric::Euclidean { f64::from(f32::MAX) / 4.0 } else { f64::from(f32::MAX) };
    if spec.metric != Metric::Cosine && norm_sq > limit {
        return Err(Error::Invalid(format!("{what}: the vector's squared length overflows 32-bit float distances; scale it down")));
    }
    Ok(())
}

/// Points and deletes of a write (`filtered`: it also deletes by filter,
/// and may then hold nothing else).
pub fn write(points: &[v1::Point], deletes: &[u64], filtered: bool, spec: &CollectionSpec, limits: &Limits) -> Result<()> {
    if points.is_empty() && deletes.is_empty() && !filtered {
        return Err(Error::Invalid("batch is empty: it has no points, no deletes and no delete filter".into()));
    }
    if points.len() + deletes.len() > limits.max_batch_ops {
        return Err(Error::Invalid(format!(
            "batch has {} operations, more than the limit of {}",
            points.len() + deletes.len(),
            limits.max_batch_ops
        )));
    }
    for (i, p) in points.iter().enumerate() {
        vector(&p.vector, spec, format_args!("point {i} (id {})", p.id))?;
        if let Some(kind) = p.payload.as_ref().and_then(|p| p.kind.as_ref()) {
            let len = match kind {
                v1::payload::Kind::Binary(b) => b.len(),
                v1::payload::Kind::Json(s) => {
                    if let Err(why) = shoal_proto::json::check_payload(s) {
                        return Err(Error::Invalid(format!("point {i} (id {}): {why}", p.id)));
                    }
                    s.len()
                }
            };
            if len + 1 > limits.max_payload_bytes {
                return Err(Error::Invalid(format!(
                    "point {i} (id {}): payload of {len} bytes exceeds the limit of {} bytes",
                    p.id,
                    limits.max_payload_bytes - 1
                )));
            }
        }
    }
    Ok(())
}

/// The source and offset of an ingest batch.
pub fn source(s: &v1::SourceOffset, limits: &Limits) -> Result<()> {
    if s.source.is_empty() || s.source.len() > limits.max_source_bytes {
        return Err(Error::Invalid(format!("source name must be 1 to {} bytes, got {}", limits.max_source_bytes, s.source.len())));
    }
    // Offsets must grow, so a source at the largest one could never apply
    // another batch.
    if s.offset == u64::MAX {
        return Err(Error::Invalid(format!("offset {} is reserved: offsets must be below 2^64-1", s.offset)));
    }
    Ok(())
}

/// The hits a search asks for: queries × k, within the limit.
pub fn hits(queries: usize, k: u32, limits: &Limits) -> Result<()> {
    let asked = queries as u64 * u64::from(k);
    if asked > limits.max_hits {
        return Err(Error::Invalid(format!(
            "a search may ask for at most {} hits (queries × k); this one asks for {queries} × {k} = {asked}: \
             lower k or send fewer queries per request",
            limits.max_hits
        )));
    }
    Ok(())
}

/// k and ef of a search; returns the per-shard ef to use.
pub fn search_params(k: u32, ef: u32, limits: &Limits) -> Result<u32> {
    if k == 0 || k > limits.max_k {
        return Err(Error::Invalid(format!("k must be between 1 and {}, got {k}", limits.max_k)));
    }
    if ef > limits.max_ef {
        return Err(Error::Invalid(format!("ef must be at most {}, got {ef}", limits.max_ef)));
    }
    Ok(if ef == 0 { shoal_proto::default_ef(k) } else { ef.max(k) })
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// Cases per fuzz property: `SHOAL_FUZZ_CASES` for a soak (docs/fuzzing.md).
    fn fuzz_cases() -> u32 {
        std::env::var("SHOAL_FUZZ_CASES").ok().and_then(|v| v.parse().ok()).unwrap_or(512)
    }

    fn hostile_f32() -> impl Strategy<Value = f32> {
        prop_oneof![
            4 => -2.0f32..2.0,
            1 => Just(f32::NAN),
            1 => Just(f32::INFINITY),
            1 => Just(f32::MAX),
            1 => Just(0.0f32),
            1 => any::<u32>().prop_map(f32::from_bits),
        ]
    }

    fn hostile_payload() -> impl Strategy<Value = Option<v1::Payload>> {
        let json = prop_oneof![
            "\\PC{0,40}",
            Just("{\"a\": [1, 2, {\"b\": null}]}".to_owned()),
            (0usize..200).prop_map(|d| format!("{}{}", "[".repeat(d), "]".repeat(d))),
            (0usize..200).prop_map(|d| "{\"a\":".repeat(d)),
        ];
        prop_oneof![
            Just(None),
            json.prop_map(|j| Some(v1::Payload { kind: Some(v1::payload::Kind::Json(j)) })),
            proptest::collection::vec(any::<u8>(), 0..300).prop_map(|b| Some(v1::Payload { kind: Some(v1::payload::Kind::Binary(b)) })),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: fuzz_cases(), failure_persistence: None, ..ProptestConfig::default() })]

        /// Whatever a client sends, validation answers (never panics), and
        /// what it lets through is what the shards can apply: every vector
        /// of the collection's dimension and finite, every JSON payload
        /// parseable and shallow enough.
        #[test]
        fn fuzz_request_validation(
            points in proptest::collection::vec(
                (any::<u64>(), proptest::collection::vec(hostile_f32(), 0..6), hostile_payload()),
                0..8,
            ),
            deletes in proptest::collection::vec(any::<u64>(), 0..4),
            dim in 1u32..5,
            metric in prop_oneof![Just(Metric::Cosine), Just(Metric::Dot), Just(Metric::Euclidean)],
            k in any::<u32>(),
            ef in any::<u32>(),
            queries in 0usize..5_000,
            source_name in "\\PC{0,300}",
            offset in any::<u64>(),
        ) {
            let spec = CollectionSpec { dimension: dim, metric, index: Default::default(), shard_count: 1 };
            let limits = Limits { max_payload_bytes: 256, ..Limits::default() };
            let points: Vec<v1::Point> = points.into_iter().map(|(id, vector, payload)| v1::Point { id, vector, payload }).collect();
            if write(&points, &deletes, false, &spec, &limits).is_ok() {
                for p in &points {
                    prop_assert_eq!(p.vector.len(), dim as usize);
                    prop_assert!(p.vector.iter().all(|x| x.is_finite()));
                    if let Some(v1::payload::Kind::Json(j)) = p.payload.as_ref().and_then(|p| p.kind.as_ref()) {
                        prop_assert!(serde_json::from_str::<serde::de::IgnoredAny>(j).is_ok());
                        prop_assert!(shoal_proto::json::json_depth(j) <= shoal_proto::json::MAX_JSON_DEPTH);
                    }
                }
            }
            if let Ok(ef) = search_params(k, ef, &limits) {
                prop_assert!(k >= 1 && k <= limits.max_k && ef <= limits.max_ef.max(k));
            }
            let _ = hits(queries, k, &limits);
            let _ = source(&v1::SourceOffset { source: source_name, offset }, &limits);
        }
    }

    fn spec(metric: Metric) -> CollectionSpec {
        CollectionSpec { dimension: 3, metric, index: Default::default(), shard_count: 1 }
    }

    #[test]
    fn vectors_get_precise_errors() {
        let s = spec(Metric::Cosine);
        let e = |v: &[f32]| vector(v, &s, "point 2 (id 9)").unwrap_err().to_string();
        assert_eq!(e(&[]), "point 2 (id 9): vector is empty");
        assert_eq!(e(&[1.0, 2.0]), "point 2 (id 9): vector has dimension 2, the collection expects 3");
        assert_eq!(e(&[1.0, f32::NAN, 0.0]), "point 2 (id 9): component 1 is NaN; every component must be finite");
        assert!(e(&[0.0, 0.0, 0.0]).contains("zero vector"));
        assert!(vector(&[0.0; 3], &spec(Metric::Euclidean), "q").is_ok());
    }

    #[test]
    fn writes_and_searches_are_bounded() {
        let s = spec(Metric::Dot);
        let l = Limits::default();
        assert!(write(&[], &[], false, &s, &l).unwrap_err().to_string().contains("empty"));
        assert!(write(&[], &[], true, &s, &l).is_ok(), "a delete by filter alone is a write");
        let bad_json =
            v1::Point { id: 1, vector: vec![1.0; 3], payload: Some(v1::Payload { kind: Some(v1::payload::Kind::Json("{oops".into())) }) };
        assert!(write(&[bad_json], &[], false, &s, &l).unwrap_err().to_string().contains("not valid JSON"));
        assert_eq!(search_params(10, 0, &l).unwrap(), 64);
        assert_eq!(search_params(100, 0, &l).unwrap(), 200);
        assert_eq!(search_params(10, 5, &l).unwrap(), 10);
        assert!(search_params(0, 10, &l).is_err());
        let at = |source: &str, offset| v1::SourceOffset { source: source.into(), offset };
        assert!(source(&at("", 0), &l).is_err());
        assert!(source(&at("job", u64::MAX), &l).unwrap_err().to_string().contains("reserved"));
        assert!(source(&at("job", u64::MAX - 1), &l).is_ok());
        assert!(hits(1024, 976, &l).is_ok());
        assert!(hits(1024, 10_000, &l).unwrap_err().to_string().contains("1024 × 10000 = 10240000"));
    }
}
