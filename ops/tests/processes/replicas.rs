//! Replicas on a real etcd, every party its own process: a shard node
//! SIGKILLed and started again within the repair delay has its copies
//! rejoin (seeded from the primary, caught up, made active in one
//! conditional change); one that stays gone past the delay has its copies
//! re-created on the other nodes. Searches stay whole throughout, and the
//! copies agree after each (`VerifyShard`). When the node gone for good
//! comes back after all, the copies it still holds are in no placement:
//! the controller drops them and their disk is given back. The times are
//! printed (docs/replication.md keeps them).

use std::time::{Duration, Instant};

use shoal_proto::v1;
use shoal_proto::v1::shard_node_client::ShardNodeClient;
use shoal_proto::v1::shoal_client::ShoalClient;
use tonic::transport::Channel;

use crate::check;
use crate::common::{Fixture, create_replicated, points, points_in, rng, upsert_all};

pub(crate) const TTL: Duration = Duration::from_secs(2);
const REPAIR_AFTER: Duration = Duration::from_secs(6);
const RECLAIM_AFTER: Duration = Duration::from_secs(2);
pub(crate) const DIM: u32 = 16;

pub(crate) async fn describe(client: &mut ShoalClient<Channel>) -> anyhow::Result<v1::CollectionInfo> {
    Ok(client.describe_collection(v1::DescribeCollectionRequest { name: "docs".into() }).await?.into_inner())
}

/// The nodes of each shard's copies, sorted, if every shard has exactly
/// two active ones and none is moving.
pub(crate) fn settled(info: &v1::CollectionInfo) -> Option<Vec<Vec<String>>> {
    let mut out = Vec::new();
    for s in &info.shards {
        if s.moving.is_some() || s.replicas.len() != 2 || s.replicas.iter().any(|r| r.state != "active") {
            return None;
        }
        let mut nodes: Vec<String> = s.replicas.iter().map(|r| r.node.clone()).collect();
        nodes.sort_unstable();
        out.push(nodes);
    }
    Some(out)
}

/// Waits for every shard to hold two active copies; returns their nodes
/// and how long it took.
pub(crate) async fn until_settled(
    client: &mut ShoalClient<Channel>,
    within: Duration,
) -> anyhow::Result<Option<(Vec<Vec<String>>, Duration)>> {
    let started = Instant::now();
    while started.elapsed() < within {
        if let Ok(info) = describe(client).await
            && let Some(nodes) = settled(&info)
        {
            return Ok(Some((nodes, started.elapsed())));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(None)
}

/// A search that must be whole: every shard answered.
pub(crate) async fn whole_search(client: &mut ShoalClient<Channel>, rng: &mut rand::rngs::StdRng) -> anyhow::Result<bool> {
    let q = crate::common::vector(rng, DIM as usize);
    let r = client.search(v1::SearchRequest { collection: "docs".into(), vector: q, k: 10, ..Default::default() }).await?.into_inner();
    Ok(!r.partial && r.shards_answered == r.shards_total && r.hits.len() == 10)
}

pub(crate) fn etcd_a_node_back_rejoins_and_a_node_gone_for_good_is_repaired() -> anyhow::Result<()> {
    let test = "etcd_a_node_back_rejoins_and_a_node_gone_for_good_is_repaired";
    let repair_ms = REPAIR_AFTER.as_millis().to_string();
    let reclaim_ms = RECLAIM_AFTER.as_millis().to_string();
    let Some(mut fx) = Fixture::on_etcd_with(test, 3, 1, TTL, |spec| {
        spec.coordinator_env.push(("SHOAL_COORD_REPAIR_AFTER_MS".into(), repair_ms));
        spec.coordinator_env.push(("SHOAL_COORD_RECLAIM_AFTER_MS".into(), reclaim_ms));
    })?
    else {
        return Ok(());
    };
    let mut rng = rng(test);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let mut client = rt.block_on(fx.client())?;
    let before = rt.block_on(async {
        create_replicated(&mut client, "docs", DIM, 3, 2).await?;
        upsert_all(&mut client, "docs", points(&mut rng, DIM as usize, 0..300), 100).await?;
        let info = describe(&mut client).await?;
        anyhow::Ok(settled(&info))
    })?;
    check!(fx, before.is_some(), "two active copies of every shard after create");

    // Rejoin: shard-2 dies, misses writes, and is back within the delay.
    fx.cluster.nodes[2].kill()?;
    let rejoined = rt.block_on(async {
        upsert_all(&mut client, "docs", points(&mut rng, DIM as usize, 300..600), 100).await?;
        let dead = describe(&mut client).await?.shards.iter().flat_map(|s| &s.replicas).filter(|r| r.state == "dead").count();
        anyhow::Ok(dead)
    })?;
    check!(fx, rejoined >= 1, "shard-2's copies missed writes: some are dead");
    fx.cluster.nodes[2].restart()?;
    let back = Instant::now();
    let after = rt.block_on(async {
        let settled = until_settled(&mut client, Duration::from_secs(60)).await?;
        let whole = whole_search(&mut client, &mut rng).await?;
        anyhow::Ok((settled, whole))
    })?;
    let Some((nodes, took)) = after.0 else { anyhow::bail!("shard-2's copies did not rejoin within 60 s\n{}", fx.cluster.logs()) };
    eprintln!("rejoin: shard-2 back, its copies in sync again {:?} after its restart ({took:?} of waiting)", back.elapsed());
    check!(fx, Some(&nodes) == before.as_ref(), "rejoined in place: {nodes:?}, before {before:?}");
    check!(fx, after.1, "searches are whole after the rejoin");
    check_agree(&fx, &rt, &mut client, 600)?;

    // Repair: shard-1 dies for good. Searches stay whole while its copies
    // are re-created on the two nodes left.
    let killed = Instant::now();
    fx.cluster.nodes[1].kill()?;
    let repaired = rt.block_on(async {
        upsert_all(&mut client, "docs", points(&mut rng, DIM as usize, 600..900), 100).await?;
        let mut whole = 0;
        let mut searched = 0;
        let started = Instant::now();
        let mut done = None;
        while started.elapsed() < TTL + REPAIR_AFTER + Duration::from_secs(60) {
            searched += 1;
            if whole_search(&mut client, &mut rng).await.unwrap_or(false) {
                whole += 1;
            }
            if let Some(nodes) = settled(&describe(&mut client).await?) {
                done = Some((nodes, killed.elapsed()));
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        anyhow::Ok((done, whole, searched))
    })?;
    let (done, whole, searched) = repaired;
    let Some((nodes, took)) = done else { anyhow::bail!("shard-1's copies were not repaired\n{}", fx.cluster.logs()) };
    eprintln!(
        "repair: shard-1 SIGKILLed; every shard had two copies in sync again after {took:?} (lease TTL {TTL:?}, repair after {REPAIR_AFTER:?}); \
         {whole} of {searched} searches meanwhile whole"
    );
    check!(fx, took >= REPAIR_AFTER, "repair waits for the delay: {took:?}");
    check!(fx, nodes.iter().all(|n| n == &["shard-0".to_owned(), "shard-2".to_owned()]), "{nodes:?}");
    check!(fx, whole == searched, "{whole} of {searched} searches were whole");
    check_agree(&fx, &rt, &mut client, 900)?;

    // shard-1 comes back after all, with its old copies: no placement
    // names them, so the controller drops them, and only them.
    let shards_dir = fx.dir.path().join("shard-1").join("shards").join("docs");
    let held = std::fs::read_dir(&shards_dir).map(|d| d.count()).unwrap_or(0);
    check!(fx, held >= 1, "shard-1 held copies before it died: {held} in {}", shards_dir.display());
    fx.cluster.nodes[1].restart()?;
    let back = Instant::now();
    let mut node = rt.block_on(ShardNodeClient::connect(fx.cluster.nodes[1].endpoint()))?;
    let listed = rt.block_on(async {
        while back.elapsed() < RECLAIM_AFTER + Duration::from_secs(30) {
            let shards = node.list_shards(v1::ListShardsRequest {}).await?.into_inner().shards;
            if shards.is_empty() {
                return anyhow::Ok(None);
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        anyhow::Ok(Some(node.list_shards(v1::ListShardsRequest {}).await?.into_inner().shards.len()))
    })?;
    let took = back.elapsed();
    eprintln!("reclaim: shard-1 back with {held} old copies; dropped {took:?} after its restart (reclaim after {RECLAIM_AFTER:?})");
    check!(fx, listed.is_none(), "shard-1 still holds {listed:?} copies no placement names, {took:?} after its restart");
    check!(fx, took >= RECLAIM_AFTER, "a copy was dropped before it had been orphaned for {RECLAIM_AFTER:?}: {took:?}");
    let left = std::fs::read_dir(&shards_dir).map(|d| d.count()).unwrap_or(0);
    check!(fx, left == 0, "{left} shard directories left in {}", shards_dir.display());
    let log = std::fs::read_to_string(&fx.cluster.coordinator.log)?;
    check!(fx, log.contains("reclaiming a copy no placement names"), "the coordinator's log does not say what it reclaimed");
    check_agree(&fx, &rt, &mut client, 900)?;
    Ok(())
}

/// Every shard's copies agree and the collection holds `points` points.
pub(crate) fn check_agree(
    fx: &Fixture,
    rt: &tokio::runtime::Runtime,
    client: &mut ShoalClient<Channel>,
    points: u64,
) -> anyhow::Result<()> {
    let (held, verdicts) = rt.block_on(async {
        let held = points_in(client, "docs").await?;
        let mut verdicts = Vec::new();
        for shard in 0..3 {
            verdicts.push(client.verify_shard(v1::VerifyShardRequest { collection: "docs".into(), shard }).await?.into_inner());
        }
        anyhow::Ok((held, verdicts))
    })?;
    check!(fx, held == points, "{held} points, {points} written");
    for v in &verdicts {
        check!(fx, v.agree && v.replicas.len() == 2, "{v:?}");
    }
    Ok(())
}

/// A replica that stops answering (SIGSTOP) while its node still looks
/// alive: reads ask the other replica once the first is slower than its
/// recent p95, so each search costs a few milliseconds more, not its 2 s
/// deadline. The health probe is slowed down so that it cannot be what
/// saves the searches.
pub(crate) fn a_stopped_replica_costs_a_search_a_hedge_not_its_deadline() -> anyhow::Result<()> {
    let test = "a_stopped_replica_costs_a_search_a_hedge_not_its_deadline";
    let fx = Fixture::start(3, |spec| {
        spec.coordinator_env.push(("SHOAL_COORD_PEERS__PROBE_INTERVAL_MS".into(), "60000".into()));
    })?;
    let mut rng = rng(test);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let mut client = rt.block_on(fx.client())?;
    rt.block_on(async {
        let req = v1::CreateCollectionRequest {
            name: "docs".into(),
            dimension: DIM,
            metric: v1::Metric::Cosine as i32,
            shard_count: 3,
            replication_factor: 2,
            ..Default::default()
        };
        client.create_collection(req).await?;
        upsert_all(&mut client, "docs", points(&mut rng, DIM as usize, 0..600), 200).await?;
        // Answer times to take a p95 of.
        for _ in 0..100 {
            whole_search(&mut client, &mut rng).await?;
        }
        anyhow::Ok(())
    })?;
    fx.cluster.nodes[1].stop()?;
    let times = rt.block_on(async {
        let mut times = Vec::new();
        for _ in 0..20 {
            let started = Instant::now();
            let whole = whole_search(&mut client, &mut rng).await?;
            times.push((started.elapsed(), whole));
        }
        anyhow::Ok(times)
    });
    fx.cluster.nodes[1].resume()?;
    let times = times?;
    let slowest = times.iter().map(|t| t.0).max().unwrap_or_default();
    eprintln!("20 searches with a replica stopped: slowest {slowest:?}, all whole: {}", times.iter().all(|t| t.1));
    check!(fx, times.iter().all(|t| t.1), "every search whole: {times:?}");
    check!(fx, slowest < Duration::from_millis(1000), "a search waited {slowest:?} for the stopped replica: {times:?}");
    Ok(())
}
