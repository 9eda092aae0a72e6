//! Stopping searches from outside: a deadline, a caller's flag, and no
//! effect on searches that are not stopped.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use proptest::prelude::*;
use shoal_engine::{Batch, Error, IndexParams, Metric, Op, Point, SearchParams, Stop};

use crate::common::{Fixture, random_batch, random_vector, rng, test_options};

/// Tries of each mid-search stop; one within the bound passes.
const TRIES: usize = 20;

/// A search that expands every node of a 30k-point index takes
/// milliseconds; stopped, it must end within microseconds of the stop (a
/// check every few expansions). The bound is a tenth of the full search,
/// and a stopped try costs a twentieth of it, so on a busy machine (where
/// the searching thread may be descheduled just then) the best of several
/// tries is what counts.
#[test]
fn a_long_search_stops_soon_after_its_deadline_or_flag() {
    let mut rng = rng("a_long_search_stops_soon_after_its_deadline_or_flag");
    let dim = 32;
    // A sparse graph built in one batch is enough: the search visits
    // every node anyway.
    let fx = Fixture::with(IndexParams::new(dim as u32, Metric::Euclidean).with_m(8).with_ef_construction(16), test_options());
    fx.index.apply(random_batch(&mut rng, dim, 0..30_000)).unwrap();
    let query = random_vector(&mut rng, dim);
    // The walk is nearly all of this search (ef covers every node, few
    // candidates are re-scored), so a stop that only took effect after it
    // would be late by most of the search.
    let sp = SearchParams { k: 10, ef: shoal_engine::MAX_EF, with_payload: true };
    let full = (0..3)
        .map(|_| {
            let t = Instant::now();
            assert_eq!(fx.index.search(&query, sp).unwrap().len(), 10);
            t.elapsed()
        })
        .min()
        .unwrap();
    eprintln!("full search: {full:?}");

    // Already stopped: no work at all.
    for (stop, deadline_passed) in [(Stop::at(Instant::now()), true), (Stop::never().with_flag(Arc::new(AtomicBool::new(true))), false)] {
        let t = Instant::now();
        match fx.index.search_until(&query, sp, &stop) {
            Err(Error::Stopped { deadline_passed: d }) => assert_eq!(d, deadline_passed),
            other => panic!("expected Stopped, got {other:?}"),
        }
        assert!(t.elapsed() < full / 10, "stopped after {:?} (full search {full:?})", t.elapsed());
        let mut snap = fx.index.snapshot().unwrap();
        assert!(matches!(snap.search_until(&query, sp, &stop), Err(Error::Stopped { .. })));
    }

    // Stopped mid-way, from another thread: how long after the flag was
    // set did the search return? A try where the setting thread ran late,
    // with most of the search behind it, proves little, and one whose
    // search was descheduled right after the flag may miss the bound:
    // retry those, and those where the flag was up before the search
    // began. The setter spins rather than sleeps: waking from a sleep on a
    // busy machine can take longer than the whole search.
    let mut late = Duration::MAX;
    for _ in 0..TRIES {
        let flag = Arc::new(AtomicBool::new(false));
        let stop = Stop::never().with_flag(Arc::clone(&flag));
        let start = Barrier::new(2);
        let (result, started, ended, set_at) = std::thread::scope(|s| {
            let setter = s.spawn(|| {
                start.wait();
                let at = Instant::now() + full / 20;
                while Instant::now() < at {
                    std::hint::spin_loop();
                }
                let at = Instant::now();
                flag.store(true, Ordering::Relaxed);
                at
            });
            start.wait();
            let started = Instant::now();
            let result = fx.index.search_until(&query, sp, &stop);
            (result, started, Instant::now(), setter.join().unwrap())
        });
        // Set before the walk began (the search thread was late), or
        // after most of it: not a mid-walk stop.
        let into = set_at.saturating_duration_since(started);
        if into < full / 40 || into > full / 2 {
            continue;
        }
        assert!(matches!(result, Err(Error::Stopped { deadline_passed: false })), "got {result:?}");
        late = late.min(ended.saturating_duration_since(set_at));
        if late < full / 10 {
            break;
        }
    }
    assert!(late < full / 10, "a cancelled search returned {late:?} after the flag (full search {full:?})");

    let mut late = Duration::MAX;
    for _ in 0..TRIES {
        let deadline = Instant::now() + full / 20;
        let result = fx.index.search_until(&query, sp, &Stop::at(deadline));
        let ended = Instant::now();
        assert!(matches!(result, Err(Error::Stopped { deadline_passed: true })), "got {result:?}");
        late = late.min(ended.saturating_duration_since(deadline));
        if late < full / 10 {
            break;
        }
    }
    assert!(late < full / 10, "a search returned {late:?} after its deadline (full search {full:?})");

    // A stopped search leaves its session fit for the next one.
    assert_eq!(fx.index.search(&query, sp).unwrap().len(), 10);
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 32, ..ProptestConfig::default() })]

    /// A stop that does not fire changes nothing: same hits, same order,
    /// same distances and payloads as `search`, tombstones included.
    #[test]
    fn search_until_without_a_stop_returns_what_search_returns(
        points in proptest::collection::vec(proptest::collection::vec(-1.0f32..1.0, 8), 1..300),
        deletes in proptest::collection::vec(any::<prop::sample::Index>(), 0..40),
        queries in proptest::collection::vec(proptest::collection::vec(-1.0f32..1.0, 8), 1..5),
        k in 1usize..30,
        ef in 1usize..120,
        with_payload in any::<bool>(),
    ) {
        let fx = Fixture::with(IndexParams::new(8, Metric::Euclidean), test_options());
        let ops = points
            .iter()
            .enumerate()
            .map(|(i, v)| Op::Upsert(Point { id: i as u64, vector: v.clone(), payload: (i % 3 == 0).then(|| vec![i as u8]) }))
            .collect();
        fx.index.apply(Batch { ops, source: None }).unwrap();
        let mut gone: Vec<u64> = deletes.iter().map(|d| d.index(points.len()) as u64).collect();
        gone.sort_unstable();
        gone.dedup();
        gone.truncate(points.len() - 1);
        if !gone.is_empty() {
            fx.index.apply(Batch { ops: gone.into_iter().map(Op::Delete).collect(), source: None }).unwrap();
        }
        let sp = SearchParams { k, ef, with_payload };
        let unfired = Stop::at(Instant::now() + Duration::from_secs(3600)).with_flag(Arc::new(AtomicBool::new(false)));
        for q in &queries {
            let want = fx.index.search(q, sp).unwrap();
            prop_assert_eq!(&fx.index.search_until(q, sp, &Stop::never()).unwrap(), &want);
            prop_assert_eq!(&fx.index.search_until(q, sp, &unfired).unwrap(), &want);
            let mut snap = fx.index.snapshot().unwrap();
            prop_assert_eq!(&snap.search_until(q, sp, &unfired).unwrap(), &want);
        }
    }
}
