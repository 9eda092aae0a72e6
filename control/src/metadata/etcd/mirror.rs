//! The coordinator's copy of the cluster's keys, as a [`View`]: built from a
//! listing, moved forward by watch events. Pure (no etcd calls), so the
//! rules are tested without a server.
//!
//! A value that does not decode is logged and left out of the view, in a
//! listing and in an event alike: every coordinator then sees the same
//! view whether it started before or after the value went bad, and the
//! watcher keeps going.

use std::sync::Arc;

use super::codec;
use super::keys::{Key, Keys};
use crate::metadata::{MetaError, Revision, Versioned, View};

/// One key as etcd holds it.
#[derive(Debug, Clone, Copy)]
pub(super) struct Entry<'a> {
    pub(super) key: &'a [u8],
    pub(super) value: &'a [u8],
    pub(super) mod_revision: Revision,
    /// 0 when the key has no lease.
    pub(super) lease: i64,
}

/// One watch event.
#[derive(Debug, Clone, Copy)]
pub(super) enum Change<'a> {
    Put(Entry<'a>),
    Delete { key: &'a [u8], revision: Revision },
}

impl Change<'_> {
    fn revision(&self) -> Revision {
        match self {
            Change::Put(e) => e.mod_revision,
            Change::Delete { revision, .. } => *revision,
        }
    }
}

#[derive(Debug, Default)]
pub(super) struct Mirror {
    view: View,
    /// The lease holding the controller key: a leader is still the leader
    /// while this is its own lease (two candidates may share a name).
    controller_lease: Option<i64>,
}

impl Mirror {
    /// The state of the keys at `revision`, from a listing made at it.
    pub(super) fn from_listing<'a>(keys: &Keys, revision: Revision, entries: impl IntoIterator<Item = Entry<'a>>) -> Mirror {
        let mut mirror = Mirror::default();
        for e in entries {
            mirror.put(keys, e);
        }
        mirror.view.revision = revision;
        mirror
    }

    /// Applies the events of one watch response; events at or below the
    /// view's revision are already in it (a listing or sync got ahead of
    /// the watch) and are skipped. True when the view changed.
    pub(super) fn apply<'a>(&mut self, keys: &Keys, changes: impl IntoIterator<Item = Change<'a>>) -> bool {
        // One revision's events (a transaction, a lease revoking several
        // keys) arrive in one response: compare with the revision the
        // response started from, not with the last event's.
        let base = self.view.revision;
        let mut last = base;
        for change in changes {
            let revision = change.revision();
            if revision <= base {
                continue;
            }
            last = last.max(revision);
            match change {
                Change::Put(e) => self.put(keys, e),
                Change::Delete { key, .. } => self.delete(keys, key),
            }
        }
        self.view.revision = last;
        last > base
    }

    pub(super) fn revision(&self) -> Revision {
        self.view.revision
    }

    pub(super) fn controller_lease(&self) -> Option<i64> {
        self.controller_lease
    }

    pub(super) fn view(&self) -> Arc<View> {
        Arc::new(self.view.clone())
    }

    fn put(&mut self, keys: &Keys, e: Entry<'_>) {
        let key = String::from_utf8_lossy(e.key);
        match keys.parse(e.key) {
            Key::Collection(Ok(name)) => match codec::decode_collection(&key, name.clone(), e.value) {
                Ok(value) => {
                    self.view.collections.insert(name, Versioned { value, revision: e.mod_revision });
                }
                Err(err) => {
                    skip(&err);
                    self.view.collections.remove(&name);
                }
            },
            Key::Node(Ok(id)) => match codec::decode_member(&key, id.clone(), e.value) {
                Ok(member) => {
                    self.view.members.insert(id, member);
                }
                Err(err) => {
                    skip(&err);
                    self.view.members.remove(&id);
                }
            },
            Key::Controller => {
                // The key is held either way (nobody else can take it), but
                // an unreadable holder is named as none.
                self.controller_lease = Some(e.lease);
                self.view.controller = codec::decode_controller(&key, e.value).map_err(|err| skip(&err)).ok();
            }
            Key::Drain(Ok(id)) => {
                // The value says nothing yet; the key's presence is the mark.
                self.view.draining.insert(id);
            }
            Key::Collection(Err(reason)) | Key::Node(Err(reason)) | Key::Drain(Err(reason)) => {
                skip(&MetaError::Corrupt { key: key.into_owned(), reason })
            }
            Key::Other => {}
        }
    }

    fn delete(&mut self, keys: &Keys, key: &[u8]) {
        match keys.parse(key) {
            Key::Collection(Ok(name)) => {
                self.view.collections.remove(&name);
            }
            Key::Node(Ok(id)) => {
                self.view.members.remove(&id);
            }
            Key::Controller => {
                self.controller_lease = None;
                self.view.controller = None;
            }
            Key::Drain(Ok(id)) => {
                self.view.draining.remove(&id);
            }
            Key::Collection(Err(_)) | Key::Node(Err(_)) | Key::Drain(Err(_)) | Key::Other => {}
        }
    }
}

fn skip(err: &MetaError) {
    tracing::warn!(error = %err, "etcd: left a corrupt value out of the view (fix or delete the key)");
}

#[cfg(test)]
mod tests {
    use shoal_proto::{CollectionName, NodeId};

    use super::*;
    use crate::model::{Collection, CollectionSpec, Member, Metric, ShardPlacement};

    fn keys() -> Keys {
        Keys::new("/t").unwrap()
    }

    fn collection(name: &str, node: &str) -> Collection {
        Collection {
            name: CollectionName::parse(name).unwrap(),
            spec: CollectionSpec { dimension: 4, metric: Metric::Dot, index: Default::default(), shard_count: 1 },
            replication: Default::default(),
            shards: vec![ShardPlacement::on(NodeId::parse(node).unwrap())],
            fields: Vec::new(),
        }
    }

    fn put<'a>(key: &'a str, value: &'a [u8], mod_revision: Revision, lease: i64) -> Change<'a> {
        Change::Put(Entry { key: key.as_bytes(), value, mod_revision, lease })
    }

    #[test]
    fn listing_then_events_build_the_view_and_skip_what_it_already_has() {
        let k = keys();
        let docs = codec::encode_collection(&collection("docs", "n0")).unwrap();
        let moved = codec::encode_collection(&collection("docs", "n1")).unwrap();
        let member = codec::encode_member(&Member::configured(NodeId::parse("n0").unwrap(), "http://a".into())).unwrap();
        let listing = [Entry { key: b"/t/collections/docs", value: &docs, mod_revision: 5, lease: 0 }];
        let mut m = Mirror::from_listing(&k, 7, listing);
        assert_eq!(m.revision(), 7);
        let name = CollectionName::parse("docs").unwrap();
        assert_eq!(m.view.collection(&name).unwrap().revision, 5);

        // An event the listing already had changes nothing.
        assert!(!m.apply(&k, [put("/t/collections/docs", &moved, 6, 0)]));
        assert_eq!(m.view.collection(&name).unwrap().value.node_of(0).as_str(), "n0");

        // Two events of one revision (one transaction) both apply.
        assert!(m.apply(&k, [put("/t/collections/docs", &moved, 8, 0), put("/t/nodes/n0", &member, 8, 42)]));
        assert_eq!(m.revision(), 8);
        assert_eq!(m.view.collection(&name).unwrap().value.node_of(0).as_str(), "n1");
        assert_eq!(m.view.collection(&name).unwrap().revision, 8);
        assert!(m.view.member(&NodeId::parse("n0").unwrap()).is_some());

        let controller = codec::encode_controller("coord-a").unwrap();
        assert!(m.apply(&k, [put("/t/controller", &controller, 9, 77)]));
        assert_eq!((m.view.controller.as_deref(), m.controller_lease()), (Some("coord-a"), Some(77)));

        let deletes = [
            Change::Delete { key: b"/t/nodes/n0", revision: 10 },
            Change::Delete { key: b"/t/controller", revision: 10 },
            Change::Delete { key: b"/t/collections/docs", revision: 11 },
        ];
        assert!(m.apply(&k, deletes));
        assert_eq!(m.revision(), 11);
        assert!(m.view.members.is_empty() && m.view.collections.is_empty() && m.view.controller.is_none());
        assert_eq!(m.controller_lease(), None);
    }

    #[test]
    fn corrupt_and_foreign_keys_are_left_out_without_stopping_the_rest() {
        let k = keys();
        let good = codec::encode_collection(&collection("good", "n0")).unwrap();
        let listing = [
            Entry { key: b"/t/collections/bad", value: b"{", mod_revision: 2, lease: 0 },
            Entry { key: b"/t/collections/good", value: &good, mod_revision: 3, lease: 0 },
            Entry { key: b"/t/collections/not a name", value: &good, mod_revision: 3, lease: 0 },
            Entry { key: b"/t/nodes/n1", value: b"[]", mod_revision: 3, lease: 9 },
            Entry { key: b"/t/something-newer", value: b"?", mod_revision: 3, lease: 0 },
        ];
        let mut m = Mirror::from_listing(&k, 3, listing);
        assert_eq!(m.view.collections.keys().map(|n| n.as_str()).collect::<Vec<_>>(), ["good"]);
        assert!(m.view.members.is_empty());

        // A good value turning bad leaves the view too; the watch goes on.
        assert!(m.apply(&k, [put("/t/collections/good", b"null", 4, 0), put("/t/collections/bad", &good, 4, 0)]));
        assert_eq!(m.view.collections.keys().map(|n| n.as_str()).collect::<Vec<_>>(), ["bad"]);

        assert!(m.apply(&k, [put("/t/controller", b"{}", 5, 3)]));
        assert_eq!((m.view.controller.clone(), m.controller_lease()), (None, Some(3)));
    }
}
