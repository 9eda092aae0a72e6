//! Acknowledged means durable; replays are skipped.

use shoal_proto::v1;

use crate::common::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_node_restart_keeps_every_acknowledged_point() {
    let mut rng = rng("a_node_restart_keeps_every_acknowledged_point");
    let mut tc = cluster(3).await;
    create(&mut tc.client, "docs", 8, v1::Metric::Dot, 3).await;
    let all = points(&mut rng, 8, 0..600);
    let batches: Vec<_> = all.chunks(100).enumerate().map(|(i, c)| batch("docs", "job", i as u64, c.to_vec())).collect();
    assert_eq!(ingest(&mut tc.client, batches).await.unwrap().len(), 6);

    for node in 0..3 {
        tc.cluster.restart_node(node).await.unwrap();
    }
    assert_eq!(points_in(&mut tc.client, "docs").await, 600);
    let got =
        tc.client.get(v1::GetRequest { collection: "docs".into(), ids: (0..600).collect(), with_vector: true }).await.unwrap().into_inner();
    assert!(got.missing.is_empty(), "lost {:?}", got.missing);
    for (p, want) in got.points.iter().zip(&all) {
        assert_eq!((p.id, &p.vector), (want.id, &want.vector));
    }
    let offsets = tc.client.get_offsets(v1::GetOffsetsRequest { collection: "docs".into(), sources: vec![] }).await.unwrap().into_inner();
    assert_eq!(offsets.offsets, vec![v1::SourceOffset { source: "job".into(), offset: 5 }]);

    // A coordinator restarted from nothing learns the collection from the nodes.
    let cfg = shoal_coordinator::CoordinatorConfig {
        shard_nodes: tc
            .cluster
            .node_addrs()
            .iter()
            .enumerate()
            .map(|(i, a)| shoal_coordinator::config::ShardNodeEntry { id: format!("shard-{i}"), address: a.to_string() })
            .collect(),
        ..Default::default()
    };
    let meta = shoal_coordinator::server::store_from_config(&cfg).await.unwrap();
    let fresh = shoal_coordinator::server::cluster_from_config(&cfg, meta, cfg.listen);
    assert!(fresh.discover().await.is_empty());
    assert_eq!(fresh.describe("docs", None).await.unwrap().points, 600);
    tc.cluster.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replayed_batch_is_not_applied_twice() {
    let mut rng = rng("a_replayed_batch_is_not_applied_twice");
    let mut tc = cluster(2).await;
    create(&mut tc.client, "docs", 4, v1::Metric::Euclidean, 4).await;
    let first = points(&mut rng, 4, 0..50);
    let acks = ingest(&mut tc.client, vec![batch("docs", "job", 7, first.clone())]).await.unwrap();
    assert_eq!(acks[0].status, v1::BatchStatus::Applied as i32);

    // The job crashed and resends batch 7 with other content, then batch 8.
    let mut replay = batch("docs", "job", 7, points(&mut rng, 4, 0..60));
    replay.deletes = vec![1, 2, 3];
    let next = batch("docs", "job", 8, points(&mut rng, 4, 100..110));
    let acks = ingest(&mut tc.client, vec![replay, next]).await.unwrap();
    assert_eq!(acks[0].status, v1::BatchStatus::Skipped as i32);
    assert_eq!((acks[0].upserted, acks[0].deleted), (0, 0));
    assert_eq!(acks[1].status, v1::BatchStatus::Applied as i32);
    assert_eq!(points_in(&mut tc.client, "docs").await, 60);
    let got = tc.client.get(v1::GetRequest { collection: "docs".into(), ids: vec![1, 55], with_vector: true }).await.unwrap().into_inner();
    assert_eq!(got.points.len(), 1, "id 1 must survive, id 55 must not exist");
    assert_eq!(got.points[0].vector, first[1].vector);
    assert_eq!(got.missing, vec![55]);
    let offsets =
        tc.client.get_offsets(v1::GetOffsetsRequest { collection: "docs".into(), sources: vec!["job".into()] }).await.unwrap().into_inner();
    assert_eq!(offsets.offsets[0].offset, 8);
    tc.cluster.shutdown().await.unwrap();
}
