//! A search whose caller has gone stops on every node, and one that asks
//! for more than a node will return is refused before any work.

use std::time::{Duration, Instant};

use shoal_proto::v1;
use shoal_proto::v1::shard_node_client::ShardNodeClient;
use tonic::Code;

use crate::check;
use crate::common::{Fixture, block_on, create, points, rng, upsert_all, vector};

/// A SearchBatch that takes seconds on every node, with a deadline of
/// 300 ms: the caller gets DEADLINE_EXCEEDED at the deadline, and the nodes
/// stop computing right after it (their CPU time stops growing) and give
/// the memory back.
pub(crate) fn a_search_past_its_deadline_stops_on_every_node() -> anyhow::Result<()> {
    let fx = Fixture::start(3, |_| {})?;
    block_on(async {
        let mut client = fx.client().await?;
        let mut rng = rng("a_search_past_its_deadline_stops_on_every_node");
        create(&mut client, "docs", 64, 3).await?;
        upsert_all(&mut client, "docs", points(&mut rng, 64, 0..15_000), 2_500).await?;
        let queries: Vec<v1::Vector> = (0..1024).map(|_| v1::Vector { values: vector(&mut rng, 64) }).collect();
        // Warm up, so the memory measured below is not the first search's.
        let warm = v1::SearchBatchRequest { collection: "docs".into(), queries: queries[..8].to_vec(), k: 10, ..Default::default() };
        client.search_batch(warm).await?;
        // The process's own memory: the pages of LMDB's file that a search
        // reads count in RSS too, but they are page cache, not the request's.
        let rss_before: Vec<u64> = fx.cluster.nodes.iter().map(|n| n.rss_anon_bytes()).collect::<anyhow::Result<_>>()?;

        // k × queries just under the hit limit and an ef that visits most
        // of each shard: seconds of work per node without a deadline.
        let req = v1::SearchBatchRequest { collection: "docs".into(), queries, k: 976, ef: 5_000, timeout_ms: 300, ..Default::default() };
        let started = Instant::now();
        let err = client.search_batch(req).await.expect_err("the search cannot finish in 300 ms");
        let answered = started.elapsed();
        check!(fx, err.code() == Code::DeadlineExceeded, "expected DEADLINE_EXCEEDED, got {err:?}");
        check!(fx, answered < Duration::from_millis(1_500), "the deadline error took {answered:?}");

        // Past the deadline: sample each node's CPU time twice, a second apart.
        tokio::time::sleep(Duration::from_millis(200)).await;
        let cpu0: Vec<Duration> = fx.cluster.nodes.iter().map(|n| n.cpu_time()).collect::<anyhow::Result<_>>()?;
        tokio::time::sleep(Duration::from_secs(1)).await;
        for (n, c0) in fx.cluster.nodes.iter().zip(&cpu0) {
            let busy = n.cpu_time()? - *c0;
            check!(fx, busy < Duration::from_millis(150), "{} kept computing: {busy:?} of CPU in the second after the deadline", n.id);
        }
        for (n, before) in fx.cluster.nodes.iter().zip(&rss_before) {
            let after = n.rss_anon_bytes()?;
            eprintln!("{}: anonymous RSS {} MiB before, {} MiB after", n.id, before >> 20, after >> 20);
            check!(fx, after <= before + before / 10 + (4 << 20), "{}: RSS grew from {before} to {after} bytes and stayed", n.id);
        }
        Ok(())
    })
}

/// Queries × k over the hit limit: refused at once with INVALID_ARGUMENT by
/// the coordinator and by a shard node asked directly, naming the limit.
pub(crate) fn a_search_asking_too_much_is_refused_before_any_work() -> anyhow::Result<()> {
    let fx = Fixture::start(1, |_| {})?;
    block_on(async {
        let mut client = fx.client().await?;
        let mut rng = rng("a_search_asking_too_much_is_refused_before_any_work");
        create(&mut client, "docs", 16, 1).await?;
        upsert_all(&mut client, "docs", points(&mut rng, 16, 0..100), 100).await?;
        let queries: Vec<v1::Vector> = (0..1024).map(|_| v1::Vector { values: vector(&mut rng, 16) }).collect();
        let req = v1::SearchBatchRequest { collection: "docs".into(), queries: queries.clone(), k: 10_000, ..Default::default() };
        let started = Instant::now();
        let err = client.search_batch(req).await.expect_err("over the hit limit");
        check!(fx, err.code() == Code::InvalidArgument, "{err:?}");
        check!(fx, err.message().contains("at most 1000000 hits") && err.message().contains("1024 × 10000"), "{}", err.message());
        check!(fx, started.elapsed() < Duration::from_millis(500), "took {:?}", started.elapsed());

        let mut node = ShardNodeClient::connect(fx.cluster.nodes[0].endpoint()).await?;
        let shard = Some(v1::ShardId { collection: "docs".into(), shard: 0 });
        let err = node
            .search_shard(v1::SearchShardRequest { shard, queries, k: 10_000, ef: 0, with_payload: false, ..Default::default() })
            .await
            .expect_err("over the node's hit limit");
        check!(fx, err.code() == Code::InvalidArgument && err.message().contains("hits"), "{err:?}");
        // A malformed query sent straight to a node is named as such, not
        // as a bad ef (0 means the default).
        let shard = Some(v1::ShardId { collection: "docs".into(), shard: 0 });
        let bad = vec![v1::Vector { values: vec![1.0; 15] }];
        let err = node
            .search_shard(v1::SearchShardRequest { shard, queries: bad, k: 5, ef: 0, with_payload: false, ..Default::default() })
            .await
            .expect_err("dimension");
        check!(
            fx,
            err.code() == Code::InvalidArgument && err.message().contains("vector has dimension 15, the index expects 16"),
            "{err:?}"
        );
        Ok(())
    })
}
