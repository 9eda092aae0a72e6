//! Gathering per-shard results into the global top-k. Pure.

use std::cmp::Ordering;

use shoal_proto::v1;

/// The `k` closest hits over all shards' lists, closest first; equal
/// distances are ordered by id so the result does not depend on which
/// shard answered first.
pub fn merge_top_k(lists: Vec<Vec<v1::Hit>>, k: usize) -> Vec<v1::Hit> {
    let mut all: Vec<v1::Hit> = lists.into_iter().flatten().collect();
    let cmp = |a: &v1::Hit, b: &v1::Hit| a.distance.total_cmp(&b.distance).then(a.id.cmp(&b.id));
    if all.len() > k {
        all.select_nth_unstable_by(k, cmp);
        all.truncate(k);
    }
    all.sort_unstable_by(cmp);
    all
}

/// Orders hits like [`merge_top_k`] (exposed for tests and callers that
/// merge incrementally).
pub fn hit_order(a: &v1::Hit, b: &v1::Hit) -> Ordering {
    a.distance.total_cmp(&b.distance).then(a.id.cmp(&b.id))
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn hit(id: u64, distance: f32) -> v1::Hit {
        v1::Hit { id, distance, payload: None }
    }

    proptest! {
        #[test]
        fn merge_equals_sorting_everything(lists in proptest::collection::vec(proptest::collection::vec((any::<u64>(), -10.0f32..10.0), 0..20), 0..6), k in 1usize..30) {
            let lists: Vec<Vec<v1::Hit>> = lists.into_iter().map(|l| l.into_iter().map(|(i, d)| hit(i, d)).collect()).collect();
            let mut want: Vec<v1::Hit> = lists.iter().flatten().cloned().collect();
            want.sort_by(hit_order);
            want.truncate(k);
            prop_assert_eq!(merge_top_k(lists, k), want);
        }
    }
}
