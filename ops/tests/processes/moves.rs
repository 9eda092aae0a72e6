//! A shard move on a real etcd whose controller dies mid-way: every party
//! its own process, the controller SIGKILLed while it copies the shard. The
//! move is a record in etcd, not a task in the dead process: the other
//! coordinator becomes the controller within a lease, takes the move over
//! (a new attempt, so the dead one could not switch it even if it came
//! back) and finishes it, while a writer through the survivor goes on.
//! Nothing acknowledged is lost, and the old copy is dropped.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use shoal_proto::v1;
use shoal_proto::v1::shoal_client::ShoalClient;
use tonic::transport::Channel;

use crate::check;
use crate::common::{Fixture, block_on, create, points, rng, upsert_all};

const TTL: Duration = Duration::from_secs(2);
const DIM: usize = 64;
/// Enough for the copy to take a while (snapshot, restore, catch-up), so
/// that the kill lands inside it.
const SEED: u64 = 12_000;

async fn status(client: &mut ShoalClient<Channel>) -> anyhow::Result<v1::ClusterStatusResponse> {
    Ok(client.cluster_status(v1::ClusterStatusRequest {}).await?.into_inner())
}

fn controller(s: &v1::ClusterStatusResponse) -> String {
    s.control_plane.as_ref().map(|c| c.controller.clone()).unwrap_or_default()
}

fn shard0(s: &v1::ClusterStatusResponse) -> Option<v1::ShardInfo> {
    s.collections.iter().find(|c| c.name == "docs")?.shards.first().cloned()
}

/// What the writer saw: acknowledged points and refused writes.
#[derive(Default)]
struct Written {
    acked: Mutex<BTreeMap<u64, Vec<f32>>>,
    refused: Mutex<Vec<String>>,
}

/// Upserts batches of new points through `client` until `stop`; a
/// refused batch is retried (upserts are idempotent), as a job would.
fn start_writer(client: ShoalClient<Channel>, stop: Arc<AtomicBool>) -> (Arc<Written>, tokio::task::JoinHandle<()>) {
    let written = Arc::new(Written::default());
    let w = Arc::clone(&written);
    let task = tokio::spawn(async move {
        let mut client = client;
        let mut rng = rng("etcd move writer");
        let mut next = 1_000_000u64;
        while !stop.load(Ordering::Relaxed) {
            let pts = points(&mut rng, DIM, next..next + 50);
            next += 50;
            loop {
                let req = v1::UpsertRequest { collection: "docs".into(), points: pts.clone() };
                match client.upsert(req).await {
                    Ok(_) => {
                        w.acked.lock().unwrap().extend(pts.iter().map(|p| (p.id, p.vector.clone())));
                        break;
                    }
                    Err(e) => {
                        w.refused.lock().unwrap().push(format!("{:?}: {}", e.code(), e.message()));
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        tokio::time::sleep(Duration::from_millis(100)).await;
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    });
    (written, task)
}

fn log_of(fx: &Fixture, id: &str) -> String {
    std::fs::read_to_string(fx.dir.path().join(format!("{id}.log"))).unwrap_or_default()
}

pub(crate) fn etcd_a_move_survives_the_death_of_its_controller() -> anyhow::Result<()> {
    let Some(fx) = Fixture::on_etcd("etcd_a_move_survives_the_death_of_its_controller", 3, 2, TTL)? else { return Ok(()) };
    block_on(async {
        let mut first = fx.client().await?;
        let mut second = ShoalClient::connect(fx.cluster.more_coordinators[0].endpoint()).await?;
        let mut rng = rng("etcd_a_move_survives_the_death_of_its_controller");
        for c in [&mut first, &mut second] {
            let deadline = Instant::now() + Duration::from_secs(10);
            while !status(c).await.is_ok_and(|s| s.nodes.len() == 3 && !controller(&s).is_empty()) {
                check!(fx, Instant::now() < deadline, "a coordinator did not see 3 nodes and a controller: {:?}", status(c).await);
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }

        // One shard with some data on it; the writer goes through the
        // coordinator that is not the controller (the one that survives).
        create(&mut first, "docs", DIM as u32, 1).await?;
        let seed = points(&mut rng, DIM, 0..SEED);
        upsert_all(&mut first, "docs", seed.clone(), 1_000).await?;
        let leader = controller(&status(&mut first).await?);
        let (killed, survivor, survivor_id) = if leader == fx.cluster.coordinator.id {
            (&fx.cluster.coordinator, second.clone(), fx.cluster.more_coordinators[0].id.clone())
        } else {
            (&fx.cluster.more_coordinators[0], first.clone(), fx.cluster.coordinator.id.clone())
        };
        check!(fx, leader == killed.id, "the controller is {leader:?}, neither coordinator");
        let mut survivor = survivor;
        let before = shard0(&status(&mut survivor).await?).expect("shard 0 of docs");
        let target = fx.cluster.nodes.iter().map(|n| n.id.clone()).find(|id| *id != before.node).expect("another node");

        let stop = Arc::new(AtomicBool::new(false));
        let (written, writer) = start_writer(survivor.clone(), Arc::clone(&stop));
        tokio::time::sleep(Duration::from_millis(300)).await;

        // Record the move through the survivor, without waiting; SIGKILL
        // the controller as soon as it starts copying.
        let req = v1::MoveShardRequest { collection: "docs".into(), shard: 0, to_node: target.clone(), wait: false, ..Default::default() };
        survivor.move_shard(req).await?;
        let deadline = Instant::now() + Duration::from_secs(10);
        while !log_of(&fx, &killed.id).contains("shard move: copying") {
            check!(fx, Instant::now() < deadline, "the controller {} did not start the move", killed.id);
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        killed.kill()?;
        let killed_at = Instant::now();
        let dead_log = log_of(&fx, &killed.id);
        let mid_copy = !dead_log.contains("placement switched");
        eprintln!("controller {} killed (SIGKILL) {} the switch", killed.id, if mid_copy { "before" } else { "after" });
        check!(fx, mid_copy, "the kill came too late to test a takeover: the dead controller had switched\n{dead_log}");

        // The survivor becomes the controller and finishes the move.
        let deadline = Instant::now() + Duration::from_secs(60);
        let after = loop {
            let s = status(&mut survivor).await?;
            if let Some(sh) = shard0(&s)
                && sh.moving.is_none()
                && sh.node == target
                && controller(&s) == survivor_id
            {
                break sh;
            }
            check!(fx, Instant::now() < deadline, "the move was not finished by {survivor_id}: {s:?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        };
        let took = killed_at.elapsed();
        tokio::time::sleep(Duration::from_millis(300)).await;
        stop.store(true, Ordering::Relaxed);
        writer.await?;
        let survivor_log = log_of(&fx, &survivor_id);
        eprintln!("the move was finished by {survivor_id} {took:?} after the kill (lease TTL {TTL:?})");
        check!(fx, survivor_log.contains("attempt=2"), "the survivor did not take the move over as a new attempt:\n{survivor_log}");
        check!(fx, after.epoch > before.epoch, "the switch raised no epoch: {before:?} -> {after:?}");

        // Nothing acknowledged is lost; a refused write was retried, and
        // says why it was refused.
        let refused = written.refused.lock().unwrap().clone();
        let mut acked: BTreeMap<u64, Vec<f32>> = seed.into_iter().map(|p| (p.id, p.vector)).collect();
        let live = written.acked.lock().unwrap().clone();
        eprintln!("writer: {} points acknowledged during the move, {} refusals (retried)", live.len(), refused.len());
        if let Some(first) = refused.first() {
            eprintln!("first refusal: {first}");
        }
        check!(fx, live.len() >= 500, "the writer barely ran: {} points", live.len());
        acked.extend(live);
        let ids: Vec<u64> = acked.keys().copied().collect();
        for chunk in ids.chunks(1_000) {
            let req = v1::GetRequest { collection: "docs".into(), ids: chunk.to_vec(), with_vector: true };
            let got = survivor.get(req).await?.into_inner();
            check!(fx, got.missing.is_empty(), "acknowledged points lost: {:?}", &got.missing[..got.missing.len().min(10)]);
            for p in got.points {
                let want = &acked[&p.id];
                let norm = want.iter().map(|x| x * x).sum::<f32>().sqrt();
                check!(fx, p.vector.iter().zip(want).all(|(a, b)| (a - b / norm).abs() < 1e-4), "point {} has another vector", p.id);
            }
        }
        let described = survivor.describe_collection(v1::DescribeCollectionRequest { name: "docs".into() }).await?.into_inner();
        check!(fx, described.points == acked.len() as u64, "{} points, {} acknowledged", described.points, acked.len());

        // The old copy goes once the grace for searches has passed.
        let source = fx.cluster.nodes.iter().find(|n| n.id == before.node).expect("the source node");
        let mut node = shoal_proto::v1::shard_node_client::ShardNodeClient::connect(source.endpoint()).await?;
        let deadline = Instant::now() + Duration::from_secs(15);
        while !node.list_shards(v1::ListShardsRequest {}).await?.into_inner().shards.is_empty() {
            check!(fx, Instant::now() < deadline, "the old copy on {} was not dropped", source.id);
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(())
    })
}

/// Streams batches `offsets` of source "job" (100 points each, ids from
/// the offset) and returns their acks.
async fn ingest_job(
    client: &mut ShoalClient<Channel>,
    rng: &mut rand::rngs::StdRng,
    offsets: std::ops::RangeInclusive<u64>,
) -> anyhow::Result<Vec<v1::IngestAck>> {
    let batches: Vec<v1::IngestRequest> = offsets
        .map(|o| v1::IngestRequest {
            collection: "docs".into(),
            source: "job".into(),
            offset: o,
            points: points(rng, 16, (o - 1) * 100..o * 100),
            deletes: vec![],
            ..Default::default()
        })
        .collect();
    let mut acks = client.ingest(tokio_stream::iter(batches)).await?.into_inner();
    let mut out = Vec::new();
    while let Some(a) = acks.message().await? {
        out.push(a);
    }
    Ok(out)
}

/// A shard node dies for good: its shard is restored on another node from
/// its last snapshot with one command, the ingest job resumes from the
/// offsets the cluster now reports, and every point is back exactly once.
pub(crate) fn etcd_a_dead_nodes_shard_is_recovered_from_its_snapshot() -> anyhow::Result<()> {
    let Some(fx) = Fixture::on_etcd("etcd_a_dead_nodes_shard_is_recovered_from_its_snapshot", 3, 1, TTL)? else { return Ok(()) };
    block_on(async {
        let mut client = fx.client().await?;
        let mut rng = rng("etcd_a_dead_nodes_shard_is_recovered_from_its_snapshot");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !status(&mut client).await.is_ok_and(|s| s.nodes.len() == 3) {
            check!(fx, Instant::now() < deadline, "the coordinator did not see 3 nodes: {:?}", status(&mut client).await);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        create(&mut client, "docs", 16, 3).await?;
        ingest_job(&mut client, &mut rng, 1..=10).await?;
        client.create_snapshot(v1::CreateSnapshotRequest { collection: "docs".into(), ..Default::default() }).await?;
        ingest_job(&mut client, &mut rng, 11..=20).await?;

        let before = status(&mut client).await?;
        let docs = before.collections.iter().find(|c| c.name == "docs").expect("docs");
        let lost = docs.shards[1].clone();

        // A live node's shard is not recovered: that would lose what it
        // took since the snapshot.
        let alive = v1::RecoverShardRequest { collection: "docs".into(), shard: 1, ..Default::default() };
        let refused = client.recover_shard(alive.clone()).await.expect_err("the node is alive");
        check!(fx, refused.code() == tonic::Code::FailedPrecondition && refused.message().contains("move the shard"), "{refused:?}");

        let victim = fx.cluster.nodes.iter().find(|n| n.id == lost.node).expect("the shard's node");
        victim.kill()?;
        let killed_at = Instant::now();
        let deadline = Instant::now() + TTL + Duration::from_secs(5);
        while !status(&mut client).await.is_ok_and(|s| s.nodes.iter().all(|n| n.id != victim.id)) {
            check!(fx, Instant::now() < deadline, "{} stayed a member", victim.id);
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        let gone_after = killed_at.elapsed();
        let q = v1::SearchRequest { collection: "docs".into(), vector: vec![0.5; 16], k: 10, ..Default::default() };
        let err = client.search(q.clone()).await.expect_err("a shard's node is gone");
        check!(fx, err.code() == tonic::Code::Unavailable, "{err:?}");

        // One command brings it back, from the snapshot, on another node.
        let started = Instant::now();
        let r = client.recover_shard(alive).await?.into_inner();
        let took = started.elapsed();
        let now = r.shard.clone().unwrap_or_default();
        eprintln!(
            "node {} killed: left the membership after {gone_after:?}; shard 1 recovered on {} in {took:?} from snapshot {} ({} points)",
            victim.id,
            now.node,
            r.snapshot.as_ref().map(|s| s.id.as_str()).unwrap_or("?"),
            now.points
        );
        check!(fx, r.from_node == victim.id && now.node != victim.id && now.epoch > lost.epoch, "{r:?} (was {lost:?})");
        check!(fx, now.points < lost.points && now.points > 0, "the snapshot's points, not the lost ones: {now:?} vs {lost:?}");
        let hits = client.search(q.clone()).await?.into_inner();
        check!(fx, hits.hits.len() == 10 && hits.shards_answered == 3, "{hits:?}");

        // The job resumes where the cluster says: after batch 10.
        let offsets = client.get_offsets(v1::GetOffsetsRequest { collection: "docs".into(), sources: vec![] }).await?.into_inner();
        let at = offsets.offsets.iter().find(|o| o.source == "job").map(|o| o.offset);
        check!(fx, at == Some(10), "GetOffsets says {offsets:?}, the snapshot was taken after batch 10");
        // Same seeded vectors are not needed: the ids are what is checked.
        ingest_job(&mut client, &mut rng, 11..=20).await?;
        let described = client.describe_collection(v1::DescribeCollectionRequest { name: "docs".into() }).await?.into_inner();
        check!(fx, described.points == 2_000, "{} points after the replay, 2000 written", described.points);
        let got = client.get(v1::GetRequest { collection: "docs".into(), ids: (0..2_000).collect(), with_vector: false }).await?;
        check!(fx, got.get_ref().missing.is_empty(), "missing after the replay: {:?}", got.get_ref().missing);

        // Asking again finds nothing to recover.
        let again = client.recover_shard(v1::RecoverShardRequest { collection: "docs".into(), shard: 1, ..Default::default() }).await;
        check!(fx, again.as_ref().is_err_and(|e| e.code() == tonic::Code::FailedPrecondition), "{again:?}");
        Ok(())
    })
}

/// The target of a move dies while the shard is copied to it: the move is
/// rolled back (the source stays the owner and keeps taking writes), a
/// caller waiting on it is told ABORTED, and nothing acknowledged is lost.
pub(crate) fn etcd_a_move_whose_target_dies_is_rolled_back() -> anyhow::Result<()> {
    let Some(fx) = Fixture::on_etcd("etcd_a_move_whose_target_dies_is_rolled_back", 3, 1, TTL)? else { return Ok(()) };
    block_on(async {
        let mut client = fx.client().await?;
        let mut rng = rng("etcd_a_move_whose_target_dies_is_rolled_back");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !status(&mut client).await.is_ok_and(|s| s.nodes.len() == 3 && !controller(&s).is_empty()) {
            check!(fx, Instant::now() < deadline, "no 3 nodes and a controller: {:?}", status(&mut client).await);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        create(&mut client, "docs", DIM as u32, 1).await?;
        let seed = points(&mut rng, DIM, 0..SEED);
        upsert_all(&mut client, "docs", seed.clone(), 1_000).await?;
        let before = shard0(&status(&mut client).await?).expect("shard 0 of docs");
        let target = fx.cluster.nodes.iter().find(|n| n.id != before.node).expect("another node");

        let stop = Arc::new(AtomicBool::new(false));
        let (written, writer) = start_writer(client.clone(), Arc::clone(&stop));
        tokio::time::sleep(Duration::from_millis(300)).await;

        // A caller that waits for the move.
        let mut waiter = client.clone();
        let req =
            v1::MoveShardRequest { collection: "docs".into(), shard: 0, to_node: target.id.clone(), wait: true, ..Default::default() };
        let waiting = tokio::spawn(async move { waiter.move_shard(req).await });
        let deadline = Instant::now() + Duration::from_secs(10);
        while !log_of(&fx, &fx.cluster.coordinator.id).contains("shard move: copying") {
            check!(fx, Instant::now() < deadline, "the controller did not start the move");
            tokio::time::sleep(Duration::from_millis(5)).await;
        }
        target.kill()?;
        check!(fx, !log_of(&fx, &fx.cluster.coordinator.id).contains("placement switched"), "the kill came after the switch");

        let answer = tokio::time::timeout(Duration::from_secs(60), waiting).await??;
        let err = answer.expect_err("the move cannot finish without its target");
        eprintln!("the waiting caller got {:?}: {}", err.code(), err.message());
        check!(fx, err.code() == tonic::Code::Aborted && err.message().contains("rolled back"), "{err:?}");
        let after = shard0(&status(&mut client).await?).expect("shard 0 of docs");
        check!(fx, after.node == before.node && after.moving.is_none() && after.available, "{before:?} -> {after:?}");

        // The source kept (or took back) the writes.
        tokio::time::sleep(Duration::from_millis(500)).await;
        stop.store(true, Ordering::Relaxed);
        writer.await?;
        let live = written.acked.lock().unwrap().clone();
        let refused = written.refused.lock().unwrap().len();
        eprintln!("writer: {} points acknowledged around the failed move, {refused} refusals (retried)", live.len());
        let mut acked: BTreeMap<u64, Vec<f32>> = seed.into_iter().map(|p| (p.id, p.vector)).collect();
        acked.extend(live);
        let ids: Vec<u64> = acked.keys().copied().collect();
        for chunk in ids.chunks(1_000) {
            let got = client.get(v1::GetRequest { collection: "docs".into(), ids: chunk.to_vec(), with_vector: false }).await?;
            check!(
                fx,
                got.get_ref().missing.is_empty(),
                "acknowledged points lost: {:?}",
                &got.get_ref().missing[..1.min(got.get_ref().missing.len())]
            );
        }
        let described = client.describe_collection(v1::DescribeCollectionRequest { name: "docs".into() }).await?.into_inner();
        check!(fx, described.points == acked.len() as u64, "{} points, {} acknowledged", described.points, acked.len());
        Ok(())
    })
}

/// The source of a move dies while it is copied: the move is rolled back
/// (ABORTED to the waiting caller) and the shard, whose node is gone, is
/// recovered on another node from its last snapshot.
pub(crate) fn etcd_a_move_whose_source_dies_is_rolled_back_and_recovered() -> anyhow::Result<()> {
    let Some(fx) = Fixture::on_etcd("etcd_a_move_whose_source_dies_is_rolled_back_and_recovered", 3, 1, TTL)? else { return Ok(()) };
    block_on(async {
        let mut client = fx.client().await?;
        let mut rng = rng("etcd_a_move_whose_source_dies_is_rolled_back_and_recovered");
        let deadline = Instant::now() + Duration::from_secs(10);
        while !status(&mut client).await.is_ok_and(|s| s.nodes.len() == 3 && !controller(&s).is_empty()) {
            check!(fx, Instant::now() < deadline, "no 3 nodes and a controller: {:?}", status(&mut client).await);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        create(&mut client, "docs", DIM as u32, 1).await?;
        upsert_all(&mut client, "docs", points(&mut rng, DIM, 0..SEED), 1_000).await?;
        client.create_snapshot(v1::CreateSnapshotRequest { collection: "docs".into(), ..Default::default() }).await?;
        let before = shard0(&status(&mut client).await?).expect("shard 0 of docs");
        let source = fx.cluster.nodes.iter().find(|n| n.id == before.node).expect("the source");
        let target = fx.cluster.nodes.iter().find(|n| n.id != before.node).expect("another node");

        let mut waiter = client.clone();
        let req =
            v1::MoveShardRequest { collection: "docs".into(), shard: 0, to_node: target.id.clone(), wait: true, ..Default::default() };
        let waiting = tokio::spawn(async move { waiter.move_shard(req).await });
        // Kill the source as soon as the controller starts copying from it.
        let deadline = Instant::now() + Duration::from_secs(20);
        while !log_of(&fx, &fx.cluster.coordinator.id).contains("shard move: copying") {
            check!(fx, Instant::now() < deadline, "the move never started");
            tokio::time::sleep(Duration::from_millis(2)).await;
        }
        source.kill()?;
        check!(fx, !log_of(&fx, &fx.cluster.coordinator.id).contains("placement switched"), "the kill came after the switch");
        let err = tokio::time::timeout(Duration::from_secs(60), waiting).await??.expect_err("the move cannot finish without its source");
        eprintln!("the waiting caller got {:?}: {}", err.code(), err.message());
        check!(fx, err.code() == tonic::Code::Aborted, "{err:?}");

        // Once the source's lease ends, the shard is recovered from its
        // last snapshot.
        let deadline = Instant::now() + TTL + Duration::from_secs(10);
        while !status(&mut client).await.is_ok_and(|s| s.nodes.iter().all(|n| n.id != source.id)) {
            check!(fx, Instant::now() < deadline, "{} stayed a member", source.id);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let r =
            client.recover_shard(v1::RecoverShardRequest { collection: "docs".into(), shard: 0, ..Default::default() }).await?.into_inner();
        let now = r.shard.unwrap_or_default();
        eprintln!("recovered on {} from snapshot {} ({} points)", now.node, r.snapshot.map(|s| s.id).unwrap_or_default(), now.points);
        check!(fx, now.node != source.id && now.points == SEED && now.moving.is_none(), "{now:?}");
        let q = v1::SearchRequest { collection: "docs".into(), vector: vec![0.5; DIM], k: 10, ..Default::default() };
        let hits = client.search(q).await?.into_inner();
        check!(fx, hits.hits.len() == 10 && !hits.partial, "{hits:?}");
        Ok(())
    })
}
