//! Each code the README promises, driven by a real failure of real
//! processes: the caller's mistakes, a node killed mid-request, answers over
//! the message limit, a deadline.

use std::time::{Duration, Instant};

use shoal_proto::v1;
use tonic::Code;

use crate::check;
use crate::common::{Fixture, block_on, create, retry_hint, rng, vector};

pub(crate) fn every_documented_code_comes_from_a_real_failure() -> anyhow::Result<()> {
    // A small message limit everywhere, so answers with payloads can
    // outgrow it.
    let fx = Fixture::start(3, |spec| {
        spec.node_env.push(("SHOAL_SHARD_MAX_MESSAGE_BYTES".into(), "262144".into()));
        spec.coordinator_env.push(("SHOAL_COORD_MAX_MESSAGE_BYTES".into(), "262144".into()));
    })?;
    block_on(async {
        let mut client = fx.client().await?;
        let mut rng = rng("every_documented_code_comes_from_a_real_failure");
        create(&mut client, "docs", 32, 3).await?;
        let text = "x".repeat(2_000);
        for b in 0..60u64 {
            let points = (b * 50..b * 50 + 50)
                .map(|id| v1::Point {
                    id,
                    vector: vector(&mut rng, 32),
                    payload: Some(v1::Payload { kind: Some(v1::payload::Kind::Json(format!("{{\"t\":\"{text}\"}}"))) }),
                })
                .collect();
            client.upsert(v1::UpsertRequest { collection: "docs".into(), points }).await?;
        }

        // INVALID_ARGUMENT: the request is wrong.
        let q = |v: Vec<f32>| v1::SearchRequest { collection: "docs".into(), vector: v, k: 10, ..Default::default() };
        let err = client.search(q(vec![1.0; 31])).await.unwrap_err();
        check!(fx, err.code() == Code::InvalidArgument && err.message().contains("dimension 31"), "{err:?}");
        // NOT_FOUND and ALREADY_EXISTS.
        let err = client.describe_collection(v1::DescribeCollectionRequest { name: "nope".into() }).await.unwrap_err();
        check!(fx, err.code() == Code::NotFound, "{err:?}");
        let err = create(&mut client, "docs", 32, 3).await.unwrap_err();
        check!(fx, err.code() == Code::AlreadyExists, "{err:?}");

        // RESOURCE_EXHAUSTED: 200 hits with 2 KB payloads cannot fit in
        // 256 KiB; retrying cannot help, so there is no retry hint.
        let big = v1::SearchRequest { with_payload: true, k: 200, ..q(vector(&mut rng, 32)) };
        let err = client.search(big).await.unwrap_err();
        check!(fx, err.code() == Code::ResourceExhausted && retry_hint(&err).is_none(), "{err:?}");
        check!(fx, err.message().contains("message limit"), "{}", err.message());
        // The same without payloads fits.
        client.search(v1::SearchRequest { k: 200, ..q(vector(&mut rng, 32)) }).await?;

        // DEADLINE_EXCEEDED: a batch that takes about a second on every
        // node (an ef that visits each whole shard, small answers), with a
        // 50 ms deadline.
        create(&mut client, "wide", 32, 3).await?;
        crate::common::upsert_all(&mut client, "wide", crate::common::points(&mut rng, 32, 0..30_000), 1_000).await?;
        let queries: Vec<v1::Vector> = (0..1024).map(|_| v1::Vector { values: vector(&mut rng, 32) }).collect();
        let heavy = |timeout_ms| v1::SearchBatchRequest {
            collection: "wide".into(),
            queries: queries.clone(),
            k: 10,
            ef: 10_000,
            timeout_ms,
            ..Default::default()
        };
        let err = client.search_batch(heavy(50)).await.unwrap_err();
        check!(fx, err.code() == Code::DeadlineExceeded, "{err:?}");

        // UNAVAILABLE with a hint: a node killed while it computes.
        let mut running = client.clone();
        let long = heavy(20_000);
        let search = tokio::spawn(async move { running.search_batch(long).await });
        tokio::time::sleep(Duration::from_millis(300)).await;
        let killed_at = Instant::now();
        let victim_status = fx.cluster.nodes[1].kill()?;
        let err = search.await?.expect_err("a node died under the search");
        let took = killed_at.elapsed();
        eprintln!("search with a node killed under it: {took:?} after the kill: {err:?} (node exit: {victim_status})");
        check!(fx, err.code() == Code::Unavailable && retry_hint(&err).is_some(), "{err:?}");
        check!(fx, took < Duration::from_secs(3), "the error came {took:?} after the kill");
        // And a write to the dead node.
        let err = client
            .upsert(v1::UpsertRequest { collection: "docs".into(), points: crate::common::points(&mut rng, 32, 100_000..100_030) })
            .await
            .unwrap_err();
        check!(fx, err.code() == Code::Unavailable && retry_hint(&err).is_some(), "{err:?}");
        Ok(())
    })
}
