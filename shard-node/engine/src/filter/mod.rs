//! Filters, answered by the engine: the language is `shoal_filter`'s; a
//! filter resolved against one commit's field indexes (`prepare`) is
//! answered from the indexes (`on_index`) or, for points a group commit
//! wrote before a delete by filter and for fields without an index, from
//! payloads (`on_payload`), with the same meaning: the property tests
//! hold the two to each other.

pub(crate) mod on_index;
pub(crate) mod on_payload;

pub use shoal_filter::{Bound, Condition, Filter, MatchValue, Range};

/// The resolved form the engine answers.
pub(crate) mod prepare {
    pub(crate) use shoal_filter::resolve::{Key, Leaf, Node, Test};

    use crate::error::{Error, InvalidInput};
    use crate::fields::Schema;

    /// Resolves `filter` (already checked) against `schema`; `next_id`
    /// sizes a build's progress in its error. A field without a ready
    /// index is refused unless `allow_unindexed`.
    pub(crate) fn prepare(filter: &shoal_filter::Filter, schema: &Schema, next_id: u32, allow_unindexed: bool) -> Result<Node, Error> {
        let lookup = |field: &str| {
            schema.get(field).map(|def| shoal_filter::resolve::Indexed {
                id: def.id,
                kind: def.kind,
                building: def
                    .building
                    .map(|below| if next_id == 0 { 99 } else { (u64::from(below) * 100 / u64::from(next_id)).min(99) as u32 }),
            })
        };
        shoal_filter::resolve(filter, &lookup, allow_unindexed).map_err(|e| match e {
            shoal_filter::resolve::ResolveError::Invalid(e) => Error::Invalid(InvalidInput::from(e)),
            shoal_filter::resolve::ResolveError::Building { path, field, percent } => Error::FieldIndexBuilding { path, field, percent },
        })
    }
}
