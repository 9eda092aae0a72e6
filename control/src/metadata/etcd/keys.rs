//! Where each thing lives under the cluster's prefix (the layout is
//! documented in the parent module).

use shoal_proto::{CollectionName, NodeId};

use crate::metadata::MetaError;

/// The keys of one cluster: everything sits under `{prefix}/`.
#[derive(Debug, Clone)]
pub(super) struct Keys {
    /// The prefix with exactly one trailing `/`, so that `/shoal/a` never
    /// matches the keys of `/shoal/ab`.
    root: String,
}

/// What a key under the root names.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Key {
    /// `collections/{name}`; an error when the name is not a valid one.
    Collection(Result<CollectionName, String>),
    /// `nodes/{id}`.
    Node(Result<NodeId, String>),
    Controller,
    /// `drains/{id}`: the operator drains that node.
    Drain(Result<NodeId, String>),
    /// Not ours (a newer version's key, or someone else's): ignored.
    Other,
}

const COLLECTIONS: &str = "collections/";
const NODES: &str = "nodes/";
const CONTROLLER: &str = "controller";
const DRAINS: &str = "drains/";

impl Keys {
    pub(super) fn new(prefix: &str) -> Result<Keys, MetaError> {
        let trimmed = prefix.trim_end_matches('/');
        if trimmed.is_empty() {
            // An empty prefix would make the store read and watch the whole
            // keyspace of a shared etcd.
            return Err(MetaError::Invalid(format!("etcd key prefix {prefix:?} is empty; use one like /shoal/<cluster>")));
        }
        Ok(Keys { root: format!("{trimmed}/") })
    }

    /// The prefix every key of the cluster starts with (to list and watch).
    pub(super) fn root(&self) -> &str {
        &self.root
    }

    pub(super) fn collection(&self, name: &CollectionName) -> String {
        format!("{}{COLLECTIONS}{name}", self.root)
    }

    pub(super) fn node(&self, id: &NodeId) -> String {
        format!("{}{NODES}{id}", self.root)
    }

    pub(super) fn drain(&self, id: &NodeId) -> String {
        format!("{}{DRAINS}{id}", self.root)
    }

    pub(super) fn controller(&self) -> String {
        format!("{}{CONTROLLER}", self.root)
    }

    pub(super) fn parse(&self, key: &[u8]) -> Key {
        let Some(rest) = key.strip_prefix(self.root.as_bytes()) else { return Key::Other };
        let Ok(rest) = std::str::from_utf8(rest) else { return Key::Other };
        if let Some(name) = rest.strip_prefix(COLLECTIONS) {
            Key::Collection(CollectionName::parse(name).map_err(|e| e.to_string()))
        } else if let Some(id) = rest.strip_prefix(NODES) {
            Key::Node(NodeId::parse(id).map_err(|e| e.to_string()))
        } else if let Some(id) = rest.strip_prefix(DRAINS) {
            Key::Drain(NodeId::parse(id).map_err(|e| e.to_string()))
        } else if rest == CONTROLLER {
            Key::Controller
        } else {
            Key::Other
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_round_trip_and_stay_inside_their_prefix() {
        let keys = Keys::new("/shoal/a/").unwrap();
        assert_eq!(keys.root(), "/shoal/a/");
        let name = CollectionName::parse("docs").unwrap();
        let id = NodeId::parse("rack1/n0").unwrap();
        assert_eq!(keys.collection(&name), "/shoal/a/collections/docs");
        assert_eq!(keys.parse(keys.collection(&name).as_bytes()), Key::Collection(Ok(name)));
        assert_eq!(keys.parse(keys.node(&id).as_bytes()), Key::Node(Ok(id.clone())));
        assert_eq!(keys.parse(keys.controller().as_bytes()), Key::Controller);
        assert_eq!(keys.parse(keys.drain(&id).as_bytes()), Key::Drain(Ok(id.clone())));
        assert_eq!(keys.parse(b"/shoal/ab/controller"), Key::Other);
        assert_eq!(keys.parse(b"/shoal/a/controller/x"), Key::Other);
        assert_eq!(keys.parse(b"/shoal/a/future/thing"), Key::Other);
        assert!(matches!(keys.parse(b"/shoal/a/collections/bad name"), Key::Collection(Err(_))));
        assert!(matches!(keys.parse(b"/shoal/a/nodes/"), Key::Node(Err(_))));
        assert!(Keys::new("/").is_err() && Keys::new("").is_err());
        assert_eq!(Keys::new("/shoal/b").unwrap().root(), "/shoal/b/");
    }
}
