//! Choosing nodes: for new shards, for shards leaving a draining node,
//! and for evening out the load. Pure functions of a view, so the rules
//! are tested without a cluster.

use std::collections::BTreeMap;

use shoal_proto::{CollectionName, NodeId};

use crate::model::{Collection, Member, MovePhase, NodeState};

/// The load every node carries: each copy it holds, plus each copy being
/// made on it (a move's target), so that choices made while moves run do
/// not all land on the same node.
fn holdings<'a>(existing: impl IntoIterator<Item = &'a Collection>) -> BTreeMap<NodeId, usize> {
    let mut load = BTreeMap::new();
    for c in existing {
        for s in &c.shards {
            for n in &s.replicas {
                *load.entry(n.clone()).or_insert(0) += 1;
            }
            if let Some(m) = s.moving.as_ref().filter(|m| m.phase == MovePhase::Copying) {
                *load.entry(m.to.clone()).or_insert(0) += 1;
            }
        }
    }
    load
}

/// Nodes for `shard_count` new shards: each goes to the serving member
/// holding the fewest shards so far (ties by node id), so collections spread
/// evenly. Fewer than `shard_count` only when no member serves.
pub fn place<'a>(
    shard_count: u32,
    members: impl IntoIterator<Item = &'a Member>,
    existing: impl IntoIterator<Item = &'a Collection>,
) -> Vec<NodeId> {
    let held = holdings(existing);
    let mut load: Vec<(usize, &NodeId)> =
        members.into_iter().filter(|m| m.state == NodeState::Serving).map(|m| (held.get(&m.id).copied().unwrap_or(0), &m.id)).collect();
    load.sort_by(|a, b| a.1.cmp(b.1));
    let mut placement = Vec::with_capacity(shard_count as usize);
    for _ in 0..shard_count {
        let Some(slot) = load.iter_mut().enumerate().min_by_key(|(i, (l, _))| (*l, *i)).map(|(_, s)| s) else { break };
        slot.0 += 1;
        placement.push(slot.1.clone());
    }
    placement
}

/// One move a plan makes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedMove {
    pub collection: CollectionName,
    pub shard: u32,
    pub from: NodeId,
    pub to: NodeId,
}

/// Moves that even out the shards among the serving `members`: from the
/// node holding the most to the one holding the fewest, until no two
/// differ by more than one. Shards already moving stay where they go, and
/// a node never receives a shard it already holds.
pub fn rebalance<'a>(members: impl IntoIterator<Item = &'a Member>, existing: &[&Collection]) -> Vec<PlannedMove> {
    let held = holdings(existing.iter().copied());
    let mut load: BTreeMap<NodeId, usize> = members
        .into_iter()
        .filter(|m| m.state == NodeState::Serving)
        .map(|m| (m.id.clone(), held.get(&m.id).copied().unwrap_or(0)))
        .collect();
    // Candidates: every shard not moving, by node.
    let mut movable: BTreeMap<NodeId, Vec<(CollectionName, u32)>> = BTreeMap::new();
    for c in existing {
        for (i, s) in c.shards.iter().enumerate() {
            if s.moving.is_none() && load.contains_key(s.node()) {
                movable.entry(s.node().clone()).or_default().push((c.name.clone(), i as u32));
            }
        }
    }
    let mut plan = Vec::new();
    // Ties broken by node id, so a plan is the same on every run.
    while let Some((max_node, max)) = load.iter().max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0))).map(|(n, l)| (n.clone(), *l)) {
        let Some((min_node, min)) = load.iter().min_by(|a, b| a.1.cmp(b.1).then(a.0.cmp(b.0))).map(|(n, l)| (n.clone(), *l)) else {
            break;
        };
        if max <= min + 1 {
            break;
        }
        let Some((collection, shard)) = movable.get_mut(&max_node).and_then(Vec::pop) else { break };
        *load.entry(max_node.clone()).or_insert(0) -= 1;
        *load.entry(min_node.clone()).or_insert(0) += 1;
        plan.push(PlannedMove { collection, shard, from: max_node, to: min_node });
    }
    plan
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

    fn collection(name: &str, nodes: &[&str]) -> Collection {
        let spec = CollectionSpec { dimension: 2, metric: Metric::Dot, index: Default::default(), shard_count: nodes.len() as u32 };
        let shards = nodes.iter().map(|n| ShardPlacement::on(NodeId::parse(n).unwrap())).collect();
        Collection { name: CollectionName::parse(name).unwrap(), spec, shards }
    }

    #[test]
    fn a_copy_being_made_counts_as_load_on_its_target() {
        let members: Vec<Member> = (0..3).map(member).collect();
        let mut a = collection("a", &["n0", "n1"]);
        a.shards[0].moving = Some(crate::model::ShardMove {
            from: NodeId::parse("n0").unwrap(),
            to: NodeId::parse("n2").unwrap(),
            phase: MovePhase::Copying,
            attempt: 0,
        });
        // n2 is receiving one: the next shard goes to n0, which it leaves.
        assert_eq!(place(1, &members, [&a]).iter().map(NodeId::as_str).collect::<Vec<_>>(), ["n0"]);
    }

    #[test]
    fn rebalance_evens_out_to_within_one_and_never_moves_a_moving_shard() {
        let mut members: Vec<Member> = (0..4).map(member).collect();
        let a = collection("a", &["n0", "n0", "n0", "n0", "n0", "n1"]);
        let plan = rebalance(&members, &[&a]);
        let moves: Vec<(u32, &str, &str)> = plan.iter().map(|m| (m.shard, m.from.as_str(), m.to.as_str())).collect();
        assert_eq!(moves, [(4, "n0", "n2"), (3, "n0", "n3"), (2, "n0", "n1")]);
        // Applying the plan leaves a balanced cluster, which plans nothing.
        let mut after = a.clone();
        for m in &plan {
            after.shards[m.shard as usize] = ShardPlacement::on(m.to.clone());
        }
        assert!(rebalance(&members, &[&after]).is_empty());

        // A draining node is not a target; its shards are the drain's.
        members[3].state = NodeState::Draining;
        assert!(rebalance(&members, &[&a]).iter().all(|m| m.to.as_str() != "n3" && m.from.as_str() == "n0"));
        let mut moving = a.clone();
        for s in &mut moving.shards[..5] {
            s.moving = Some(crate::model::ShardMove {
                from: NodeId::parse("n0").unwrap(),
                to: NodeId::parse("n9").unwrap(),
                phase: MovePhase::Copying,
                attempt: 0,
            });
        }
        assert!(rebalance(&members, &[&moving]).is_empty(), "nothing left to move on n0");
    }
}
