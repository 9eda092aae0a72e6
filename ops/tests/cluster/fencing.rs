//! Fencing where the write lands: a shard node that knows a newer epoch
//! for a shard (a move fenced it) refuses writes stamped with an older
//! one, and the coordinator, whose view is behind, follows the shard to
//! its new placement instead of failing the caller; if no new placement
//! comes within the write's deadline, the write fails UNAVAILABLE with a
//! retry hint and nothing was written.

use std::sync::Arc;
use std::time::{Duration, Instant};

use shoal_coordinator::client::PeerSettings;
use shoal_coordinator::cluster::{Cluster, ClusterOptions};
use shoal_coordinator::metadata::{InMemoryStore, MetadataStore};
use shoal_coordinator::model::Member;
use shoal_coordinator::pool::GrpcConnector;
use shoal_proto::v1::shard_node_client::ShardNodeClient;
use shoal_proto::{CollectionName, ErrorCode, NodeId, v1};

use crate::common::{points, rng, shard_node};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_fenced_shard_refuses_stale_writes_and_the_coordinator_follows_the_new_placement() {
    let dir = tempfile::tempdir().unwrap();
    let mut rng = rng("fencing");
    let node = shard_node(dir.path(), "n0").await;
    let member = Member::configured(NodeId::parse("n0").unwrap(), format!("http://{}", node.addr));
    let store: Arc<dyn MetadataStore> = Arc::new(InMemoryStore::new(vec![member]));
    let connector = GrpcConnector { max_message_bytes: 64 << 20, peers: PeerSettings::default() };
    let cluster = Cluster::new(Arc::clone(&store), Box::new(connector), ClusterOptions::default());
    let create = v1::CreateCollectionRequest {
        name: "docs".into(),
        dimension: 8,
        metric: v1::Metric::Cosine as i32,
        shard_count: 1,
        ..Default::default()
    };
    cluster.create_collection(create).await.unwrap();
    cluster.write("docs", points(&mut rng, 8, 0..10), vec![], None, None).await.unwrap();

    let mut direct = ShardNodeClient::connect(format!("http://{}", node.addr)).await.unwrap();
    let fence = |epoch| v1::FenceShardRequest { shard: Some(v1::ShardId { collection: "docs".into(), shard: 0 }), epoch };
    let name = CollectionName::parse("docs").unwrap();

    // Fenced at 2 while the view still says 1: the write waits for the new
    // placement, then lands there with epoch 2.
    direct.fence_shard(fence(2)).await.unwrap();
    let started = Instant::now();
    let write = cluster.write("docs", points(&mut rng, 8, 10..20), vec![], None, Some(Duration::from_secs(10)));
    let publish = async {
        tokio::time::sleep(Duration::from_millis(300)).await;
        let v = store.view().collection(&name).unwrap().clone();
        let mut c = v.value;
        c.shards[0].epoch = 2;
        store.update_collection(c, v.revision).await.unwrap();
    };
    let (written, ()) = tokio::join!(write, publish);
    let took = started.elapsed();
    let written = written.unwrap();
    assert_eq!(written.upserted, 10, "{written:?}");
    assert!(took >= Duration::from_millis(300), "the write cannot land before the placement moved: {took:?}");
    assert_eq!(cluster.describe("docs", None).await.unwrap().points, 20);

    // Fenced at 3 and no new placement: refused within the caller's
    // deadline, UNAVAILABLE with a hint, nothing written.
    direct.fence_shard(fence(3)).await.unwrap();
    let started = Instant::now();
    let e = cluster.write("docs", points(&mut rng, 8, 20..30), vec![], None, Some(Duration::from_secs(1))).await.unwrap_err();
    let took = started.elapsed();
    assert_eq!(e.code(), ErrorCode::Unavailable, "{e:?}");
    assert!(e.retry_after().is_some() && e.to_string().contains("moving") && e.to_string().contains("nothing was written"), "{e:?}");
    assert!(took >= Duration::from_millis(900) && took < Duration::from_secs(3), "{took:?}");
    assert_eq!(cluster.describe("docs", None).await.unwrap().points, 20, "the refused write must change nothing");

    drop(cluster);
    node.shutdown().await.unwrap();
}
