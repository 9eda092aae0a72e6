//! The control plane on a real etcd, with every party its own process:
//! shard nodes register under a lease, two coordinators share membership
//! and placement, one of them is the controller. SIGKILL the controller:
//! the other takes over within one lease TTL (plus a second). SIGKILL a
//! shard node: once its lease ends, its shards fail fast with UNAVAILABLE
//! naming it, and the other shards keep serving. The figures are printed
//! (`docs/control-plane.md` keeps them).

use std::time::{Duration, Instant};

use shoal_proto::v1;
use shoal_proto::v1::shoal_client::ShoalClient;
use tonic::Code;
use tonic::transport::Channel;

use crate::check;
use crate::common::{Fixture, block_on, create, points, rng, upsert_all};

const TTL: Duration = Duration::from_secs(2);

async fn status(client: &mut ShoalClient<Channel>) -> anyhow::Result<v1::ClusterStatusResponse> {
    Ok(client.cluster_status(v1::ClusterStatusRequest {}).await?.into_inner())
}

fn controller(s: &v1::ClusterStatusResponse) -> String {
    s.control_plane.as_ref().map(|c| c.controller.clone()).unwrap_or_default()
}

/// Polls `client`'s status until `ok`, within `within`; returns how long it took.
async fn until(
    client: &mut ShoalClient<Channel>,
    within: Duration,
    ok: impl Fn(&v1::ClusterStatusResponse) -> bool,
) -> anyhow::Result<Option<Duration>> {
    let started = Instant::now();
    while started.elapsed() < within {
        if let Ok(s) = status(client).await
            && ok(&s)
        {
            return Ok(Some(started.elapsed()));
        }
        tokio::time::sleep(Duration::from_millis(25)).await;
    }
    Ok(None)
}

pub(crate) fn etcd_controller_and_node_deaths_are_noticed_within_a_lease() -> anyhow::Result<()> {
    let Some(fx) = Fixture::on_etcd("etcd_controller_and_node_deaths_are_noticed_within_a_lease", 3, 2, TTL)? else { return Ok(()) };
    block_on(async {
        let mut first = fx.client().await?;
        let mut second = ShoalClient::connect(fx.cluster.more_coordinators[0].endpoint()).await?;
        let mut rng = rng("etcd_controller_and_node_deaths_are_noticed_within_a_lease");

        // Both coordinators see the three registered nodes and one controller.
        for c in [&mut first, &mut second] {
            let seen = until(c, Duration::from_secs(10), |s| s.nodes.len() == 3 && !controller(s).is_empty()).await?;
            check!(fx, seen.is_some(), "a coordinator did not see 3 nodes and a controller: {:?}", status(c).await);
        }
        let s = status(&mut first).await?;
        let cp = s.control_plane.clone().unwrap_or_default();
        check!(fx, cp.store == "etcd" && cp.reachable, "{cp:?}");

        // What one coordinator decides, the other serves.
        create(&mut first, "docs", 16, 3).await?;
        upsert_all(&mut first, "docs", points(&mut rng, 16, 0..300), 100).await?;
        let q = v1::SearchRequest { collection: "docs".into(), vector: vec![0.5; 16], k: 5, ..Default::default() };
        let seen =
            until(&mut second, Duration::from_secs(5), |s| s.collections.iter().any(|c| c.name == "docs" && c.points == 300)).await?;
        check!(fx, seen.is_some(), "the second coordinator does not serve what the first created: {:?}", status(&mut second).await);
        let hits = second.search(q.clone()).await?.into_inner().hits;
        check!(fx, hits.len() == 5, "{hits:?}");

        // SIGKILL the controller: the other coordinator takes over.
        let leader = controller(&status(&mut first).await?);
        let (killed, mut survivor, survivor_id) = if leader == fx.cluster.coordinator.id {
            (&fx.cluster.coordinator, second.clone(), fx.cluster.more_coordinators[0].id.clone())
        } else {
            (&fx.cluster.more_coordinators[0], first.clone(), fx.cluster.coordinator.id.clone())
        };
        check!(fx, leader == killed.id, "the controller is {leader:?}, neither coordinator");
        killed.kill()?;
        let took = until(&mut survivor, TTL + Duration::from_secs(5), |s| controller(s) == survivor_id).await?;
        eprintln!("controller {leader} killed (SIGKILL): {survivor_id} became the controller after {took:?} (lease TTL {TTL:?})");
        check!(fx, took.is_some_and(|t| t <= TTL + Duration::from_secs(1)), "takeover took {took:?}, more than TTL + 1 s");

        // SIGKILL a shard node: its shards are reported unavailable once
        // its lease ends, searches fail fast naming it, the others serve.
        let victim = &fx.cluster.nodes[1];
        victim.kill()?;
        let took = until(&mut survivor, TTL + Duration::from_secs(5), |s| s.nodes.iter().all(|n| n.id != victim.id)).await?;
        eprintln!("shard node {} killed (SIGKILL): left the membership after {took:?} (lease TTL {TTL:?})", victim.id);
        check!(fx, took.is_some_and(|t| t <= TTL + Duration::from_secs(1)), "the dead node stayed a member for {took:?}");
        let started = Instant::now();
        let err = survivor.search(q.clone()).await.expect_err("a shard's node is gone");
        check!(fx, err.code() == Code::Unavailable && err.message().contains(&victim.id), "{err:?}");
        check!(fx, started.elapsed() < Duration::from_millis(500), "the search took {:?}", started.elapsed());
        let partial = survivor.search(v1::SearchRequest { allow_partial: true, ..q }).await?.into_inner();
        check!(fx, partial.shards_answered == 2 && partial.shards_total == 3, "{partial:?}");
        let s = status(&mut survivor).await?;
        let down: Vec<u32> = s.collections.iter().flat_map(|c| &c.shards).filter(|sh| !sh.available).map(|sh| sh.shard).collect();
        check!(fx, down.len() == 1, "status should report exactly the dead node's shard unavailable: {s:?}");
        Ok(())
    })
}
