//! Snapshots through the public API: a collection snapshotted on one
//! cluster restores onto a fresh one (other nodes, other placement) and
//! serves identical results; errors come back with their codes.

use shoal_proto::v1;
use tonic::Code;

use crate::common::*;

/// Where the two clusters of a test share their snapshots: a directory,
/// and the S3 test server when the test command started one.
fn stores(test: &str, dir: &std::path::Path) -> Vec<String> {
    let mut out = vec![dir.join("store").to_string_lossy().into_owned()];
    match std::env::var("SHOAL_TEST_S3_ENDPOINT").ok().filter(|e| !e.is_empty()) {
        Some(endpoint) => {
            let bucket = std::env::var("SHOAL_TEST_S3_BUCKET").unwrap_or_else(|_| "shoal-test".into());
            out.push(format!(
                "s3://{bucket}/{test}-{:016x}?endpoint={endpoint}&region=us-east-1&access_key_id=testing&secret_access_key=testing",
                rand::random::<u64>()
            ));
        }
        None => eprintln!("SKIPPED the S3 half of {test}: SHOAL_TEST_S3_ENDPOINT is not set (ops/test.sh sets it)"),
    }
    out
}

async fn search_all(
    client: &mut shoal_proto::v1::shoal_client::ShoalClient<tonic::transport::Channel>,
    queries: &[Vec<f32>],
) -> Vec<Vec<(u64, f32)>> {
    let mut out = Vec::new();
    for q in queries {
        let r = client
            .search(v1::SearchRequest { collection: "docs".into(), vector: q.clone(), k: 10, ef: 64, ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        out.push(r.hits.iter().map(|h| (h.id, h.distance)).collect());
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_collection_restores_onto_a_fresh_cluster_with_identical_results() {
    let test = "a_collection_restores_onto_a_fresh_cluster_with_identical_results";
    let mut rng = rng(test);
    let dir = tempfile::tempdir().unwrap();
    for url in stores(test, dir.path()) {
        let mut a = cluster_with_store(3, Some(&url)).await;
        create(&mut a.client, "docs", 16, v1::Metric::Cosine, 3).await;
        let all = points(&mut rng, 16, 0..1500);
        let batches: Vec<_> = all.chunks(250).enumerate().map(|(i, c)| batch("docs", "job", i as u64, c.to_vec())).collect();
        ingest(&mut a.client, batches).await.unwrap();
        let made = a
            .client
            .create_snapshot(v1::CreateSnapshotRequest { collection: "docs".into(), ..Default::default() })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(made.shards.len(), 3);
        assert_eq!(made.shards.iter().map(|s| s.points).sum::<u64>(), 1500);
        let listed =
            a.client.list_snapshots(v1::ListSnapshotsRequest { collection: "docs".into(), shard: None }).await.unwrap().into_inner();
        assert_eq!(listed.snapshots.len(), 3, "{url}");
        assert!(listed.snapshots.iter().all(|s| s.id == made.snapshot_id && s.error.is_empty()));

        // A fresh cluster with two nodes and nothing on them.
        let mut b = cluster_with_store(2, Some(&url)).await;
        let restored = b
            .client
            .restore_snapshot(v1::RestoreSnapshotRequest {
                collection: "docs".into(),
                snapshot_id: made.snapshot_id.clone(),
                shard: None,
                replace: false,
            })
            .await
            .unwrap()
            .into_inner();
        assert_eq!(restored.restored.len(), 3);
        assert_eq!(restored.collection.as_ref().map(|c| c.points), Some(1500));

        let queries: Vec<Vec<f32>> = (0..20).map(|_| vector(&mut rng, 16)).collect();
        assert_eq!(search_all(&mut b.client, &queries).await, search_all(&mut a.client, &queries).await, "{url}");
        let get = |ids: Vec<u64>| v1::GetRequest { collection: "docs".into(), ids, with_vector: true };
        let from_a = a.client.get(get((0..1500).collect())).await.unwrap().into_inner();
        let from_b = b.client.get(get((0..1500).collect())).await.unwrap().into_inner();
        assert!(from_b.missing.is_empty());
        assert_eq!(from_a.points, from_b.points);
        let offsets = |c: &mut shoal_proto::v1::shoal_client::ShoalClient<_>| {
            let mut c = c.clone();
            async move {
                c.get_offsets(v1::GetOffsetsRequest { collection: "docs".into(), sources: vec![] }).await.unwrap().into_inner().offsets
            }
        };
        assert_eq!(offsets(&mut b.client).await, vec![v1::SourceOffset { source: "job".into(), offset: 5 }]);

        // The job resumes on the restored cluster: a replay is skipped, the
        // next batch applies.
        let acks = ingest(
            &mut b.client,
            vec![batch("docs", "job", 5, all[..10].to_vec()), batch("docs", "job", 6, points(&mut rng, 16, 5000..5010))],
        )
        .await
        .unwrap();
        assert_eq!(acks.iter().map(|a| a.status).collect::<Vec<_>>(), [v1::BatchStatus::Skipped as i32, v1::BatchStatus::Applied as i32]);
        assert_eq!(points_in(&mut b.client, "docs").await, 1510);
        assert!(
            b.client
                .get_snapshot_progress(v1::GetSnapshotProgressRequest { collection: "docs".into() })
                .await
                .unwrap()
                .into_inner()
                .running
                .is_empty()
        );
        a.cluster.shutdown().await.unwrap();
        b.cluster.shutdown().await.unwrap();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn snapshot_errors_have_their_codes_and_leave_the_collection_serving() {
    let mut rng = rng("snapshot_errors_have_their_codes_and_leave_the_collection_serving");
    let dir = tempfile::tempdir().unwrap();
    let store = dir.path().join("store");
    let mut tc = cluster_with_store(2, Some(store.to_str().unwrap())).await;
    create(&mut tc.client, "docs", 8, v1::Metric::Euclidean, 2).await;
    ingest(&mut tc.client, vec![batch("docs", "job", 0, points(&mut rng, 8, 0..600))]).await.unwrap();
    let snap = tc
        .client
        .create_snapshot(v1::CreateSnapshotRequest { collection: "docs".into(), ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    let restore =
        |id: &str, replace: bool| v1::RestoreSnapshotRequest { collection: "docs".into(), snapshot_id: id.into(), shard: None, replace };

    let e = tc.client.restore_snapshot(restore(&snap.snapshot_id, false)).await.unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    let e = tc.client.restore_snapshot(restore("no-such-snapshot", true)).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let e = tc.client.restore_snapshot(restore("../../etc", true)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    let e = tc.client.create_snapshot(v1::CreateSnapshotRequest { collection: "nope".into(), ..Default::default() }).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    let e = tc
        .client
        .create_snapshot(v1::CreateSnapshotRequest { collection: "docs".into(), snapshot_id: snap.snapshot_id.clone(), zstd_level: 0 })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists, "{e:?}");
    let e = tc
        .client
        .create_snapshot(v1::CreateSnapshotRequest { collection: "docs".into(), snapshot_id: String::new(), zstd_level: 99 })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");

    // Corrupt every chunk of the snapshot on disk: the restore (with
    // replace) fails and the shards keep serving what they had.
    let q = vector(&mut rng, 8);
    let before = search_one(&mut tc.client, &q).await;
    for entry in std::fs::read_dir(store.join("chunks")).unwrap() {
        let path = entry.unwrap().path();
        let mut b = std::fs::read(&path).unwrap();
        let mid = b.len() / 2;
        b[mid] ^= 0xff;
        std::fs::write(&path, b).unwrap();
    }
    let e = tc.client.restore_snapshot(restore(&snap.snapshot_id, true)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("corrupt") || e.message().contains("truncated"), "{}", e.message());
    assert_eq!(search_one(&mut tc.client, &q).await, before);
    assert_eq!(points_in(&mut tc.client, "docs").await, 600);

    // Prune through the API: keep 1 of 2.
    ingest(&mut tc.client, vec![batch("docs", "job", 1, points(&mut rng, 8, 1000..1010))]).await.unwrap();
    tc.client.create_snapshot(v1::CreateSnapshotRequest { collection: "docs".into(), ..Default::default() }).await.unwrap();
    let pruned = tc
        .client
        .prune_snapshots(v1::PruneSnapshotsRequest { collection: "docs".into(), shard: None, keep_last: 1 })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(pruned.deleted.len(), 2, "{pruned:?}");
    assert_eq!(pruned.kept_snapshots, 2);
    let left = tc.client.list_snapshots(v1::ListSnapshotsRequest { collection: "docs".into(), shard: None }).await.unwrap().into_inner();
    assert!(left.snapshots.iter().all(|s| s.id != snap.snapshot_id));
    let kept = left.snapshots[0].id.clone();
    assert_eq!((left.snapshots[0].dimension, left.snapshots[0].metric), (8, v1::Metric::Euclidean as i32));

    // A collection of the same name but another dimension is not
    // overwritten by a snapshot of the old one.
    tc.client.drop_collection(v1::DropCollectionRequest { name: "docs".into() }).await.unwrap();
    create(&mut tc.client, "docs", 4, v1::Metric::Euclidean, 2).await;
    let e = tc.client.restore_snapshot(restore(&kept, true)).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert!(e.message().contains("dimension"), "{}", e.message());
    tc.cluster.shutdown().await.unwrap();
}

async fn search_one(client: &mut shoal_proto::v1::shoal_client::ShoalClient<tonic::transport::Channel>, q: &[f32]) -> Vec<(u64, f32)> {
    let r = client
        .search(v1::SearchRequest { collection: "docs".into(), vector: q.to_vec(), k: 5, ef: 64, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    r.hits.iter().map(|h| (h.id, h.distance)).collect()
}
