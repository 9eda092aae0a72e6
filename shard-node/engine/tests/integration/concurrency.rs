//! Many readers while one writer commits.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use shoal_engine::{Metric, Op, SearchParams};

use crate::common::{Fixture, random_batch, random_vector, rng};

#[test]
fn many_threads_search_while_one_writes() {
    let mut rng = rng("many_threads_search_while_one_writes");
    let dim = 32;
    let fx = Arc::new(Fixture::new(dim, Metric::Cosine));
    fx.index.apply(random_batch(&mut rng, dim as usize, 0..500)).unwrap();
    let done = Arc::new(AtomicBool::new(false));
    let searches = Arc::new(AtomicU64::new(0));
    let readers: Vec<_> = (0..6)
        .map(|t| {
            let (fx, done, searches) = (Arc::clone(&fx), Arc::clone(&done), Arc::clone(&searches));
            let mut rng = crate::common::rng(&format!("reader {t}"));
            std::thread::spawn(move || {
                let mut last_live = 0;
                while !done.load(Ordering::Relaxed) {
                    let q = random_vector(&mut rng, dim as usize);
                    let mut snap = fx.index.snapshot().unwrap();
                    let live = snap.len();
                    assert!(live >= last_live, "live count went back from {last_live} to {live}");
                    last_live = live;
                    // Every commit adds 200 points and deletes 100: any other
                    // count would be a half-applied batch.
                    assert!(live == 500 || (live - 500) % 100 == 0 && live <= 500 + 20 * 100, "live = {live}");
                    let rounds = (live - 500) / 100;
                    // The last committed round's first and last point are
                    // both there; the previous round's odd ids are gone.
                    if rounds > 0 {
                        let start = 500 + (rounds - 1) * 200;
                        assert!(snap.get(start).unwrap().is_some() && snap.get(start + 199).unwrap().is_some());
                        if rounds > 1 {
                            assert!(snap.get(start - 199).unwrap().is_none(), "round {rounds}: delete not applied");
                        }
                    }
                    let hits = snap.search(&q, SearchParams::new(10, 32)).unwrap();
                    assert_eq!(hits.len(), 10);
                    for h in &hits {
                        assert!(snap.get(h.id).unwrap().is_some(), "hit {} is not in its own snapshot", h.id);
                    }
                    drop(snap);
                    assert_eq!(fx.index.search(&q, SearchParams::new(5, 16)).unwrap().len(), 5);
                    searches.fetch_add(1, Ordering::Relaxed);
                }
            })
        })
        .collect();
    for round in 0..20u64 {
        let start = 500 + round * 200;
        let mut batch = random_batch(&mut rng, dim as usize, start..start + 200);
        // Delete the odd ids of the previous round, in the same batch.
        if round > 0 {
            batch.ops.extend((start - 199..start).step_by(2).map(Op::Delete));
        } else {
            batch.ops.extend((1..200).step_by(2).map(Op::Delete));
        }
        fx.index.apply(batch).unwrap();
    }
    done.store(true, Ordering::Relaxed);
    for r in readers {
        r.join().expect("reader panicked");
    }
    assert!(searches.load(Ordering::Relaxed) > 0);
    assert_eq!(fx.index.stats().unwrap().live, 500 + 20 * 100);
    assert!(fx.index.get(start_of(19) + 1).unwrap().is_some());
    assert!(fx.index.get(start_of(18) + 1).unwrap().is_none());
}

fn start_of(round: u64) -> u64 {
    500 + round * 200
}
