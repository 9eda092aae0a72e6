//! Shard epochs: writes stamped with an epoch below the shard's are
//! refused where they land, whatever the sender believes.

use shoal_engine::{Batch, BatchOutcome, CopyMode, Error, Index, IndexParams, Metric, Rejected, SearchParams, Write, Written};

use crate::common::{Fixture, random_batch, random_vector, rng, test_options};

/// Everything a refused write could have changed.
fn state(index: &Index) -> (u64, u64, u64, Vec<(String, u64)>) {
    let s = index.stats().unwrap();
    (s.live, s.last_seq, s.epoch, index.offsets().unwrap())
}

#[test]
fn a_write_below_the_shards_epoch_is_refused_and_changes_nothing() {
    let mut rng = rng("a_write_below_the_shards_epoch_is_refused_and_changes_nothing");
    let dim = 8;
    let f = Fixture::new(dim as u32, Metric::Cosine);
    assert_eq!(f.index.stats().unwrap().epoch, 1, "a new index starts at epoch 1");
    // A higher epoch is adopted with its batch.
    f.index.apply_fenced(random_batch(&mut rng, dim, 0..20).with_source("job", 1), 3).unwrap();
    assert_eq!(f.index.stats().unwrap().epoch, 3);
    let before = state(&f.index);
    for (batch, epoch) in [
        (random_batch(&mut rng, dim, 100..120).with_source("job", 2), 2),
        (random_batch(&mut rng, dim, 100..120), 1),
        // Even one the shard would skip as a replay.
        (random_batch(&mut rng, dim, 100..120).with_source("job", 1), 2),
    ] {
        match f.index.apply_fenced(batch, epoch) {
            Err(e @ Error::StaleEpoch { current: 3, .. }) => {
                assert_eq!(
                    e.to_string(),
                    format!("the shard is at epoch 3, the write carries {epoch}: its placement changed; re-read the placement")
                );
            }
            other => panic!("epoch {epoch} below 3 was not refused: {other:?}"),
        }
        assert_eq!(state(&f.index), before, "a refused write changed the shard");
        assert!(f.index.get(100).unwrap().is_none());
    }
    // The current epoch and the unfenced 0 are accepted; 0 raises nothing.
    assert!(matches!(f.index.apply_fenced(random_batch(&mut rng, dim, 20..30), 3), Ok(BatchOutcome::Applied { .. })));
    assert!(matches!(f.index.apply(random_batch(&mut rng, dim, 30..40)), Ok(BatchOutcome::Applied { .. })));
    assert_eq!(f.index.stats().unwrap().epoch, 3);
    // An invalid batch with a higher epoch leaves no trace, its epoch included.
    let mut bad = random_batch(&mut rng, dim, 40..45);
    bad.ops.push(shoal_engine::Op::Delete(9999));
    assert!(matches!(f.index.apply_fenced(bad, 9), Err(Error::Invalid(_))));
    assert_eq!(f.index.stats().unwrap().epoch, 3);
    // A skipped replay with a higher epoch still adopts it: it was accepted.
    assert_eq!(f.index.apply_fenced(Batch::default().with_source("job", 1), 4).unwrap(), BatchOutcome::Skipped { current: 1 });
    assert_eq!(f.index.stats().unwrap().epoch, 4);
}

#[test]
fn a_fence_refuses_older_writes_and_never_lowers_the_epoch() {
    let mut rng = rng("a_fence_refuses_older_writes_and_never_lowers_the_epoch");
    let dim = 8;
    let f = Fixture::new(dim as u32, Metric::Euclidean);
    f.index.apply_fenced(random_batch(&mut rng, dim, 0..10), 2).unwrap();
    let last_seq = f.index.stats().unwrap().last_seq;
    assert_eq!(f.index.fence(5).unwrap(), 5);
    // A fence is not a batch: no sequence number.
    assert_eq!(f.index.stats().unwrap().last_seq, last_seq);
    assert!(matches!(f.index.apply_fenced(random_batch(&mut rng, dim, 10..20), 2), Err(Error::StaleEpoch { current: 5, carried: 2 })));
    assert!(matches!(f.index.apply_fenced(random_batch(&mut rng, dim, 10..20), 4), Err(Error::StaleEpoch { current: 5, carried: 4 })));
    // Equal: nothing to do, fine. Lower (or 0): refused.
    assert_eq!(f.index.fence(5).unwrap(), 5);
    for lower in [4, 1, 0] {
        match f.index.fence(lower) {
            Err(e @ Error::EpochLowered { current: 5, .. }) => assert!(e.to_string().contains("cannot lower"), "{e}"),
            other => panic!("fence to {lower} under 5: {other:?}"),
        }
    }
    assert_eq!(f.index.stats().unwrap().epoch, 5);
    // Reads are never fenced.
    let q = random_vector(&mut rng, dim);
    assert_eq!(f.index.search(&q, SearchParams::new(3, 32)).unwrap().len(), 3);
    assert!(f.index.get(0).unwrap().is_some());
    assert!(matches!(f.index.apply_fenced(random_batch(&mut rng, dim, 10..20), 5), Ok(BatchOutcome::Applied { .. })));
}

/// In a group commit, writes are checked in order: batches queued before
/// a fence pass, those after it with an older epoch are refused, and the
/// group's other writes go ahead.
#[test]
fn a_fence_in_a_group_takes_effect_where_it_stands() {
    let mut rng = rng("a_fence_in_a_group_takes_effect_where_it_stands");
    let dim = 8;
    let f = Fixture::new(dim as u32, Metric::Dot);
    let outcomes = f
        .index
        .write(vec![
            Write::Batch { batch: random_batch(&mut rng, dim, 0..10), epoch: 1 },
            Write::Fence { epoch: 2 },
            Write::Batch { batch: random_batch(&mut rng, dim, 10..20), epoch: 1 },
            Write::Batch { batch: random_batch(&mut rng, dim, 20..30), epoch: 0 },
            Write::Fence { epoch: 1 },
            Write::Batch { batch: random_batch(&mut rng, dim, 30..40), epoch: 3 },
            Write::Batch { batch: random_batch(&mut rng, dim, 40..50), epoch: 2 },
        ])
        .unwrap();
    assert!(matches!(outcomes[0], Ok(Written::Batch { outcome: BatchOutcome::Applied { .. }, .. })));
    assert_eq!(outcomes[1], Ok(Written::Fenced { epoch: 2 }));
    assert_eq!(outcomes[2], Err(Rejected::StaleEpoch { current: 2, carried: 1 }));
    assert!(matches!(outcomes[3], Ok(Written::Batch { outcome: BatchOutcome::Applied { .. }, .. })));
    assert_eq!(outcomes[4], Err(Rejected::EpochLowered { current: 2, requested: 1 }));
    assert!(matches!(outcomes[5], Ok(Written::Batch { outcome: BatchOutcome::Applied { .. }, .. })));
    assert_eq!(outcomes[6], Err(Rejected::StaleEpoch { current: 3, carried: 2 }));
    // The applied batches took consecutive sequence numbers; fences and
    // refused writes took none.
    let seqs: Vec<Option<u64>> = outcomes
        .iter()
        .map(|o| match o {
            Ok(Written::Batch { seq, .. }) => *seq,
            _ => None,
        })
        .collect();
    assert_eq!(seqs, [Some(1), None, None, Some(2), None, Some(3), None]);
    let s = f.index.stats().unwrap();
    assert_eq!((s.epoch, s.live, s.last_seq), (3, 30, 3));
    assert!(f.index.get(15).unwrap().is_none() && f.index.get(45).unwrap().is_none());
}

/// The epoch lives in the environment: it survives a restart and travels
/// with a copy (what a snapshot is), like the batch log's numbers.
#[test]
fn the_epoch_survives_reopen_and_copy() {
    let mut rng = rng("the_epoch_survives_reopen_and_copy");
    let dim = 8;
    let dir = tempfile::tempdir().unwrap();
    let index = Index::open_or_create_at_epoch(dir.path().join("s"), IndexParams::new(dim, Metric::Cosine), 7, test_options()).unwrap();
    assert_eq!(index.stats().unwrap().epoch, 7, "created at the epoch asked for");
    index.apply_fenced(random_batch(&mut rng, dim as usize, 0..10), 7).unwrap();
    assert!(matches!(index.apply_fenced(random_batch(&mut rng, dim as usize, 0..10), 6), Err(Error::StaleEpoch { .. })));
    index.fence(9).unwrap();
    drop(index);
    // Reopened with the plain constructor: an existing index keeps its epoch.
    let index = Index::open_or_create(dir.path().join("s"), IndexParams::new(dim, Metric::Cosine), test_options()).unwrap();
    let s = index.stats().unwrap();
    assert_eq!((s.epoch, s.last_seq), (9, 1));
    let mut image = Vec::new();
    let info = index.copy_to(CopyMode::Compact, &mut image).unwrap();
    assert_eq!((info.epoch, info.last_seq), (9, 1));
    let copy_dir = tempfile::tempdir().unwrap();
    std::fs::write(copy_dir.path().join("data.mdb"), &image).unwrap();
    let copy = Index::open(copy_dir.path(), test_options()).unwrap();
    assert_eq!(copy.stats().unwrap().epoch, 9);
    assert!(matches!(copy.apply_fenced(random_batch(&mut rng, dim as usize, 0..10), 8), Err(Error::StaleEpoch { current: 9, carried: 8 })));
    // Creating at epoch 0 means 1.
    let zero = Fixture::with(IndexParams::new(dim, Metric::Cosine), test_options());
    assert_eq!(zero.index.stats().unwrap().epoch, 1);
    let dir0 = tempfile::tempdir().unwrap();
    let at0 = Index::open_or_create_at_epoch(dir0.path(), IndexParams::new(dim, Metric::Cosine), 0, test_options()).unwrap();
    assert_eq!(at0.stats().unwrap().epoch, 1);
}

/// Log entries are fenced like batches.
#[test]
fn log_entries_are_fenced_too() {
    let mut rng = rng("log_entries_are_fenced_too");
    let dim = 8;
    let a = Fixture::new(dim as u32, Metric::Cosine);
    let b = Fixture::new(dim as u32, Metric::Cosine);
    a.index.apply(random_batch(&mut rng, dim, 0..10)).unwrap();
    b.index.fence(4).unwrap();
    let entries = a.index.read_log(1, u64::MAX).unwrap().entries;
    assert!(matches!(b.index.apply_log(entries.clone(), 3), Err(Error::StaleEpoch { current: 4, carried: 3 })));
    assert_eq!(b.index.stats().unwrap().last_seq, 0);
    let applied = b.index.apply_log(entries, 5).unwrap();
    assert_eq!((applied.applied, applied.last_seq), (1, 1));
    assert_eq!(b.index.stats().unwrap().epoch, 5);
}
