//! Membership that follows registrations: shard nodes register themselves
//! in the metadata store under a lease, the coordinator's shard pool
//! follows the store's view, a node that joins gets new shards, and a node
//! whose lease ends makes its shards fail fast (UNAVAILABLE, naming it)
//! while the others keep serving. Run here against the in-memory store;
//! the etcd tests run the same scenario against a real etcd.

use std::sync::Arc;
use std::time::{Duration, Instant};

use shoal_coordinator::client::PeerSettings;
use shoal_coordinator::cluster::{Cluster, ClusterOptions};
use shoal_coordinator::metadata::{InMemoryStore, MetadataStore};
use shoal_coordinator::pool::GrpcConnector;
use shoal_coordinator::search::SearchQuery;
use shoal_proto::{ErrorCode, NodeId, v1};
use shoal_shard_node::RunningShardNode;
use shoal_shard_node::registration::Presence;

use crate::common::{points, rng, shard_node as node};

const TTL: Duration = Duration::from_secs(1);

async fn join(store: &Arc<dyn MetadataStore>, n: &RunningShardNode, id: &str, dir: &std::path::Path) -> Presence {
    let id = NodeId::parse(id).unwrap();
    Presence::join(Arc::clone(store), id, format!("http://{}", n.addr), String::new(), Arc::clone(&n.host), dir.to_path_buf(), TTL)
        .await
        .unwrap()
}

/// Waits (bounded) until the store's view satisfies `ok`.
async fn until(store: &Arc<dyn MetadataStore>, what: &str, within: Duration, ok: impl Fn(&shoal_coordinator::metadata::View) -> bool) {
    let started = Instant::now();
    while !ok(&store.view()) {
        assert!(started.elapsed() < within, "{what}: not within {within:?}; view: {:?}", store.view());
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

fn create(name: &str, shards: u32) -> v1::CreateCollectionRequest {
    v1::CreateCollectionRequest {
        name: name.into(),
        dimension: 8,
        metric: v1::Metric::Cosine as i32,
        shard_count: shards,
        ..Default::default()
    }
}

fn search(collection: &str, allow_partial: bool) -> SearchQuery {
    SearchQuery {
        collection: collection.into(),
        queries: vec![vec![0.5; 8]],
        k: 5,
        ef: 0,
        with_payload: false,
        allow_partial,
        timeout_ms: 0,
        ..Default::default()
    }
}

/// The scenario, against any store.
pub(crate) async fn membership_follows_registrations(store: Arc<dyn MetadataStore>) {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rng("membership_follows_registrations");
    let connector = GrpcConnector { max_message_bytes: 64 << 20, peers: PeerSettings::default() };
    let cluster = Cluster::new(Arc::clone(&store), Box::new(connector), ClusterOptions::default());

    // No member: a create is refused with a retry hint, nothing recorded.
    let e = cluster.create_collection(create("early", 1)).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Unavailable, "{e:?}");
    assert!(store.view().collections.is_empty());

    let a = node(dir.path(), "node-a").await;
    let presence_a = join(&store, &a, "node-a", dir.path()).await;
    until(&store, "node-a registered", Duration::from_secs(5), |v| v.members.len() == 1).await;
    cluster.create_collection(create("one", 2)).await.unwrap();

    // A node that joins gets the next shards.
    let b = node(dir.path(), "node-b").await;
    let presence_b = join(&store, &b, "node-b", dir.path()).await;
    until(&store, "node-b registered", Duration::from_secs(5), |v| v.members.len() == 2).await;
    cluster.create_collection(create("two", 2)).await.unwrap();
    let two = store.view().collections.values().find(|c| c.value.name.as_str() == "two").unwrap().value.clone();
    let nodes: Vec<&str> = two.shards.iter().map(|s| s.node().as_str()).collect();
    assert_eq!(nodes, ["node-b", "node-b"], "the new node holds no shard yet, so it takes both");
    // Each node reports its capacity as it changes.
    let a_id = NodeId::parse("node-a").unwrap();
    until(&store, "node-a reports its 2 shards", Duration::from_secs(6), |v| v.members.get(&a_id).is_some_and(|m| m.capacity.shards == 2))
        .await;
    assert!(store.view().members[&a_id].capacity.disk_free_bytes > 0, "{:?}", store.view().members[&a_id]);

    for c in ["one", "two"] {
        cluster.write(c, points(&mut rng, 8, 0..50), vec![], None, None).await.unwrap();
        let found = cluster.search_many(search(c, false), None).await.unwrap();
        assert_eq!(found.results[0].len(), 5);
    }

    // node-b crashes (its presence dropped, not left): once its lease ends
    // it is no member, and "two" fails fast naming it; "one" is unharmed.
    let crashed = Instant::now();
    drop(presence_b);
    until(&store, "node-b's lease ended", TTL * 4 + Duration::from_secs(2), |v| v.members.len() == 1).await;
    let gone_after = crashed.elapsed();
    eprintln!("node-b left the view {gone_after:?} after its keep-alive stopped (TTL {TTL:?})");
    assert!(gone_after >= TTL / 2, "the lease cannot end before its TTL: {gone_after:?}");
    let started = Instant::now();
    let e = cluster.search_many(search("two", false), None).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Unavailable, "{e:?}");
    assert!(e.to_string().contains("node-b"), "{e}");
    assert!(e.retry_after().is_some(), "{e:?}");
    assert!(started.elapsed() < Duration::from_millis(500), "the search waited {:?}", started.elapsed());
    let e = cluster.write("two", points(&mut rng, 8, 100..110), vec![], None, None).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Unavailable, "{e:?}");
    assert!(e.to_string().contains("nothing was written"), "{e}");
    assert_eq!(cluster.search_many(search("one", false), None).await.unwrap().results[0].len(), 5);

    // A graceful leave is seen at once, not after the TTL.
    let started = Instant::now();
    presence_a.leave().await;
    until(&store, "node-a left", TTL / 2, |v| v.members.is_empty()).await;
    eprintln!("node-a's leave was seen after {:?}", started.elapsed());

    drop(cluster);
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_follows_registrations_in_memory() {
    membership_follows_registrations(Arc::new(InMemoryStore::new(Vec::new()))).await;
}

/// The same against a real etcd (`ops/test.sh` starts one and sets
/// `SHOAL_TEST_ETCD_ENDPOINT`; without it this prints SKIPPED, as the S3
/// tests do without theirs).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn membership_follows_registrations_on_etcd() {
    let Some(endpoint) = std::env::var("SHOAL_TEST_ETCD_ENDPOINT").ok().filter(|e| !e.is_empty()) else {
        eprintln!("SKIPPED membership_follows_registrations_on_etcd: SHOAL_TEST_ETCD_ENDPOINT is not set");
        return;
    };
    let cfg = shoal_control::ClusterConfig {
        etcd: vec![endpoint],
        prefix: format!("/shoal-test/membership-{:016x}", rand::random::<u64>()),
        ..shoal_control::ClusterConfig::default()
    };
    membership_follows_registrations(shoal_control::metadata::open(&cfg).await.unwrap()).await;
}

/// A probe's verdict is a suspicion: one that timed out on a busy node
/// marks a node down that still answers. Reads skip a suspected replica
/// while another can answer, but when every in-sync replica of a shard is
/// suspected, the last one is still asked: before, such a search failed
/// with "its health check failed" although the node would have answered
/// (18 of 412,597 searches in the 1,100 s chaos run).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_replica_the_prober_suspects_is_still_asked_when_no_other_is_left() {
    let store: Arc<dyn MetadataStore> = Arc::new(InMemoryStore::new(Vec::new()));
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rng("a_replica_the_prober_suspects_is_still_asked_when_no_other_is_left");
    // Probes far apart: the marks below stay until the test ends.
    let peers = PeerSettings { probe_interval_ms: 600_000, ..PeerSettings::default() };
    let connector = GrpcConnector { max_message_bytes: 64 << 20, peers };
    let cluster = Cluster::new(Arc::clone(&store), Box::new(connector), ClusterOptions::default());
    let a = node(dir.path(), "node-a").await;
    let b = node(dir.path(), "node-b").await;
    let _presence_a = join(&store, &a, "node-a", dir.path()).await;
    let _presence_b = join(&store, &b, "node-b", dir.path()).await;
    until(&store, "both registered", Duration::from_secs(5), |v| v.members.len() == 2).await;
    cluster.create_collection(v1::CreateCollectionRequest { replication_factor: 2, ..create("docs", 2) }).await.unwrap();
    cluster.write("docs", points(&mut rng, 8, 0..50), vec![], None, None).await.unwrap();
    let whole = cluster.search_many(search("docs", false), None).await.unwrap();
    assert_eq!(whole.results[0].len(), 5);

    // One suspected: its shards' other copies answer, as before.
    let a_id = NodeId::parse("node-a").unwrap();
    let b_id = NodeId::parse("node-b").unwrap();
    cluster.liveness().mark_down(&a_id, "no answer within 1s (test)");
    for _ in 0..20 {
        let found = cluster.search_many(search("docs", false), None).await.unwrap();
        assert_eq!(found.results, whole.results);
    }
    // Both suspected, both alive: every shard's last replica is asked.
    cluster.liveness().mark_down(&b_id, "no answer within 1s (test)");
    for _ in 0..20 {
        let found = cluster.search_many(search("docs", false), None).await.unwrap_or_else(|e| panic!("both suspected: {e}"));
        assert_eq!(found.results, whole.results);
    }

    // One really gone and one suspected: the suspected one answers.
    a.shutdown().await.unwrap();
    let found = cluster.search_many(search("docs", false), None).await.unwrap_or_else(|e| panic!("node-a gone: {e}"));
    assert_eq!(found.results, whole.results);
    // Both gone: the error names every replica's reason, not only the last.
    b.shutdown().await.unwrap();
    let e = cluster.search_many(search("docs", false), None).await.unwrap_err();
    assert_eq!(e.code(), ErrorCode::Unavailable, "{e:?}");
    let message = e.to_string();
    assert!(message.contains("node-a") && message.contains("node-b"), "{message}");
}
