//! A shard whose environment is damaged on disk: the node starts and
//! serves its other shards, names the damaged one in every request for it
//! (DATA_LOSS), and serves it again once it is restored from a snapshot.

use shoal_proto::v1;
use tonic::Code;

use crate::moves::{batch, node, points, rng, shard, spec_of};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_shard_is_named_and_the_others_serve_until_it_is_restored() {
    let mut rng = rng("a_damaged_shard_is_named_and_the_others_serve_until_it_is_restored");
    let dir = tempfile::tempdir().unwrap();
    let (running, mut c) = node(dir.path(), "n", 16 << 20).await;
    let own = |s: u32| move |id: &u64| shoal_proto::shard_for(*id, 2) == s;
    for s in 0..2u32 {
        c.create_shard(v1::CreateShardRequest { shard: shard(s), spec: spec_of(2), epoch: 1, ..Default::default() }).await.unwrap();
        let ids: Vec<u64> = (0..400u64).filter(own(s)).collect();
        let pts = points(&mut rng, 0..ids.len() as u64).into_iter().zip(&ids).map(|(p, &id)| v1::Point { id, ..p }).collect();
        c.apply_batch(batch(s, None, pts, vec![], 1)).await.unwrap();
    }
    c.snapshot_shard(v1::SnapshotShardRequest { shard: shard(1), snapshot_id: "before".into(), zstd_level: 0 }).await.unwrap();
    running.shutdown().await.unwrap();

    // Both meta pages of shard 1's data.mdb overwritten: what a torn write
    // or a bad disk does.
    let file = dir.path().join("n/shards/docs/1/data.mdb");
    let mut bytes = std::fs::read(&file).unwrap();
    for b in &mut bytes[..8192] {
        *b = 0xA5;
    }
    std::fs::write(&file, bytes).unwrap();

    let (running, mut c) = node(dir.path(), "n", 16 << 20).await;
    let stats = c.get_shard_stats(v1::ShardStatsRequest { shard: shard(0) }).await.unwrap().into_inner();
    assert_eq!(stats.points, (0..400u64).filter(own(0)).count() as u64, "the healthy shard serves");
    let e = c.get_shard_stats(v1::ShardStatsRequest { shard: shard(1) }).await.unwrap_err();
    assert_eq!(e.code(), Code::DataLoss, "{e:?}");
    assert!(e.message().contains("docs/1") && e.message().contains("snapshot restore docs ID --shard 1 --replace"), "{}", e.message());
    let search = || v1::SearchShardRequest {
        shard: shard(1),
        queries: vec![v1::Vector { values: vec![0.1; 16] }],
        k: 3,
        ef: 0,
        with_payload: false,
        ..Default::default()
    };
    let e = c.search_shard(search()).await.unwrap_err();
    assert_eq!(e.code(), Code::DataLoss);

    // Restored from its snapshot, it serves again.
    let restored = c
        .restore_shard(v1::RestoreShardRequest { shard: shard(1), snapshot_id: "before".into(), replace: true })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(restored.points, (0..400u64).filter(own(1)).count() as u64);
    let hits = c.search_shard(search()).await.unwrap().into_inner();
    assert_eq!(hits.results[0].hits.len(), 3);
    running.shutdown().await.unwrap();
}
