//! Replicas (docs/replication.md): a shard's copies agree, a node that
//! stops costs no search and stops no ingest, and concurrent writers
//! cannot make two copies commit the same batches in different orders.

use shoal_engine::{Batch, Index, IndexOptions, IndexParams, Metric, SearchParams};
use shoal_proto::v1;
use shoal_proto::v1::shoal_client::ShoalClient;
use tonic::Code;
use tonic::transport::Channel;

use crate::common::*;

const DIM: u32 = 16;

async fn create_replicated(
    client: &mut ShoalClient<Channel>,
    name: &str,
    shards: u32,
    factor: u32,
    min_in_sync: u32,
) -> v1::CollectionInfo {
    let req = v1::CreateCollectionRequest {
        name: name.into(),
        dimension: DIM,
        metric: v1::Metric::Euclidean as i32,
        shard_count: shards,
        replication_factor: factor,
        min_in_sync,
        ..Default::default()
    };
    client.create_collection(req).await.unwrap().into_inner()
}

async fn describe(client: &mut ShoalClient<Channel>, name: &str) -> v1::CollectionInfo {
    client.describe_collection(v1::DescribeCollectionRequest { name: name.into() }).await.unwrap().into_inner()
}

async fn verify(client: &mut ShoalClient<Channel>, name: &str, shard: u32) -> v1::VerifyShardResponse {
    client.verify_shard(v1::VerifyShardRequest { collection: name.into(), shard }).await.unwrap().into_inner()
}

/// Exact search through the cluster against one engine holding `all`:
/// every shard answers (no partial results), and the hits are the same.
async fn assert_exact(client: &mut ShoalClient<Channel>, all: &[v1::Point], rng: &mut rand::rngs::StdRng, when: &str) {
    let dir = tempfile::tempdir().unwrap();
    let single = Index::open_or_create(dir.path(), IndexParams::new(DIM, Metric::Euclidean), IndexOptions::default()).unwrap();
    single.apply(Batch::upserts(all.iter().map(|p| (p.id, p.vector.clone())))).unwrap();
    for _ in 0..10 {
        let q = vector(rng, DIM as usize);
        let want: Vec<u64> = single.search(&q, SearchParams::new(10, 2000)).unwrap().iter().map(|h| h.id).collect();
        let got = client
            .search(v1::SearchRequest { collection: "docs".into(), vector: q, k: 10, ef: 2000, ..Default::default() })
            .await
            .unwrap_or_else(|e| panic!("{when}: search failed: {e:?}"))
            .into_inner();
        assert!(!got.partial && got.shards_answered == got.shards_total, "{when}: {got:?}");
        assert_eq!(got.hits.iter().map(|h| h.id).collect::<Vec<_>>(), want, "{when}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopped_node_costs_no_search_and_no_ingest() {
    let mut rng = rng("a_stopped_node_costs_no_search_and_no_ingest");
    let mut tc = cluster(3).await;
    let info = create_replicated(&mut tc.client, "docs", 3, 2, 1).await;
    assert_eq!((info.replication_factor, info.min_in_sync), (2, 1));
    let info = describe(&mut tc.client, "docs").await;
    for s in &info.shards {
        let nodes: Vec<&str> = s.replicas.iter().map(|r| r.node.as_str()).collect();
        assert!(nodes.len() == 2 && nodes[0] != nodes[1], "shard {}: {nodes:?}", s.shard);
        assert!(s.replicas.iter().all(|r| r.state == "active"), "{s:?}");
    }

    let all = points(&mut rng, DIM as usize, 0..1200);
    let before: Vec<_> = all[..600].chunks(100).enumerate().map(|(i, c)| batch("docs", "job", i as u64 + 1, c.to_vec())).collect();
    let acks = ingest(&mut tc.client, before).await.unwrap();
    assert!(acks.iter().all(|a| a.status == v1::BatchStatus::Applied as i32), "{acks:?}");
    for shard in 0..3 {
        let v = verify(&mut tc.client, "docs", shard).await;
        assert!(v.agree && v.replicas.len() == 2, "shard {shard}: {v:?}");
        assert_eq!(v.replicas[0].last_seq, 6, "every batch reaches every shard (it carries the offset)");
    }
    assert_exact(&mut tc.client, &all[..600], &mut rng, "all nodes up").await;

    // shard-1 goes away. Searches go to the other copies at once.
    tc.cluster.stop_node(1).await.unwrap();
    assert_exact(&mut tc.client, &all[..600], &mut rng, "shard-1 stopped").await;

    // Ingest goes on: the copies on shard-1 leave the in-sync set.
    let after: Vec<_> = all[600..].chunks(100).enumerate().map(|(i, c)| batch("docs", "job", i as u64 + 7, c.to_vec())).collect();
    let acks = ingest(&mut tc.client, after).await.unwrap();
    assert!(acks.iter().all(|a| a.status == v1::BatchStatus::Applied as i32), "{acks:?}");
    assert_eq!(points_in(&mut tc.client, "docs").await, 1200);
    let info = describe(&mut tc.client, "docs").await;
    for s in &info.shards {
        for r in &s.replicas {
            let want = if r.node == "shard-1" { "dead" } else { "active" };
            assert_eq!(r.state, want, "shard {}: {:?}", s.shard, s.replicas);
        }
        assert_ne!(s.node, "shard-1", "the primary is an in-sync copy");
    }
    assert_exact(&mut tc.client, &all, &mut rng, "after ingest without shard-1").await;

    // Back: its copies are read only once they rejoined, seeded from the
    // primary and caught up, so searches stay exact throughout.
    tc.cluster.restart_node(1).await.unwrap();
    assert_exact(&mut tc.client, &all, &mut rng, "shard-1 back, rejoining").await;
    let info = wait_for_replicas(&mut tc.client, "docs", 2).await;
    assert!(info.shards.iter().any(|s| s.replicas.iter().any(|r| r.node == "shard-1")), "{info:?}");
    for shard in 0..3 {
        let v = verify(&mut tc.client, "docs", shard).await;
        assert!(v.agree && v.replicas.iter().all(|r| r.last_seq == 12), "shard {shard}: {v:?}");
    }
    assert_exact(&mut tc.client, &all, &mut rng, "shard-1 rejoined").await;
    tc.cluster.shutdown().await.unwrap();
}

/// Waits (bounded) until every shard of `name` holds exactly `factor`
/// active copies and nothing is moving.
async fn wait_for_replicas(client: &mut ShoalClient<Channel>, name: &str, factor: usize) -> v1::CollectionInfo {
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    loop {
        let info = describe(client, name).await;
        let settled =
            |s: &v1::ShardInfo| s.moving.is_none() && s.replicas.len() == factor && s.replicas.iter().all(|r| r.state == "active");
        if info.shards.iter().all(settled) {
            return info;
        }
        assert!(std::time::Instant::now() < deadline, "not {factor} active copies of every shard after 60 s: {info:?}");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    }
}

/// The factor of a collection with data goes up while batches keep
/// coming (every new copy is seeded, caught up and agrees), then down
/// (extra copies leave, never the primary); searches stay exact.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_replication_factor_changes_under_ingest() {
    let mut rng = rng("the_replication_factor_changes_under_ingest");
    let mut tc = cluster(3).await;
    create_replicated(&mut tc.client, "docs", 2, 1, 1).await;
    let all = points(&mut rng, DIM as usize, 0..900);
    let first: Vec<_> = all[..300].chunks(100).enumerate().map(|(i, c)| batch("docs", "job", i as u64 + 1, c.to_vec())).collect();
    ingest(&mut tc.client, first).await.unwrap();
    let primaries: Vec<String> = describe(&mut tc.client, "docs").await.shards.into_iter().map(|s| s.node).collect();

    let mut setter = tc.client.clone();
    let raise = v1::SetReplicationRequest { collection: "docs".into(), replication_factor: 3, min_in_sync: 2, wait: true };
    let raising = tokio::spawn(async move { setter.set_replication(raise).await });
    for (i, c) in all[300..].chunks(50).enumerate() {
        let acks = ingest(&mut tc.client, vec![batch("docs", "job", i as u64 + 4, c.to_vec())]).await.unwrap();
        assert_eq!(acks[0].status, v1::BatchStatus::Applied as i32);
    }
    let raised = raising.await.unwrap().unwrap().into_inner();
    assert_eq!((raised.replication_factor, raised.min_in_sync), (3, 2));
    wait_for_replicas(&mut tc.client, "docs", 3).await;
    for shard in 0..2 {
        let v = verify(&mut tc.client, "docs", shard).await;
        assert!(v.agree && v.replicas.len() == 3, "shard {shard}: {v:?}");
    }
    assert_eq!(points_in(&mut tc.client, "docs").await, 900);
    assert_exact(&mut tc.client, &all, &mut rng, "factor 3").await;

    // Above the nodes: refused, nothing changed.
    let e = tc
        .client
        .set_replication(v1::SetReplicationRequest { collection: "docs".into(), replication_factor: 4, ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    let e = tc
        .client
        .set_replication(v1::SetReplicationRequest { collection: "docs".into(), min_in_sync: 5, ..Default::default() })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert_eq!(describe(&mut tc.client, "docs").await.replication_factor, 3);

    // Down to one: the minimum follows, and each shard keeps its primary.
    let lower = v1::SetReplicationRequest { collection: "docs".into(), replication_factor: 1, min_in_sync: 0, wait: true };
    let lowered = tc.client.set_replication(lower).await.unwrap().into_inner();
    assert_eq!((lowered.replication_factor, lowered.min_in_sync), (1, 1));
    let info = wait_for_replicas(&mut tc.client, "docs", 1).await;
    let kept: Vec<String> = info.shards.into_iter().map(|s| s.node).collect();
    assert_eq!(kept, primaries);
    assert_exact(&mut tc.client, &all, &mut rng, "factor 1").await;
    tc.cluster.shutdown().await.unwrap();
}

/// Two writers upsert the same ids with different vectors at the same
/// time. Sent to both copies in parallel, the copies could commit them in
/// different orders and disagree for good; through the primary's order
/// they cannot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_writers_leave_the_copies_equal() {
    let mut rng = rng("concurrent_writers_leave_the_copies_equal");
    let mut tc = cluster(2).await;
    create_replicated(&mut tc.client, "docs", 2, 2, 2).await;
    let writers: Vec<_> = ["a", "b"]
        .into_iter()
        .map(|source| {
            let batches: Vec<_> = (1..=30).map(|o| batch("docs", source, o, points(&mut rng, DIM as usize, 0..40))).collect();
            let client = tc.client.clone();
            tokio::spawn(async move {
                let mut client = client;
                let mut acks = Vec::new();
                // One batch per stream, so the two writers interleave.
                for b in batches {
                    acks.extend(ingest(&mut client, vec![b]).await.unwrap());
                }
                acks
            })
        })
        .collect();
    for w in writers {
        let acks = w.await.unwrap();
        assert!(acks.iter().all(|a| a.status == v1::BatchStatus::Applied as i32), "{acks:?}");
    }
    for shard in 0..2 {
        let v = verify(&mut tc.client, "docs", shard).await;
        assert!(v.agree, "shard {shard}: {v:?}");
        assert_eq!(v.replicas.iter().map(|r| r.last_seq).collect::<Vec<_>>(), [60, 60], "shard {shard}: the same log");
    }
    tc.cluster.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replication_is_checked_and_a_write_below_the_minimum_is_refused() {
    let mut rng = rng("replication_is_checked_and_a_write_below_the_minimum_is_refused");
    let mut tc = cluster(2).await;
    let mut req = v1::CreateCollectionRequest {
        name: "docs".into(),
        dimension: DIM,
        metric: v1::Metric::Euclidean as i32,
        shard_count: 1,
        replication_factor: 3,
        ..Default::default()
    };
    let e = tc.client.create_collection(req.clone()).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("replication factor 3 needs as many serving nodes; the cluster has 2"), "{}", e.message());
    req.replication_factor = 2;
    req.min_in_sync = 3;
    let e = tc.client.create_collection(req.clone()).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(tc.client.list_collections(v1::ListCollectionsRequest {}).await.unwrap().into_inner().collections.is_empty());

    // Both copies needed: with one gone, writes are refused with a hint.
    create_replicated(&mut tc.client, "docs", 1, 2, 2).await;
    let acks = ingest(&mut tc.client, vec![batch("docs", "job", 1, points(&mut rng, DIM as usize, 0..50))]).await.unwrap();
    assert_eq!(acks[0].status, v1::BatchStatus::Applied as i32);
    tc.cluster.stop_node(1).await.unwrap();
    let e = ingest(&mut tc.client, vec![batch("docs", "job", 2, points(&mut rng, DIM as usize, 50..100))]).await.unwrap_err();
    assert_eq!(e.code(), Code::Unavailable, "{e:?}");
    assert!(e.metadata().get(shoal_proto::RETRY_AFTER_MS).is_some(), "a retry hint: {e:?}");
    // Searches still answer from the copy in sync.
    let found = tc
        .client
        .search(v1::SearchRequest { collection: "docs".into(), vector: vector(&mut rng, DIM as usize), k: 5, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((found.hits.len(), found.partial), (5, false));
    tc.cluster.shutdown().await.unwrap();
}

/// One copy of a replicated shard moves (the follower, named by its node)
/// while batches keep coming: the copy that arrives is in sync, the other
/// copy stays, and the two agree.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_copy_moves_and_the_copies_agree() {
    let mut rng = rng("a_follower_copy_moves_and_the_copies_agree");
    let mut tc = cluster(3).await;
    create_replicated(&mut tc.client, "docs", 1, 2, 1).await;
    let before = describe(&mut tc.client, "docs").await.shards.remove(0);
    let (primary, follower) = (before.replicas[0].node.clone(), before.replicas[1].node.clone());
    let spare = ["shard-0", "shard-1", "shard-2"].into_iter().find(|n| *n != primary && *n != follower).unwrap().to_owned();
    let all = points(&mut rng, DIM as usize, 0..800);
    let first: Vec<_> = all[..400].chunks(100).enumerate().map(|(i, c)| batch("docs", "job", i as u64 + 1, c.to_vec())).collect();
    ingest(&mut tc.client, first).await.unwrap();

    let mut mover = tc.client.clone();
    let req = v1::MoveShardRequest { collection: "docs".into(), shard: 0, from_node: follower.clone(), to_node: spare.clone(), wait: true };
    let moving = tokio::spawn(async move { mover.move_shard(req).await });
    let rest: Vec<_> = all[400..].chunks(50).enumerate().map(|(i, c)| batch("docs", "job", i as u64 + 5, c.to_vec())).collect();
    for b in rest {
        let acks = ingest(&mut tc.client, vec![b]).await.unwrap();
        assert_eq!(acks[0].status, v1::BatchStatus::Applied as i32);
    }
    assert_eq!(moving.await.unwrap().unwrap().into_inner().r#move.unwrap().phase, "done");

    let after = describe(&mut tc.client, "docs").await.shards.remove(0);
    let mut nodes: Vec<(&str, &str)> = after.replicas.iter().map(|r| (r.node.as_str(), r.state.as_str())).collect();
    nodes.sort_unstable();
    let mut want = vec![(primary.as_str(), "active"), (spare.as_str(), "active")];
    want.sort_unstable();
    assert_eq!(nodes, want, "the follower's copy went to {spare}; the primary's stayed");
    let v = verify(&mut tc.client, "docs", 0).await;
    assert!(v.agree, "{v:?}");
    assert_eq!(v.replicas[0].points, 800);
    assert_exact(&mut tc.client, &all, &mut rng, "after the move").await;
    // Copying from an out-of-sync copy, or one the shard does not have, is refused.
    let bad = v1::MoveShardRequest { collection: "docs".into(), shard: 0, from_node: follower, to_node: String::new(), wait: true };
    let e = tc.client.move_shard(bad).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    tc.cluster.shutdown().await.unwrap();
}

/// A node that comes back with copies out of sync is drained: those copies
/// leave the placement (there is nothing in them to move), the in-sync
/// ones move, and the drain ends.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_drain_drops_copies_out_of_sync_and_moves_the_others() {
    let mut rng = rng("a_drain_drops_copies_out_of_sync_and_moves_the_others");
    let mut tc = cluster(3).await;
    create_replicated(&mut tc.client, "docs", 3, 2, 1).await;
    let all = points(&mut rng, DIM as usize, 0..300);
    ingest(&mut tc.client, vec![batch("docs", "job", 1, all[..150].to_vec())]).await.unwrap();
    tc.cluster.stop_node(1).await.unwrap();
    ingest(&mut tc.client, vec![batch("docs", "job", 2, all[150..].to_vec())]).await.unwrap();
    tc.cluster.restart_node(1).await.unwrap();
    let held = |info: &v1::CollectionInfo| info.shards.iter().filter(|s| s.replicas.iter().any(|r| r.node == "shard-1")).count();
    let before = describe(&mut tc.client, "docs").await;
    assert!(held(&before) >= 1, "shard-1 holds copies: {before:?}");

    // Bounded: a drain held up by a copy it cannot move would wait forever.
    let mut req = tonic::Request::new(v1::DrainNodeRequest { node: "shard-1".into(), undrain: false, wait: true });
    req.set_timeout(std::time::Duration::from_secs(60));
    let drained = tc.client.drain_node(req).await.unwrap().into_inner();
    assert!(drained.removable, "{drained:?}");
    let after = describe(&mut tc.client, "docs").await;
    assert_eq!(held(&after), 0, "{after:?}");
    for s in &after.shards {
        assert!(s.replicas.iter().any(|r| r.state == "active"), "{s:?}");
        let v = verify(&mut tc.client, "docs", s.shard).await;
        assert!(v.agree, "shard {}: {v:?}", s.shard);
    }
    assert_exact(&mut tc.client, &all, &mut rng, "after the drain").await;
    tc.cluster.shutdown().await.unwrap();
}

/// A follower that was written behind the coordinator's back disagrees
/// with the primary; `ResyncReplica` takes it out of the in-sync set and
/// the controller seeds it anew from the primary, after which the copies
/// agree. The primary itself is not resynced.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_that_disagrees_is_resynced_from_the_primary() {
    let mut rng = rng("a_replica_that_disagrees_is_resynced_from_the_primary");
    let mut tc = cluster(2).await;
    create_replicated(&mut tc.client, "docs", 1, 2, 1).await;
    let all = points(&mut rng, DIM as usize, 0..200);
    ingest(&mut tc.client, vec![batch("docs", "job", 1, all.clone())]).await.unwrap();
    let shard = describe(&mut tc.client, "docs").await.shards.remove(0);
    let (primary, follower) = (shard.replicas[0].node.clone(), shard.replicas[1].node.clone());
    let i: usize = follower.trim_start_matches("shard-").parse().unwrap();
    let addr = tc.cluster.nodes[i].as_ref().unwrap().addr;
    let mut direct = shoal_proto::v1::shard_node_client::ShardNodeClient::connect(format!("http://{addr}")).await.unwrap();
    let stray = v1::ApplyBatchRequest {
        shard: Some(v1::ShardId { collection: "docs".into(), shard: 0 }),
        points: points(&mut rng, DIM as usize, 0..1),
        ..Default::default()
    };
    direct.apply_batch(stray).await.unwrap();
    assert!(!verify(&mut tc.client, "docs", 0).await.agree, "the follower's point 0 differs");

    let e = tc
        .client
        .resync_replica(v1::ResyncReplicaRequest { collection: "docs".into(), shard: 0, node: primary, wait: true })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    let req = v1::ResyncReplicaRequest { collection: "docs".into(), shard: 0, node: follower.clone(), wait: true };
    let info = tc.client.resync_replica(req).await.unwrap().into_inner();
    assert!(info.shards[0].replicas.iter().all(|r| r.state == "active"), "{info:?}");
    let v = verify(&mut tc.client, "docs", 0).await;
    assert!(v.agree && v.replicas.len() == 2, "{v:?}");
    assert_exact(&mut tc.client, &all, &mut rng, "after the resync").await;
    tc.cluster.shutdown().await.unwrap();
}

/// Stops node `i`, overwrites both LMDB meta pages of its copies of
/// `docs`'s `shards` shards (what a torn write or a bad disk does), and
/// starts it again: it then answers every request for them with DATA_LOSS
/// (docs/security.md, "Damaged data on disk"). Returns once the prober
/// has seen it down and up again, so that reads ask it among the first
/// rather than last.
async fn damage_copies(tc: &mut TestCluster, i: usize, shards: u32) {
    tc.cluster.stop_node(i).await.unwrap();
    wait_for_health(tc, i, false).await;
    for s in 0..shards {
        let file = tc.node_dir(i).join(format!("shards/docs/{s}/data.mdb"));
        let mut bytes = std::fs::read(&file).unwrap();
        bytes[..8192].fill(0xA5);
        std::fs::write(&file, bytes).unwrap();
    }
    tc.cluster.restart_node(i).await.unwrap();
    wait_for_health(tc, i, true).await;
}

/// Waits (bounded) until the coordinator's prober sees node `i` up (or down).
async fn wait_for_health(tc: &TestCluster, i: usize, up: bool) {
    let id = shoal_proto::NodeId::parse(&format!("shard-{i}")).unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while tc.cluster.coordinator.cluster.liveness().health(&id).up != up {
        assert!(std::time::Instant::now() < deadline, "shard-{i} not marked {} after 10 s", if up { "up" } else { "down" });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
    }
}

/// A copy whose data is damaged answers DATA_LOSS. Reads go to another
/// copy of the shard, as they do when a node is down: searches stay exact
/// and a get finds every point. Only when every copy is damaged does a
/// read fail, with DATA_LOSS (no retry hint: retrying cannot help) naming
/// every copy and the way out.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn reads_fail_over_from_a_damaged_copy_and_report_data_loss_when_every_copy_is() {
    let mut rng = rng("reads_fail_over_from_a_damaged_copy_and_report_data_loss_when_every_copy_is");
    let mut tc = cluster(2).await;
    create_replicated(&mut tc.client, "docs", 2, 2, 1).await;
    let all = points(&mut rng, DIM as usize, 0..400);
    let batches: Vec<_> = all.chunks(100).enumerate().map(|(i, c)| batch("docs", "job", i as u64 + 1, c.to_vec())).collect();
    ingest(&mut tc.client, batches).await.unwrap();
    assert_exact(&mut tc.client, &all, &mut rng, "both copies sound").await;
    let get_all = || v1::GetRequest { collection: "docs".into(), ids: (0..400).collect(), with_vector: true };

    // Damage the copies on shard 0's primary: the replica a read asks
    // first (among equally busy ones, the placement's order), and the
    // only one a get used to ask.
    let primary = describe(&mut tc.client, "docs").await.shards[0].node.clone();
    let damaged: usize = primary.trim_start_matches("shard-").parse().unwrap();
    damage_copies(&mut tc, damaged, 2).await;
    assert_exact(&mut tc.client, &all, &mut rng, "one copy of each shard damaged").await;
    for _ in 0..5 {
        let got = tc.client.get(get_all()).await.unwrap_or_else(|e| panic!("get with one copy damaged: {e:?}")).into_inner();
        assert!(got.missing.is_empty(), "missing {:?}", got.missing);
        assert_eq!(got.points.len(), all.len());
        for (p, want) in got.points.iter().zip(&all) {
            assert_eq!((p.id, &p.vector), (want.id, &want.vector));
        }
    }

    // Every copy damaged: DATA_LOSS, not UNAVAILABLE with a retry hint.
    damage_copies(&mut tc, 1 - damaged, 2).await;
    let search = v1::SearchRequest { collection: "docs".into(), vector: vector(&mut rng, DIM as usize), k: 10, ..Default::default() };
    let e = tc.client.search(search).await.unwrap_err();
    assert_eq!(e.code(), Code::DataLoss, "{e:?}");
    assert!(e.metadata().get("retry-after-ms").is_none(), "a retry cannot help: {e:?}");
    assert!(e.message().contains("snapshot restore docs ID --shard"), "the way out is named: {}", e.message());
    assert!(e.message().contains("shard-0") && e.message().contains("shard-1"), "every copy is named: {}", e.message());
    let e = tc.client.get(get_all()).await.unwrap_err();
    assert_eq!(e.code(), Code::DataLoss, "{e:?}");
    assert!(e.metadata().get("retry-after-ms").is_none(), "a retry cannot help: {e:?}");
    assert!(e.message().contains("snapshot restore docs ID --shard"), "{}", e.message());
    tc.cluster.shutdown().await.unwrap();
}

/// Two writes of one shard race through a failover: the first was
/// committed by the primary as entry `n` and is on its way to the follower
/// when the primary dies; the second fails on the primary, which leaves
/// the in-sync set, and commits on the follower, the new primary, under
/// the same number `n`. The first write's entry reaching the new primary
/// then must not pass for one it holds (that write would be acknowledged
/// while only the dead copy has it: acknowledged points lost in a chaos
/// run). The failover raises the placement's epoch, so the new primary's
/// first write raises its own, and the old primary's entry is refused as
/// stale; the write goes to the new primary again, exactly once by its
/// offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_entry_the_failed_primary_ordered_is_refused_by_the_next_one() {
    use shoal_proto::v1::shard_node_client::ShardNodeClient;
    let mut rng = rng("an_entry_the_failed_primary_ordered_is_refused_by_the_next_one");
    let mut tc = cluster(2).await;
    create_replicated(&mut tc.client, "docs", 1, 2, 1).await;
    let all = points(&mut rng, DIM as usize, 0..300);
    let acks = ingest(&mut tc.client, vec![batch("docs", "job", 1, all[..100].to_vec())]).await.unwrap();
    assert_eq!(acks[0].status, v1::BatchStatus::Applied as i32, "{acks:?}");
    let before = describe(&mut tc.client, "docs").await.shards.remove(0);
    let old: usize = before.node.trim_start_matches("shard-").parse().unwrap();
    let addrs = tc.cluster.node_addrs();
    let shard = Some(v1::ShardId { collection: "docs".into(), shard: 0 });

    // The first write, as a coordinator's first step: committed on the
    // primary, its entry in hand.
    let mut primary = ShardNodeClient::connect(format!("http://{}", addrs[old])).await.unwrap();
    let first = v1::ApplyBatchRequest {
        shard: shard.clone(),
        source: Some(v1::SourceOffset { source: "late".into(), offset: 1 }),
        points: all[100..200].to_vec(),
        epoch: before.epoch,
        return_entry: true,
        ..Default::default()
    };
    let answer = primary.apply_batch(first).await.unwrap().into_inner();
    let entry = answer.entry.expect("the primary returns the entry it committed");
    assert_eq!(entry.seq, 2);

    // The primary dies; the second write fails over to the follower.
    tc.cluster.stop_node(old).await.unwrap();
    let acks = ingest(&mut tc.client, vec![batch("docs", "job", 2, all[200..].to_vec())]).await.unwrap();
    assert_eq!(acks[0].status, v1::BatchStatus::Applied as i32, "{acks:?}");
    let after = describe(&mut tc.client, "docs").await.shards.remove(0);
    assert_ne!(after.node, before.node, "the follower orders the shard now: {after:?}");
    assert!(after.epoch > before.epoch, "a failover raises the placement's epoch: {} then {}", before.epoch, after.epoch);
    let new: usize = after.node.trim_start_matches("shard-").parse().unwrap();
    let mut next = ShardNodeClient::connect(format!("http://{}", addrs[new])).await.unwrap();
    let stats = next.get_shard_stats(v1::ShardStatsRequest { shard: shard.clone() }).await.unwrap().into_inner();
    assert_eq!(stats.last_seq, 2, "the second write is entry 2 of the new primary");

    // The first write's entry, as its coordinator would ship it.
    let shipped =
        next.apply_log_entries(v1::ApplyLogEntriesRequest { shard: shard.clone(), epoch: before.epoch, entries: vec![entry] }).await;
    match shipped {
        Err(e) => assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}"),
        Ok(a) => panic!("the new primary took the old primary's entry 2 as its own entry 2: {:?}", a.into_inner()),
    }

    // Sent again, the first write lands on the new primary.
    let acks = ingest(&mut tc.client, vec![batch("docs", "late", 1, all[100..200].to_vec())]).await.unwrap();
    assert_eq!(acks[0].status, v1::BatchStatus::Applied as i32, "{acks:?}");
    let got = tc
        .client
        .get(v1::GetRequest { collection: "docs".into(), ids: (0..300).collect(), with_vector: false })
        .await
        .unwrap()
        .into_inner();
    assert!(got.missing.is_empty(), "missing: {:?}", got.missing);
    tc.cluster.shutdown().await.unwrap();
}
