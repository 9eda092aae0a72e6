//! TLS between every process, API keys at the coordinator
//! (docs/security.md): real certificates made by `shoalctl tls init`'s
//! code, real loopback gRPC.

use std::path::Path;
use std::time::{Duration, Instant};

use shoal_coordinator::auth::{AuthConfig, KeyEntry, Role};
use shoal_ops::ctl::{Credentials, connect_with};
use shoal_ops::embedded::{EmbeddedCluster, EmbeddedConfig};
use shoal_ops::security::{make_cluster_certs, new_api_key};
use shoal_proto::v1;
use shoal_proto::v1::shard_node_client::ShardNodeClient;
use shoal_server::ClientTls;
use tonic::Code;
use tonic::transport::Endpoint;

async fn tls_cluster(dir: &Path, certs: &shoal_ops::security::ClusterCerts, auth: AuthConfig) -> EmbeddedCluster {
    let mut cfg = EmbeddedConfig::ephemeral(dir.join("data"), 2);
    cfg.engine.build_threads = 2;
    // The layout `shoalctl tls init` writes.
    cfg.use_tls(certs.ca.parent().unwrap());
    assert_eq!(cfg.node_tls.as_ref().unwrap().cert_file, certs.node_cert);
    cfg.coordinator.auth = auth;
    EmbeddedCluster::start(cfg).await.unwrap()
}

fn point(id: u64) -> v1::Point {
    v1::Point { id, vector: vec![1.0, id as f32], payload: None }
}

/// A TLS channel to a shard node, with or without a client certificate.
async fn node_channel(addr: std::net::SocketAddr, tls: ClientTls) -> Result<ShardNodeClient<tonic::transport::Channel>, String> {
    let ep = Endpoint::from_shared(format!("https://{addr}")).unwrap().tls_config(tls.load().unwrap()).unwrap();
    let channel = ep.connect_timeout(Duration::from_secs(2)).connect().await.map_err(|e| format!("{e:?}"))?;
    Ok(ShardNodeClient::new(channel))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_mutual_between_coordinator_and_nodes_refuses_stray_clients() {
    let dir = tempfile::tempdir().unwrap();
    let certs = make_cluster_certs(&dir.path().join("tls"), &[]).unwrap();
    let stranger = make_cluster_certs(&dir.path().join("other-ca"), &[]).unwrap();
    let tc = tls_cluster(dir.path(), &certs, AuthConfig::default()).await;
    let creds = Credentials { api_key: None, tls: Some(ClientTls::with_ca(&certs.ca)) };
    let mut client = connect_with(&tc.endpoint(), &creds).await.unwrap();
    client
        .create_collection(v1::CreateCollectionRequest {
            name: "docs".into(),
            dimension: 2,
            metric: v1::Metric::Euclidean as i32,
            shard_count: 2,
            ..Default::default()
        })
        .await
        .unwrap();
    client.upsert(v1::UpsertRequest { collection: "docs".into(), points: (0..50).map(point).collect() }).await.unwrap();
    let hits = client
        .search(v1::SearchRequest { collection: "docs".into(), vector: vec![1.0, 7.0], k: 3, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(hits.hits[0].id, 7);
    assert_eq!(hits.shards_answered, 2, "the coordinator reached both nodes over mutual TLS");

    // Plain text to the coordinator: no answer.
    let plain = shoal_ops::ctl::connect_with(&tc.endpoint(), &Credentials::default()).await;
    if let Ok(mut c) = plain {
        assert!(c.list_collections(v1::ListCollectionsRequest {}).await.is_err(), "a TLS coordinator answered plain text");
    }
    // A client that does not trust the cluster's CA refuses the coordinator.
    let wrong_ca = Credentials { api_key: None, tls: Some(ClientTls::with_ca(&stranger.ca)) };
    assert!(connect_with(&tc.endpoint(), &wrong_ca).await.is_err());

    let node = tc.node_addrs()[0];
    let drop = |c: &mut ShardNodeClient<tonic::transport::Channel>| {
        let mut c = c.clone();
        async move { c.drop_shard(v1::DropShardRequest { shard: Some(v1::ShardId { collection: "docs".into(), shard: 0 }), copy: 0 }).await }
    };
    // To a shard node: a TLS client without a certificate, and one with a
    // certificate from another CA, cannot call DropShard.
    for tls in [
        ClientTls::with_ca(&certs.ca),
        ClientTls {
            ca_file: certs.ca.clone(),
            cert_file: Some(stranger.coordinator_cert.clone()),
            key_file: Some(stranger.coordinator_key.clone()),
            domain_name: None,
        },
    ] {
        let refused = match node_channel(node, tls).await {
            Err(_) => true,
            Ok(mut c) => drop(&mut c).await.is_err(),
        };
        assert!(refused, "a shard node served a client without the cluster's certificate");
    }
    // Plain text to a shard node.
    let plain = ShardNodeClient::connect(format!("http://{node}")).await;
    if let Ok(mut c) = plain {
        assert!(drop(&mut c).await.is_err());
    }
    // Nothing was dropped: every point is still found.
    let got =
        client.get(v1::GetRequest { collection: "docs".into(), ids: (0..50).collect(), with_vector: false }).await.unwrap().into_inner();
    assert!(got.missing.is_empty(), "lost {:?}", got.missing);
    // The cluster's own certificate works directly (what the coordinator uses).
    let own = ClientTls {
        ca_file: certs.ca.clone(),
        cert_file: Some(certs.coordinator_cert.clone()),
        key_file: Some(certs.coordinator_key.clone()),
        domain_name: None,
    };
    let mut direct = node_channel(node, own).await.unwrap();
    assert!(direct.list_shards(v1::ListShardsRequest {}).await.is_ok());
    tc.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_plain_text_off_loopback_is_refused_unless_insecure() {
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = shoal_shard_node::ShardNodeConfig {
        listen: "0.0.0.0:0".parse().unwrap(),
        advertise: Some("127.0.0.1:1".into()),
        data_dir: dir.path().join("n"),
        ..Default::default()
    };
    let e = shoal_shard_node::RunningShardNode::start(&cfg).await.err().expect("a plain-text node on 0.0.0.0 started");
    let msg = format!("{e:#}");
    assert!(msg.contains("refusing to serve plain text") && msg.contains("--insecure"), "{msg}");
    cfg.listener.insecure = true;
    let node = shoal_shard_node::RunningShardNode::start(&cfg).await.unwrap();
    node.shutdown().await.unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn auth_keys_decide_by_role_and_collection_and_rotate_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (admin, admin_hash) = new_api_key();
    let (reader, reader_hash) = new_api_key();
    let (scoped, scoped_hash) = new_api_key();
    let keys_file = dir.path().join("keys.toml");
    let entries = |with_reader: bool| {
        let mut keys = vec![
            KeyEntry { name: "ops".into(), sha256: admin_hash.clone(), role: Role::Admin, collections: vec![] },
            KeyEntry { name: "docs-job".into(), sha256: scoped_hash.clone(), role: Role::Write, collections: vec!["docs".into()] },
        ];
        if with_reader {
            keys.push(KeyEntry { name: "search-ui".into(), sha256: reader_hash.clone(), role: Role::Read, collections: vec![] });
        }
        let mut text = String::new();
        for k in keys {
            let role = match k.role {
                Role::Read => "read",
                Role::Write => "write",
                Role::Admin => "admin",
            };
            text.push_str(&shoal_ops::security::key_entry_toml(&k.name, &k.sha256, role, &k.collections));
        }
        text
    };
    std::fs::write(&keys_file, entries(true)).unwrap();
    let certs = make_cluster_certs(&dir.path().join("tls"), &[]).unwrap();
    let tc = tls_cluster(dir.path(), &certs, AuthConfig { keys: vec![], keys_file: Some(keys_file.clone()) }).await;
    let as_key = |key: Option<&str>| Credentials { api_key: key.map(str::to_owned), tls: Some(ClientTls::with_ca(&certs.ca)) };
    let mut ops = connect_with(&tc.endpoint(), &as_key(Some(&admin))).await.unwrap();
    let mut ui = connect_with(&tc.endpoint(), &as_key(Some(&reader))).await.unwrap();
    let mut job = connect_with(&tc.endpoint(), &as_key(Some(&scoped))).await.unwrap();
    let mut nobody = connect_with(&tc.endpoint(), &as_key(None)).await.unwrap();
    let mut forger = connect_with(&tc.endpoint(), &as_key(Some("shoal_0000"))).await.unwrap();
    for name in ["docs", "secret"] {
        let create = v1::CreateCollectionRequest {
            name: name.into(),
            dimension: 2,
            metric: v1::Metric::Euclidean as i32,
            shard_count: 2,
            ..Default::default()
        };
        assert_eq!(job.create_collection(create.clone()).await.unwrap_err().code(), Code::PermissionDenied);
        ops.create_collection(create).await.unwrap();
    }
    let upsert = |c: &str, ids: std::ops::Range<u64>| v1::UpsertRequest { collection: c.into(), points: ids.map(point).collect() };
    job.upsert(upsert("docs", 0..20)).await.unwrap();
    // Refused calls change nothing.
    assert_eq!(job.upsert(upsert("secret", 0..5)).await.unwrap_err().code(), Code::PermissionDenied);
    assert_eq!(ui.upsert(upsert("docs", 100..105)).await.unwrap_err().code(), Code::PermissionDenied);
    assert_eq!(nobody.upsert(upsert("docs", 100..105)).await.unwrap_err().code(), Code::Unauthenticated);
    assert_eq!(forger.upsert(upsert("docs", 100..105)).await.unwrap_err().code(), Code::Unauthenticated);
    assert_eq!(ui.drop_collection(v1::DropCollectionRequest { name: "docs".into() }).await.unwrap_err().code(), Code::PermissionDenied);
    let e = job.rebalance(v1::RebalanceRequest::default()).await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);
    let count = |info: v1::CollectionInfo| info.points;
    let docs = count(ops.describe_collection(v1::DescribeCollectionRequest { name: "docs".into() }).await.unwrap().into_inner());
    let secret = count(ops.describe_collection(v1::DescribeCollectionRequest { name: "secret".into() }).await.unwrap().into_inner());
    assert_eq!((docs, secret), (20, 0));
    // Reading: the reader anywhere, the scoped key only in its collection,
    // and a listing shows a scoped key its collections only.
    let search = |c: &str| v1::SearchRequest { collection: c.into(), vector: vec![1.0, 3.0], k: 1, ..Default::default() };
    assert_eq!(ui.search(search("docs")).await.unwrap().into_inner().hits[0].id, 3);
    assert!(ui.search(search("secret")).await.is_ok());
    assert_eq!(job.search(search("secret")).await.unwrap_err().code(), Code::PermissionDenied);
    let listed: Vec<String> =
        job.list_collections(v1::ListCollectionsRequest {}).await.unwrap().into_inner().collections.into_iter().map(|c| c.name).collect();
    assert_eq!(listed, vec!["docs".to_owned()]);
    // Ingest streams check every batch's collection.
    let batch = |c: &str| v1::IngestRequest {
        collection: c.into(),
        source: "job".into(),
        offset: 0,
        points: vec![point(500)],
        deletes: vec![],
        ..Default::default()
    };
    let mut acks = job.ingest(tokio_stream::iter(vec![batch("secret")])).await.unwrap().into_inner();
    let e = acks.message().await.unwrap_err();
    assert_eq!(e.code(), Code::PermissionDenied);

    // Rotation: the reader's key leaves the file; within seconds it is refused.
    std::fs::write(&keys_file, entries(false)).unwrap();
    let started = Instant::now();
    loop {
        match ui.search(search("docs")).await {
            Err(e) if e.code() == Code::Unauthenticated => break,
            Ok(_) if started.elapsed() < Duration::from_secs(10) => tokio::time::sleep(Duration::from_millis(100)).await,
            other => panic!("the revoked key still works after {:?}: {other:?}", started.elapsed()),
        }
    }
    assert!(ops.search(search("docs")).await.is_ok(), "the other keys stay");
    tc.shutdown().await.unwrap();
}
