//! Nodes that come back at once, on a real etcd, every party its own
//! process. A shard node SIGKILLed and started again right away (once, as
//! a service manager does) takes its own registration over although its
//! lease has not ended, and its copies are back in sync; a second process
//! with its id is refused, saying why: on the same data directory because
//! the directory is in use, on another because the id is held by another
//! incarnation. A node started before etcd waits for it and registers once
//! it is up.

use std::time::{Duration, Instant};

use shoal_ops::etcd_server::Etcd;
use shoal_proto::v1;
use shoal_proto::v1::shoal_client::ShoalClient;
use tonic::transport::Channel;

use crate::check;
use crate::common::{Fixture, block_on, create_replicated, points, points_in, rng, upsert_all};

/// Long enough that waiting the lease out would show: the restart must
/// not need it.
const TTL: Duration = Duration::from_secs(10);
const DIM: u32 = 16;

async fn in_sync(client: &mut ShoalClient<Channel>) -> anyhow::Result<bool> {
    let info = client.describe_collection(v1::DescribeCollectionRequest { name: "docs".into() }).await?.into_inner();
    Ok(info.shards.iter().all(|s| s.moving.is_none() && s.replicas.len() == 2 && s.replicas.iter().all(|r| r.state == "active")))
}

async fn until_in_sync(client: &mut ShoalClient<Channel>, within: Duration) -> anyhow::Result<Option<Duration>> {
    let started = Instant::now();
    while started.elapsed() < within {
        if in_sync(client).await.unwrap_or(false) {
            return Ok(Some(started.elapsed()));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(None)
}

pub(crate) fn etcd_a_node_restarted_at_once_takes_its_registration_over() -> anyhow::Result<()> {
    let test = "etcd_a_node_restarted_at_once_takes_its_registration_over";
    let Some(mut fx) = Fixture::on_etcd(test, 3, 1, TTL)? else { return Ok(()) };
    let mut rng = rng(test);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let mut client = rt.block_on(fx.client())?;
    let created = rt.block_on(async {
        create_replicated(&mut client, "docs", DIM, 3, 2).await?;
        upsert_all(&mut client, "docs", points(&mut rng, DIM as usize, 0..300), 100).await?;
        in_sync(&mut client).await
    })?;
    check!(fx, created, "two active copies of every shard after create");

    // SIGKILL, writes its copies miss, then one start: no retry, no
    // waiting out the 10 s lease.
    fx.cluster.nodes[2].kill()?;
    let killed = Instant::now();
    rt.block_on(upsert_all(&mut client, "docs", points(&mut rng, DIM as usize, 600..700), 100))?;
    let down = killed.elapsed();
    let restarted = Instant::now();
    let once = fx.cluster.nodes[2].restart_once();
    check!(fx, once.is_ok(), "the restart right after the crash was refused: {:?}", once.err());
    let serving = restarted.elapsed();
    let synced = rt.block_on(async {
        upsert_all(&mut client, "docs", points(&mut rng, DIM as usize, 300..600), 100).await?;
        until_in_sync(&mut client, Duration::from_secs(30)).await
    })?;
    eprintln!(
        "shard-2 SIGKILLed and started once {down:?} later: serving after {serving:?}, copies in sync {synced:?} later (lease TTL {TTL:?})"
    );
    check!(fx, serving < TTL, "the restart took {serving:?}: it waited for the old lease");
    check!(fx, synced.is_some(), "shard-2's copies were not in sync again within 30 s");
    let count = rt.block_on(points_in(&mut client, "docs"))?;
    check!(fx, count == 700, "{count} points, 700 written");
    let log = std::fs::read_to_string(&fx.cluster.nodes[2].log)?;
    check!(fx, log.contains("took over the registration of this node's previous run"), "shard-2's log does not say it took over");

    // Its twin on the same directory: refused, the directory is in use.
    let node = &fx.cluster.nodes[2];
    let data = fx.dir.path().join("shard-2");
    let e = node.start_twin(&data, fx.dir.path().join("twin-same.log")).err().map(|e| format!("{e:#}")).unwrap_or_default();
    check!(fx, e.contains("is in use by process") && e.contains(&node.pid().to_string()), "a twin on the same data started: {e}");
    // On another directory: refused, the id is held by another process.
    let other = fx.dir.path().join("twin");
    let e = node.start_twin(&other, fx.dir.path().join("twin-other.log")).err().map(|e| format!("{e:#}")).unwrap_or_default();
    check!(
        fx,
        e.contains("node shard-2 (held by another process, with another data directory") && e.contains("stop that process"),
        "a twin on other data: {e}"
    );
    // The refusals changed nothing.
    let still = rt.block_on(async { anyhow::Ok((in_sync(&mut client).await?, points_in(&mut client, "docs").await?)) })?;
    check!(fx, still == (true, 700), "after the twins: {still:?}");
    Ok(())
}

pub(crate) fn etcd_a_node_started_before_etcd_registers_once_it_is_up() -> anyhow::Result<()> {
    let test = "etcd_a_node_started_before_etcd_registers_once_it_is_up";
    if std::env::var("SHOAL_TEST_ETCD_ENDPOINT").ok().filter(|e| !e.is_empty()).is_none() {
        eprintln!("SKIPPED {test}: SHOAL_TEST_ETCD_ENDPOINT is not set (it says etcd is installed)");
        return Ok(());
    }
    let etcd_dir = tempfile::tempdir()?;
    let mut etcd = Etcd::on_free_ports(etcd_dir.path())?;
    let endpoint = etcd.endpoint();
    // The cluster starts while nothing answers there: each node waits
    // (its start returns once it is registered, so in a thread).
    let starting = std::thread::spawn(move || {
        Fixture::start(2, |spec| {
            spec.etcd = Some((endpoint, "/shoal-test/before-etcd".into()));
            spec.node_env.push(("SHOAL_SHARD_CLUSTER__LEASE_TTL_MS".into(), "2000".into()));
            spec.coordinator_env.push(("SHOAL_COORD_CLUSTER__LEASE_TTL_MS".into(), "2000".into()));
        })
    });
    std::thread::sleep(Duration::from_secs(3));
    let started_early = starting.is_finished();
    etcd.spawn()?;
    let up = Instant::now();
    let fx = starting.join().map_err(|_| anyhow::anyhow!("the starting thread panicked"))??;
    let joined = up.elapsed();
    eprintln!("two shard nodes started 3 s before etcd: registered {joined:?} after etcd was up");
    check!(fx, !started_early, "a node reported serving the cluster before etcd was up");
    let log = std::fs::read_to_string(&fx.cluster.nodes[0].log)?;
    check!(fx, log.contains("the metadata store cannot be reached"), "shard-0 did not say it was waiting");
    check!(fx, joined < Duration::from_secs(15), "registering took {joined:?} after etcd was up");
    let mut rng = rng(test);
    let served = block_on(async {
        let mut client = fx.client().await?;
        let started = Instant::now();
        loop {
            let s = client.cluster_status(v1::ClusterStatusRequest {}).await?.into_inner();
            if s.nodes.len() == 2 || started.elapsed() > Duration::from_secs(10) {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        crate::common::create(&mut client, "docs", DIM, 2).await?;
        upsert_all(&mut client, "docs", points(&mut rng, DIM as usize, 0..200), 100).await?;
        points_in(&mut client, "docs").await
    })?;
    check!(fx, served == 200, "{served} points served, 200 written");
    Ok(())
}
