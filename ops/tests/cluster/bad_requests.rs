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
    let e = tc
        .client
        .search(v1::SearchRequest { collection: "nope".into(), vector: vec![1.0; 4], k: 1, ..Default::default() })
        .await
        .unwrap_err();
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
    let e = tc
        .client
        .search(v1::SearchRequest { collection: "docs".into(), vector: vec![0.0; 4], k: 3, ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    // k = 0.
    let e = tc
        .client
        .search(v1::SearchRequest { collection: "docs".into(), vector: vec![1.0; 4], k: 0, ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    // Oversized message: over the coordinator's 64 MiB limit.
    let huge = v1::UpsertRequest {
        collection: "docs".into(),
        points: vec![v1::Point {
            id: 1,
            vector: vec![0.5; 4],
            payload: Some(v1::Payload { kind: Some(v1::payload::Kind::Binary(vec![0; 65 << 20])) }),
        }],
    };
    let e = tc.client.clone().max_encoding_message_size(usize::MAX).upsert(huge).await.unwrap_err();
    assert_eq!(e.code(), Code::ResourceExhausted, "{e}");
    // Payload over the per-point limit.
    let big = v1::UpsertRequest {
        collection: "docs".into(),
        points: vec![v1::Point {
            id: 1,
            vector: vec![0.5; 4],
            payload: Some(v1::Payload { kind: Some(v1::payload::Kind::Binary(vec![0; 100_000])) }),
        }],
    };
    assert_eq!(tc.client.upsert(big).await.unwrap_err().code(), Code::InvalidArgument);
    // Bad collection names and duplicates.
    let e = tc
        .client
        .create_collection(v1::CreateCollectionRequest { name: "../x".into(), dimension: 4, metric: 1, ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = tc
        .client
        .create_collection(v1::CreateCollectionRequest { name: "docs".into(), dimension: 4, metric: 1, ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists);

    let after = tc.client.describe_collection(v1::DescribeCollectionRequest { name: "docs".into() }).await.unwrap().into_inner();
    assert_eq!(after.points, before.points);
    assert_eq!(after.shards.iter().map(|s| s.points).collect::<Vec<_>>(), before.shards.iter().map(|s| s.points).collect::<Vec<_>>());
    let offsets = tc.client.get_offsets(v1::GetOffsetsRequest { collection: "docs".into(), sources: vec![] }).await.unwrap().into_inner();
    assert_eq!(offsets.offsets, vec![v1::SourceOffset { source: "job".into(), offset: 0 }], "a rejected batch moved the offset");
    tc.cluster.shutdown().await.unwrap();
}

/// A shard node validates what it is sent directly, in the order a caller
/// should fix it: the query before `ef` (an `ef` of 0 means the default).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_node_names_what_is_wrong_with_a_query() {
    let mut rng = rng("a_shard_node_names_what_is_wrong_with_a_query");
    let mut tc = cluster(1).await;
    create(&mut tc.client, "docs", 4, v1::Metric::Cosine, 1).await;
    ingest(&mut tc.client, vec![batch("docs", "job", 0, points(&mut rng, 4, 0..40))]).await.unwrap();
    let addr = tc.cluster.node_addrs()[0];
    let mut node = v1::shard_node_client::ShardNodeClient::connect(format!("http://{addr}")).await.unwrap();
    let shard = || Some(v1::ShardId { collection: "docs".into(), shard: 0 });
    let search = |queries: Vec<Vec<f32>>, k, ef| v1::SearchShardRequest {
        shard: shard(),
        queries: queries.into_iter().map(|values| v1::Vector { values }).collect(),
        k,
        ef,
        with_payload: false,
        ..Default::default()
    };
    let e = node.search_shard(search(vec![vec![1.0; 3]], 5, 0)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert_eq!(e.message(), "shard docs/0: query: vector has dimension 3, the index expects 4");
    let e = node.search_shard(search(vec![vec![1.0; 4], vec![1.0, f32::NAN, 0.0, 0.0]], 5, 0)).await.unwrap_err();
    assert_eq!(e.message(), "shard docs/0: query 1: component 1 is NaN; every component must be finite");
    let e = node.search_shard(search(vec![vec![1.0; 4]], 0, 0)).await.unwrap_err();
    assert!(e.message().contains("k must be between 1 and"), "{}", e.message());
    let e = node.search_shard(search(vec![], 5, 0)).await.unwrap_err();
    assert!(e.message().contains("1 to 1024 query vectors, got 0"), "{}", e.message());
    // ef 0 is the default, as through the coordinator.
    let ok = node.search_shard(search(vec![vec![1.0; 4]], 5, 0)).await.unwrap().into_inner();
    assert_eq!(ok.results[0].hits.len(), 5);
    tc.cluster.shutdown().await.unwrap();
}

/// The same id twice in one write: the last one wins and counts once; an
/// offset at 2^64-1 is refused, so its source can go on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn duplicate_ids_count_once_and_the_last_offset_is_refused() {
    let mut tc = cluster(2).await;
    create(&mut tc.client, "docs", 2, v1::Metric::Euclidean, 2).await;
    let point = |id, x: f32| v1::Point { id, vector: vec![x, 0.0], payload: None };
    let w = tc
        .client
        .upsert(v1::UpsertRequest { collection: "docs".into(), points: vec![point(7, 1.0), point(8, 5.0), point(7, 2.0)] })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((w.upserted, w.deleted, w.missing), (2, 0, 0));
    let got = tc.client.get(v1::GetRequest { collection: "docs".into(), ids: vec![7], with_vector: true }).await.unwrap().into_inner();
    assert_eq!(got.points[0].vector, vec![2.0, 0.0], "the last upsert of id 7 wins");
    assert_eq!(points_in(&mut tc.client, "docs").await, 2);

    let e = ingest(&mut tc.client, vec![batch("docs", "job", u64::MAX, vec![point(9, 1.0)])]).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("reserved"), "{}", e.message());
    // A shard node asked directly refuses it too.
    let addr = tc.cluster.node_addrs()[0];
    let mut node = v1::shard_node_client::ShardNodeClient::connect(format!("http://{addr}")).await.unwrap();
    let shards = tc.client.describe_collection(v1::DescribeCollectionRequest { name: "docs".into() }).await.unwrap().into_inner().shards;
    let on_node0 = shards.iter().find(|s| s.node == "shard-0").unwrap().shard;
    let e = node
        .apply_batch(v1::ApplyBatchRequest {
            shard: Some(v1::ShardId { collection: "docs".into(), shard: on_node0 }),
            source: Some(v1::SourceOffset { source: "job".into(), offset: u64::MAX }),
            points: vec![],
            deletes: vec![],
            epoch: 0,
            return_entry: false,
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let acks = ingest(&mut tc.client, vec![batch("docs", "job", 1, vec![point(9, 1.0)])]).await.unwrap();
    assert_eq!(acks[0].status, v1::BatchStatus::Applied as i32);
    tc.cluster.shutdown().await.unwrap();
}

/// A shard node checks what it applies whoever sends it: a point routed to
/// another shard and a payload tagged JSON that is not are refused, and
/// nothing of the batch is applied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_shard_node_refuses_points_of_other_shards_and_payloads_that_are_not_json() {
    let mut tc = cluster(2).await;
    create(&mut tc.client, "docs", 2, v1::Metric::Euclidean, 2).await;
    let addr = tc.cluster.node_addrs()[0];
    let mut node = v1::shard_node_client::ShardNodeClient::connect(format!("http://{addr}")).await.unwrap();
    let shards = tc.client.describe_collection(v1::DescribeCollectionRequest { name: "docs".into() }).await.unwrap().into_inner().shards;
    let mine = shards.iter().find(|s| s.node == "shard-0").unwrap().shard;
    let id_on = |shard: u32| (0u64..).find(|&id| shoal_proto::shard_for(id, 2) == shard).unwrap();
    let (own, foreign) = (id_on(mine), id_on(1 - mine));
    let apply = |points: Vec<v1::Point>, deletes: Vec<u64>| v1::ApplyBatchRequest {
        shard: Some(v1::ShardId { collection: "docs".into(), shard: mine }),
        source: None,
        points,
        deletes,
        epoch: 0,
        return_entry: false,
        ..Default::default()
    };
    let json = |id: u64, text: &str| v1::Point {
        id,
        vector: vec![1.0, 0.0],
        payload: Some(v1::Payload { kind: Some(v1::payload::Kind::Json(text.into())) }),
    };
    let e = node.apply_batch(apply(vec![json(own, "{}"), json(foreign, "{}")], vec![])).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains(&format!("point {foreign} belongs to shard {}", 1 - mine)), "{}", e.message());
    let e = node.apply_batch(apply(vec![], vec![foreign])).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    let e = node.apply_batch(apply(vec![json(own, "{\"deep\": [[[")], vec![])).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains("not valid JSON"), "{}", e.message());
    assert_eq!(points_in(&mut tc.client, "docs").await, 0, "a refused batch applied something");
    // The same node takes a good batch.
    let ok = node.apply_batch(apply(vec![json(own, "{\"a\": 1}")], vec![])).await.unwrap().into_inner();
    assert_eq!(ok.upserted, 1);
    tc.cluster.shutdown().await.unwrap();
}
