//! A shard node that is alive but answers nothing (SIGSTOP) must not hang
//! the cluster: status reports it within about a second, writes fail fast
//! with a retry hint (and, once it is known to be down, write nothing),
//! searches fail fast or return what the others found.

use std::time::{Duration, Instant};

use shoal_proto::v1;
use tonic::Code;

use crate::check;
use crate::common::{Fixture, block_on, create, points, points_in, retry_hint, rng, upsert_all};

pub(crate) fn a_stopped_node_does_not_hang_the_cluster() -> anyhow::Result<()> {
    let fx = Fixture::start(3, |_| {})?;
    block_on(async {
        let mut client = fx.client().await?;
        let mut rng = rng("a_stopped_node_does_not_hang_the_cluster");
        create(&mut client, "docs", 16, 3).await?;
        upsert_all(&mut client, "docs", points(&mut rng, 16, 0..300), 300).await?;
        let stopped = &fx.cluster.nodes[2];
        stopped.stop()?;

        // Right away, before anything noticed: the write ends within a few
        // seconds, UNAVAILABLE with a hint, and says what it did.
        let started = Instant::now();
        let err = client
            .upsert(v1::UpsertRequest { collection: "docs".into(), points: points(&mut rng, 16, 1_000..1_030) })
            .await
            .expect_err("a shard is stopped");
        let took = started.elapsed();
        eprintln!("upsert right after SIGSTOP: {took:?}: {}", err.message());
        check!(fx, err.code() == Code::Unavailable && retry_hint(&err).is_some(), "{err:?}");
        check!(fx, took < Duration::from_secs(3), "the upsert took {took:?}");

        // Status within 1.5 s, naming the silent node.
        let started = Instant::now();
        let status = client.cluster_status(v1::ClusterStatusRequest {}).await?.into_inner();
        let took = started.elapsed();
        eprintln!("ClusterStatus with a stopped node: {took:?}");
        check!(fx, took < Duration::from_millis(1_500), "ClusterStatus took {took:?}");
        let up: Vec<(String, bool)> = status.nodes.iter().map(|n| (n.id.clone(), n.available)).collect();
        check!(fx, up == [("shard-0".into(), true), ("shard-1".into(), true), ("shard-2".into(), false)], "{up:?}");

        // Known to be down now: a write fails at once and writes nothing.
        let started = Instant::now();
        let err = client
            .upsert(v1::UpsertRequest { collection: "docs".into(), points: points(&mut rng, 16, 2_000..2_030) })
            .await
            .expect_err("a shard is down");
        let took = started.elapsed();
        check!(fx, err.code() == Code::Unavailable && retry_hint(&err).is_some(), "{err:?}");
        check!(fx, err.message().contains("nothing was written"), "{}", err.message());
        check!(fx, took < Duration::from_millis(500), "the write to a node known to be down took {took:?}");

        // An ingest stream ends just as fast.
        let started = Instant::now();
        let batch = v1::IngestRequest {
            collection: "docs".into(),
            source: "job".into(),
            offset: 0,
            points: points(&mut rng, 16, 3_000..3_010),
            deletes: vec![],
            ..Default::default()
        };
        let outcome = async {
            let mut acks = client.ingest(tokio_stream::iter(vec![batch])).await?.into_inner();
            acks.message().await
        }
        .await;
        let took = started.elapsed();
        check!(fx, matches!(&outcome, Err(s) if s.code() == Code::Unavailable), "{outcome:?}");
        check!(fx, took < Duration::from_millis(500), "the ingest took {took:?}");

        // Searches: UNAVAILABLE at once, or the others' hits with allow_partial.
        let q = v1::SearchRequest { collection: "docs".into(), vector: vec![1.0; 16], k: 5, ..Default::default() };
        let started = Instant::now();
        let err = client.search(q.clone()).await.expect_err("a shard is down");
        check!(
            fx,
            err.code() == Code::Unavailable && started.elapsed() < Duration::from_millis(500),
            "{err:?} after {:?}",
            started.elapsed()
        );
        let partial = client.search(v1::SearchRequest { allow_partial: true, ..q }).await?.into_inner();
        check!(fx, partial.shards_answered == 2 && partial.partial && partial.hits.len() == 5, "{partial:?}");

        // Back: served again within a few probe rounds, and nothing of the
        // refused write was applied anywhere.
        stopped.resume()?;
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            let s = client.cluster_status(v1::ClusterStatusRequest {}).await?.into_inner();
            if s.nodes.iter().all(|n| n.available) {
                break;
            }
            check!(fx, Instant::now() < deadline, "the resumed node was not seen again: {s:?}");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        // The probe may lag the status call by one round.
        tokio::time::sleep(Duration::from_secs(2)).await;
        let got = client
            .get(v1::GetRequest { collection: "docs".into(), ids: (2_000..2_030).chain(3_000..3_010).collect(), with_vector: false })
            .await?
            .into_inner();
        check!(fx, got.points.is_empty(), "refused writes were applied: {:?}", got.points.iter().map(|p| p.id).collect::<Vec<_>>());
        upsert_all(&mut client, "docs", points(&mut rng, 16, 4_000..4_030), 30).await?;
        let n = points_in(&mut client, "docs").await?;
        check!(fx, n >= 330, "{n} points");
        Ok(())
    })
}
