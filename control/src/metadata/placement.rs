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
            for n in s.nodes() {
                *load.entry(n.clone()).or_insert(0) += 1;
            }
            if let Some(m) = s.moving.as_ref().filter(|m| m.phase == MovePhase::Copying && !s.holds(&m.to)) {
                *load.entry(m.to.clone()).or_insert(0) += 1;
            }
        }
    }
    load
}

/// Nodes for `shard_count` new single-copy shards: see [`place_replicas`].
pub fn place<'a>(
    shard_count: u32,
    members: impl IntoIterator<Item = &'a Member>,
    existing: impl IntoIterator<Item = &'a Collection>,
) -> Vec<NodeId> {
    place_replicas(shard_count, 1, members, existing).into_iter().flatten().collect()
}

/// Nodes for the `factor` replicas of each of `shard_count` new shards:
/// each replica goes to the serving member holding the fewest copies so
/// far (ties by node id) that has no replica of the same shard yet, so
/// collections spread evenly. A shard gets fewer than `factor` nodes only
/// when fewer members serve; none only when no member serves.
pub fn place_replicas<'a>(
    shard_count: u32,
    factor: u32,
    members: impl IntoIterator<Item = &'a Member>,
    existing: impl IntoIterator<Item = &'a Collection>,
) -> Vec<Vec<NodeId>> {
    let held = holdings(existing);
    let mut load: Vec<(usize, &NodeId)> =
        members.into_iter().filter(|m| m.state == NodeState::Serving).map(|m| (held.get(&m.id).copied().unwrap_or(0), &m.id)).collect();
    load.sort_by(|a, b| a.1.cmp(b.1));
    let mut placement = Vec::with_capacity(shard_count as usize);
    for _ in 0..shard_count {
        let mut nodes: Vec<NodeId> = Vec::with_capacity(factor as usize);
        for _ in 0..factor {
            let Some(slot) =
                load.iter_mut().enumerate().filter(|(_, (_, n))| !nodes.contains(n)).min_by_key(|(i, (l, _))| (*l, *i)).map(|(_, s)| s)
            else {
                break;
            };
            slot.0 += 1;
            nodes.push(slot.1.clone());
        }
        if nodes.is_empty() {
            break;
        }
        placement.push(nodes);
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

/// Moves that even out the copies among the serving `members`: from the
/// node holding the most to the one holding the fewest, until no two
/// differ by more than one. Shards already moving stay where they go, and
/// a node never receives a copy of a shard it already holds.
pub fn rebalance<'a>(members: impl IntoIterator<Item = &'a Member>, existing: &[&Collection]) -> Vec<PlannedMove> {
    let held = holdings(existing.iter().copied());
    let mut load: BTreeMap<NodeId, usize> = members
        .into_iter()
        .filter(|m| m.state == NodeState::Serving)
        .map(|m| (m.id.clone(), held.get(&m.id).copied().unwrap_or(0)))
        .collect();
    // Candidates: every copy of a shard not moving, by node; and where
    // each shard has copies.
    let mut movable: BTreeMap<NodeId, Vec<(CollectionName, u32)>> = BTreeMap::new();
    let mut holders: BTreeMap<(CollectionName, u32), Vec<NodeId>> = BTreeMap::new();
    for c in existing {
        for (i, s) in c.shards.iter().enumerate() {
            holders.insert((c.name.clone(), i as u32), s.nodes().cloned().collect());
            for n in s.nodes().filter(|n| s.moving.is_none() && load.contains_key(*n)) {
                movable.entry(n.clone()).or_default().push((c.name.clone(), i as u32));
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
        // The last candidate whose shard has no copy on the target yet.
        let Some(candidates) = movable.get_mut(&max_node) else { break };
        let Some(pick) = candidates.iter().rposition(|k| !holders.get(k).is_some_and(|h| h.contains(&min_node))) else { break };
        let (collection, shard) = candidates.remove(pick);
        if let Some(h) = holders.get_mut(&(collection.clone(), shard)) {
            h.retain(|n| n != &max_node);
            h.push(min_node.clone());
        }
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
        let existing = [Collection {
            name: CollectionName::parse("a").unwrap(),
            spec,
            replication: Default::default(),
            shards: first.into_iter().map(ShardPlacement::on).collect(),
            fields: Vec::new(),
        }];
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
        Collection { name: CollectionName::parse(name).unwrap(), spec, replication: Default::default(), shards, fields: Vec::new() }
    }

    #[test]
    fn replicas_of_a_shard_land_on_distinct_nodes_and_spread_evenly() {
        let mut members: Vec<Member> = (0..3).map(member).collect();
        let placed = place_replicas(3, 2, &members, []);
        let names: Vec<Vec<&str>> = placed.iter().map(|s| s.iter().map(NodeId::as_str).collect()).collect();
        assert_eq!(names, [["n0", "n1"], ["n2", "n0"], ["n1", "n2"]]);
        // More replicas than serving nodes: as many as there are nodes.
        members[2].state = NodeState::Draining;
        assert_eq!(place_replicas(1, 3, &members, []), [vec![NodeId::parse("n0").unwrap(), NodeId::parse("n1").unwrap()]]);
        assert!(place_replicas(2, 2, &[], []).is_empty());
    }

    #[test]
    fn rebalance_never_puts_two_copies_of_a_shard_on_one_node() {
        let members: Vec<Member> = (0..3).map(member).collect();
        let node = |n: &str| NodeId::parse(n).unwrap();
        // n0 and n1 hold both copies of every shard; n2 is new.
        let mut a = collection("a", &["n0", "n0", "n0", "n0"]);
        for s in &mut a.shards {
            *s = ShardPlacement::on_all(vec![node("n0"), node("n1")], 1);
        }
        let plan = rebalance(&members, &[&a]);
        assert!(!plan.is_empty());
        let mut after = a.clone();
        for m in &plan {
            let s = &mut after.shards[m.shard as usize];
            assert!(!s.holds(&m.to), "{m:?} lands on a node with a copy");
            let r = s.replicas.iter_mut().find(|r| r.node == m.from).unwrap();
            r.node = m.to.clone();
        }
        after.check().unwrap();
        let on = |n: &str| after.shards.iter().filter(|s| s.holds(&node(n))).count();
        assert!([on("n0"), on("n1"), on("n2")].iter().all(|&c| (2..=3).contains(&c)), "{:?}", [on("n0"), on("n1"), on("n2")]);
        assert!(rebalance(&members, &[&after]).is_empty());
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
            kind: crate::model::MoveKind::Move,
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
                kind: crate::model::MoveKind::Move,
            });
        }
        assert!(rebalance(&members, &[&moving]).is_empty(), "nothing left to move on n0");
    }
}
