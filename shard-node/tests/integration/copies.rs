//! Which copy of a shard a node holds: every create and restore makes a
//! new copy id, kept across restarts, and a drop that names a copy takes
//! only that one, so a drop decided before a newer copy arrived keeps it.

use shoal_proto::v1;
use tonic::Code;

use crate::moves::{batch, node, points, rng, shard, spec_of};

async fn copy_of(c: &mut v1::shard_node_client::ShardNodeClient<tonic::transport::Channel>) -> u64 {
    c.get_shard_stats(v1::ShardStatsRequest { shard: shard(0) }).await.unwrap().into_inner().copy
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drop_that_names_a_copy_keeps_any_newer_one() {
    let mut rng = rng("a_drop_that_names_a_copy_keeps_any_newer_one");
    let dir = tempfile::tempdir().unwrap();
    let (running, mut c) = node(dir.path(), "n", 16 << 20).await;
    let create = v1::CreateShardRequest { shard: shard(0), spec: spec_of(1), epoch: 1, ..Default::default() };
    let first = c.create_shard(create.clone()).await.unwrap().into_inner().copy;
    assert_ne!(first, 0);
    assert_eq!(c.create_shard(create.clone()).await.unwrap().into_inner().copy, first, "a create confirmed is the same copy");
    c.apply_batch(batch(0, None, points(&mut rng, 0..50), vec![], 1)).await.unwrap();

    // A drop naming another copy changes nothing.
    let e = c.drop_shard(v1::DropShardRequest { shard: shard(0), copy: first ^ 1 }).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("docs/0") && e.message().contains("is kept"), "{}", e.message());
    let stats = c.get_shard_stats(v1::ShardStatsRequest { shard: shard(0) }).await.unwrap().into_inner();
    assert_eq!((stats.points, stats.copy), (50, first));

    // A restore is a new copy: a drop decided for the old one keeps it.
    c.snapshot_shard(v1::SnapshotShardRequest { shard: shard(0), snapshot_id: "s".into(), zstd_level: 0 }).await.unwrap();
    let restore = v1::RestoreShardRequest { shard: shard(0), snapshot_id: "s".into(), replace: true };
    let restored = c.restore_shard(restore).await.unwrap().into_inner().copy;
    assert!(restored != 0 && restored != first);
    let e = c.drop_shard(v1::DropShardRequest { shard: shard(0), copy: first }).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");

    // The id stays across a restart.
    running.shutdown().await.unwrap();
    let (running, mut c) = node(dir.path(), "n", 16 << 20).await;
    assert_eq!(copy_of(&mut c).await, restored);

    // Naming the copy there drops it; so does naming none.
    c.drop_shard(v1::DropShardRequest { shard: shard(0), copy: restored }).await.unwrap();
    let e = c.get_shard_stats(v1::ShardStatsRequest { shard: shard(0) }).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
    assert!(!dir.path().join("n/shards/docs/0").exists(), "its files are gone");
    let again = c.create_shard(create).await.unwrap().into_inner().copy;
    assert!(again != 0 && again != first && again != restored, "a new create is a new copy");
    c.drop_shard(v1::DropShardRequest { shard: shard(0), copy: 0 }).await.unwrap();
    assert_eq!(c.list_shards(v1::ListShardsRequest {}).await.unwrap().into_inner().shards.len(), 0);
    running.shutdown().await.unwrap();
}
