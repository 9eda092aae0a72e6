//! What the coordinator knows about the cluster: members, collections and
//! where each shard lives. Behind a trait so that etcd can hold it for
//! clusters beyond one machine; the embedded default keeps it in memory and
//! rebuilds it from the shard nodes on start (they hold the truth: every
//! shard knows its collection's spec and shard count).

use std::collections::BTreeMap;

use parking_lot::RwLock;
use shoal_proto::{CollectionName, NodeId, v1};

/// A collection and the placement of its shards.
#[derive(Clone, Debug, PartialEq)]
pub struct Collection {
    pub name: CollectionName,
    pub spec: v1::ShardSpec,
    /// Node of shard i at index i.
    pub placement: Vec<NodeId>,
}

impl Collection {
    pub fn shard_count(&self) -> u32 {
        self.placement.len() as u32
    }
}

/// A shard node the coordinator talks to.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    pub id: NodeId,
    /// `http://host:port`.
    pub address: String,
}

/// Storage of cluster metadata.
pub trait MetadataStore: Send + Sync {
    fn members(&self) -> Vec<Member>;
    fn collections(&self) -> Vec<Collection>;
    fn collection(&self, name: &CollectionName) -> Option<Collection>;
    /// Adds a collection; false if one of that name exists.
    fn insert_collection(&self, c: Collection) -> bool;
    fn remove_collection(&self, name: &CollectionName) -> Option<Collection>;
}

/// The embedded default: static membership from the configuration,
/// collections in memory.
pub struct InMemoryMetadata {
    members: Vec<Member>,
    collections: RwLock<BTreeMap<CollectionName, Collection>>,
}

impl InMemoryMetadata {
    pub fn new(members: Vec<Member>) -> Self {
        InMemoryMetadata { members, collections: RwLock::new(BTreeMap::new()) }
    }
}

impl MetadataStore for InMemoryMetadata {
    fn members(&self) -> Vec<Member> {
        self.members.clone()
    }

    fn collections(&self) -> Vec<Collection> {
        self.collections.read().values().cloned().collect()
    }

    fn collection(&self, name: &CollectionName) -> Option<Collection> {
        self.collections.read().get(name).cloned()
    }

    fn insert_collection(&self, c: Collection) -> bool {
        let mut all = self.collections.write();
        if all.contains_key(&c.name) {
            return false;
        }
        all.insert(c.name.clone(), c);
        true
    }

    fn remove_collection(&self, name: &CollectionName) -> Option<Collection> {
        self.collections.write().remove(name)
    }
}

/// Shards to nodes: each new shard goes to the node holding the fewest
/// shards so far (ties by node order), so collections spread evenly.
pub fn place(shard_count: u32, members: &[Member], existing: &[Collection]) -> Vec<NodeId> {
    let mut load: Vec<(usize, &Member)> =
        members.iter().map(|m| (existing.iter().flat_map(|c| &c.placement).filter(|n| **n == m.id).count(), m)).collect();
    let mut placement = Vec::with_capacity(shard_count as usize);
    for _ in 0..shard_count {
        let Some(slot) = load.iter_mut().enumerate().min_by_key(|(i, (l, _))| (*l, *i)).map(|(_, s)| s) else { break };
        slot.0 += 1;
        placement.push(slot.1.id.clone());
    }
    placement
}

#[cfg(test)]
mod tests {
    use super::*;

    fn member(i: usize) -> Member {
        Member { id: NodeId::parse(&format!("n{i}")).unwrap(), address: format!("http://127.0.0.1:{}", 7000 + i) }
    }

    #[test]
    fn placement_balances_across_collections() {
        let members: Vec<Member> = (0..3).map(member).collect();
        let first = place(4, &members, &[]);
        let ids: Vec<&str> = first.iter().map(NodeId::as_str).collect();
        assert_eq!(ids, ["n0", "n1", "n2", "n0"]);
        let existing = [Collection { name: CollectionName::parse("a").unwrap(), spec: v1::ShardSpec::default(), placement: first }];
        let second: Vec<String> = place(2, &members, &existing).iter().map(ToString::to_string).collect();
        assert_eq!(second, ["n1", "n2"]);
        assert!(place(3, &[], &[]).is_empty());
    }
}
