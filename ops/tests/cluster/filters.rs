//! Filters through the cluster: a collection of three shards with payload
//! indexes, searched, counted, scrolled and deleted from by filter, each
//! answer held to a model of the points; bad filters refused whole with
//! the place inside them named; an index declared on live data built
//! online.

use std::collections::BTreeMap;

use rand::Rng;
use rand::rngs::StdRng;
use serde_json::{Value, json};
use shoal_proto::v1;
use shoal_proto::v1::shoal_client::ShoalClient;
use tonic::transport::Channel;

use crate::common::{cluster, ingest, rng, vector};

const DIM: usize = 8;
const TAGS: [&str; 5] = ["a", "b", "c", "d", "e"];

fn payload(rng: &mut StdRng, id: u64) -> Value {
    let tags: Vec<&str> = TAGS.iter().copied().filter(|_| rng.random_bool(0.3)).collect();
    let mut p = json!({"tags": tags, "n": id % 50, "t": format!("2026-01-{:02}T00:00:00Z", 1 + id % 28)});
    if id.is_multiple_of(7) {
        p["late"] = json!(if id.is_multiple_of(2) { "x" } else { "y" });
    }
    p
}

fn filter(text: &str) -> v1::Filter {
    shoal_filter::wire::to_proto(&shoal_filter::parse_json(text).unwrap())
}

/// Ids of the model's points matching `f` (the same rules, written here).
fn matching(model: &BTreeMap<u64, (Vec<f32>, Value)>, f: &dyn Fn(&Value) -> bool) -> Vec<u64> {
    model.iter().filter(|(_, (_, p))| f(p)).map(|(id, _)| *id).collect()
}

fn has_tag(p: &Value, t: &str) -> bool {
    p["tags"].as_array().is_some_and(|a| a.iter().any(|x| x == t))
}

fn cosine_distance(a: &[f32], b: &[f32]) -> f32 {
    let dot: f32 = a.iter().zip(b).map(|(x, y)| x * y).sum();
    let n = |v: &[f32]| v.iter().map(|x| x * x).sum::<f32>().sqrt();
    1.0 - dot / (n(a) * n(b))
}

async fn count(client: &mut ShoalClient<Channel>, f: Option<v1::Filter>) -> u64 {
    client.count(v1::CountRequest { collection: "docs".into(), filter: f, ..Default::default() }).await.unwrap().into_inner().count
}

async fn scroll_all(client: &mut ShoalClient<Channel>, f: Option<v1::Filter>, limit: u32) -> Vec<u64> {
    let (mut after, mut ids) = (None, Vec::new());
    loop {
        let req = v1::ScrollRequest { collection: "docs".into(), filter: f.clone(), after, limit, ..Default::default() };
        let page = client.scroll(req).await.unwrap().into_inner();
        assert!(page.points.len() <= limit as usize);
        ids.extend(page.points.iter().map(|p| p.id));
        match page.next_after {
            Some(a) => after = Some(a),
            None => return ids,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn filters_search_count_scroll_and_delete_through_three_shards() {
    let mut rng = rng("filters_search_count_scroll_and_delete_through_three_shards");
    let mut tc = cluster(3).await;
    let c = &mut tc.client;
    let index = |field: &str, t: v1::FieldType| v1::FieldIndex { field: field.into(), r#type: t as i32 };
    c.create_collection(v1::CreateCollectionRequest {
        name: "docs".into(),
        dimension: DIM as u32,
        metric: v1::Metric::Cosine as i32,
        shard_count: 3,
        field_indexes: vec![index("tags", v1::FieldType::Keyword), index("n", v1::FieldType::Integer), index("t", v1::FieldType::Datetime)],
        ..Default::default()
    })
    .await
    .unwrap();
    let mut model: BTreeMap<u64, (Vec<f32>, Value)> = BTreeMap::new();
    let mut batches = Vec::new();
    for b in 0..6u64 {
        let mut points = Vec::new();
        for id in b * 100..(b + 1) * 100 {
            let (v, p) = (vector(&mut rng, DIM), payload(&mut rng, id));
            points.push(v1::Point {
                id,
                vector: v.clone(),
                payload: Some(v1::Payload { kind: Some(v1::payload::Kind::Json(p.to_string())) }),
            });
            model.insert(id, (v, p));
        }
        batches.push(v1::IngestRequest { collection: "docs".into(), source: "job".into(), offset: b, points, ..Default::default() });
    }
    ingest(c, batches).await.unwrap();

    // Each filter with the model's reading of it.
    type Rule = Box<dyn Fn(&Value) -> bool>;
    let cases: Vec<(&str, Rule)> = vec![
        (r#"{"must": [{"key": "tags", "match": "a"}]}"#, Box::new(|p: &Value| has_tag(p, "a"))),
        (r#"{"must": [{"key": "n", "range": {"gte": 10, "lt": 13}}]}"#, Box::new(|p: &Value| (10..13).contains(&p["n"].as_u64().unwrap()))),
        (
            r#"{"must": [{"key": "t", "range": {"lte": "2026-01-03T00:00:00Z"}}], "must_not": [{"key": "tags", "any": ["b", "c"]}]}"#,
            Box::new(|p: &Value| p["t"].as_str().unwrap() <= "2026-01-03T00:00:00Z" && !has_tag(p, "b") && !has_tag(p, "c")),
        ),
        (r#"{"should": [{"key": "n", "match": 7}, {"has_id": [1, 2, 3]}]}"#, Box::new(|p: &Value| p["n"] == 7)),
    ];
    for (text, rule) in &cases {
        let mut want = matching(&model, rule.as_ref());
        if text.contains("has_id") {
            want.extend([1, 2, 3]);
            want.sort_unstable();
            want.dedup();
        }
        let f = filter(text);
        assert_eq!(count(c, Some(f.clone())).await, want.len() as u64, "count {text}");
        assert_eq!(scroll_all(c, Some(f.clone()), 37).await, want, "scroll {text}");
        for _ in 0..5 {
            let q = vector(&mut rng, DIM);
            let req =
                v1::SearchRequest { collection: "docs".into(), vector: q.clone(), k: 10, filter: Some(f.clone()), ..Default::default() };
            let r = c.search(req).await.unwrap().into_inner();
            assert!(r.hits.iter().all(|h| want.binary_search(&h.id).is_ok()), "{text}: a hit that does not match");
            assert_eq!(r.explain.len(), 3, "one plan per shard: {:?}", r.explain);
            assert!(r.explain.iter().all(|e| e.explain.as_ref().is_some_and(|x| !x.plan.is_empty())));
            // Few matches on each shard: every shard compares them all, so
            // the merged answer is the exact one.
            if want.len() < 200 {
                let mut exact: Vec<(f32, u64)> = want.iter().map(|id| (cosine_distance(&q, &model[id].0), *id)).collect();
                exact.sort_by(|a, b| a.0.total_cmp(&b.0));
                let got: Vec<f32> = r.hits.iter().map(|h| h.distance).collect();
                let wanted: Vec<f32> = exact.iter().take(10).map(|e| e.0).collect();
                assert_eq!(got.len(), wanted.len(), "{text}");
                for (g, w) in got.iter().zip(&wanted) {
                    assert!((g - w).abs() < 1e-4, "{text}: {got:?} against {wanted:?}");
                }
            }
        }
    }

    // Bad filters: refused whole, the place named.
    let bad = |c: &str| filter(c);
    let e = c
        .count(v1::CountRequest {
            collection: "docs".into(),
            filter: Some(bad(r#"{"must": [{"key": "late", "match": "x"}]}"#)),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("filter must[0]: the field late has no index"), "{}", e.message());
    let e = c
        .search(v1::SearchRequest {
            collection: "docs".into(),
            vector: vector(&mut rng, DIM),
            k: 5,
            filter: Some(bad(r#"{"should": [{"key": "n", "match": "seven"}]}"#)),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), tonic::Code::InvalidArgument);
    assert!(e.message().contains("filter should[0].match: the field n is indexed as integer"), "{}", e.message());
    let empty_condition = v1::Filter { must: vec![v1::Condition { kind: None }], ..Default::default() };
    let e = c.count(v1::CountRequest { collection: "docs".into(), filter: Some(empty_condition), ..Default::default() }).await.unwrap_err();
    assert!(e.message().contains("filter must[0]: a condition must be"), "{}", e.message());
    // With a scan allowed, the payloads answer the field without an index.
    let late_x = matching(&model, &|p: &Value| p["late"] == "x");
    let scanned = c
        .count(v1::CountRequest {
            collection: "docs".into(),
            filter: Some(filter(r#"{"must": [{"key": "late", "match": "x"}]}"#)),
            allow_unindexed: true,
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner()
        .count;
    assert_eq!(scanned, late_x.len() as u64);

    // An index declared on live data, built online on every shard.
    let info = c
        .create_field_index(v1::CreateFieldIndexRequest {
            collection: "docs".into(),
            index: Some(index("late", v1::FieldType::Keyword)),
            wait: true,
        })
        .await
        .unwrap()
        .into_inner();
    assert!(info.field_indexes.iter().any(|f| f.field == "late"));
    for s in &info.shards {
        assert!(s.field_indexes.iter().any(|f| f.field == "late" && f.ready), "shard {}: {:?}", s.shard, s.field_indexes);
    }
    assert_eq!(count(c, Some(filter(r#"{"must": [{"key": "late", "match": "x"}]}"#))).await, late_x.len() as u64);

    // Delete by filter: through Delete, and through Ingest with an offset
    // (exactly once: the same offset again is skipped).
    let a = matching(&model, &|p: &Value| has_tag(p, "a"));
    let w = c
        .delete(v1::DeleteRequest {
            collection: "docs".into(),
            filter: Some(filter(r#"{"must": [{"key": "tags", "match": "a"}]}"#)),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(w.deleted as usize, a.len());
    model.retain(|_, (_, p)| !has_tag(p, "a"));
    let low = matching(&model, &|p: &Value| p["n"].as_u64().unwrap() < 5);
    let by_offset = v1::IngestRequest {
        collection: "docs".into(),
        source: "job".into(),
        offset: 100,
        delete_filter: Some(filter(r#"{"must": [{"key": "n", "range": {"lt": 5}}]}"#)),
        ..Default::default()
    };
    let acks = ingest(c, vec![by_offset.clone()]).await.unwrap();
    assert_eq!((acks[0].status, acks[0].deleted as usize), (v1::BatchStatus::Applied as i32, low.len()));
    model.retain(|_, (_, p)| p["n"].as_u64().unwrap() >= 5);
    let again = ingest(c, vec![by_offset]).await.unwrap();
    assert_eq!((again[0].status, again[0].deleted), (v1::BatchStatus::Skipped as i32, 0));
    assert_eq!(count(c, None).await, model.len() as u64);
    assert_eq!(scroll_all(c, None, 1000).await, model.keys().copied().collect::<Vec<_>>());
}
