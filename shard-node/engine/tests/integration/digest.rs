//! The content digest tells copies of a shard apart exactly when a reader
//! could: same points (id, vector, payload) in, same digest out, whatever
//! path built each copy.

use proptest::prelude::*;
use shoal_engine::{Batch, Metric, Op, Point};

use crate::common::Fixture;

const DIM: usize = 4;

/// A point whose vector is a function of its id and version, so the model
/// below can say which vector a copy should hold.
fn point(id: u64, version: u8, payload: bool) -> Point {
    let v = f32::from(version) + 1.0;
    Point { id, vector: vec![v, id as f32 + 1.0, -v, 0.5], payload: payload.then(|| vec![version, id as u8]) }
}

#[derive(Clone, Debug)]
enum Step {
    Upsert { id: u64, version: u8, payload: bool },
    Delete(u64),
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    let step = prop_oneof![
        3 => (0u64..24, 0u8..3, any::<bool>()).prop_map(|(id, version, payload)| Step::Upsert { id, version, payload }),
        1 => (0u64..24).prop_map(Step::Delete),
    ];
    prop::collection::vec(step, 1..60)
}

/// What the steps leave: id → (version, payload), the model's final state.
fn final_state(steps: &[Step]) -> std::collections::BTreeMap<u64, (u8, bool)> {
    let mut m = std::collections::BTreeMap::new();
    for s in steps {
        match *s {
            Step::Upsert { id, version, payload } => {
                m.insert(id, (version, payload));
            }
            Step::Delete(id) => {
                m.remove(&id);
            }
        }
    }
    m
}

fn op(s: &Step) -> Op {
    match *s {
        Step::Upsert { id, version, payload } => Op::Upsert(point(id, version, payload)),
        Step::Delete(id) => Op::DeleteIfPresent(id),
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 24, ..ProptestConfig::default() })]

    /// A copy built through every step, in batches of `split`, agrees with
    /// one built from the final state in one batch: history does not count.
    #[test]
    fn copies_with_the_same_points_agree_whatever_their_history(steps in steps(), split in 1usize..8) {
        let walked = Fixture::new(DIM as u32, Metric::Euclidean);
        for chunk in steps.chunks(split) {
            walked.index.apply(Batch { ops: chunk.iter().map(op).collect(), source: None }).unwrap();
        }
        let direct = Fixture::new(DIM as u32, Metric::Euclidean);
        let state = final_state(&steps);
        if !state.is_empty() {
            let ops = state.iter().rev().map(|(&id, &(version, payload))| Op::Upsert(point(id, version, payload))).collect();
            direct.index.apply(Batch { ops, source: None }).unwrap();
        }
        let (a, b) = (walked.index.snapshot().unwrap().digest().unwrap(), direct.index.snapshot().unwrap().digest().unwrap());
        prop_assert_eq!(a.points, state.len() as u64);
        prop_assert_eq!(a, b);
    }
}

#[test]
fn any_difference_a_reader_could_see_changes_the_digest() {
    let base: Vec<Op> = (0..20).map(|id| Op::Upsert(point(id, 0, id % 2 == 0))).collect();
    let digest_of = |extra: Option<Op>| {
        let f = Fixture::new(DIM as u32, Metric::Euclidean);
        f.index.apply(Batch { ops: base.clone(), source: None }).unwrap();
        if let Some(op) = extra {
            f.index.apply(Batch { ops: vec![op], source: None }).unwrap();
        }
        f.index.snapshot().unwrap().digest().unwrap()
    };
    let same = digest_of(None);
    assert_eq!(same, digest_of(None), "the digest is deterministic");
    assert_eq!(same.points, 20);
    assert_eq!(same.hex().len(), 64);
    let changes = [
        ("a vector", Op::Upsert(point(3, 1, false))),
        ("a payload", Op::Upsert(Point { payload: Some(vec![9]), ..point(4, 0, true) })),
        ("a payload removed", Op::Upsert(point(4, 0, false))),
        ("a point added", Op::Upsert(point(20, 0, false))),
        ("a point deleted", Op::Delete(7)),
    ];
    for (what, op) in changes {
        assert_ne!(digest_of(Some(op)), same, "{what} must change the digest");
    }
}
