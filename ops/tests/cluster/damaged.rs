//! A shard whose only in-sync copy is damaged has no replica to be seeded
//! from: the controller restores it from its newest snapshot on its own
//! (`coordinator/src/restore_damaged.rs`), and the ingest job's replay
//! from the offsets in it brings back what came after. The runbook's
//! by-hand restore, for when it cannot, is `runbooks::etcd_runbook_a_copy_is_damaged`.

use shoal_proto::v1;

use crate::dev::{DevCluster, shoalctl};
use crate::runbooks::{flip_on_disk, ingest_job, points_of, wait_until};

const NOTE: &str = r#"{"note": "needle-of-the-only-copy"}"#;

async fn needle(endpoint: &str) -> Result<Option<v1::payload::Kind>, tonic::Status> {
    let mut client =
        v1::shoal_client::ShoalClient::connect(endpoint.to_owned()).await.map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let got = client.get(v1::GetRequest { collection: "docs".into(), ids: vec![100_000], with_vector: false }).await?.into_inner();
    Ok(got.points.first().and_then(|p| p.payload.clone()).and_then(|p| p.kind))
}

#[test]
fn etcd_the_only_damaged_copy_is_restored_from_its_snapshot() {
    let env = [("SHOAL_SHARD_SCRUB__BYTES_PER_SECOND", "33554432"), ("SHOAL_COORD_RECLAIM_AFTER_MS", "4000")];
    let Some(dev) = DevCluster::on_test_etcd_with_env("etcd_the_only_damaged_copy_is_restored_from_its_snapshot", 2, 1, &env) else {
        return;
    };
    let endpoint = dev.endpoint();
    shoalctl(&endpoint, &["collections", "create", "docs", "--dimension", "8", "--shards", "2"]);
    ingest_job(&endpoint, 1..=3);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().unwrap();
    rt.block_on(async {
        let mut client = v1::shoal_client::ShoalClient::connect(endpoint.clone()).await.unwrap();
        let payload = Some(v1::Payload { kind: Some(v1::payload::Kind::Json(NOTE.into())) });
        let point = v1::Point { id: 100_000, vector: vec![0.5; 8], payload };
        client.upsert(v1::UpsertRequest { collection: "docs".into(), points: vec![point] }).await.unwrap();
    });
    shoalctl(&endpoint, &["snapshot", "create", "docs"]);
    // After the snapshot: what the restored shard will lack until replayed.
    ingest_job(&endpoint, 4..=5);
    assert_eq!(points_of(&endpoint, "docs"), 501);
    let flipped = flip_on_disk(dev.data_dir(), b"needle-of-the-only-copy", 1);
    assert_eq!(flipped.len(), 1, "the needle is where it was put");

    // The damaged payload is refused (DATA_LOSS) until the copy is
    // restored; then it reads back as it was written.
    let mut refused = 0;
    wait_until("the damaged shard restored from its snapshot", || match rt.block_on(needle(&endpoint)) {
        Ok(kind) => kind == Some(v1::payload::Kind::Json(NOTE.into())),
        Err(e) => {
            assert_eq!(e.code(), tonic::Code::DataLoss, "{e:?}");
            refused += 1;
            false
        }
    });
    eprintln!("the needle was refused {refused} times before the restore");
    assert!(!shoalctl(&endpoint, &["status"]).contains("DAMAGED"));
    // The restored shard holds what its snapshot held: the points written
    // to it after are missing until the job replays from its offsets.
    let held = points_of(&endpoint, "docs");
    assert!(held < 501, "the restored shard lacks the points written after its snapshot: {held}");
    ingest_job(&endpoint, 1..=5);
    assert_eq!(points_of(&endpoint, "docs"), 501);
    assert_eq!(rt.block_on(needle(&endpoint)).unwrap(), Some(v1::payload::Kind::Json(NOTE.into())));
    dev.interrupt();
}
