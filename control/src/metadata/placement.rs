//! Choosing nodes for new shards.

use shoal_proto::NodeId;

use crate::model::{Collection, Member, NodeState};

/// Nodes for `shard_count` new shards: each goes to the serving member
/// holding the fewest shards so far (ties by node id), so collections spread
/// evenly. Fewer than `shard_count` only when no member serves.
pub fn place<'a>(
    shard_count: u32,
    members: impl IntoIterator<Item = &'a Member>,
    existing: impl IntoIterator<Item = &'a Collection>,
) -> Vec<NodeId> {
    let mut load: Vec<(usize, &NodeId)> = members.into_iter().filter(|m| m.state == NodeState::Serving).map(|m| (0, &m.id)).collect();
    load.sort_by(|a, b| a.1.cmp(b.1));
    for c in existing {
        for s in &c.shards {
            for n in &s.replicas {
                if let Some(slot) = load.iter_mut().find(|(_, id)| *id == n) {
                    slot.0 += 1;
                }
            }
        }
    }
    let mut placement = Vec::with_capacity(shard_count as usize);
    for _ in 0..shard_count {
        let Some(slot) = load.iter_mut().enumerate().min_by_key(|(i, (l, _))| (*l, *i)).map(|(_, s)| s) else { break };
        slot.0 += 1;
        placement.push(slot.1.clone());
    }
    placement
}

#[cfg(test)]
mod tests {
    use shoal_proto::CollectionName;

    use super::*;
    use crate::model::{CollectionSpec, Metric, ShardPlacement};

    fn member(i: usize) -> Member {
        Member::configured(NodeId::parse(&format!("n{i}")).unwrap(), format!("http://127.0.0.1:{}", 7000 + i))
    }

    #[test]
    fn placement_balances_across_collections_and_skips_nodes_that_take_no_shards() {
        let mut members: Vec<Member> = (0..3).map(member).collect();
        let first = place(4, &members, []);
        let ids: Vec<&str> = first.iter().map(NodeId::as_str).collect();
        assert_eq!(ids, ["n0", "n1", "n2", "n0"]);
        let spec = CollectionSpec { dimension: 2, metric: Metric::Dot, index: Default::default(), shard_count: 4 };
        let existing =
            [Collection { name: CollectionName::parse("a").unwrap(), spec, shards: first.into_iter().map(ShardPlacement::on).collect() }];
        let second: Vec<String> = place(2, &members, &existing).iter().map(ToString::to_string).collect();
        assert_eq!(second, ["n1", "n2"]);
        members[1].state = NodeState::Draining;
        let third: Vec<String> = place(2, &members, &existing).iter().map(ToString::to_string).collect();
        assert_eq!(third, ["n2", "n0"]);
        assert!(place(3, &[], []).is_empty());
    }
}
