//! Filtered search, count and scroll against a brute-force model: random
//! payloads (wrong types, nulls and nesting included), random filters of
//! every operator, and upserts that change payloads, deletes, vacuum,
//! compaction and an index built online between them.

use std::collections::BTreeMap;

use rand::Rng;
use rand::rngs::StdRng;
use serde_json::{Value, json};
use shoal_engine::{
    Batch, Bound, Condition, Error, FieldState, FieldType, Filter, IndexOptions, IndexParams, MatchValue, Metric, Op, PAYLOAD_JSON, Plan,
    PlannerOptions, Point, Range, SearchParams, Stop, Where,
};

use crate::common::{Fixture, assert_exact, brute_force, random_vector, rng, test_options};

const DIM: usize = 8;
const IDS: u64 = 400;
const VOCAB: [&str; 6] = ["a", "b", "c", "d", "e", "f"];
const LANGS: [&str; 3] = ["en", "de", "fr"];

/// The indexed fields and their types.
const FIELDS: [(&str, FieldType); 6] = [
    ("tags", FieldType::Keyword),
    ("n", FieldType::Integer),
    ("f", FieldType::Float),
    ("b", FieldType::Bool),
    ("t", FieldType::Datetime),
    ("meta.lang", FieldType::Keyword),
];

fn time_of(day: u32, hour: u32) -> String {
    format!("2026-01-{:02}T{:02}:00:00Z", day.clamp(1, 28), hour % 24)
}

fn random_payload(rng: &mut StdRng) -> Option<Value> {
    if rng.random_bool(0.15) {
        return None;
    }
    let mut o = serde_json::Map::new();
    if rng.random_bool(0.8) {
        let v = match rng.random_range(0..10) {
            0 => json!(VOCAB[rng.random_range(0..VOCAB.len())]),
            1 => json!(7),
            2 => json!([]),
            3 => Value::Null,
            _ => Value::Array((0..rng.random_range(1..4)).map(|_| json!(VOCAB[rng.random_range(0..VOCAB.len())])).collect()),
        };
        o.insert("tags".into(), v);
    }
    if rng.random_bool(0.8) {
        let v = match rng.random_range(0..12) {
            0 => json!(2.5),
            1 => json!("seven"),
            2 => json!(4.0),
            _ => json!(rng.random_range(-5i64..20)),
        };
        o.insert("n".into(), v);
    }
    if rng.random_bool(0.7) {
        o.insert("f".into(), if rng.random_bool(0.1) { json!(true) } else { json!(rng.random_range(-50i32..50) as f64 / 8.0) });
    }
    if rng.random_bool(0.7) {
        o.insert("b".into(), if rng.random_bool(0.1) { json!(1) } else { json!(rng.random_bool(0.5)) });
    }
    if rng.random_bool(0.7) {
        let v = if rng.random_bool(0.1) { json!("soon") } else { json!(time_of(rng.random_range(1..29), rng.random_range(0..24))) };
        o.insert("t".into(), v);
    }
    if rng.random_bool(0.6) {
        o.insert("meta".into(), json!({"lang": LANGS[rng.random_range(0..LANGS.len())]}));
    }
    if rng.random_bool(0.3) {
        o.insert("late".into(), json!(VOCAB[rng.random_range(0..3)]));
    }
    Some(Value::Object(o))
}

fn stored(p: &Option<Value>) -> Option<Vec<u8>> {
    p.as_ref().map(|v| {
        let mut b = vec![PAYLOAD_JSON];
        b.extend(serde_json::to_vec(v).unwrap());
        b
    })
}

// The model's own reading of a payload, written from the documented
// rules (docs/filters.md), not from the engine's code.

fn lookup<'v>(p: &'v Value, path: &str) -> Option<&'v Value> {
    path.split('.').try_fold(p, |at, k| at.as_object()?.get(k))
}

fn is_absent(v: Option<&Value>) -> bool {
    matches!(v, None | Some(Value::Null)) || v.and_then(Value::as_array).is_some_and(Vec::is_empty)
}

fn keywords(v: &Value) -> Vec<String> {
    if let Some(a) = v.as_array() {
        a.iter().filter_map(Value::as_str).filter(|s| s.len() <= 256).map(str::to_owned).collect()
    } else {
        v.as_str().filter(|s| s.len() <= 256).map(|s| vec![s.to_owned()]).unwrap_or_default()
    }
}

fn integer(v: &Value) -> Option<i64> {
    let n = v.as_number()?;
    n.as_i64().or_else(|| n.as_f64().filter(|f| f.fract() == 0.0 && f.abs() < 9e18).map(|f| f as i64)).filter(|&i| i != i64::MIN)
}

fn micros(s: &str) -> Option<i64> {
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
    Some((t.unix_timestamp_nanos() / 1000) as i64)
}

fn kind_of(key: &str) -> FieldType {
    FIELDS.iter().find(|(k, _)| *k == key).map_or(FieldType::Keyword, |(_, t)| *t)
}

/// The value of `v` as a number on the model's scale for a range on a
/// field of `kind`.
fn number(v: &Value, kind: FieldType) -> Option<f64> {
    match kind {
        FieldType::Integer => integer(v).map(|i| i as f64),
        FieldType::Float => v.as_number().and_then(serde_json::Number::as_f64),
        FieldType::Datetime => v.as_str().and_then(micros).map(|m| m as f64),
        FieldType::Keyword | FieldType::Bool => None,
    }
}

fn bound(b: &Bound) -> f64 {
    match b {
        Bound::Integer(i) => *i as f64,
        Bound::Number(f) => *f,
        Bound::Datetime(s) => micros(s).unwrap() as f64,
    }
}

fn model_cond(c: &Condition, id: u64, p: Option<&Value>) -> bool {
    let get = |key: &str| p.and_then(|p| lookup(p, key));
    match c {
        Condition::Filter(f) => model_matches(f, id, p),
        Condition::HasId { ids } => ids.contains(&id),
        Condition::IsEmpty { key, empty } => is_absent(get(key)) == *empty,
        Condition::Match { key, value } => match_any(get(key), key, std::slice::from_ref(value)),
        Condition::Any { key, values } => match_any(get(key), key, values),
        Condition::Range { key, range } => {
            let Some(x) = get(key).filter(|v| !is_absent(Some(v))).and_then(|v| number(v, kind_of(key))) else { return false };
            range.gt.as_ref().is_none_or(|b| x > bound(b))
                && range.gte.as_ref().is_none_or(|b| x >= bound(b))
                && range.lt.as_ref().is_none_or(|b| x < bound(b))
                && range.lte.as_ref().is_none_or(|b| x <= bound(b))
        }
    }
}

fn match_any(v: Option<&Value>, key: &str, values: &[MatchValue]) -> bool {
    let Some(v) = v.filter(|v| !is_absent(Some(v))) else { return false };
    values.iter().any(|want| match (kind_of(key), want) {
        (FieldType::Keyword, MatchValue::Keyword(s)) => keywords(v).contains(s),
        (FieldType::Integer, MatchValue::Integer(i)) => integer(v) == Some(*i),
        (FieldType::Bool, MatchValue::Bool(b)) => v.as_bool() == Some(*b),
        _ => false,
    })
}

fn model_matches(f: &Filter, id: u64, p: Option<&Value>) -> bool {
    f.must.iter().all(|c| model_cond(c, id, p))
        && (f.should.is_empty() || f.should.iter().any(|c| model_cond(c, id, p)))
        && !f.must_not.iter().any(|c| model_cond(c, id, p))
}

fn random_condition(rng: &mut StdRng, depth: usize, late_ready: bool) -> Condition {
    let kw = |rng: &mut StdRng| {
        MatchValue::Keyword(if rng.random_bool(0.1) { "zz".into() } else { VOCAB[rng.random_range(0..VOCAB.len())].into() })
    };
    let pick = rng.random_range(0..if depth < 3 { 13 } else { 12 });
    match pick {
        0 => Condition::Match { key: "tags".into(), value: kw(rng) },
        1 => Condition::Any { key: "tags".into(), values: (0..rng.random_range(1..4)).map(|_| kw(rng)).collect() },
        2 => Condition::Match { key: "n".into(), value: MatchValue::Integer(rng.random_range(-5..20)) },
        3 => Condition::Any {
            key: "n".into(),
            values: (0..rng.random_range(1..4)).map(|_| MatchValue::Integer(rng.random_range(-5..20))).collect(),
        },
        4 => {
            let num = |rng: &mut StdRng| {
                if rng.random_bool(0.3) {
                    Bound::Number(rng.random_range(-60..200) as f64 / 10.0)
                } else {
                    Bound::Integer(rng.random_range(-6..21))
                }
            };
            let mut r = Range::default();
            if rng.random_bool(0.6) {
                if rng.random_bool(0.5) { r.gt = Some(num(rng)) } else { r.gte = Some(num(rng)) }
            }
            if r.gt.is_none() && r.gte.is_none() || rng.random_bool(0.5) {
                if rng.random_bool(0.5) { r.lt = Some(num(rng)) } else { r.lte = Some(num(rng)) }
            }
            Condition::Range { key: "n".into(), range: r }
        }
        5 => {
            let a = rng.random_range(-50..50) as f64 / 8.0;
            let b = a + rng.random_range(0..60) as f64 / 8.0;
            Condition::Range {
                key: "f".into(),
                range: Range { gte: Some(Bound::Number(a)), lt: Some(Bound::Number(b)), ..Range::default() },
            }
        }
        6 => Condition::Match { key: "b".into(), value: MatchValue::Bool(rng.random_bool(0.5)) },
        7 => {
            let a = rng.random_range(1..28);
            let r = Range {
                gte: Some(Bound::Datetime(time_of(a, 0))),
                lte: Some(Bound::Datetime(time_of(a + rng.random_range(0..10), 12))),
                ..Range::default()
            };
            Condition::Range { key: "t".into(), range: r }
        }
        8 => Condition::IsEmpty {
            key: ["tags", "n", "f", "b", "t", "meta.lang"][rng.random_range(0..6)].into(),
            empty: rng.random_bool(0.5),
        },
        9 => Condition::HasId { ids: (0..rng.random_range(0..30)).map(|_| rng.random_range(0..IDS)).collect() },
        10 => Condition::Match { key: "meta.lang".into(), value: MatchValue::Keyword(LANGS[rng.random_range(0..LANGS.len())].into()) },
        11 if late_ready => Condition::Match { key: "late".into(), value: kw(rng) },
        11 => Condition::Match { key: "b".into(), value: MatchValue::Bool(true) },
        _ => Condition::Filter(random_filter(rng, depth + 1, late_ready)),
    }
}

fn random_filter(rng: &mut StdRng, depth: usize, late_ready: bool) -> Filter {
    let list = |rng: &mut StdRng, max: usize| (0..rng.random_range(0..=max)).map(|_| random_condition(rng, depth, late_ready)).collect();
    let must = list(rng, 3);
    let should = if rng.random_bool(0.4) { list(rng, 3) } else { Vec::new() };
    let must_not = if rng.random_bool(0.3) { list(rng, 2) } else { Vec::new() };
    Filter { must, should, must_not }
}

struct Model {
    points: BTreeMap<u64, (Vec<f32>, Option<Value>)>,
}

impl Model {
    fn matching(&self, f: &Filter) -> Vec<u64> {
        self.points.iter().filter(|(id, (_, p))| model_matches(f, **id, p.as_ref())).map(|(id, _)| *id).collect()
    }
}

/// Plans that must return exactly the model's answer.
fn exact_plan(p: Plan) -> bool {
    matches!(p, Plan::Exact | Plan::Empty)
}

/// A delete by filter in a later batch of the same group sees what the
/// earlier batches wrote, and the filter is refused whole when it names a
/// field without an index (nothing of its batch is applied).
#[test]
fn deletes_by_filter_see_the_group_and_refuse_unindexed_fields() {
    let mut rng = rng("deletes_by_filter_see_the_group_and_refuse_unindexed_fields");
    let fx = Fixture::new(DIM as u32, Metric::Cosine);
    fx.index.create_field_index("tags", FieldType::Keyword).unwrap();
    let tagged = |id: u64, tag: &str| Op::Upsert(Point { id, vector: vec![1.0; DIM], payload: stored(&Some(json!({"tags": [tag]}))) });
    fx.index.apply(Batch { ops: (0..10).map(|i| tagged(i, if i % 2 == 0 { "a" } else { "b" })).collect(), source: None }).unwrap();
    let a = Filter { must: vec![Condition::Match { key: "tags".into(), value: MatchValue::Keyword("a".into()) }], ..Filter::default() };
    let outcomes = fx
        .index
        .apply_group(vec![
            // 1 becomes an "a", 2 a "b", 20 is new.
            Batch { ops: vec![tagged(1, "a"), tagged(2, "b"), tagged(20, "a")], source: None },
            Batch { ops: vec![Op::DeleteWhere { filter: a.clone(), allow_unindexed: false }, tagged(30, "a")], source: None },
        ])
        .unwrap();
    // 0, 4, 6, 8 held before the group; 1 and 20 came in its first batch.
    assert_eq!(outcomes[1], Ok(shoal_engine::BatchOutcome::Applied { upserted: 1, deleted: 6, missing: 0 }));
    let page = fx.index.scroll(Where::new(&Filter::default()), None, 100, false).unwrap();
    let ids: Vec<u64> = page.points.iter().map(|p| p.id).collect();
    assert_eq!(ids, vec![2, 3, 5, 7, 9, 30]);
    assert_eq!(fx.index.count(Where::new(&a)).unwrap(), 1);
    let unindexed =
        Filter { must: vec![Condition::Match { key: "lang".into(), value: MatchValue::Keyword("en".into()) }], ..Filter::default() };
    let err = fx
        .index
        .apply(Batch { ops: vec![tagged(40, "a"), Op::DeleteWhere { filter: unindexed.clone(), allow_unindexed: false }], source: None });
    match err {
        Err(Error::Invalid(e)) => assert!(e.to_string().contains("operation 1") && e.to_string().contains("lang has no index"), "{e}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(fx.index.stats().unwrap().live, 6, "nothing of the refused batch was applied");
    // With a scan allowed, the payloads answer.
    let outcome = fx.index.apply(Batch { ops: vec![Op::DeleteWhere { filter: unindexed, allow_unindexed: true }], source: None }).unwrap();
    assert_eq!(outcome, shoal_engine::BatchOutcome::Applied { upserted: 0, deleted: 0, missing: 0 });
    let _ = &mut rng;
}

#[test]
fn filtered_search_count_and_scroll_match_the_model() {
    let mut rng = rng("filtered_search_count_and_scroll_match_the_model");
    // Small planner lines, so that every plan runs on a few hundred points.
    let opts = IndexOptions { planner: PlannerOptions { exact_max: 25, scan_max: 90, ..PlannerOptions::default() }, ..test_options() };
    let fx = Fixture::with(IndexParams::new(DIM as u32, Metric::Cosine), opts);
    for (field, kind) in FIELDS {
        assert_eq!(fx.index.create_field_index(field, kind).unwrap().state, FieldState::Ready, "{field}: an empty shard's index is ready");
    }
    let mut model = Model { points: BTreeMap::new() };
    let mut plans: BTreeMap<&str, (usize, usize, usize)> = BTreeMap::new();
    let mut late: Option<bool> = None;
    for round in 0..30 {
        // Writes: new points, payload changes, deletes.
        let mut ops = Vec::new();
        for _ in 0..rng.random_range(10..60) {
            let id = rng.random_range(0..IDS);
            let (vector, payload) = (random_vector(&mut rng, DIM), random_payload(&mut rng));
            ops.push(Op::Upsert(Point { id, vector: vector.clone(), payload: stored(&payload) }));
            model.points.insert(id, (vector, payload));
        }
        for _ in 0..rng.random_range(0..25) {
            let id = rng.random_range(0..IDS);
            ops.push(Op::DeleteIfPresent(id));
            model.points.remove(&id);
        }
        let before: std::collections::BTreeSet<u64> = model.points.keys().copied().collect();
        // A delete by filter sees the batch's earlier operations, and the
        // later ones come after it.
        if round % 3 == 1 {
            let filter = random_filter(&mut rng, 2, late == Some(true));
            for id in model.matching(&filter) {
                model.points.remove(&id);
            }
            ops.push(Op::DeleteWhere { filter, allow_unindexed: false });
            for _ in 0..rng.random_range(0..10) {
                let id = rng.random_range(0..IDS);
                let (vector, payload) = (random_vector(&mut rng, DIM), random_payload(&mut rng));
                ops.push(Op::Upsert(Point { id, vector: vector.clone(), payload: stored(&payload) }));
                model.points.insert(id, (vector, payload));
            }
        }
        let outcome = fx.index.apply(Batch { ops, source: None }).unwrap();
        let _ = before;
        assert!(matches!(outcome, shoal_engine::BatchOutcome::Applied { .. }), "round {round}: {outcome:?}");
        assert_eq!(fx.index.stats().unwrap().live, model.points.len() as u64, "round {round}: live points");
        assert_eq!(
            fx.index.snapshot().unwrap().digest().unwrap().index_mismatches,
            0,
            "round {round}: the indexes agree with the payloads"
        );
        if round % 7 == 3 {
            fx.index.vacuum(1_000).unwrap();
        }
        if round % 11 == 5 {
            fx.index.compact().unwrap();
        }
        // An index declared on a shard that holds points, built in steps
        // between the batches.
        if round == 8 {
            let info = fx.index.create_field_index("late", FieldType::Keyword).unwrap();
            assert!(matches!(info.state, FieldState::Building { indexed_below: 0, .. }), "{info:?}");
            late = Some(false);
        }
        if late == Some(false) {
            let f =
                Filter { must: vec![Condition::Match { key: "late".into(), value: MatchValue::Keyword("a".into()) }], ..Filter::default() };
            match fx.index.count(Where::new(&f)) {
                Err(Error::FieldIndexBuilding { field, .. }) => assert_eq!(field, "late"),
                other => panic!("a filter on an index being built: {other:?}"),
            }
            // A scan of the payloads is the same answer meanwhile.
            assert_eq!(fx.index.count(Where { filter: &f, allow_unindexed: true }).unwrap(), model.matching(&f).len() as u64);
            let step = fx.index.build_field_indexes(37).unwrap().unwrap();
            if step.done {
                late = Some(true);
            }
        }
        let late_ready = late == Some(true);
        // Reads.
        for q in 0..30 {
            let filter = random_filter(&mut rng, 1, late_ready);
            let matching = model.matching(&filter);
            let context = format!("round {round} query {q}: {filter:?}");
            assert_eq!(fx.index.count(Where::new(&filter)).unwrap(), matching.len() as u64, "count, {context}");
            let query = random_vector(&mut rng, DIM);
            let k = rng.random_range(1..12);
            let found = fx.index.search_where(&query, SearchParams::new(k, 48), Where::new(&filter), &Stop::never()).unwrap();
            let candidates: Vec<(u64, Vec<f32>)> = matching.iter().map(|id| (*id, model.points[id].0.clone())).collect();
            let want = brute_force(Metric::Cosine, &candidates, &query, k);
            for h in &found.hits {
                assert!(matching.binary_search(&h.id).is_ok(), "hit {} does not match, {context}", h.id);
            }
            if found.explain.matches_exact {
                assert_eq!(found.explain.matches, matching.len() as u64, "explain, {context}");
            }
            let e = plans.entry(found.explain.plan.name()).or_default();
            e.0 += 1;
            if exact_plan(found.explain.plan) {
                assert_exact(&found.hits, &want, &context);
            } else {
                e.1 += want.iter().filter(|w| found.hits.iter().any(|h| h.id == w.0)).count();
                e.2 += want.len();
            }
            // Scroll in pages of a random size: every match once, in order,
            // with its payload.
            let limit = rng.random_range(1..8);
            let mut after = None;
            let mut seen = Vec::new();
            loop {
                let page = fx.index.scroll(Where::new(&filter), after, limit, rng.random_bool(0.3)).unwrap();
                assert!(page.points.len() <= limit);
                for p in &page.points {
                    assert_eq!(p.payload, stored(&model.points[&p.id].1), "payload of {}, {context}", p.id);
                    assert!(p.vector.is_empty() || p.vector.len() == DIM);
                }
                seen.extend(page.points.iter().map(|p| p.id));
                match page.next_after {
                    Some(a) => after = Some(a),
                    None => break,
                }
            }
            assert_eq!(seen, matching, "scroll, {context}");
        }
    }
    assert_eq!(late, Some(true), "the online build finished");
    eprintln!("plans: {plans:?}");
    for (plan, (runs, found, wanted)) in &plans {
        if *wanted > 0 {
            let recall = *found as f64 / *wanted as f64;
            assert!(recall >= 0.9, "{plan}: recall {recall:.3} over {runs} searches");
        }
    }
    for plan in ["exact", "scan", "filtered_graph"] {
        assert!(plans.get(plan).is_some_and(|p| p.0 > 20), "plan {plan} ran too rarely: {plans:?}");
    }
}
