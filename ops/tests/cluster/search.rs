//! Scatter-gather gives what one engine holding every point gives.

use shoal_engine::{Batch, Index, IndexOptions, IndexParams, Metric, SearchParams};
use shoal_proto::v1;
use tonic::Code;

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ingest_then_search_matches_one_engine() {
    let mut rng = rng("ingest_then_search_matches_one_engine");
    let mut tc = cluster(3).await;
    let dim = 16;
    create(&mut tc.client, "docs", dim, v1::Metric::Euclidean, 3).await;
    let all = points(&mut rng, dim as usize, 0..900);
    let batches: Vec<_> = all.chunks(150).enumerate().map(|(i, c)| batch("docs", "job", i as u64, c.to_vec())).collect();
    let acks = ingest(&mut tc.client, batches).await.unwrap();
    assert_eq!(acks.len(), 6);
    assert!(acks.iter().all(|a| a.status == v1::BatchStatus::Applied as i32 && a.upserted == 150));
    assert_eq!(points_in(&mut tc.client, "docs").await, 900);

    // The same points in one engine.
    let dir = tempfile::tempdir().unwrap();
    let single = Index::open_or_create(dir.path(), IndexParams::new(dim, Metric::Euclidean), IndexOptions::default()).unwrap();
    single.apply(Batch::upserts(all.iter().map(|p| (p.id, p.vector.clone())))).unwrap();

    for _ in 0..20 {
        let q = vector(&mut rng, dim as usize);
        // ef above every shard's size: both sides are exact.
        let want = single.search(&q, SearchParams::new(10, 1000)).unwrap();
        let got = tc
            .client
            .search(v1::SearchRequest {
                collection: "docs".into(),
                vector: q.clone(),
                k: 10,
                ef: 1000,
                with_payload: true,
                ..Default::default()
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!((got.shards_total, got.shards_answered, got.partial), (3, 3, false));
        let got_ids: Vec<(u64, f32)> = got.hits.iter().map(|h| (h.id, h.distance)).collect();
        let want_ids: Vec<(u64, f32)> = want.iter().map(|h| (h.id, h.distance)).collect();
        assert_eq!(got_ids.len(), 10);
        for (g, w) in got_ids.iter().zip(&want_ids) {
            assert!((g.1 - w.1).abs() < 1e-4, "got {got_ids:?}\nwant {want_ids:?}");
        }
        for h in &got.hits {
            assert_eq!(h.payload.as_ref().and_then(|p| p.kind.clone()), Some(v1::payload::Kind::Json(format!("{{\"id\":{}}}", h.id))));
        }
    }

    // Batch search answers like single searches.
    let qs: Vec<Vec<f32>> = (0..4).map(|_| vector(&mut rng, dim as usize)).collect();
    let batch = tc
        .client
        .search_batch(v1::SearchBatchRequest {
            collection: "docs".into(),
            queries: qs.iter().map(|q| v1::Vector { values: q.clone() }).collect(),
            k: 5,
            ef: 1000,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(batch.results.len(), 4);
    for (q, r) in qs.iter().zip(&batch.results) {
        let one = tc
            .client
            .search(v1::SearchRequest { collection: "docs".into(), vector: q.clone(), k: 5, ef: 1000, ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(one.hits, r.hits);
    }
    tc.cluster.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_shard_is_an_error_unless_partial_results_are_allowed() {
    let mut rng = rng("a_missing_shard_is_an_error_unless_partial_results_are_allowed");
    let mut tc = cluster(3).await;
    create(&mut tc.client, "docs", 8, v1::Metric::Cosine, 3).await;
    ingest(&mut tc.client, vec![batch("docs", "job", 0, points(&mut rng, 8, 0..300))]).await.unwrap();
    tc.cluster.stop_node(1).await.unwrap();

    let q = vector(&mut rng, 8);
    let req = v1::SearchRequest { collection: "docs".into(), vector: q.clone(), k: 10, ..Default::default() };
    let err = tc.client.search(req.clone()).await.unwrap_err();
    assert_eq!(err.code(), Code::Unavailable, "{err}");
    assert!(err.message().contains("1 of 3 shards did not answer"), "{}", err.message());
    assert!(err.metadata().get("retry-after-ms").is_some(), "no retry hint");

    let partial = tc.client.search(v1::SearchRequest { allow_partial: true, ..req }).await.unwrap().into_inner();
    assert_eq!((partial.shards_total, partial.shards_answered, partial.partial), (3, 2, true));
    assert_eq!(partial.hits.len(), 10);
    // Shard 1 lives on node 1 (placement is round-robin): none of its points.
    for h in &partial.hits {
        assert_ne!(shoal_coordinator::routing::shard_for(h.id, 3), 1);
    }

    tc.cluster.restart_node(1).await.unwrap();
    let full = tc
        .client
        .search(v1::SearchRequest { collection: "docs".into(), vector: q, k: 10, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((full.shards_answered, full.partial), (3, false));
    tc.cluster.shutdown().await.unwrap();
}
