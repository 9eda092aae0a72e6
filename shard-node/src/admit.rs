//! What a shard node checks in every write itself, whoever sends it: the
//! coordinator validates requests where they enter the cluster, but a
//! shard node cannot tell a coordinator's call from a stray client's (nor
//! from a coordinator with a bug), and what it commits stays. A point that
//! belongs to another shard would be found by no search routed by id and
//! never deleted; a payload that is not JSON would break every reader that
//! trusts the JSON tag.

use shoal_proto::{ShoalError, shard_for, v1};

use crate::host::ShardKey;

/// INVALID_ARGUMENT naming the first id that is not this shard's or the
/// first JSON payload that does not parse; nothing is applied then.
pub(crate) fn batch(key: &ShardKey, shard_count: u32, points: &[v1::Point], deletes: &[u64]) -> Result<(), ShoalError> {
    let (collection, shard) = (&key.0, key.1);
    let foreign = |id: u64| -> ShoalError {
        ShoalError::invalid(format!(
            "point {id} belongs to shard {} of collection {collection}, not to shard {shard}: nothing was applied",
            shard_for(id, shard_count.max(1))
        ))
    };
    for (i, p) in points.iter().enumerate() {
        if shard_for(p.id, shard_count.max(1)) != shard {
            return Err(foreign(p.id));
        }
        if let Some(v1::payload::Kind::Json(text)) = p.payload.as_ref().and_then(|p| p.kind.as_ref())
            && let Err(why) = shoal_proto::json::check_payload(text)
        {
            return Err(ShoalError::invalid(format!("point {i} (id {}): {why}: nothing was applied to {collection}/{shard}", p.id)));
        }
    }
    if let Some(&id) = deletes.iter().find(|&&id| shard_for(id, shard_count.max(1)) != shard) {
        return Err(foreign(id));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use shoal_proto::CollectionName;

    use super::*;

    fn own(shard: u32, count: u32) -> impl Iterator<Item = u64> {
        (0u64..).filter(move |&id| shard_for(id, count) == shard)
    }

    #[test]
    fn foreign_ids_and_broken_json_are_refused_with_the_id_named() {
        let key = (CollectionName::parse("docs").unwrap(), 1);
        let mine: Vec<u64> = own(1, 3).take(3).collect();
        let other = own(2, 3).next().unwrap();
        let point = |id: u64, json: &str| v1::Point {
            id,
            vector: vec![1.0],
            payload: Some(v1::Payload { kind: Some(v1::payload::Kind::Json(json.into())) }),
        };
        assert!(batch(&key, 3, &[point(mine[0], "{\"a\": 1}")], &[mine[1]]).is_ok());
        let e = batch(&key, 3, &[point(other, "{}")], &[]).unwrap_err().to_string();
        assert!(e.contains(&format!("point {other} belongs to shard 2")), "{e}");
        let e = batch(&key, 3, &[], &[mine[2], other]).unwrap_err().to_string();
        assert!(e.contains(&other.to_string()), "{e}");
        let e = batch(&key, 3, &[point(mine[0], "{oops")], &[]).unwrap_err().to_string();
        assert!(e.contains("not valid JSON"), "{e}");
        let deep = format!("{}{}", "[".repeat(65), "]".repeat(65));
        let e = batch(&key, 3, &[point(mine[0], &deep)], &[]).unwrap_err().to_string();
        assert!(e.contains("nests 65 levels"), "{e}");
        // A single-shard collection owns every id.
        let key0 = (CollectionName::parse("docs").unwrap(), 0);
        assert!(batch(&key0, 1, &[point(other, "[]")], &[12345]).is_ok());
    }
}
