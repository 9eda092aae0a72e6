//! The JSON values stored in etcd. The records are private to this module:
//! the domain types have no serde on purpose, so the stored format changes
//! only here, and every decoded value is checked like a new one.

use serde::{Deserialize, Serialize};
use shoal_proto::{CollectionName, NodeId};

use crate::metadata::MetaError;
use crate::model::{
    Capacity, Collection, CollectionSpec, FieldIndexSpec, FieldKind, IndexParams, Member, Metric, MoveKind, MovePhase, NodeState, Replica,
    ReplicaState, Replication, ShardMove, ShardPlacement,
};

#[derive(Serialize, Deserialize)]
struct CollectionRecord {
    spec: SpecRecord,
    /// Absent in values written before replication: one copy.
    #[serde(default)]
    replication: ReplicationRecord,
    shards: Vec<ShardRecord>,
    /// Payload indexes; absent in values written before them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    fields: Vec<FieldRecord>,
}

#[derive(Serialize, Deserialize)]
struct FieldRecord {
    field: String,
    #[serde(rename = "type")]
    kind: String,
}

#[derive(Serialize, Deserialize)]
struct ReplicationRecord {
    factor: u32,
    min_in_sync: u32,
}

impl Default for ReplicationRecord {
    fn default() -> Self {
        let r = Replication::default();
        ReplicationRecord { factor: r.factor, min_in_sync: r.min_in_sync }
    }
}

/// An active replica is stored as its node's name alone (as every replica
/// was before replicas had states); any other as node and state.
#[derive(Serialize, Deserialize)]
#[serde(untagged)]
enum ReplicaRecord {
    Active(String),
    Other { node: String, state: String },
}

#[derive(Serialize, Deserialize)]
struct SpecRecord {
    dimension: u32,
    metric: String,
    m: u32,
    ef_construction: u32,
    shard_count: u32,
}

#[derive(Serialize, Deserialize)]
struct ShardRecord {
    replicas: Vec<ReplicaRecord>,
    epoch: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    moving: Option<MoveRecord>,
}

#[derive(Serialize, Deserialize)]
struct MoveRecord {
    from: String,
    to: String,
    phase: String,
    attempt: u64,
    /// Absent for a move (and in values written before copies existed).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    kind: Option<String>,
}

#[derive(Serialize, Deserialize)]
struct MemberRecord {
    address: String,
    state: String,
    disk_free_bytes: u64,
    shards: u32,
    /// Absent in records written before nodes kept one.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    incarnation: String,
}

#[derive(Serialize, Deserialize)]
struct ControllerRecord {
    candidate: String,
}

fn to_json<T: Serialize>(what: &str, record: &T) -> Result<Vec<u8>, MetaError> {
    serde_json::to_vec(record).map_err(|e| MetaError::Invalid(format!("{what} cannot be encoded: {e}")))
}

fn from_json<'a, T: Deserialize<'a>>(key: &str, bytes: &'a [u8]) -> Result<T, MetaError> {
    serde_json::from_slice(bytes).map_err(|e| corrupt(key, e))
}

fn corrupt(key: &str, reason: impl ToString) -> MetaError {
    MetaError::Corrupt { key: key.to_owned(), reason: reason.to_string() }
}

/// The value of `collections/{name}`: everything but the name (the key
/// holds it).
pub(super) fn encode_collection(c: &Collection) -> Result<Vec<u8>, MetaError> {
    let record = CollectionRecord {
        spec: SpecRecord {
            dimension: c.spec.dimension,
            metric: c.spec.metric.as_str().to_owned(),
            m: c.spec.index.m,
            ef_construction: c.spec.index.ef_construction,
            shard_count: c.spec.shard_count,
        },
        replication: ReplicationRecord { factor: c.replication.factor, min_in_sync: c.replication.min_in_sync },
        shards: c
            .shards
            .iter()
            .map(|s| ShardRecord {
                replicas: s
                    .replicas
                    .iter()
                    .map(|r| match r.state {
                        ReplicaState::Active => ReplicaRecord::Active(r.node.as_str().to_owned()),
                        other @ (ReplicaState::Recovering | ReplicaState::Dead) => {
                            ReplicaRecord::Other { node: r.node.as_str().to_owned(), state: other.as_str().to_owned() }
                        }
                    })
                    .collect(),
                epoch: s.epoch,
                moving: s.moving.as_ref().map(|m| MoveRecord {
                    from: m.from.as_str().to_owned(),
                    to: m.to.as_str().to_owned(),
                    phase: m.phase.as_str().to_owned(),
                    attempt: m.attempt,
                    kind: (m.kind != MoveKind::Move).then(|| m.kind.as_str().to_owned()),
                }),
            })
            .collect(),
        fields: c.fields.iter().map(|f| FieldRecord { field: f.field.clone(), kind: f.kind.as_str().to_owned() }).collect(),
    };
    to_json(&format!("collection {}", c.name), &record)
}

pub(super) fn decode_collection(key: &str, name: CollectionName, bytes: &[u8]) -> Result<Collection, MetaError> {
    let r: CollectionRecord = from_json(key, bytes)?;
    let metric = Metric::parse(&r.spec.metric).map_err(|e| corrupt(key, e.message))?;
    let mut shards = Vec::with_capacity(r.shards.len());
    for (i, s) in r.shards.into_iter().enumerate() {
        let mut replicas = Vec::with_capacity(s.replicas.len());
        for r in &s.replicas {
            let (node, state) = match r {
                ReplicaRecord::Active(node) => (node, ReplicaState::Active),
                ReplicaRecord::Other { node, state } => {
                    let state = ReplicaState::parse(state)
                        .ok_or_else(|| corrupt(key, format!("shard {i}: replica state {state:?} is not a known one")))?;
                    (node, state)
                }
            };
            let node = NodeId::parse(node).map_err(|e| corrupt(key, format!("shard {i}: {e}")))?;
            replicas.push(Replica { node, state });
        }
        let moving = match s.moving {
            None => None,
            Some(m) => {
                let node = |n: &str| NodeId::parse(n).map_err(|e| corrupt(key, format!("shard {i}'s move: {e}")));
                let phase = MovePhase::parse(&m.phase)
                    .ok_or_else(|| corrupt(key, format!("shard {i}'s move phase {:?} is not a known one", m.phase)))?;
                let kind = match m.kind.as_deref() {
                    None => MoveKind::Move,
                    Some(k) => MoveKind::parse(k).ok_or_else(|| corrupt(key, format!("shard {i}'s move kind {k:?} is not a known one")))?,
                };
                Some(ShardMove { from: node(&m.from)?, to: node(&m.to)?, phase, attempt: m.attempt, kind })
            }
        };
        shards.push(ShardPlacement { replicas, epoch: s.epoch, moving });
    }
    let spec = CollectionSpec {
        dimension: r.spec.dimension,
        metric,
        index: IndexParams { m: r.spec.m, ef_construction: r.spec.ef_construction },
        shard_count: r.spec.shard_count,
    };
    let replication = Replication { factor: r.replication.factor, min_in_sync: r.replication.min_in_sync };
    let mut fields = Vec::with_capacity(r.fields.len());
    for f in r.fields {
        let kind = FieldKind::parse(&f.kind)
            .ok_or_else(|| corrupt(key, format!("field index {:?} has type {:?}, not a known one", f.field, f.kind)))?;
        fields.push(FieldIndexSpec { field: f.field, kind });
    }
    let c = Collection { name, spec, replication, shards, fields };
    c.check().map_err(|e| corrupt(key, e))?;
    Ok(c)
}

/// The value of `nodes/{id}`: what the node says about itself.
pub(super) fn encode_member(m: &Member) -> Result<Vec<u8>, MetaError> {
    let record = MemberRecord {
        address: m.address.clone(),
        state: m.state.as_str().to_owned(),
        disk_free_bytes: m.capacity.disk_free_bytes,
        shards: m.capacity.shards,
        incarnation: m.incarnation.clone(),
    };
    to_json(&format!("node {}", m.id), &record)
}

pub(super) fn decode_member(key: &str, id: NodeId, bytes: &[u8]) -> Result<Member, MetaError> {
    let r: MemberRecord = from_json(key, bytes)?;
    let state = NodeState::parse(&r.state).ok_or_else(|| corrupt(key, format!("node state {:?} is not a known one", r.state)))?;
    Ok(Member {
        id,
        address: r.address,
        state,
        capacity: Capacity { disk_free_bytes: r.disk_free_bytes, shards: r.shards },
        incarnation: r.incarnation,
    })
}

/// The value of `drains/{id}`: the key is the mark; the value leaves room
/// for a reason later.
pub(super) fn encode_drain() -> Result<Vec<u8>, MetaError> {
    Ok(b"{}".to_vec())
}

/// The value of `controller`: who holds it.
pub(super) fn encode_controller(candidate: &str) -> Result<Vec<u8>, MetaError> {
    to_json("controller", &ControllerRecord { candidate: candidate.to_owned() })
}

pub(super) fn decode_controller(key: &str, bytes: &[u8]) -> Result<String, MetaError> {
    from_json::<ControllerRecord>(key, bytes).map(|r| r.candidate)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn collection() -> impl Strategy<Value = Collection> {
        let metric = prop_oneof![Just(Metric::Cosine), Just(Metric::Dot), Just(Metric::Euclidean)];
        let states = [ReplicaState::Active, ReplicaState::Recovering, ReplicaState::Dead];
        let shard = (
            proptest::collection::btree_set("[a-z0-9/_.-]{1,12}", 1..4),
            proptest::collection::vec(0..3usize, 3),
            1..u64::MAX,
            any::<Option<(bool, u64, bool)>>(),
        )
            .prop_map(move |(nodes, state_of, epoch, moving)| {
                // The first replica is active: a placement always has one.
                let replicas: Vec<Replica> = nodes
                    .iter()
                    .enumerate()
                    .map(|(i, n)| Replica {
                        node: NodeId::parse(n).unwrap(),
                        state: if i == 0 { ReplicaState::Active } else { states[state_of[i]] },
                    })
                    .collect();
                let moving = moving.map(|(switched, attempt, copy)| {
                    let (phase, from, to) = match switched {
                        false => (MovePhase::Copying, replicas[0].node.clone(), NodeId::parse("elsewhere!").unwrap()),
                        true => (MovePhase::Switched, NodeId::parse("elsewhere!").unwrap(), replicas[0].node.clone()),
                    };
                    let kind = if copy && !switched { MoveKind::Copy } else { MoveKind::Move };
                    ShardMove { from, to, phase, attempt, kind }
                });
                ShardPlacement { replicas, epoch, moving }
            });
        let replication = (1..5u32).prop_flat_map(|factor| (Just(factor), 1..=factor));
        let field = ("[a-z]{1,8}(\\.[a-z]{1,4})?", 0..5usize).prop_map(|(field, k)| FieldIndexSpec { field, kind: FieldKind::ALL[k] });
        let fields = proptest::collection::vec(field, 0..4);
        ("[a-z0-9][a-z0-9_-]{0,20}", 1..4096u32, metric, any::<(u32, u32)>(), replication, proptest::collection::vec(shard, 1..20), fields)
            .prop_map(|(name, dimension, metric, (m, ef_construction), (factor, min_in_sync), shards, fields)| Collection {
                name: CollectionName::parse(&name).unwrap(),
                spec: CollectionSpec { dimension, metric, index: IndexParams { m, ef_construction }, shard_count: shards.len() as u32 },
                replication: Replication { factor, min_in_sync },
                shards,
                fields,
            })
    }

    proptest! {
        #[test]
        fn collections_round_trip(c in collection()) {
            let bytes = encode_collection(&c).unwrap();
            prop_assert_eq!(decode_collection("k", c.name.clone(), &bytes).unwrap(), c);
        }

        #[test]
        fn members_round_trip(id in "[!-~]{1,40}", address in ".{0,40}", state in 0..3usize, free: u64, shards: u32, incarnation in "[0-9a-f]{0,32}") {
            let state = [NodeState::Serving, NodeState::Draining, NodeState::Removable][state];
            let m = Member { id: NodeId::parse(&id).unwrap(), address, state, capacity: Capacity { disk_free_bytes: free, shards }, incarnation };
            let bytes = encode_member(&m).unwrap();
            prop_assert_eq!(decode_member("k", m.id.clone(), &bytes).unwrap(), m);
        }
    }

    #[test]
    fn a_large_placement_fits_in_one_etcd_request() {
        // etcd refuses requests over 1.5 MiB by default (--max-request-bytes);
        // a collection is one value, so its largest plausible placement must
        // stay well below: 4,096 shards with three 32-character replicas and
        // 20-digit epochs take about 150 bytes a shard.
        let node = |i: usize| NodeId::parse(&format!("shard-node-{i:022}")).unwrap();
        let shards: Vec<ShardPlacement> = (0..4096)
            .map(|i| {
                let mut p = ShardPlacement::on_all(vec![node(i), node(i + 1), node(i + 2)], u64::MAX);
                p.replicas[2].state = ReplicaState::Recovering;
                p
            })
            .collect();
        let spec = CollectionSpec { dimension: 1536, metric: Metric::Cosine, index: IndexParams::default(), shard_count: 4096 };
        let replication = Replication { factor: 3, min_in_sync: 2 };
        let fields = vec![
            FieldIndexSpec { field: "tags".into(), kind: FieldKind::Keyword },
            FieldIndexSpec { field: "at".into(), kind: FieldKind::Datetime },
        ];
        let c = Collection { name: CollectionName::parse("docs").unwrap(), spec, replication, shards, fields };
        let size = encode_collection(&c).unwrap().len();
        assert!(size < 1 << 20, "{size} bytes");
    }

    #[test]
    fn corrupt_values_say_which_key_and_why() {
        let name = || CollectionName::parse("docs").unwrap();
        let err = |bytes: &[u8]| match decode_collection("/p/collections/docs", name(), bytes) {
            Err(MetaError::Corrupt { key, reason }) => {
                assert_eq!(key, "/p/collections/docs");
                reason
            }
            other => panic!("{other:?}"),
        };
        assert!(err(b"not json").contains("expected"), "{}", err(b"not json"));
        let spec = r#""spec":{"dimension":2,"metric":"cosine","m":0,"ef_construction":0,"shard_count":1}"#;
        assert!(err(format!(r#"{{{spec},"shards":[]}}"#).as_bytes()).contains("0 placements for 1 shards"));
        assert!(err(format!(r#"{{{spec},"shards":[{{"replicas":[""],"epoch":1}}]}}"#).as_bytes()).contains("shard 0"));
        assert!(
            err(r#"{"spec":{"dimension":2,"metric":"manhattan","m":0,"ef_construction":0,"shard_count":1},"shards":[]}"#.as_bytes())
                .contains("manhattan")
        );
        assert!(
            err(format!(r#"{{{spec},"shards":[{{"replicas":[{{"node":"n0","state":"zombie"}}],"epoch":1}}]}}"#).as_bytes())
                .contains("zombie")
        );
        assert!(
            err(format!(r#"{{{spec},"shards":[{{"replicas":[{{"node":"n0","state":"dead"}}],"epoch":1}}]}}"#).as_bytes())
                .contains("no active replica")
        );
        let bad_factor = format!(r#"{{{spec},"replication":{{"factor":1,"min_in_sync":2}},"shards":[{{"replicas":["n0"],"epoch":1}}]}}"#);
        assert!(err(bad_factor.as_bytes()).contains("replication factor 1 with a minimum of 2"));
        // A value written before replicas had states: one active copy.
        let good = format!(r#"{{{spec},"shards":[{{"replicas":["n0"],"epoch":1}}]}}"#);
        let c = decode_collection("k", name(), good.as_bytes()).unwrap();
        assert_eq!((c.node_of(0).as_str(), c.replication), ("n0", Replication::default()));
        assert_eq!(c.shards[0].replicas, [Replica::active(NodeId::parse("n0").unwrap())]);
        assert!(matches!(
            decode_member("k", NodeId::parse("n0").unwrap(), br#"{"address":"a","state":"asleep","disk_free_bytes":0,"shards":0}"#),
            Err(MetaError::Corrupt { .. })
        ));
        assert!(matches!(decode_controller("k", b"{}"), Err(MetaError::Corrupt { .. })));
    }
}
