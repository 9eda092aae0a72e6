//! Filtered searches, counts and scrolls through a coordinator with a
//! replica down: a collection of three shards with two copies each, on
//! three shard-node processes, one of them SIGKILLed. Every shard still
//! has a copy, so every answer is whole and the same as before the kill.

use shoal_proto::v1;
use shoal_proto::v1::shoal_client::ShoalClient;
use tonic::transport::Channel;

use crate::check;
use crate::common::{Fixture, rng, upsert_all, vector};

const DIM: usize = 16;

fn filter(text: &str) -> v1::Filter {
    shoal_filter::wire::to_proto(&shoal_filter::parse_json(text).expect("a test filter"))
}

/// What a filter's answers are: its count, every id a scroll of pages
/// of 50 returns, and the hits of a few fixed queries.
async fn answers(
    client: &mut ShoalClient<Channel>,
    f: &v1::Filter,
    queries: &[Vec<f32>],
) -> anyhow::Result<(u64, Vec<u64>, Vec<Vec<u64>>)> {
    let count =
        client.count(v1::CountRequest { collection: "docs".into(), filter: Some(f.clone()), ..Default::default() }).await?.into_inner();
    anyhow::ensure!(!count.partial, "a partial count: {count:?}");
    let (mut after, mut ids) = (None, Vec::new());
    loop {
        let req = v1::ScrollRequest { collection: "docs".into(), filter: Some(f.clone()), after, limit: 50, ..Default::default() };
        let page = client.scroll(req).await?.into_inner();
        ids.extend(page.points.iter().map(|p| p.id));
        match page.next_after {
            Some(a) => after = Some(a),
            None => break,
        }
    }
    let mut hits = Vec::new();
    for q in queries {
        let req = v1::SearchRequest { collection: "docs".into(), vector: q.clone(), k: 10, filter: Some(f.clone()), ..Default::default() };
        let r = client.search(req).await?.into_inner();
        anyhow::ensure!(!r.partial && r.shards_answered == 3, "a partial search: {} of {}", r.shards_answered, r.shards_total);
        hits.push(r.hits.iter().map(|h| h.id).collect());
    }
    Ok((count.count, ids, hits))
}

pub(crate) fn filters_answer_whole_with_a_replica_down() -> anyhow::Result<()> {
    let test = "filters_answer_whole_with_a_replica_down";
    let fx = Fixture::start(3, |_| {})?;
    let mut rng = rng(test);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build()?;
    let mut client = rt.block_on(fx.client())?;
    let queries: Vec<Vec<f32>> = (0..5).map(|_| vector(&mut rng, DIM)).collect();
    // Few matches per shard (each compares every one, exactly) and many.
    let narrow = filter(r#"{"must": [{"key": "tag", "match": "t3"}, {"key": "n", "range": {"lt": 40}}]}"#);
    let wide = filter(r#"{"must_not": [{"key": "tag", "match": "t0"}]}"#);
    let before = rt.block_on(async {
        let index = |field: &str, t: v1::FieldType| v1::FieldIndex { field: field.into(), r#type: t as i32 };
        let req = v1::CreateCollectionRequest {
            name: "docs".into(),
            dimension: DIM as u32,
            metric: v1::Metric::Cosine as i32,
            shard_count: 3,
            replication_factor: 2,
            field_indexes: vec![index("tag", v1::FieldType::Keyword), index("n", v1::FieldType::Integer)],
            ..Default::default()
        };
        client.create_collection(req).await?;
        let points = (0..900u64)
            .map(|id| {
                let json = format!(r#"{{"tag": "t{}", "n": {}}}"#, id % 5, id % 100);
                v1::Point { id, vector: vector(&mut rng, DIM), payload: Some(v1::Payload { kind: Some(v1::payload::Kind::Json(json)) }) }
            })
            .collect();
        upsert_all(&mut client, "docs", points, 300).await?;
        anyhow::Ok((answers(&mut client, &narrow, &queries).await?, answers(&mut client, &wide, &queries).await?))
    })?;
    check!(fx, before.0.0 == 72 && before.0.1.len() == 72, "t3 and n < 40: 72 points, got {} and {}", before.0.0, before.0.1.len());
    check!(fx, before.1.0 == 720, "not t0: 720 points, got {}", before.1.0);

    fx.cluster.nodes[1].kill()?;
    let after =
        rt.block_on(async { anyhow::Ok((answers(&mut client, &narrow, &queries).await?, answers(&mut client, &wide, &queries).await?)) })?;
    check!(fx, after.0 == before.0, "the narrow filter's answers changed with shard-1 down: {:?} against {:?}", after.0, before.0);
    check!(fx, after.1.0 == before.1.0 && after.1.1 == before.1.1, "the wide filter's count or scroll changed with shard-1 down");
    // A walk of another copy's graph may order near ties differently, but
    // it finds the same matching points.
    let same: usize = after.1.2.iter().zip(&before.1.2).map(|(a, b)| a.iter().filter(|id| b.contains(id)).count()).sum();
    check!(fx, same * 10 >= 9 * 50, "the wide filter's hits with shard-1 down: {same} of 50 as before");
    Ok(())
}
