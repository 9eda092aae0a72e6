//! Shards move while the cluster serves: a move, a drain and a rebalance
//! under concurrent ingest (with and without offsets) and searches. The
//! promise checked: no search fails, no write fails, every acknowledged
//! point is where the placement says with the vector it was given, and
//! the old copies are gone.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rand::Rng;
use shoal_proto::v1;
use shoal_proto::v1::shard_node_client::ShardNodeClient;
use shoal_proto::v1::shoal_client::ShoalClient;
use tonic::transport::Channel;

use crate::common::{TestCluster, batch, cluster, create, points, rng, vector};

const DIM: usize = 16;

/// What the background load saw.
#[derive(Default)]
struct Load {
    /// Every acknowledged point's vector, by id.
    acked: Mutex<BTreeMap<u64, Vec<f32>>>,
    searches: AtomicU64,
    writes: AtomicU64,
    failures: Mutex<Vec<String>>,
}

/// Ingest (sourced batches), upserts (no offsets) and searches on `name`
/// until `stop`; ids from `first_id` up.
fn start_load(
    client: &ShoalClient<Channel>,
    name: &str,
    first_id: u64,
    stop: &Arc<AtomicBool>,
) -> (Arc<Load>, Vec<tokio::task::JoinHandle<()>>) {
    let load = Arc::new(Load::default());
    let mut tasks = Vec::new();
    for writer in 0..2u64 {
        let (mut client, load, stop, name) = (client.clone(), Arc::clone(&load), Arc::clone(stop), name.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut rng = rng(&format!("moves writer {writer}"));
            let mut next = first_id + writer * 1_000_000;
            let mut offset = 0;
            while !stop.load(Ordering::Relaxed) {
                let pts = points(&mut rng, DIM, next..next + 20);
                next += 20;
                offset += 1;
                // Writer 0 ingests with offsets, writer 1 upserts without.
                let r = if writer == 0 {
                    crate::common::ingest(&mut client, vec![batch(&name, "live", offset, pts.clone())]).await.map(|_| ())
                } else {
                    client.upsert(v1::UpsertRequest { collection: name.clone(), points: pts.clone() }).await.map(|_| ())
                };
                match r {
                    Ok(()) => {
                        load.writes.fetch_add(1, Ordering::Relaxed);
                        load.acked.lock().unwrap().extend(pts.into_iter().map(|p| (p.id, p.vector)));
                    }
                    Err(e) => load.failures.lock().unwrap().push(format!("write: {e:?}")),
                }
                tokio::time::sleep(Duration::from_millis(5)).await;
            }
        }));
    }
    for searcher in 0..2 {
        let (mut client, load, stop, name) = (client.clone(), Arc::clone(&load), Arc::clone(stop), name.to_owned());
        tasks.push(tokio::spawn(async move {
            let mut rng = rng(&format!("moves searcher {searcher}"));
            while !stop.load(Ordering::Relaxed) {
                let req = v1::SearchRequest { collection: name.clone(), vector: vector(&mut rng, DIM), k: 10, ..Default::default() };
                match client.search(req).await {
                    Ok(r) if r.get_ref().hits.len() == 10 && !r.get_ref().partial => {
                        load.searches.fetch_add(1, Ordering::Relaxed);
                    }
                    Ok(r) => load.failures.lock().unwrap().push(format!(
                        "search: {} hits, partial {}",
                        r.get_ref().hits.len(),
                        r.get_ref().partial
                    )),
                    Err(e) => load.failures.lock().unwrap().push(format!("search: {e:?}")),
                }
            }
        }));
    }
    (load, tasks)
}

async fn stop_load(stop: &AtomicBool, tasks: Vec<tokio::task::JoinHandle<()>>) {
    stop.store(true, Ordering::Relaxed);
    for t in tasks {
        t.await.unwrap();
    }
}

/// Every acknowledged point is there, with its vector, and the collection
/// holds nothing else.
async fn all_acked_points_are_there(client: &mut ShoalClient<Channel>, name: &str, acked: &BTreeMap<u64, Vec<f32>>) {
    let ids: Vec<u64> = acked.keys().copied().collect();
    for chunk in ids.chunks(500) {
        let got =
            client.get(v1::GetRequest { collection: name.into(), ids: chunk.to_vec(), with_vector: true }).await.unwrap().into_inner();
        assert!(got.missing.is_empty(), "acknowledged points missing after the move: {:?}", &got.missing[..got.missing.len().min(10)]);
        for p in got.points {
            let want = &acked[&p.id];
            let norm = want.iter().map(|x| x * x).sum::<f32>().sqrt();
            // Stored unit length under cosine.
            assert!(p.vector.iter().zip(want).all(|(a, b)| (a - b / norm).abs() < 1e-4), "point {} has another vector", p.id);
        }
    }
    let described = client.describe_collection(v1::DescribeCollectionRequest { name: name.into() }).await.unwrap().into_inner();
    assert_eq!(described.points, acked.len() as u64, "the collection holds exactly the acknowledged points");
}

async fn shards_on(t: &TestCluster, node: usize) -> Vec<(String, u32)> {
    let addr = t.cluster.node_addrs()[node];
    let mut c = ShardNodeClient::connect(format!("http://{addr}")).await.unwrap();
    let mut held: Vec<(String, u32)> = c
        .list_shards(v1::ListShardsRequest {})
        .await
        .unwrap()
        .into_inner()
        .shards
        .into_iter()
        .filter_map(|s| s.shard.map(|id| (id.collection, id.shard)))
        .collect();
    held.sort();
    held
}

async fn placement(client: &mut ShoalClient<Channel>, name: &str) -> Vec<v1::ShardInfo> {
    client.describe_collection(v1::DescribeCollectionRequest { name: name.into() }).await.unwrap().into_inner().shards
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_shard_moves_under_ingest_and_search_without_a_failure_or_a_lost_point() {
    let mut t = cluster(3).await;
    let mut rng = rng("a_shard_moves_under_ingest_and_search");
    create(&mut t.client, "docs", DIM as u32, v1::Metric::Cosine, 2).await;
    let seed = points(&mut rng, DIM, 0..2_000);
    let mut acked: BTreeMap<u64, Vec<f32>> = seed.iter().map(|p| (p.id, p.vector.clone())).collect();
    for (i, chunk) in seed.chunks(500).enumerate() {
        crate::common::ingest(&mut t.client, vec![batch("docs", "seed", i as u64 + 1, chunk.to_vec())]).await.unwrap();
    }
    let before = placement(&mut t.client, "docs").await;
    assert_eq!((before[0].node.as_str(), before[0].epoch), ("shard-0", 1));

    let stop = Arc::new(AtomicBool::new(false));
    let (load, tasks) = start_load(&t.client, "docs", 10_000, &stop);
    tokio::time::sleep(Duration::from_millis(300)).await;
    let moved = t
        .client
        .move_shard(v1::MoveShardRequest {
            collection: "docs".into(),
            shard: 0,
            to_node: "shard-2".into(),
            wait: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(moved.r#move.unwrap().phase, "done");
    tokio::time::sleep(Duration::from_millis(300)).await;
    stop_load(&stop, tasks).await;

    let failures = load.failures.lock().unwrap().clone();
    assert!(failures.is_empty(), "{} failures during the move, first: {:?}", failures.len(), failures.first());
    let (searches, writes) = (load.searches.load(Ordering::Relaxed), load.writes.load(Ordering::Relaxed));
    eprintln!("during the move: {searches} searches, {writes} writes, none failed");
    assert!(searches > 20 && writes > 10, "the load ran ({searches} searches, {writes} writes)");

    let after = placement(&mut t.client, "docs").await;
    assert_eq!((after[0].node.as_str(), after[0].epoch, after[0].moving.is_none()), ("shard-2", 2, true));
    assert_eq!((after[1].node.as_str(), after[1].epoch), (before[1].node.as_str(), 1), "the other shard stays");
    acked.extend(load.acked.lock().unwrap().clone());
    all_acked_points_are_there(&mut t.client, "docs", &acked).await;

    // The old copy is gone once searches that started before the switch
    // had time to end.
    let gone = async {
        while shards_on(&t, 0).await.contains(&("docs".into(), 0)) {
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    };
    tokio::time::timeout(Duration::from_secs(10), gone).await.expect("the source's copy is dropped");
    assert_eq!(shards_on(&t, 2).await, [("docs".to_owned(), 0)]);

    // The source's offsets moved with the shard: replaying the seed skips.
    let again = crate::common::ingest(&mut t.client, vec![batch("docs", "seed", 4, seed[1500..].to_vec())]).await.unwrap();
    assert_eq!(again[0].status, v1::BatchStatus::Skipped as i32);
    t.cluster.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn bad_move_requests_are_refused_and_change_nothing() {
    // Two shards on three nodes: shard-2 holds none.
    let mut t = cluster(3).await;
    create(&mut t.client, "docs", DIM as u32, v1::Metric::Cosine, 2).await;
    let before = placement(&mut t.client, "docs").await;
    let mv = |collection: &str, shard: u32, to: &str| v1::MoveShardRequest {
        collection: collection.into(),
        shard,
        to_node: to.into(),
        wait: true,
        ..Default::default()
    };
    let cases = [
        (mv("docs", 0, "shard-9"), tonic::Code::NotFound, "node shard-9 is not a member (members: shard-0, shard-1, shard-2)"),
        (mv("docs", 0, "shard-0"), tonic::Code::InvalidArgument, "node shard-0 already holds shard 0 of docs"),
        (mv("docs", 5, "shard-1"), tonic::Code::InvalidArgument, "collection docs has 2 shards; there is no shard 5"),
        (mv("nope", 0, "shard-1"), tonic::Code::NotFound, "collection nope does not exist"),
        (mv("docs", 0, "bad node!"), tonic::Code::InvalidArgument, "node id"),
    ];
    for (req, code, message) in cases {
        let e = t.client.move_shard(req.clone()).await.unwrap_err();
        assert_eq!(e.code(), code, "{req:?}: {e:?}");
        assert!(e.message().contains(message), "{req:?}: {:?} does not say {message:?}", e.message());
    }
    // A drained node takes no shard; draining one that holds none leaves
    // it removable at once.
    let drained = t.client.drain_node(v1::DrainNodeRequest { node: "shard-2".into(), undrain: false, wait: true }).await.unwrap();
    assert!(drained.get_ref().removable, "{drained:?}");
    let e = t.client.move_shard(mv("docs", 0, "shard-2")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("node shard-2 is draining"), "{}", e.message());
    let e = t.client.drain_node(v1::DrainNodeRequest { node: "shard-7".into(), undrain: false, wait: false }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::NotFound, "{e:?}");
    t.client.drain_node(v1::DrainNodeRequest { node: "shard-2".into(), undrain: true, wait: false }).await.unwrap();
    assert_eq!(before, placement(&mut t.client, "docs").await, "refused requests changed the placement");
    t.cluster.shutdown().await.unwrap();

    // The only node cannot be drained: nowhere for its shards to go.
    let mut t = cluster(1).await;
    create(&mut t.client, "docs", DIM as u32, v1::Metric::Cosine, 2).await;
    let e = t.client.drain_node(v1::DrainNodeRequest { node: "shard-0".into(), undrain: false, wait: false }).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("no serving node other than shard-0 can take its 2 shards"), "{}", e.message());
    let e = t.client.move_shard(mv("docs", 1, "")).await.unwrap_err();
    assert_eq!(e.code(), tonic::Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("no serving node other than shard-0 can take shard 1 of docs"), "{}", e.message());
    t.cluster.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_drain_empties_a_node_under_load_and_a_rebalance_fills_it_again() {
    let mut t = cluster(3).await;
    let mut rng = rng("a_drain_empties_a_node");
    create(&mut t.client, "docs", DIM as u32, v1::Metric::Cosine, 6).await;
    let seed = points(&mut rng, DIM, 0..1_200);
    let mut acked: BTreeMap<u64, Vec<f32>> = seed.iter().map(|p| (p.id, p.vector.clone())).collect();
    crate::common::ingest(&mut t.client, vec![batch("docs", "seed", 1, seed)]).await.unwrap();
    let count = |shards: &[v1::ShardInfo], node: &str| shards.iter().filter(|s| s.node == node).count();
    assert_eq!(count(&placement(&mut t.client, "docs").await, "shard-2"), 2);

    let stop = Arc::new(AtomicBool::new(false));
    let (load, tasks) = start_load(&t.client, "docs", 10_000, &stop);
    let drained =
        t.client.drain_node(v1::DrainNodeRequest { node: "shard-2".into(), undrain: false, wait: true }).await.unwrap().into_inner();
    assert!(drained.removable && drained.moves.is_empty(), "{drained:?}");
    let status = t.client.cluster_status(v1::ClusterStatusRequest {}).await.unwrap().into_inner();
    let state = |s: &v1::ClusterStatusResponse, id: &str| s.nodes.iter().find(|n| n.id == id).unwrap().state.clone();
    assert_eq!(state(&status, "shard-2"), "removable");
    let shards = placement(&mut t.client, "docs").await;
    assert_eq!((count(&shards, "shard-0"), count(&shards, "shard-1"), count(&shards, "shard-2")), (3, 3, 0));

    // A new collection avoids the drained node.
    create(&mut t.client, "other", DIM as u32, v1::Metric::Cosine, 2).await;
    assert_eq!(count(&placement(&mut t.client, "other").await, "shard-2"), 0);
    t.client.drop_collection(v1::DropCollectionRequest { name: "other".into() }).await.unwrap();

    // Undrained, the node is empty: a rebalance gives it its share back.
    t.client.drain_node(v1::DrainNodeRequest { node: "shard-2".into(), undrain: true, wait: false }).await.unwrap();
    let plan = t.client.rebalance(v1::RebalanceRequest { dry_run: true, wait: false }).await.unwrap().into_inner();
    assert_eq!(plan.moves.len(), 2, "{plan:?}");
    assert!(plan.moves.iter().all(|m| m.to_node == "shard-2" && m.phase == "planned"), "{plan:?}");
    assert_eq!(count(&placement(&mut t.client, "docs").await, "shard-2"), 0, "a dry run moves nothing");
    let done = t.client.rebalance(v1::RebalanceRequest { dry_run: false, wait: true }).await.unwrap().into_inner();
    assert!(done.moves.iter().all(|m| m.phase == "done"), "{done:?}");
    stop_load(&stop, tasks).await;

    let failures = load.failures.lock().unwrap().clone();
    assert!(failures.is_empty(), "{} failures during the drain and rebalance, first: {:?}", failures.len(), failures.first());
    let shards = placement(&mut t.client, "docs").await;
    assert_eq!((count(&shards, "shard-0"), count(&shards, "shard-1"), count(&shards, "shard-2")), (2, 2, 2));
    let balanced = t.client.rebalance(v1::RebalanceRequest { dry_run: true, wait: false }).await.unwrap().into_inner();
    assert!(balanced.moves.is_empty());
    acked.extend(load.acked.lock().unwrap().clone());
    all_acked_points_are_there(&mut t.client, "docs", &acked).await;
    let _ = rng.random::<u8>();
    t.cluster.shutdown().await.unwrap();
}
