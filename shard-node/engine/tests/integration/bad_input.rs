//! Bad input gets a precise error and changes nothing.

use shoal_engine::{Batch, Error, Index, IndexParams, InvalidInput, Location, Metric, Op, Point, SearchParams, VectorError};

use crate::common::{Fixture, random_batch, rng, test_options};

fn upsert(id: u64, vector: Vec<f32>) -> Op {
    Op::Upsert(Point { id, vector, payload: None })
}

/// Applies `batch` to an index holding 100 points and checks both the error
/// and that the index, file included, did not change.
fn rejected(metric: Metric, batch: Batch) -> InvalidInput {
    let mut rng = rng("rejected");
    let fx = Fixture::new(4, metric);
    fx.index.apply(random_batch(&mut rng, 4, 0..100).with_source("src", 5)).unwrap();
    let data = fx.dir.path().join("shard/data.mdb");
    let bytes_before = std::fs::read(&data).unwrap();
    let stats_before = fx.index.stats().unwrap();
    let err = fx.index.apply(batch).unwrap_err();
    assert!(err.is_invalid_input(), "{err}");
    assert_eq!(fx.index.stats().unwrap(), stats_before);
    assert_eq!(fx.index.offset("src").unwrap(), Some(5));
    assert!(std::fs::read(&data).unwrap() == bytes_before, "the data file changed");
    // Any other error fails the test, whatever variants come later.
    #[allow(clippy::wildcard_enum_match_arm)]
    match err {
        Error::Invalid(e) => e,
        other => panic!("not an input error: {other}"),
    }
}

fn vector_error(at: usize, error: VectorError) -> InvalidInput {
    InvalidInput::Vector { at: Location::Op(at), error }
}

#[test]
fn wrong_dimension_is_named_with_its_position() {
    let e = rejected(Metric::Cosine, Batch { ops: vec![upsert(1000, vec![1.0; 4]), upsert(1001, vec![1.0; 5])], source: None });
    assert_eq!(e, vector_error(1, VectorError::WrongDimension { expected: 4, got: 5 }));
    assert_eq!(e.to_string(), "operation 1: vector has dimension 5, the index expects 4");
}

#[test]
fn nan_and_infinity_are_rejected() {
    let e = rejected(Metric::Euclidean, Batch { ops: vec![upsert(1000, vec![0.0, f32::NAN, 0.0, 0.0])], source: None });
    assert!(matches!(e, InvalidInput::Vector { at: Location::Op(0), error: VectorError::NonFinite { index: 1, .. } }));
    let e = rejected(
        Metric::Dot,
        Batch { ops: vec![upsert(1, vec![1.0; 4]), upsert(2, vec![0.0, 0.0, 0.0, f32::NEG_INFINITY])], source: None },
    );
    assert!(matches!(e, InvalidInput::Vector { at: Location::Op(1), error: VectorError::NonFinite { index: 3, .. } }));
}

#[test]
fn empty_vectors_and_empty_batches_are_rejected() {
    assert_eq!(rejected(Metric::Cosine, Batch { ops: vec![upsert(5, vec![])], source: None }), vector_error(0, VectorError::Empty));
    assert_eq!(rejected(Metric::Cosine, Batch::default()), InvalidInput::EmptyBatch);
}

#[test]
fn a_batch_without_operations_records_its_offset() {
    let fx = Fixture::new(4, Metric::Cosine);
    let outcome = fx.index.apply(Batch::default().with_source("src", 9)).unwrap();
    assert_eq!(outcome, shoal_engine::BatchOutcome::Applied { upserted: 0, deleted: 0, missing: 0 });
    assert_eq!(fx.index.offset("src").unwrap(), Some(9));
    assert_eq!(fx.index.stats().unwrap().live, 0);
}

/// `u64::MAX` would be a source's last offset forever (a later batch
/// must carry a higher one): it is refused, and the source goes on.
#[test]
fn the_largest_offset_is_reserved() {
    for batch in [Batch::upserts([(1000, vec![1.0, 0.0, 0.0, 0.0])]), Batch::default()] {
        let e = rejected(Metric::Cosine, batch.with_source("src", u64::MAX));
        assert_eq!(e, InvalidInput::OffsetOutOfRange { offset: u64::MAX });
        assert_eq!(e.to_string(), "offset 18446744073709551615 is reserved: offsets must be below 2^64-1");
    }
    let fx = Fixture::new(4, Metric::Cosine);
    assert!(fx.index.apply(Batch::default().with_source("src", u64::MAX)).is_err());
    fx.index.apply(Batch::upserts([(1, vec![1.0, 0.0, 0.0, 0.0])]).with_source("src", 7)).unwrap();
    assert_eq!(fx.index.offset("src").unwrap(), Some(7));
}

#[test]
fn zero_vectors_have_no_cosine() {
    let e = rejected(Metric::Cosine, Batch { ops: vec![upsert(1000, vec![0.0; 4])], source: None });
    assert_eq!(e, vector_error(0, VectorError::ZeroVector));
}

#[test]
fn deleting_a_missing_id_rejects_the_whole_batch() {
    let ops = vec![upsert(1000, vec![1.0, 0.0, 0.0, 0.0]), Op::Delete(3), Op::Delete(424242)];
    let e = rejected(Metric::Cosine, Batch { ops, source: Some(shoal_engine::SourceOffset { source: "src".into(), offset: 6 }) });
    assert_eq!(e, InvalidInput::UnknownId { op: 2, id: 424242 });
    assert_eq!(e.to_string(), "operation 2: cannot delete id 424242: no such point");
}

#[test]
fn oversized_payloads_and_bad_source_names_are_rejected() {
    let e = rejected(
        Metric::Cosine,
        Batch { ops: vec![Op::Upsert(Point { id: 1, vector: vec![1.0; 4], payload: Some(vec![0; 70_000]) })], source: None },
    );
    assert_eq!(e, InvalidInput::PayloadTooLarge { op: 0, len: 70_000, max: 64 << 10 });
    let e = rejected(Metric::Cosine, Batch::upserts([(1, vec![1.0; 4])]).with_source("x".repeat(300), 1));
    assert_eq!(e, InvalidInput::BadSourceName { len: 300, max: 255 });
}

#[test]
fn bad_queries_get_precise_errors() {
    let mut rng = rng("bad_queries_get_precise_errors");
    let fx = Fixture::new(4, Metric::Cosine);
    fx.index.apply(random_batch(&mut rng, 4, 0..10)).unwrap();
    // Any other error fails the test, whatever variants come later.
    #[allow(clippy::wildcard_enum_match_arm)]
    let err = |q: &[f32], k, ef| match fx.index.search(q, SearchParams::new(k, ef)).unwrap_err() {
        Error::Invalid(e) => e,
        other => panic!("{other}"),
    };
    assert_eq!(
        err(&[1.0; 3], 5, 10),
        InvalidInput::Vector { at: Location::Query, error: VectorError::WrongDimension { expected: 4, got: 3 } }
    );
    assert_eq!(err(&[0.0; 4], 5, 10), InvalidInput::Vector { at: Location::Query, error: VectorError::ZeroVector });
    assert_eq!(err(&[1.0; 4], 0, 10), InvalidInput::BadK { k: 0, max: shoal_engine::MAX_K });
    assert_eq!(err(&[1.0; 4], 5, 0), InvalidInput::BadEf { ef: 0, max: shoal_engine::MAX_EF });
    assert!(err(&[f32::NAN, 1.0, 1.0, 1.0], 5, 10).to_string().starts_with("query: component 0 is NaN"));
    // ef below k is raised to k, not an error.
    assert_eq!(fx.index.search(&[1.0; 4], SearchParams::new(5, 1)).unwrap().len(), 5);
}

#[test]
fn bad_parameters_and_mismatched_reopens_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let bad = IndexParams::new(0, Metric::Cosine);
    assert!(matches!(Index::open_or_create(dir.path(), bad, test_options()), Err(Error::Invalid(InvalidInput::BadParams(_)))));
    let p = IndexParams::new(8, Metric::Cosine);
    drop(Index::open_or_create(dir.path().join("a"), p, test_options()).unwrap());
    let other = IndexParams::new(8, Metric::Euclidean);
    let err = Index::open_or_create(dir.path().join("a"), other, test_options()).err().expect("mismatch");
    assert!(matches!(err, Error::ParamsMismatch { .. }), "{err}");
    assert!(err.to_string().contains("metric=cosine") && err.to_string().contains("metric=euclidean"), "{err}");
    assert!(matches!(Index::open(dir.path().join("nothing"), test_options()), Err(Error::NotFound { .. })));
    assert!(!dir.path().join("nothing").exists(), "open must not create a directory");
}
