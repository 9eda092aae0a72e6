//! Hostile input against a running cluster (issue 23): bytes that are not
//! the message they claim to be (alone, or as a later message of a
//! stream), oversized and absurd requests, JSON built to exhaust a parser,
//! streams whose acks are never read or read slowly, a flood of
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
    let (_dir, cluster, mut client, mut rng, acked) = hostile_cluster("hostile_input_is_refused_precisely_and_the_cluster_serves_on").await;
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

/// A 2-node cluster with a 1 MiB message limit, collection `docs` (4
/// dimensions, 2 shards) holding points 0..500, acknowledged (returned
/// last).
async fn hostile_cluster(
    test: &str,
) -> (
    tempfile::TempDir,
    shoal_ops::embedded::EmbeddedCluster,
    shoal_proto::v1::shoal_client::ShoalClient<Channel>,
    rand::rngs::StdRng,
    Vec<v1::Point>,
) {
    let mut rng = rng(test);
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = shoal_ops::embedded::EmbeddedConfig::ephemeral(dir.path(), 2);
    cfg.engine.build_threads = 2;
    cfg.coordinator.max_message_bytes = 1 << 20;
    let cluster = shoal_ops::embedded::EmbeddedCluster::start(cfg).await.unwrap();
    let mut client = cluster.client().await.unwrap();
    create(&mut client, "docs", 4, v1::Metric::Cosine, 2).await;
    let acked = points(&mut rng, 4, 0..500);
    ingest(&mut client, vec![batch("docs", "job", 1, acked.clone())]).await.unwrap();
    (dir, cluster, client, rng, acked)
}

/// One gRPC message frame as it goes on the wire: a compressed-flag byte,
/// the length the frame claims, and the bytes that follow (which need not
/// be that many).
fn grpc_frame(flag: u8, len: u32, bytes: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(5 + bytes.len());
    out.put_u8(flag);
    out.put_u32(len);
    out.put_slice(bytes);
    out
}

/// A request stream's whole body, framed by hand, sent to `path` as it is;
/// gives back the answer's messages (unframed) and the call's status (from
/// the trailers, or from the headers of an answer that has none).
async fn raw_stream(channel: &Channel, path: &str, body: Vec<u8>) -> (Vec<Vec<u8>>, tonic::Status) {
    use http_body_util::BodyExt;
    use tonic::codegen::Service;
    use tonic::codegen::http;
    let req = http::Request::builder()
        .method("POST")
        .uri(path)
        .header("content-type", "application/grpc")
        .header("te", "trailers")
        .body(tonic::body::Body::new(http_body_util::Full::new(bytes::Bytes::from(body))))
        .unwrap();
    let mut ch = channel.clone();
    std::future::poll_fn(|cx| ch.poll_ready(cx)).await.unwrap();
    let resp = tokio::time::timeout(Duration::from_secs(10), ch.call(req)).await.expect("an answer within 10 s").unwrap();
    let headers = resp.headers().clone();
    let body = tokio::time::timeout(Duration::from_secs(10), resp.into_body().collect()).await.expect("the answer's end within 10 s");
    let body = body.unwrap();
    let trailers = body.trailers().cloned();
    let mut data = body.to_bytes();
    let mut messages = Vec::new();
    while data.len() >= 5 {
        let _flag = data.get_u8();
        let len = data.get_u32() as usize;
        messages.push(data.split_to(len).to_vec());
    }
    let status = trailers
        .as_ref()
        .and_then(tonic::Status::from_header_map)
        .or_else(|| tonic::Status::from_header_map(&headers))
        .expect("a grpc-status in the trailers or the headers");
    (messages, status)
}

/// An Ingest stream whose first message is a valid batch and whose next is
/// not a message (bytes that do not decode, a frame with a flag gRPC does
/// not have, a frame cut off by the end of the stream, a frame over the
/// message limit), followed by another valid batch: the answer is the
/// first batch's ack and then INVALID_ARGUMENT (RESOURCE_EXHAUSTED for the
/// oversized one) naming the message, as for a unary call (tonic's own
/// answer is INTERNAL: the server is broken). What was acknowledged stays,
/// nothing after the bad message is applied, and the cluster serves on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_later_message_of_a_stream_that_does_not_decode_is_invalid_argument() {
    let test = "a_later_message_of_a_stream_that_does_not_decode_is_invalid_argument";
    let (_dir, cluster, mut client, mut rng, _) = hostile_cluster(test).await;
    let channel = Channel::from_shared(cluster.endpoint()).unwrap().connect().await.unwrap();
    const INGEST: &str = "/shoal.v1.Shoal/Ingest";
    eprintln!("| input | response | cluster still serving |\n|---|---|---|");

    let cases: Vec<(&str, Vec<u8>, Code)> = vec![
        ("1 KiB of 0xff", grpc_frame(0, 1024, &[0xff; 1024]), Code::InvalidArgument),
        ("collection sent as a varint (wrong wire type)", grpc_frame(0, 3, &[0x08, 0x96, 0x01]), Code::InvalidArgument),
        ("a frame with compressed-flag 7", grpc_frame(7, 3, &[0x08, 0x96, 0x01]), Code::InvalidArgument),
        ("a frame of 100 bytes cut off after 10 by the end of the stream", grpc_frame(0, 100, &[0x22; 10]), Code::InvalidArgument),
        ("a frame claiming 2 MiB (over the 1 MiB message limit)", grpc_frame(0, 2 << 20, &[]), Code::ResourceExhausted),
    ];
    let mut acked = Vec::new();
    let mut refused = Vec::new();
    for (i, (input, bad, want)) in cases.into_iter().enumerate() {
        let i = i as u64;
        let source = format!("later-{i}");
        let first = points(&mut rng, 4, 20_000 + i * 100..20_000 + i * 100 + 10);
        let third = points(&mut rng, 4, 20_000 + i * 100 + 50..20_000 + i * 100 + 60);
        let mut body = Vec::new();
        for (offset, pts) in [(1, &first), (3, &third)] {
            let msg = batch("docs", &source, offset, pts.clone()).encode_to_vec();
            body.push(grpc_frame(0, msg.len() as u32, &msg));
        }
        // The bad message second, then the third: the stream ends at the
        // bad one, so the third is never read. A frame cut off by the end
        // of the stream has to be last.
        body.insert(1, bad);
        let body = if input.contains("cut off") { body[..2].concat() } else { body.concat() };
        let (answers, status) = raw_stream(&channel, INGEST, body).await;
        let serving = still_serving(&mut client).await;
        eprintln!(
            "| {input}, as an Ingest stream's 2nd message | {} ack, then {:?}: {} | {} |",
            answers.len(),
            status.code(),
            status.message(),
            if serving { "yes" } else { "NO" }
        );
        assert_eq!(status.code(), want, "{input}: {status:?}");
        assert!(status.message().contains("message 2 of the Ingest stream"), "{input}: {status:?}");
        assert_eq!(answers.len(), 1, "{input}: the first batch's ack, and only it");
        let ack = v1::IngestAck::decode(&answers[0][..]).unwrap();
        assert_eq!((ack.offset, ack.status(), ack.upserted), (1, v1::BatchStatus::Applied, 10), "{input}");
        assert!(serving, "{input}: the cluster stopped serving");
        acked.extend(first.iter().map(|p| p.id));
        refused.extend(third.iter().map(|p| p.id));
    }

    // The first message of a stream too.
    let (answers, status) = raw_stream(&channel, INGEST, grpc_frame(0, 1024, &[0xff; 1024])).await;
    eprintln!("| 1 KiB of 0xff, as an Ingest stream's 1st message | {:?}: {} | yes |", status.code(), status.message());
    assert_eq!(status.code(), Code::InvalidArgument, "{status:?}");
    assert!(status.message().contains("message 1 of the Ingest stream"), "{status:?}");
    assert!(answers.is_empty());

    // Acknowledged batches stay; the batches after the bad messages were
    // not applied.
    let got = client.get(v1::GetRequest { collection: "docs".into(), ids: acked.clone(), with_vector: false }).await.unwrap().into_inner();
    assert!(got.missing.is_empty(), "acknowledged and lost: {:?}", got.missing);
    let got =
        client.get(v1::GetRequest { collection: "docs".into(), ids: refused.clone(), with_vector: false }).await.unwrap().into_inner();
    assert_eq!(got.missing.len(), refused.len(), "a batch after a bad message was applied");
    let offsets =
        client.get_offsets(v1::GetOffsetsRequest { collection: "docs".into(), sources: vec![] }).await.unwrap().into_inner().offsets;
    assert!(offsets.iter().filter(|o| o.source.starts_with("later-")).all(|o| o.offset == 1), "{offsets:?}");
    assert!(still_serving(&mut client).await);
    cluster.shutdown().await.unwrap();
}

/// An Ingest stream whose acks are read, but slowly: one every 200 ms for
/// 3 s, on a connection whose HTTP/2 window lets the node send only 1 KiB
/// of answers the reader has not taken (acks of 226 bytes: a long source
/// name), while its sender offers batches of 16 KiB as fast as the node
/// takes them. HTTP/2 flow control and the stream's own backpressure (one
/// batch in flight, four acks queued) hold the node: it applies only a few
/// batches more than were read, and of the rest it holds at most its
/// receive window (1 MiB) while the sender waits, so what a slow client
/// costs the node is bounded however long it reads. Meanwhile searches and
/// an Ingest stream read at full speed are served in time. Then the reader
/// stops sending and reads the rest at full speed: every ack comes, in
/// order, and every acknowledged batch is stored.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_slow_reader_of_acks_is_held_by_flow_control_and_others_are_served() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

    use tokio_stream::StreamExt;

    let test = "a_slow_reader_of_acks_is_held_by_flow_control_and_others_are_served";
    let (_dir, cluster, mut client, mut rng, _) = hostile_cluster(test).await;
    const DIM: usize = 256;
    const PER_BATCH: u64 = 16;
    const BATCHES: u64 = 300;
    const READS: u64 = 15;
    // The reader's HTTP/2 stream window: answers the node may send it
    // before it reads them.
    const WINDOW: u32 = 1 << 10;
    // Request bytes the node may have received but not decoded: its
    // receive window per stream (hyper's default, which shoal's listeners
    // keep: 1 MiB), and one chunk the sender's tonic encodes ahead (32 KiB
    // and the message that crosses it).
    const REQUEST_SLACK: usize = (1 << 20) + (64 << 10);
    create(&mut client, "slow", DIM as u32, v1::Metric::Cosine, 2).await;
    let source = format!("slow-reader-{}", "s".repeat(200));
    let ids = |b: u64| 1_000_000 + b * PER_BATCH..1_000_000 + (b + 1) * PER_BATCH;
    let batches: Vec<v1::IngestRequest> = (1..=BATCHES).map(|b| batch("slow", &source, b, points(&mut rng, DIM, ids(b)))).collect();
    let batch_len = batches[0].encoded_len() + 5;
    let ack_len = v1::IngestAck {
        source: source.clone(),
        offset: READS,
        status: v1::BatchStatus::Applied as i32,
        upserted: PER_BATCH as u32,
        ..Default::default()
    }
    .encoded_len()
        + 5;
    // Acks the node may have made and the reader not read: those in the
    // reader's window and in the frame its client is taking apart (a
    // window's worth each), the chunk the node's HTTP/2 layer holds while
    // it waits for the window (at most the queue and one more), the four
    // queued, one waiting to be queued, one being applied. Batches the node
    // may have taken beyond those applied: REQUEST_SLACK's worth, one
    // decoded and one being applied. Asserted with twice those as margin
    // (a node that ran ahead of its reader would be hundreds ahead).
    let window_acks = (WINDOW as usize).div_ceil(ack_len) as u64;
    let acks_ahead = 2 * (2 * window_acks + 5 + 4 + 1 + 1);
    let batches_ahead = 2 * (REQUEST_SLACK.div_ceil(batch_len) as u64 + 2);

    // The slow reader's sender, which stops when told, and a count of the
    // batches its client has taken from it.
    let sent = Arc::new(AtomicU64::new(0));
    let stop_sending = Arc::new(AtomicBool::new(false));
    let sender = {
        let (sent, stop) = (Arc::clone(&sent), Arc::clone(&stop_sending));
        tokio_stream::iter(batches).take_while(move |_| !stop.load(Ordering::SeqCst)).map(move |b| {
            sent.fetch_add(1, Ordering::SeqCst);
            b
        })
    };
    let channel =
        tonic::transport::Endpoint::from_shared(cluster.endpoint()).unwrap().initial_stream_window_size(WINDOW).connect().await.unwrap();
    let mut slow = shoal_proto::v1::shoal_client::ShoalClient::new(channel);
    let mut acks = slow.ingest(sender).await.unwrap().into_inner();

    // The others: searches every 50 ms, and an Ingest stream read at full
    // speed.
    let stop = Arc::new(AtomicBool::new(false));
    let searches = {
        let (mut c, stop) = (client.clone(), Arc::clone(&stop));
        tokio::spawn(async move {
            let mut slowest = Duration::ZERO;
            let mut served = 0;
            while !stop.load(Ordering::SeqCst) {
                let q = v1::SearchRequest { collection: "docs".into(), vector: vec![0.5; 4], k: 3, ..Default::default() };
                let started = Instant::now();
                let got = tokio::time::timeout(Duration::from_secs(2), c.search(q)).await;
                assert!(matches!(&got, Ok(Ok(r)) if r.get_ref().hits.len() == 3), "a search beside the slow reader: {got:?}");
                slowest = slowest.max(started.elapsed());
                served += 1;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
            (served, slowest)
        })
    };
    let brisk: Vec<v1::IngestRequest> =
        (1..=20u64).map(|o| batch("docs", "brisk", o, points(&mut rng, 4, 30_000 + o * 10..30_000 + o * 10 + 10))).collect();
    let brisk = {
        let mut c = client.clone();
        tokio::spawn(async move {
            let started = Instant::now();
            let acks = tokio::time::timeout(Duration::from_secs(5), ingest(&mut c, brisk)).await;
            (acks, started.elapsed())
        })
    };

    // One ack every 200 ms.
    let mut read = Vec::new();
    for _ in 0..READS {
        tokio::time::sleep(Duration::from_millis(200)).await;
        read.push(acks.message().await.unwrap().expect("an ack"));
    }
    // Time for the node to run as far ahead as it can.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let batches_stored = |client: &mut shoal_proto::v1::shoal_client::ShoalClient<Channel>, batches: std::ops::RangeInclusive<u64>| {
        let mut client = client.clone();
        async move {
            let ask: Vec<u64> = batches.clone().flat_map(ids).collect();
            let got = client.get(v1::GetRequest { collection: "slow".into(), ids: ask, with_vector: false }).await.unwrap().into_inner();
            let found: std::collections::HashSet<u64> = got.points.iter().map(|p| p.id).collect();
            batches.filter(|b| ids(*b).any(|id| found.contains(&id))).collect::<Vec<u64>>()
        }
    };
    let applied = batches_stored(&mut client, 1..=BATCHES).await.into_iter().max().unwrap_or(0);
    let taken = sent.load(Ordering::SeqCst);
    stop.store(true, Ordering::SeqCst);
    let (served, slowest) = searches.await.unwrap();
    let (brisk_acks, brisk_took) = brisk.await.unwrap();
    let serving = still_serving(&mut client).await;
    eprintln!(
        "| an Ingest stream of {BATCHES} batches of {} KiB whose acks are read one per 200 ms through a {} KiB HTTP/2 window | \
         held: after {READS} acks read, {applied} batches applied (bound {}), {taken} taken from the sender (bound {}); \
         {served} searches beside it, the slowest {} ms; an Ingest of 20 batches read at full speed took {} ms | {} |",
        batch_len >> 10,
        WINDOW >> 10,
        READS + acks_ahead,
        applied + batches_ahead,
        slowest.as_millis(),
        brisk_took.as_millis(),
        if serving { "yes" } else { "NO" }
    );
    assert!(applied >= READS, "acknowledged but not stored: {applied} < {READS}");
    assert!(applied <= READS + acks_ahead, "the node ran {} batches ahead of a reader that read {READS}", applied - READS);
    assert!(taken <= applied + batches_ahead, "the sender got {} batches past the {applied} applied", taken - applied);
    assert!(taken < BATCHES, "flow control never held the sender");
    assert!(served >= 10, "{served} searches in 3.5 s");
    let brisk_acks = brisk_acks.expect("an Ingest read at full speed did not finish in 5 s").unwrap();
    assert_eq!(brisk_acks.len(), 20);
    assert!(serving);

    // The reader stops sending and catches up: the rest of its acks, in
    // order, and the stream ends cleanly.
    stop_sending.store(true, Ordering::SeqCst);
    loop {
        match tokio::time::timeout(Duration::from_secs(10), acks.message()).await {
            Ok(Ok(Some(a))) => read.push(a),
            Ok(Ok(None)) => break,
            Ok(Err(e)) => panic!("the slow reader's stream failed: {e:?}"),
            Err(_) => panic!("no ack in 10 s after {} read", read.len()),
        }
    }
    let sent = sent.load(Ordering::SeqCst);
    let offsets: Vec<u64> = read.iter().map(|a| a.offset).collect();
    assert_eq!(offsets, (1..=sent).collect::<Vec<_>>(), "acks missing or out of order");
    assert!(read.iter().all(|a| a.status() == v1::BatchStatus::Applied && u64::from(a.upserted) == PER_BATCH));
    // Every acknowledged batch is stored, whole; nothing not sent is.
    let acked: Vec<u64> = (1..=sent).flat_map(ids).collect();
    let got = client.get(v1::GetRequest { collection: "slow".into(), ids: acked, with_vector: false }).await.unwrap().into_inner();
    assert!(got.missing.is_empty(), "acknowledged and lost: {:?}", got.missing);
    assert!(batches_stored(&mut client, sent + 1..=BATCHES).await.is_empty(), "a batch never sent is stored");
    assert!(still_serving(&mut client).await);
    cluster.shutdown().await.unwrap();
}

/// A client that stops reading its Ingest acks and neither closes nor
/// resets the stream used to hold the coordinator's graceful shutdown for
/// ever (its call never ends). The listener's `shutdown_grace_ms` bounds
/// the drain: after it the connection is closed and shutdown completes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stalled_stream_does_not_hold_shutdown_past_the_grace() {
    use tokio_stream::StreamExt;

    let test = "a_stalled_stream_does_not_hold_shutdown_past_the_grace";
    let mut rng = rng(test);
    let dir = tempfile::tempdir().unwrap();
    let mut cfg = shoal_ops::embedded::EmbeddedConfig::ephemeral(dir.path(), 1);
    cfg.engine.build_threads = 2;
    cfg.coordinator.listener.shutdown_grace_ms = 1_000;
    let cluster = shoal_ops::embedded::EmbeddedCluster::start(cfg).await.unwrap();
    let mut client = cluster.client().await.unwrap();
    create(&mut client, "docs", 256, v1::Metric::Cosine, 1).await;
    // Batches, then a sender that never ends, read through a 1 KiB window
    // that the acks soon fill: the call stays open, stuck on both sides.
    let batches: Vec<v1::IngestRequest> =
        (1..=50u64).map(|b| batch("docs", "stalled", b, points(&mut rng, 256, b * 10..b * 10 + 10))).collect();
    let sender = tokio_stream::iter(batches).chain(tokio_stream::pending());
    let channel =
        tonic::transport::Endpoint::from_shared(cluster.endpoint()).unwrap().initial_stream_window_size(1 << 10).connect().await.unwrap();
    let mut stalled = shoal_proto::v1::shoal_client::ShoalClient::new(channel);
    let acks = stalled.ingest(sender).await.unwrap().into_inner();
    // Some batches applied (the stream is really under way) before the stop.
    let mut applied = 0;
    for _ in 0..100 {
        let got = client.get(v1::GetRequest { collection: "docs".into(), ids: vec![10, 11], with_vector: false }).await.unwrap();
        applied = got.into_inner().points.len();
        if applied > 0 {
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(applied > 0, "the first batch was never applied");

    let started = Instant::now();
    let done = tokio::time::timeout(Duration::from_secs(10), cluster.shutdown()).await;
    let took = started.elapsed();
    assert!(matches!(done, Ok(Ok(()))), "shutdown with a stalled stream open: {done:?} after {took:?}");
    assert!(took >= Duration::from_millis(900), "the stream was given its grace: {took:?}");
    eprintln!("shutdown with a stalled Ingest stream open took {took:?} (grace 1 s)");
    drop((acks, stalled));
}
