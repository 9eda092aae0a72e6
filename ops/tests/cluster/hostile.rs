//! Hostile input against a running cluster (issue 23): bytes that are not
//! the message they claim to be, oversized and absurd requests, JSON built
//! to exhaust a parser, streams whose acks are never read, a flood of
//! connections. After each, the cluster still serves others, and every
//! acknowledged point is still there. The table this prints is in
//! docs/security.md.

use std::time::{Duration, Instant};

use bytes::{Buf, BufMut};
use prost::Message;
use shoal_proto::v1;
use tonic::Code;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::transport::Channel;

use crate::common::*;

/// Sends bytes as they are and gives back the answer's bytes: what a
/// hostile or broken client can put on the wire.
#[derive(Clone, Copy, Default)]
struct Raw;

impl Codec for Raw {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = Raw;
    type Decoder = Raw;
    fn encoder(&mut self) -> Raw {
        Raw
    }
    fn decoder(&mut self) -> Raw {
        Raw
    }
}

impl Encoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for Raw {
    type Item = Vec<u8>;
    type Error = tonic::Status;
    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, tonic::Status> {
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

async fn raw_call(channel: &Channel, path: &'static str, body: Vec<u8>) -> Result<Vec<u8>, tonic::Status> {
    let mut grpc = tonic::client::Grpc::new(channel.clone()).max_encoding_message_size(usize::MAX);
    grpc.ready().await.map_err(|e| tonic::Status::unavailable(e.to_string()))?;
    let path = tonic::codegen::http::uri::PathAndQuery::from_static(path);
    grpc.unary(tonic::Request::new(body), path, Raw).await.map(tonic::Response::into_inner)
}

/// One line of the printed table.
fn row(input: &str, got: &Result<Vec<u8>, tonic::Status>, serving: bool) {
    let answer = match got {
        Ok(_) => "answered".to_owned(),
        Err(s) => format!("{:?}: {}", s.code(), s.message().chars().take(90).collect::<String>()),
    };
    eprintln!("| {input} | {answer} | {} |", if serving { "yes" } else { "NO" });
}

async fn still_serving(client: &mut shoal_proto::v1::shoal_client::ShoalClient<Channel>) -> bool {
    let q = v1::SearchRequest { collection: "docs".into(), vector: vec![0.5; 4], k: 3, ..Default::default() };
    matches!(tokio::time::timeout(Duration::from_secs(5), client.search(q)).await, Ok(Ok(r)) if r.get_ref().hits.len() == 3)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hostile_input_is_refused_precisely_and_the_cluster_serves_on() {
    let mut rng = rng("hostile_input_is_refused_precisely_and_the_cluster_serves_on");
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = shoal_ops::embedded::EmbeddedConfig::ephemeral(dir.path(), 2);
    cfg.engine.build_threads = 2;
    cfg.coordinator.max_message_bytes = 1 << 20;
    let cluster = shoal_ops::embedded::EmbeddedCluster::start(cfg).await.unwrap();
    let mut client = cluster.client().await.unwrap();
    create(&mut client, "docs", 4, v1::Metric::Cosine, 2).await;
    let acked = points(&mut rng, 4, 0..500);
    ingest(&mut client, vec![batch("docs", "job", 1, acked.clone())]).await.unwrap();
    let channel = Channel::from_shared(cluster.endpoint()).unwrap().connect().await.unwrap();
    const SEARCH: &str = "/shoal.v1.Shoal/Search";
    const UPSERT: &str = "/shoal.v1.Shoal/Upsert";
    eprintln!("| input | response | cluster still serving |\n|---|---|---|");

    let valid = v1::SearchRequest { collection: "docs".into(), vector: vec![0.5; 4], k: 3, ..Default::default() }.encode_to_vec();
    let mut cases: Vec<(&str, &'static str, Vec<u8>, Code)> = vec![
        ("SearchRequest cut in half", SEARCH, valid[..valid.len() / 2].to_vec(), Code::InvalidArgument),
        ("collection sent as a varint (wrong wire type)", SEARCH, vec![0x08, 0x96, 0x01], Code::InvalidArgument),
        ("collection not UTF-8", SEARCH, vec![0x0a, 0x03, 0xff, 0xfe, 0xfd], Code::InvalidArgument),
        ("1 KiB of 0xff", SEARCH, vec![0xff; 1024], Code::InvalidArgument),
        (
            "k = 4,294,967,295",
            SEARCH,
            v1::SearchRequest { collection: "docs".into(), vector: vec![0.5; 4], k: u32::MAX, ..Default::default() }.encode_to_vec(),
            Code::InvalidArgument,
        ),
        (
            "ef = 4,294,967,295",
            SEARCH,
            v1::SearchRequest { collection: "docs".into(), vector: vec![0.5; 4], k: 3, ef: u32::MAX, ..Default::default() }.encode_to_vec(),
            Code::InvalidArgument,
        ),
        (
            "a 1,000,000-dimensional query",
            SEARCH,
            v1::SearchRequest { collection: "docs".into(), vector: vec![0.5; 1_000_000], k: 3, ..Default::default() }.encode_to_vec(),
            Code::ResourceExhausted,
        ),
    ];
    let json_point = |id: u64, json: String| v1::Point {
        id,
        vector: vec![0.5; 4],
        payload: Some(v1::Payload { kind: Some(v1::payload::Kind::Json(json)) }),
    };
    let deep = format!("{}{}", "[".repeat(10_000), "]".repeat(10_000));
    cases.push((
        "JSON payload nested 10,000 deep",
        UPSERT,
        v1::UpsertRequest { collection: "docs".into(), points: vec![json_point(10_000, deep)] }.encode_to_vec(),
        Code::InvalidArgument,
    ));
    cases.push((
        "JSON payload of 1 MiB (over the 1 MiB message limit of this test cluster)",
        UPSERT,
        v1::UpsertRequest { collection: "docs".into(), points: vec![json_point(10_001, format!("\"{}\"", "x".repeat(1 << 20)))] }
            .encode_to_vec(),
        Code::ResourceExhausted,
    ));
    cases.push((
        "a NaN in a vector",
        UPSERT,
        v1::UpsertRequest {
            collection: "docs".into(),
            points: vec![v1::Point { id: 10_002, vector: vec![f32::NAN, 0.0, 0.0, 1.0], payload: None }],
        }
        .encode_to_vec(),
        Code::InvalidArgument,
    ));
    for (input, path, body, want) in cases {
        let got = raw_call(&channel, path, body).await;
        let serving = still_serving(&mut client).await;
        row(input, &got, serving);
        let code = got.as_ref().err().map(tonic::Status::code);
        assert_eq!(code, Some(want), "{input}: {got:?}");
        assert!(serving, "{input}: the cluster stopped serving");
    }

    // Ingest streams whose acks are never read: the server's backpressure
    // holds them; others are served.
    let mut held = Vec::new();
    for s in 0..16u64 {
        let batches: Vec<v1::IngestRequest> = (1..=8u64)
            .map(|o| {
                batch(
                    "docs",
                    &format!("never-read-{s}"),
                    o,
                    points(&mut rng, 4, 100_000 + s * 1_000 + o * 10..100_000 + s * 1_000 + o * 10 + 10),
                )
            })
            .collect();
        let mut c = client.clone();
        held.push(tokio::spawn(async move {
            // Opened and fed; the answer stream is kept but never polled.
            let answer = c.ingest(tokio_stream::iter(batches)).await;
            tokio::time::sleep(Duration::from_secs(3)).await;
            drop(answer);
        }));
    }
    tokio::time::sleep(Duration::from_millis(500)).await;
    let serving = still_serving(&mut client).await;
    eprintln!(
        "| 16 Ingest streams of 8 batches whose acks are never read | held by backpressure | {} |",
        if serving { "yes" } else { "NO" }
    );
    assert!(serving);
    for h in held {
        h.await.unwrap();
    }

    // A flood of connections that never speak: the listener keeps at most
    // max_connections and closes silent ones after the handshake timeout;
    // a client already connected is served throughout.
    let want = 10_000usize;
    let floods = open_many(cluster.coordinator.addr, want).await;
    let serving = still_serving(&mut client).await;
    eprintln!(
        "| {} connections opened without a word | excess closed by the listener (max_connections 4,096) | {} |",
        floods.len(),
        if serving { "yes" } else { "NO" }
    );
    assert!(serving, "flooded");
    drop(floods);
    let started = Instant::now();
    let mut fresh = loop {
        match cluster.client().await {
            Ok(c) => break c,
            Err(e) if started.elapsed() < Duration::from_secs(10) => {
                eprintln!("a new client waits for the flood to clear: {e}");
                tokio::time::sleep(Duration::from_millis(200)).await;
            }
            Err(e) => panic!("no new connection 10 s after the flood: {e}"),
        }
    };
    assert!(still_serving(&mut fresh).await);

    // Nothing acknowledged was lost, nothing refused was written.
    let got = client
        .get(v1::GetRequest { collection: "docs".into(), ids: acked.iter().map(|p| p.id).collect(), with_vector: true })
        .await
        .unwrap()
        .into_inner();
    assert!(got.missing.is_empty(), "lost {:?}", got.missing);
    let refused =
        client.get(v1::GetRequest { collection: "docs".into(), ids: vec![10_000, 10_001, 10_002], with_vector: false }).await.unwrap();
    assert_eq!(refused.into_inner().missing.len(), 3, "a refused write was stored");
    cluster.shutdown().await.unwrap();
}

/// Up to `n` TCP connections to `addr`, as many as the process's file
/// limit allows (raised to its hard limit first).
async fn open_many(addr: std::net::SocketAddr, n: usize) -> Vec<tokio::net::TcpStream> {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: plain getrlimit/setrlimit on this process.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) == 0 {
            lim.rlim_cur = lim.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &lim);
        }
    }
    // Each connection is a descriptor here, and the listener (in this
    // process too) holds at most max_connections (4,096) of the other
    // ends; keep a margin for the cluster's own files.
    let room = (lim.rlim_cur as usize).saturating_sub(4_096 + 1_500);
    let n = n.min(room);
    if n < 10_000 {
        eprintln!("the open-file limit ({}) allows {n} connections, not 10,000", lim.rlim_cur);
    }
    let mut out = Vec::with_capacity(n);
    for _ in 0..n {
        match tokio::net::TcpStream::connect(addr).await {
            Ok(s) => out.push(s),
            Err(e) => {
                eprintln!("connection {} failed: {e}", out.len());
                break;
            }
        }
    }
    out
}
