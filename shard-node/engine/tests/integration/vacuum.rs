//! The online vacuum: tombstones leave the graph in bounded steps, answers
//! stay right, slots come back to new points, and a step killed half-way
//! leaves the index whole.

use std::collections::BTreeMap;
use std::path::Path;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use shoal_engine::{Batch, Index, IndexOptions, IndexParams, Metric, Op, Point, SearchParams};

use crate::common::{Fixture, brute_force, random_vector, rng, spawn_child, test_options};

const DIM: usize = 16;

fn upserts(points: &BTreeMap<u64, Vec<f32>>) -> Batch {
    Batch {
        ops: points.iter().map(|(&id, v)| Op::Upsert(Point { id, vector: v.clone(), payload: Some(id.to_le_bytes().to_vec()) })).collect(),
        source: None,
    }
}

/// recall@10 at ef=64 against brute force; every hit must be live.
fn recall(index: &Index, points: &BTreeMap<u64, Vec<f32>>, queries: &[Vec<f32>]) -> f64 {
    let model: Vec<(u64, Vec<f32>)> = points.iter().map(|(id, v)| (*id, v.clone())).collect();
    let (mut hits, mut total) = (0, 0);
    for q in queries {
        let want: Vec<u64> = brute_force(Metric::Cosine, &model, q, 10).into_iter().map(|(id, _)| id).collect();
        let got = index.search(q, SearchParams::new(10, 64)).unwrap();
        for h in &got {
            assert!(points.contains_key(&h.id), "search returned {}, which is deleted", h.id);
        }
        hits += got.iter().filter(|h| want.contains(&h.id)).count();
        total += want.len();
    }
    hits as f64 / total as f64
}

/// 2,000 points, 40% of them deleted: tombstones well past the ratio.
fn churned(rng: &mut StdRng, opts: IndexOptions) -> (Fixture, BTreeMap<u64, Vec<f32>>) {
    let fx = Fixture::with(IndexParams::new(DIM as u32, Metric::Cosine), opts);
    let mut points: BTreeMap<u64, Vec<f32>> = (0..2000).map(|id| (id, random_vector(rng, DIM))).collect();
    fx.index.apply(upserts(&points)).unwrap();
    let mut ids: Vec<u64> = points.keys().copied().collect();
    ids.shuffle(rng);
    for chunk in ids[..800].chunks(200) {
        fx.index.apply(Batch { ops: chunk.iter().map(|&id| Op::Delete(id)).collect(), source: None }).unwrap();
        for id in chunk {
            points.remove(id);
        }
    }
    (fx, points)
}

#[test]
fn a_vacuum_that_started_runs_until_every_tombstone_is_vacuumed() {
    let mut rng = rng("a_vacuum_that_started_runs_until_every_tombstone_is_vacuumed");
    // 800 tombstones in 2,000 nodes: past a ratio of 0.3, and below it
    // after the first step of 300.
    let opts = IndexOptions { vacuum_ratio: 0.3, ..test_options() };
    let (fx, _) = churned(&mut rng, opts);
    assert!(fx.index.vacuum_due().unwrap());
    let mut steps = 0;
    while fx.index.vacuum_due().unwrap() {
        let o = fx.index.vacuum(300).unwrap();
        steps += 1;
        assert!(o.vacuumed > 0 && steps <= 3, "step {steps}: {o:?}");
    }
    let s = fx.index.stats().unwrap();
    assert!(s.vacuumed >= 799, "stopped at {s:?} after {steps} steps instead of running to the end");
    assert_eq!(steps, 3);
}

#[test]
fn vacuum_unlinks_tombstones_in_steps_and_slots_come_back() {
    let mut rng = rng("vacuum_unlinks_tombstones_in_steps_and_slots_come_back");
    let (fx, mut points) = churned(&mut rng, test_options());
    let queries: Vec<Vec<f32>> = (0..40).map(|_| random_vector(&mut rng, DIM)).collect();
    let before = recall(&fx.index, &points, &queries);
    assert!(fx.index.vacuum_due().unwrap(), "800 tombstones in 2,000 nodes are past the default ratio");
    let s = fx.index.stats().unwrap();
    assert_eq!((s.tombstones, s.vacuumed), (800, 0));
    let mut steps = 0;
    loop {
        let o = fx.index.vacuum(150).unwrap();
        steps += 1;
        let s = fx.index.stats().unwrap();
        assert_eq!(s.vacuumed + o.pending, 800, "step {steps}: {o:?} {s:?}");
        assert!(o.vacuumed <= 150);
        if o.vacuumed == 0 {
            break;
        }
        // Searches stay right between steps.
        assert!(recall(&fx.index, &points, &queries) >= before - 0.05, "step {steps}");
    }
    assert!(steps >= 6, "800 tombstones in steps of 150 take 6 steps, took {steps}");
    let s = fx.index.stats().unwrap();
    assert!(s.vacuumed >= 799, "all but a retired entry point: {s:?}");
    assert!(!fx.index.vacuum_due().unwrap());
    let after = recall(&fx.index, &points, &queries);
    assert!(after >= before - 0.02 && after >= 0.9, "recall {before} before the vacuum, {after} after");
    // Payloads of live points are untouched; the vacuumed points' are gone.
    for (&id, _) in points.iter().step_by(29) {
        assert_eq!(fx.index.get(id).unwrap().unwrap().payload, Some(id.to_le_bytes().to_vec()));
    }
    // New points take the vacuumed slots: no new node until they run out.
    let nodes = s.live + s.tombstones;
    let new: BTreeMap<u64, Vec<f32>> = (5000..5600).map(|id| (id, random_vector(&mut rng, DIM))).collect();
    fx.index.apply(upserts(&new)).unwrap();
    points.extend(new);
    let s = fx.index.stats().unwrap();
    assert_eq!(s.live + s.tombstones, nodes, "{s:?}");
    assert_eq!(s.tombstones, 200, "{s:?}");
    let fx = fx.reopen(test_options());
    let refilled = recall(&fx.index, &points, &queries);
    assert!(refilled >= before - 0.03, "recall {before} before the vacuum, {refilled} with the slots refilled");
    for (&id, v) in points.range(5000..).step_by(17) {
        let got = fx.index.get(id).unwrap().unwrap();
        let norm = v.iter().map(|x| x * x).sum::<f32>().sqrt();
        assert!(got.vector.iter().zip(v).all(|(a, b)| (a - b / norm).abs() < 1e-5), "vector of {id} in a reused slot");
    }
}

const CHILD: &str = "SHOAL_TEST_VACUUM_CHILD";
const NAME: &str = "vacuum::a_vacuum_killed_mid_step_leaves_the_index_whole";

/// The child: vacuum steps on an index until killed, telling the parent
/// after each one.
fn vacuum_until_killed(dir: &Path) {
    let opts = IndexOptions { durable: true, ..test_options() };
    let index = Index::open(dir, opts).expect("the child opens the index");
    loop {
        let o = index.vacuum(40).expect("vacuum step");
        println!("step vacuumed={} pending={}", o.vacuumed, o.pending);
        if o.vacuumed == 0 {
            println!("done");
            std::thread::sleep(Duration::from_secs(60));
        }
    }
}

#[test]
fn a_vacuum_killed_mid_step_leaves_the_index_whole() {
    if let Ok(dir) = std::env::var(CHILD) {
        vacuum_until_killed(Path::new(&dir));
        return;
    }
    let mut rng = rng("a_vacuum_killed_mid_step_leaves_the_index_whole");
    let (fx, points) = churned(&mut rng, IndexOptions { durable: true, ..test_options() });
    let queries: Vec<Vec<f32>> = (0..40).map(|_| random_vector(&mut rng, DIM)).collect();
    let before = recall(&fx.index, &points, &queries);
    let Fixture { dir: tmp, index } = fx;
    drop(index);
    let dir = tmp.path().join("shard");
    let (mut child, mut lines) = spawn_child(NAME, CHILD, &dir);
    let t0 = Instant::now();
    let mut steps = 0;
    // Killed (SIGKILL) right after its third step reported: somewhere in
    // the fourth step's transaction.
    while steps < 3 {
        let line = lines.next().expect("the child stopped talking").unwrap();
        if line.starts_with("step ") {
            steps += 1;
        }
        assert!(t0.elapsed() < Duration::from_secs(120), "the child is too slow");
    }
    child.kill().unwrap();
    child.wait().unwrap();
    let index = Index::open(&dir, test_options()).expect("the index opens after the kill");
    let s = index.stats().unwrap();
    assert!(s.vacuumed >= 120 && s.vacuumed.is_multiple_of(40), "whole steps only: {s:?}");
    assert_eq!((s.live, s.tombstones), (1200, 800));
    assert!(recall(&index, &points, &queries) >= before - 0.05);
    while index.vacuum(500).unwrap().vacuumed > 0 {}
    assert!(index.stats().unwrap().vacuumed >= 799);
    let after = recall(&index, &points, &queries);
    assert!(after >= before - 0.02, "recall {before} before the vacuum, {after} after");
    drop(tmp);
}

/// Points written into reused slots are found as well as points given new
/// ids: each is the nearest hit for its own vector. Lists of live nodes
/// still name retired slots (links no repair or vacuum found), so before
/// reused nodes were hidden from walks until linked (`Overlay::reused_linked`), an insert could step
/// onto a reused node whose lists were still empty and link to the few far
/// nodes that dead end offered: in about half of the tries, up to 57 of
/// 600 points were then missed.
#[test]
fn points_in_reused_slots_are_found_by_their_own_vector() {
    let mut rng = rng("points_in_reused_slots_are_found_by_their_own_vector");
    // Three tries each way: the dead end is met in about half of them.
    for vacuum in [false, true, false, true, false, true] {
        let fx = Fixture::with(IndexParams::new(DIM as u32, Metric::Cosine), test_options());
        let points: BTreeMap<u64, Vec<f32>> = (0..2000).map(|id| (id, random_vector(&mut rng, DIM))).collect();
        fx.index.apply(upserts(&points)).unwrap();
        // 40% deleted at once: lists of live nodes name many retired slots.
        fx.index.apply(Batch { ops: (0..2000).filter(|id| id % 5 < 2).map(Op::Delete).collect(), source: None }).unwrap();
        if vacuum {
            while fx.index.vacuum(150).unwrap().vacuumed > 0 {}
        }
        let new: BTreeMap<u64, Vec<f32>> = (5000..5600).map(|id| (id, random_vector(&mut rng, DIM))).collect();
        fx.index.apply(upserts(&new)).unwrap();
        let s = fx.index.stats().unwrap();
        assert_eq!((s.live + s.tombstones, s.tombstones), (2000, 200), "every new point took a retired slot: {s:?}");
        let missed: Vec<u64> = new
            .iter()
            .filter(|(id, v)| fx.index.search(v, SearchParams::new(1, 64)).unwrap().first().map(|h| h.id) != Some(**id))
            .map(|(id, _)| *id)
            .collect();
        assert!(missed.len() <= 2, "vacuumed first: {vacuum}; {} of 600 points in reused slots not found: {missed:?}", missed.len());
    }
}
