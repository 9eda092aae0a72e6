//! The RPCs a shard move is built from, over loopback gRPC: epochs fence
//! writes (CreateShard, ApplyBatch, FenceShard), and a copy restored from a
//! snapshot on another node catches up from the source's batch log
//! (ReadBatchLog, ApplyLogEntries), and the two copies then agree
//! (DigestShard).

use std::path::Path;

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use shoal_proto::v1;
use shoal_proto::v1::shard_node_client::ShardNodeClient;
use shoal_shard_node::{RunningShardNode, ShardNodeConfig};
use tonic::Code;
use tonic::transport::Channel;

const DIM: u32 = 16;

pub(crate) fn rng(test: &str) -> StdRng {
    let seed = std::env::var("SHOAL_TEST_SEED").ok().and_then(|s| s.parse().ok()).unwrap_or_else(rand::random::<u64>);
    eprintln!("{test}: seed {seed} (SHOAL_TEST_SEED={seed} replays it)");
    StdRng::seed_from_u64(seed)
}

/// A node on a free loopback port, with its data and a snapshot store
/// shared by the nodes of a test under `dir`.
pub(crate) async fn node(dir: &Path, name: &str, max_message_bytes: usize) -> (RunningShardNode, ShardNodeClient<Channel>) {
    let mut cfg = ShardNodeConfig {
        node_id: name.into(),
        listen: "127.0.0.1:0".parse().unwrap(),
        data_dir: dir.join(name),
        max_message_bytes,
        ..ShardNodeConfig::default()
    };
    cfg.snapshot.url = dir.join("snapshots").to_string_lossy().into_owned();
    cfg.snapshot.chunk_bytes = 64 << 10;
    cfg.engine.build_threads = 2;
    cfg.engine.durable = false;
    cfg.telemetry.metrics = false;
    let running = RunningShardNode::start(&cfg).await.unwrap();
    let client = ShardNodeClient::connect(format!("http://{}", running.addr))
        .await
        .unwrap()
        .max_decoding_message_size(max_message_bytes)
        .max_encoding_message_size(max_message_bytes);
    (running, client)
}

pub(crate) fn shard(n: u32) -> Option<v1::ShardId> {
    Some(v1::ShardId { collection: "docs".into(), shard: n })
}

/// A one-shard collection's spec: its shard owns every id, so the tests
/// write any ids into shard 0 (a node refuses ids of other shards).
fn spec() -> Option<v1::ShardSpec> {
    spec_of(1)
}

pub(crate) fn spec_of(shard_count: u32) -> Option<v1::ShardSpec> {
    Some(v1::ShardSpec { dimension: DIM, metric: v1::Metric::Cosine as i32, index: None, shard_count })
}

pub(crate) fn points(rng: &mut StdRng, ids: std::ops::Range<u64>) -> Vec<v1::Point> {
    ids.map(|id| v1::Point {
        id,
        vector: (0..DIM).map(|_| rng.random_range(-1.0f32..1.0)).collect(),
        payload: Some(v1::Payload { kind: Some(v1::payload::Kind::Json(format!("{{\"id\":{id}}}"))) }),
    })
    .collect()
}

pub(crate) fn batch(n: u32, source: Option<(&str, u64)>, points: Vec<v1::Point>, deletes: Vec<u64>, epoch: u64) -> v1::ApplyBatchRequest {
    v1::ApplyBatchRequest {
        shard: shard(n),
        source: source.map(|(s, offset)| v1::SourceOffset { source: s.into(), offset }),
        points,
        deletes,
        epoch,
        return_entry: false,
        ..Default::default()
    }
}

/// A replicated shard's primary returns the log entry each batch became,
/// which the other replicas apply: the same entry its log holds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_returns_the_log_entry_it_became() {
    let mut rng = rng("a_batch_returns_the_log_entry_it_became");
    let dir = tempfile::tempdir().unwrap();
    let (a, mut ca) = node(dir.path(), "a", 64 << 20).await;
    let (b, mut cb) = node(dir.path(), "b", 64 << 20).await;
    for c in [&mut ca, &mut cb] {
        c.create_shard(v1::CreateShardRequest { shard: shard(0), spec: spec(), epoch: 1, ..Default::default() }).await.unwrap();
    }
    for offset in 1..=3u64 {
        let mut req = batch(0, Some(("job", offset)), points(&mut rng, offset * 10..offset * 10 + 10), vec![offset * 10 - 5], 1);
        req.return_entry = true;
        let r = ca.apply_batch(req).await.unwrap().into_inner();
        let entry = r.entry.clone().expect("the entry, as asked");
        assert_eq!((r.seq, r.last_seq, entry.seq), (offset, offset, offset));
        let logged = ca.read_batch_log(v1::ReadBatchLogRequest { shard: shard(0), from_seq: offset, max_bytes: 1 }).await.unwrap();
        assert_eq!(logged.into_inner().entries[0], entry);
        cb.apply_log_entries(v1::ApplyLogEntriesRequest { shard: shard(0), epoch: 1, entries: vec![entry] }).await.unwrap();
    }
    // A replay is skipped: no entry, and where the log stands.
    let mut replay = batch(0, Some(("job", 2)), points(&mut rng, 0..1), vec![], 1);
    replay.return_entry = true;
    let r = ca.apply_batch(replay).await.unwrap().into_inner();
    assert_eq!((r.status, r.seq, r.last_seq, r.entry), (v1::BatchStatus::Skipped as i32, 0, 3, None));
    // Not asked: no entry, still the sequence number.
    let r = ca.apply_batch(batch(0, None, points(&mut rng, 90..91), vec![], 1)).await.unwrap().into_inner();
    assert_eq!((r.seq, r.entry), (4, None));
    // The follower that applied entries 1 to 3 holds what the primary held then.
    let digest = |c: &mut ShardNodeClient<Channel>| {
        let mut c = c.clone();
        async move { c.digest_shard(v1::DigestShardRequest { shard: shard(0) }).await.unwrap().into_inner() }
    };
    let db = digest(&mut cb).await;
    // 30 points, of which batches 2 and 3 deleted one each (batch 1 missed id 5).
    assert_eq!((db.points, db.last_seq), (28, 3));
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}

async fn stats(client: &mut ShardNodeClient<Channel>, n: u32) -> v1::ShardStats {
    client.get_shard_stats(v1::ShardStatsRequest { shard: shard(n) }).await.unwrap().into_inner()
}

/// Every point of shard `n` among `ids`, vectors and payloads included
/// (asked for 200 at a time, to stay under a small message limit).
async fn all_points(client: &mut ShardNodeClient<Channel>, n: u32, ids: std::ops::Range<u64>) -> Vec<v1::Point> {
    let ids: Vec<u64> = ids.collect();
    let mut out = Vec::new();
    for part in ids.chunks(200) {
        let req = v1::GetPointsRequest { shard: shard(n), ids: part.to_vec(), with_vector: true };
        out.extend(client.get_points(req).await.unwrap().into_inner().points);
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn epochs_fence_writes_on_the_wire() {
    let mut rng = rng("epochs_fence_writes_on_the_wire");
    let dir = tempfile::tempdir().unwrap();
    let (running, mut client) = node(dir.path(), "a", 64 << 20).await;
    // 0 on the wire means 1; a create may set it.
    let s = client
        .create_shard(v1::CreateShardRequest { shard: shard(0), spec: spec(), epoch: 0, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((s.epoch, s.last_seq, s.log_first_seq), (1, 0, 1));
    let s = client
        .create_shard(v1::CreateShardRequest { shard: shard(1), spec: spec_of(2), epoch: 4, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(s.epoch, 4);
    // A retried create raises the epoch, never lowers it.
    let s = client
        .create_shard(v1::CreateShardRequest { shard: shard(1), spec: spec_of(2), epoch: 6, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(s.epoch, 6);
    let s = client
        .create_shard(v1::CreateShardRequest { shard: shard(1), spec: spec_of(2), epoch: 2, ..Default::default() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(s.epoch, 6);

    // Unfenced writes (epoch 0) are accepted as before; a higher epoch is adopted.
    client.apply_batch(batch(0, Some(("job", 1)), points(&mut rng, 0..20), vec![], 0)).await.unwrap();
    client.apply_batch(batch(0, Some(("job", 2)), points(&mut rng, 20..30), vec![], 3)).await.unwrap();
    let s = stats(&mut client, 0).await;
    assert_eq!((s.epoch, s.last_seq, s.points), (3, 2, 30));
    assert!(s.log_bytes > 0);

    // A fence, then a write of the placement before it: refused, nothing changes.
    let s = client.fence_shard(v1::FenceShardRequest { shard: shard(0), epoch: 5 }).await.unwrap().into_inner();
    assert_eq!((s.epoch, s.last_seq), (5, 2));
    let e = client.apply_batch(batch(0, Some(("job", 3)), points(&mut rng, 30..40), vec![0], 4)).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert_eq!(e.message(), "shard docs/0 is at epoch 5, the write carries 4: its placement changed; re-read the placement");
    let s = stats(&mut client, 0).await;
    assert_eq!((s.points, s.last_seq, s.offsets[0].offset), (30, 2, 2));
    // Reads are never fenced.
    let hits = client
        .search_shard(v1::SearchShardRequest {
            shard: shard(0),
            queries: vec![v1::Vector { values: vec![0.5; DIM as usize] }],
            k: 3,
            ef: 32,
            with_payload: false,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(hits.results[0].hits.len(), 3);
    // A fence never lowers the epoch; 0 is not an epoch.
    let e = client.fence_shard(v1::FenceShardRequest { shard: shard(0), epoch: 4 }).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("cannot lower it to 4"), "{}", e.message());
    let e = client.fence_shard(v1::FenceShardRequest { shard: shard(0), epoch: 0 }).await.unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument, "{e:?}");
    assert_eq!(client.fence_shard(v1::FenceShardRequest { shard: shard(0), epoch: 5 }).await.unwrap().into_inner().epoch, 5);
    // The current epoch writes.
    client.apply_batch(batch(0, Some(("job", 3)), points(&mut rng, 30..40), vec![0], 5)).await.unwrap();
    assert_eq!(stats(&mut client, 0).await.points, 39);

    // The epoch is in the shard's environment: a restarted node keeps it.
    running.shutdown().await.unwrap();
    let (running, mut client) = node(dir.path(), "a", 64 << 20).await;
    let s = stats(&mut client, 0).await;
    assert_eq!((s.epoch, s.last_seq), (5, 3));
    let e = client.apply_batch(batch(0, None, points(&mut rng, 50..51), vec![], 4)).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    running.shutdown().await.unwrap();
}

/// The move, as far as shard nodes go: snapshot the source, restore it on
/// another node, keep writing to the source, catch the copy up from the
/// source's log in pieces that fit the message limit, fence the source,
/// catch up the rest. The copy ends up with the source's points, offsets,
/// sequence numbers and epoch.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restored_copy_catches_up_from_the_batch_log() {
    let mut rng = rng("a_restored_copy_catches_up_from_the_batch_log");
    let dir = tempfile::tempdir().unwrap();
    // A small message limit on the source: reads must come in pieces.
    let limit = 64 << 10;
    let (a, mut ca) = node(dir.path(), "a", limit).await;
    let (b, mut cb) = node(dir.path(), "b", 64 << 20).await;
    ca.create_shard(v1::CreateShardRequest { shard: shard(0), spec: spec(), epoch: 2, ..Default::default() }).await.unwrap();
    let mut offset = 0;
    let mut next = 0u64;
    for _ in 0..5 {
        offset += 1;
        ca.apply_batch(batch(0, Some(("job", offset)), points(&mut rng, next..next + 100), vec![], 2)).await.unwrap();
        next += 100;
    }
    ca.snapshot_shard(v1::SnapshotShardRequest { shard: shard(0), snapshot_id: "s1".into(), zstd_level: 0 }).await.unwrap();
    // Writes go on while the copy is restored: replacements, deletes, unsourced parts.
    for i in 0..12u64 {
        offset += 1;
        let deletes = (0..5).map(|_| rng.random_range(0..next)).collect();
        let replaced = rng.random_range(0..next - 50);
        let mut pts = points(&mut rng, next..next + 60);
        pts.extend(points(&mut rng, replaced..replaced + 10));
        let source = if i % 3 == 2 { None } else { Some(("job", offset)) };
        ca.apply_batch(batch(0, source, pts, deletes, 2)).await.unwrap();
        next += 60;
    }
    let restored =
        cb.restore_shard(v1::RestoreShardRequest { shard: shard(0), snapshot_id: "s1".into(), replace: false }).await.unwrap().into_inner();
    // The snapshot carries the epoch and the sequence number it holds.
    assert_eq!((restored.epoch, restored.last_seq, restored.offsets[0].offset), (2, 5, 5));

    // Catch up while the source still takes writes.
    let pull = |from: u64, max_bytes: u64| v1::ReadBatchLogRequest { shard: shard(0), from_seq: from, max_bytes };
    let mut reads = 0;
    loop {
        let last = stats(&mut cb, 0).await.last_seq;
        let read = ca.read_batch_log(pull(last + 1, 0)).await.unwrap().into_inner();
        if read.entries.is_empty() {
            break;
        }
        reads += 1;
        assert!(prost::Message::encoded_len(&read) <= limit, "a read over the message limit");
        assert_eq!(read.entries[0].seq, last + 1);
        let applied =
            cb.apply_log_entries(v1::ApplyLogEntriesRequest { shard: shard(0), epoch: 2, entries: read.entries.clone() }).await.unwrap();
        let applied = applied.into_inner();
        assert_eq!(
            (applied.applied as usize, applied.skipped, applied.last_seq),
            (read.entries.len(), 0, read.entries.last().unwrap().seq)
        );
        // Sent twice (an answer lost): skipped.
        let again = cb.apply_log_entries(v1::ApplyLogEntriesRequest { shard: shard(0), epoch: 2, entries: read.entries }).await.unwrap();
        assert_eq!((again.get_ref().applied, again.get_ref().skipped as usize > 0), (0, true));
    }
    assert!(reads > 1, "12 entries of ~70 points of 16-d should not fit in 64 KiB at once");
    // Out of order: refused with what to do.
    let read = ca.read_batch_log(pull(3, 1)).await.unwrap().into_inner();
    assert_eq!(read.entries.len(), 1);
    let ahead = v1::LogEntry { seq: stats(&mut cb, 0).await.last_seq + 2, ..read.entries[0].clone() };
    let e = cb.apply_log_entries(v1::ApplyLogEntriesRequest { shard: shard(0), epoch: 2, entries: vec![ahead] }).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("does not follow"), "{}", e.message());
    // Past the source's last batch: the copies would have diverged.
    let e = ca.read_batch_log(pull(1000, 0)).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");

    // Fence the source: a writer that missed the move is refused there;
    // the copy takes the new epoch with the last entries.
    offset += 1;
    ca.apply_batch(batch(0, Some(("job", offset)), points(&mut rng, next..next + 30), vec![1, 2, 3], 2)).await.unwrap();
    next += 30;
    ca.fence_shard(v1::FenceShardRequest { shard: shard(0), epoch: 3 }).await.unwrap();
    let e = ca.apply_batch(batch(0, Some(("job", offset + 1)), points(&mut rng, next..next + 1), vec![], 2)).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    let from = stats(&mut cb, 0).await.last_seq + 1;
    let read = ca.read_batch_log(pull(from, 0)).await.unwrap().into_inner();
    let applied =
        cb.apply_log_entries(v1::ApplyLogEntriesRequest { shard: shard(0), epoch: 3, entries: read.entries.clone() }).await.unwrap();
    assert_eq!(applied.get_ref().applied, 1);
    // A mover still at the old epoch is refused by the copy now, even
    // with entries the copy holds.
    let e = cb.apply_log_entries(v1::ApplyLogEntriesRequest { shard: shard(0), epoch: 2, entries: read.entries }).await.unwrap_err();
    assert_eq!(e.code(), Code::FailedPrecondition, "{e:?}");
    assert!(e.message().contains("is at epoch 3, the write carries 2"), "{}", e.message());

    let (sa, sb) = (stats(&mut ca, 0).await, stats(&mut cb, 0).await);
    assert_eq!((sb.epoch, sb.last_seq, sb.points, &sb.offsets), (3, sa.last_seq, sa.points, &sa.offsets));
    assert_eq!(sa.last_seq, 18);
    let (pa, pb) = (all_points(&mut ca, 0, 0..next).await, all_points(&mut cb, 0, 0..next).await);
    assert_eq!(pa.len() as u64, sa.points);
    assert_eq!(pa, pb, "the copy holds other points than the source");
    // The copy's log continues the source's: the snapshot brought entries
    // 1 to 5, catching up the rest, under the same numbers.
    let (la, lb) = (ca.read_batch_log(pull(1, 0)).await.unwrap().into_inner(), cb.read_batch_log(pull(1, 0)).await.unwrap().into_inner());
    assert_eq!((lb.first_seq, lb.last_seq, lb.entries.len()), (1, 18, 18));
    assert_eq!(la.entries[..], lb.entries[..la.entries.len()]);

    // The digest says so too, in one call per copy; and it sees the one
    // point a copy has that the other lacks.
    let digest = |c: &mut ShardNodeClient<Channel>| {
        let mut c = c.clone();
        async move { c.digest_shard(v1::DigestShardRequest { shard: shard(0) }).await.unwrap().into_inner() }
    };
    let (da, db) = (digest(&mut ca).await, digest(&mut cb).await);
    assert_eq!((da.points, &da.digest, &da.offsets), (sa.points, &db.digest, &db.offsets));
    assert_eq!(da.digest.len(), 64);
    cb.apply_batch(batch(0, None, points(&mut rng, next..next + 1), vec![], 3)).await.unwrap();
    let db = digest(&mut cb).await;
    assert_eq!(db.points, da.points + 1);
    assert_ne!(db.digest, da.digest);
    let e = ca.digest_shard(v1::DigestShardRequest { shard: shard(7) }).await.unwrap_err();
    assert_eq!(e.code(), Code::NotFound, "{e:?}");
    a.shutdown().await.unwrap();
    b.shutdown().await.unwrap();
}
