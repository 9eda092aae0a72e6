//! Bad requests get the right status code and change nothing.

use shoal_proto::v1;
use tonic::Code;

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_the_right_code_and_change_nothing() {
    let mut rng = rng("bad_requests_get_the_right_code_and_change_nothing");
    let mut tc = cluster(2).await;
    create(&mut tc.client, "docs", 4, v1::Metric::Cosine, 2).await;
    ingest(&mut tc.client, vec![batch("docs", "job", 0, points(&mut rng, 4, 0..40))]).await.unwrap();
    let before = tc.client.describe_collection(v1::DescribeCollectionRequest { name: "docs".into() }).await.unwrap().into_inner();

    let code = |r: Result<Vec<v1::IngestAck>, tonic::Status>| r.unwrap_err();
    // Unknown collection.
    let e = code(ingest(&mut tc.client, vec![batch("nope", "job", 1, points(&mut rng, 4, 0..2))]).await);
    assert_eq!(e.code(), Code::NotFound, "{e}");
    assert!(e.message().contains("collection nope does not exist"), "{}", e.message());
    let e = tc.client.search(v1::SearchRequest { collection: "nope".into(), vector: vec![1.0; 4], k: 1, ..Default::default() }).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    // Wrong dimension, in the middle of a batch: nothing of it applies.
    let mut ps = points(&mut rng, 4, 100..110);
    ps[5].vector.push(1.0);
    let e = code(ingest(&mut tc.client, vec![batch("docs", "job", 1, ps)]).await);
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("point 5 (id 105): vector has dimension 5, the collection expects 4"), "{}", e.message());
    // NaN.
    let mut ps = points(&mut rng, 4, 200..203);
    ps[2].vector[1] = f32::NAN;
    let e = code(ingest(&mut tc.client, vec![batch("docs", "job", 2, ps)]).await);
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("component 1 is NaN"), "{}", e.message());
    // Empty batch.
    let e = code(ingest(&mut tc.client, vec![batch("docs", "job", 3, vec![])]).await);
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("empty"), "{}", e.message());
    // Zero vector under cosine, in a search.
    let e = tc.client.search(v1::SearchRequest { collection: "docs".into(), vector: vec![0.0; 4], k: 3, ..Default::default() }).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    // k = 0.
    let e = tc.client.search(v1::SearchRequest { collection: "docs".into(), vector: vec![1.0; 4], k: 0, ..Default::default() }).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    // Oversized message: over the coordinator's 64 MiB limit.
    let huge = v1::UpsertRequest {
        collection: "docs".into(),
        points: vec![v1::Point { id: 1, vector: vec![0.5; 4], payload: Some(v1::Payload { kind: Some(v1::payload::Kind::Binary(vec![0; 65 << 20])) }) }],
    };
    let e = tc.client.clone().max_encoding_message_size(usize::MAX).upsert(huge).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
    // Payload over the per-point limit.
    let big = v1::UpsertRequest {
        collection: "docs".into(),
        points: vec![v1::Point { id: 1, vector: vec![0.5; 4], payload: Some(v1::Payload { kind: Some(v1::payload::Kind::Binary(vec![0; 100_000])) }) }],
    };
    assert_eq!(tc.client.upsert(big).await.unwrap_err().code(), Code::InvalidArgument);
    // Bad collection names and duplicates.
    let e = tc.client.create_collection(v1::CreateCollectionRequest { name: "../x".into(), dimension: 4, metric: 1, ..Default::default() }).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = tc.client.create_collection(v1::CreateCollectionRequest { name: "docs".into(), dimension: 4, metric: 1, ..Default::default() }).await.unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists);

    let after = tc.client.describe_collection(v1::DescribeCollectionRequest { name: "docs".into() }).await.unwrap().into_inner();
    assert_eq!(after.points, before.points);
    assert_eq!(after.shards.iter().map(|s| s.points).collect::<Vec<_>>(), before.shards.iter().map(|s| s.points).collect::<Vec<_>>());
    let offsets = tc.client.get_offsets(v1::GetOffsetsRequest { collection: "docs".into(), sources: vec![] }).await.unwrap().into_inner();
    assert_eq!(offsets.offsets, vec![v1::SourceOffset { source: "job".into(), offset: 0 }], "a rejected batch moved the offset");
    tc.cluster.shutdown().await.unwrap();
}
