//! Which shard a point lives on, and splitting a batch into per-shard parts.
//! Pure functions, tested without a network.

use shoal_proto::v1;

pub use shoal_proto::shard_for;

/// The points and deletes of a batch destined for one shard.
#[derive(Debug, Default, Clone, PartialEq)]
pub struct Part {
    pub points: Vec<v1::Point>,
    pub deletes: Vec<u64>,
}

impl Part {
    pub fn is_empty(&self) -> bool {
        self.points.is_empty() && self.deletes.is_empty()
    }
}

/// Splits a batch into exactly `shards` parts (some possibly empty), keeping
/// the batch's order within each part.
pub fn split(points: Vec<v1::Point>, deletes: Vec<u64>, shards: u32) -> Vec<Part> {
    let mut parts = vec![Part::default(); shards as usize];
    for p in points {
        parts[shard_for(p.id, shards) as usize].points.push(p);
    }
    for d in deletes {
        parts[shard_for(d, shards) as usize].deletes.push(d);
    }
    parts
}

/// Ids grouped by shard: `(shard, ids)` for every shard that has some.
pub fn group_ids(ids: &[u64], shards: u32) -> Vec<(u32, Vec<u64>)> {
    let mut by: Vec<Vec<u64>> = vec![Vec::new(); shards as usize];
    for &id in ids {
        by[shard_for(id, shards) as usize].push(id);
    }
    by.into_iter().enumerate().filter(|(_, v)| !v.is_empty()).map(|(s, v)| (s as u32, v)).collect()
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    #[test]
    fn sequential_ids_spread_evenly() {
        let shards = 7;
        let mut counts = [0u32; 7];
        for id in 0..70_000u64 {
            counts[shard_for(id, shards) as usize] += 1;
        }
        for c in counts {
            assert!((9_500..10_500).contains(&c), "{counts:?}");
        }
    }

    #[test]
    fn the_mapping_is_stable() {
        // Points on disk depend on these values; they must never change.
        assert_eq!([shard_for(0, 3), shard_for(1, 3), shard_for(2, 3), shard_for(u64::MAX, 3)], [2, 1, 1, 2]);
    }

    proptest! {
        #[test]
        fn split_keeps_every_item_once_in_its_shard(ids in proptest::collection::vec(any::<u64>(), 0..200), dels in proptest::collection::vec(any::<u64>(), 0..50), shards in 1u32..16) {
            let points: Vec<v1::Point> = ids.iter().map(|&id| v1::Point { id, vector: vec![], payload: None }).collect();
            let parts = split(points, dels.clone(), shards);
            prop_assert_eq!(parts.len(), shards as usize);
            let mut seen: Vec<u64> = Vec::new();
            for (s, part) in parts.iter().enumerate() {
                for p in &part.points { prop_assert_eq!(shard_for(p.id, shards), s as u32); seen.push(p.id); }
                for &d in &part.deletes { prop_assert_eq!(shard_for(d, shards), s as u32); }
            }
            let mut want = ids.clone();
            want.sort_unstable();
            seen.sort_unstable();
            prop_assert_eq!(seen, want);
            prop_assert_eq!(parts.iter().map(|p| p.deletes.len()).sum::<usize>(), dels.len());
        }
    }
}
