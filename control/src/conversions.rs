//! Between the coordinator's model and the wire: the one place where
//! `v1::` messages become domain types and back. A message that does not
//! convert is the sender's mistake and gets INVALID_ARGUMENT.

use shoal_proto::{NodeId, ShoalError, v1};

use crate::model::{Collection, CollectionSpec, FieldIndexSpec, FieldKind, IndexParams, Metric};

impl TryFrom<i32> for Metric {
    type Error = ShoalError;

    fn try_from(metric: i32) -> Result<Metric, ShoalError> {
        match v1::Metric::try_from(metric) {
            Ok(v1::Metric::Cosine) => Ok(Metric::Cosine),
            Ok(v1::Metric::Dot) => Ok(Metric::Dot),
            Ok(v1::Metric::Euclidean) => Ok(Metric::Euclidean),
            Ok(v1::Metric::Unspecified) | Err(_) => {
                Err(ShoalError::invalid(format!("metric {metric} is not one of COSINE, DOT, EUCLIDEAN")))
            }
        }
    }
}

impl From<Metric> for v1::Metric {
    fn from(m: Metric) -> v1::Metric {
        match m {
            Metric::Cosine => v1::Metric::Cosine,
            Metric::Dot => v1::Metric::Dot,
            Metric::Euclidean => v1::Metric::Euclidean,
        }
    }
}

impl From<Option<v1::IndexParams>> for IndexParams {
    fn from(p: Option<v1::IndexParams>) -> IndexParams {
        p.map_or_else(IndexParams::default, |p| IndexParams { m: p.m, ef_construction: p.ef_construction })
    }
}

fn index_to_wire(p: IndexParams) -> Option<v1::IndexParams> {
    (p != IndexParams::default()).then_some(v1::IndexParams { m: p.m, ef_construction: p.ef_construction })
}

impl TryFrom<v1::ShardSpec> for CollectionSpec {
    type Error = ShoalError;

    fn try_from(s: v1::ShardSpec) -> Result<CollectionSpec, ShoalError> {
        Ok(CollectionSpec {
            dimension: s.dimension,
            metric: Metric::try_from(s.metric)?,
            index: s.index.into(),
            shard_count: s.shard_count,
        })
    }
}

impl From<CollectionSpec> for v1::ShardSpec {
    fn from(s: CollectionSpec) -> v1::ShardSpec {
        v1::ShardSpec {
            dimension: s.dimension,
            metric: v1::Metric::from(s.metric) as i32,
            index: index_to_wire(s.index),
            shard_count: s.shard_count,
        }
    }
}

/// A collection as the public API describes it, with the live state of
/// each shard when it was asked for.
pub fn collection_info(c: &Collection, shards: Vec<v1::ShardInfo>) -> v1::CollectionInfo {
    let points = shards.iter().map(|s| s.points).sum();
    v1::CollectionInfo {
        name: c.name.to_string(),
        dimension: c.spec.dimension,
        metric: v1::Metric::from(c.spec.metric) as i32,
        shard_count: c.shard_count(),
        index: index_to_wire(c.spec.index),
        shards,
        points,
        replication_factor: c.replication.factor,
        min_in_sync: c.replication.min_in_sync,
        field_indexes: c.fields.iter().map(field_index_to_wire).collect(),
    }
}

impl From<FieldKind> for v1::FieldType {
    fn from(k: FieldKind) -> v1::FieldType {
        match k {
            FieldKind::Keyword => v1::FieldType::Keyword,
            FieldKind::Integer => v1::FieldType::Integer,
            FieldKind::Float => v1::FieldType::Float,
            FieldKind::Bool => v1::FieldType::Bool,
            FieldKind::Datetime => v1::FieldType::Datetime,
        }
    }
}

/// A field index as the wire carries it.
pub fn field_index_to_wire(f: &FieldIndexSpec) -> v1::FieldIndex {
    v1::FieldIndex { field: f.field.clone(), r#type: v1::FieldType::from(f.kind) as i32 }
}

impl TryFrom<v1::FieldIndex> for FieldIndexSpec {
    type Error = ShoalError;

    fn try_from(f: v1::FieldIndex) -> Result<FieldIndexSpec, ShoalError> {
        let v1::FieldIndex { field, r#type } = f;
        let kind = match v1::FieldType::try_from(r#type) {
            Ok(v1::FieldType::Keyword) => FieldKind::Keyword,
            Ok(v1::FieldType::Integer) => FieldKind::Integer,
            Ok(v1::FieldType::Float) => FieldKind::Float,
            Ok(v1::FieldType::Bool) => FieldKind::Bool,
            Ok(v1::FieldType::Datetime) => FieldKind::Datetime,
            Ok(v1::FieldType::Unspecified) | Err(_) => {
                return Err(ShoalError::invalid(format!(
                    "field index on {field:?}: type {type_} is not one of KEYWORD, INTEGER, FLOAT, BOOL, DATETIME",
                    type_ = r#type
                )));
            }
        };
        let ok = !field.is_empty() && field.len() <= 255 && field.split('.').all(|s| !s.is_empty());
        if !ok {
            return Err(ShoalError::invalid(format!("field name {field:?} must be 1 to 255 bytes of dotted, non-empty segments")));
        }
        Ok(FieldIndexSpec { field, kind })
    }
}

/// A shard's replicas as the public API lists them, each with whether
/// its node is `up` (else `node_down`).
pub fn replicas_info(p: &crate::model::ShardPlacement, up: impl Fn(&NodeId) -> bool) -> Vec<v1::ReplicaInfo> {
    p.replicas
        .iter()
        .map(|r| v1::ReplicaInfo { node: r.node.to_string(), state: r.state.as_str().to_owned(), node_down: !up(&r.node) })
        .collect()
}

/// A damaged copy a node lists, as the cluster's status shows it; `None`
/// if the node named no shard.
pub fn damaged_copy(d: &v1::DamagedShard) -> Option<v1::DamagedCopy> {
    let id = d.shard.as_ref()?;
    Some(v1::DamagedCopy { collection: id.collection.clone(), shard: id.shard, reason: d.reason.clone(), since_ms: d.since_ms })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_spec_survives_the_wire_and_a_bad_metric_is_refused() {
        for metric in [Metric::Cosine, Metric::Dot, Metric::Euclidean] {
            for index in [IndexParams::default(), IndexParams { m: 32, ef_construction: 200 }] {
                let spec = CollectionSpec { dimension: 384, metric, index, shard_count: 3 };
                assert_eq!(CollectionSpec::try_from(v1::ShardSpec::from(spec)).unwrap(), spec);
            }
        }
        for bad in [0, 4, -1] {
            let e = CollectionSpec::try_from(v1::ShardSpec { dimension: 3, metric: bad, index: None, shard_count: 1 }).unwrap_err();
            assert!(e.message.contains(&format!("metric {bad}")), "{e}");
        }
    }
}
