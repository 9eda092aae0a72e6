//! The definitions of a shard's field indexes, as stored in the `fields`
//! table and as readers and writers hold them.

use heed::RoTxn;

use crate::error::{Error, InvalidInput, Result};
use crate::store::Store;

pub use shoal_filter::FieldType;

/// A type's code in a stored definition.
fn code(t: FieldType) -> u8 {
    match t {
        FieldType::Keyword => 0,
        FieldType::Integer => 1,
        FieldType::Float => 2,
        FieldType::Bool => 3,
        FieldType::Datetime => 4,
    }
}

fn from_code(c: u8) -> Option<FieldType> {
    FieldType::ALL.into_iter().find(|t| code(*t) == c)
}

/// Where an index's online build stands.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum FieldState {
    /// Every point is indexed: filters may use it.
    Ready,
    /// Points with internal ids below `indexed_below` are indexed, of
    /// `of` ids (the shard's id space when the step ran); writes keep
    /// those exact meanwhile, and filters on the field are refused.
    Building {
        /// Ids below this are indexed.
        indexed_below: u32,
        /// Ids the shard had at the last step.
        of: u32,
    },
}

/// An index as [`crate::Index::field_indexes`] reports it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct FieldIndexInfo {
    /// The field's name: a key of the payload's top-level object, or a
    /// dotted path into nested objects (`meta.lang`).
    pub field: String,
    /// What it holds.
    pub kind: FieldType,
    /// Whether it is ready.
    pub state: FieldState,
    /// Points holding an indexed value of the field.
    pub points: u64,
    /// Points whose value is of another type (a string in an integer
    /// field, say): not indexed, so no condition on the field matches them
    /// but `is_empty: false`.
    pub other_type: u64,
}

/// Most field indexes one shard keeps.
pub const MAX_FIELD_INDEXES: usize = 64;
pub use shoal_filter::MAX_FIELD_NAME_BYTES;

/// One index, as stored.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct FieldDef {
    /// The field's name, as given.
    pub(crate) name: String,
    /// Its number in the postings' and columns' keys.
    pub(crate) id: u16,
    pub(crate) kind: FieldType,
    /// While built online: ids below this are indexed.
    pub(crate) building: Option<u32>,
}

const DEF_VERSION: u8 = 1;

impl FieldDef {
    /// The path of object keys the name stands for.
    pub(crate) fn path(&self) -> impl Iterator<Item = &str> {
        self.name.split('.')
    }

    /// Whether writes keep `id`'s entries: every id once ready, those below
    /// the cursor while building (the build indexes the rest as it gets
    /// there, from the payload they hold then).
    #[inline]
    pub(crate) fn covers(&self, id: u32) -> bool {
        self.building.is_none_or(|below| id < below)
    }

    pub(crate) fn encode(&self) -> Vec<u8> {
        let mut v = vec![DEF_VERSION];
        v.extend_from_slice(&self.id.to_be_bytes());
        v.push(code(self.kind));
        match self.building {
            None => v.push(0),
            Some(below) => {
                v.push(1);
                v.extend_from_slice(&below.to_be_bytes());
            }
        }
        v
    }

    pub(crate) fn decode(name: &[u8], b: &[u8]) -> Option<FieldDef> {
        let name = std::str::from_utf8(name).ok()?.to_owned();
        let (&version, rest) = b.split_first()?;
        if version != DEF_VERSION || rest.len() < 4 {
            return None;
        }
        let id = u16::from_be_bytes([rest[0], rest[1]]);
        let kind = from_code(rest[2])?;
        let building = match (rest[3], &rest[4..]) {
            (0, []) => None,
            (1, cursor) => Some(u32::from_be_bytes(cursor.try_into().ok()?)),
            _ => return None,
        };
        Some(FieldDef { name, id, kind, building })
    }
}

/// Checks a field name (`shoal_filter::check_name`).
pub(crate) fn check_name(field: &str) -> Result<(), InvalidInput> {
    shoal_filter::check_name(field).map_err(|_| InvalidInput::BadFieldName { field: field.to_owned(), max: MAX_FIELD_NAME_BYTES })
}

/// The field indexes of one commit, by name.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Schema {
    /// Sorted by name.
    pub(crate) fields: Vec<FieldDef>,
}

impl Schema {
    /// The definitions `txn` holds.
    pub(crate) fn read(store: &Store, txn: &RoTxn) -> Result<Schema> {
        let mut fields = Vec::new();
        for item in store.dbs.fields.iter(txn).map_err(|e| store.err(e))? {
            let (name, value) = item.map_err(|e| store.err(e))?;
            let def = FieldDef::decode(name, value).ok_or_else(|| Error::Corrupt {
                path: store.path.clone(),
                detail: format!("the definition of field index {:?} is malformed", String::from_utf8_lossy(name)),
            })?;
            fields.push(def);
        }
        Ok(Schema { fields })
    }

    pub(crate) fn is_empty(&self) -> bool {
        self.fields.is_empty()
    }

    pub(crate) fn get(&self, field: &str) -> Option<&FieldDef> {
        self.fields.binary_search_by(|d| d.name.as_str().cmp(field)).ok().map(|i| &self.fields[i])
    }

    /// The lowest id no definition uses.
    pub(crate) fn free_id(&self) -> Option<u16> {
        let mut used: Vec<u16> = self.fields.iter().map(|d| d.id).collect();
        used.sort_unstable();
        (0..=u16::MAX).find(|id| used.binary_search(id).is_err())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    proptest! {
        #[test]
        fn definitions_round_trip(name in "[a-z]{1,8}(\\.[a-z]{1,8}){0,2}", id: u16, kind in 0usize..5, building: Option<u32>) {
            let def = FieldDef { name: name.clone(), id, kind: FieldType::ALL[kind], building };
            prop_assert_eq!(FieldDef::decode(name.as_bytes(), &def.encode()), Some(def));
        }
    }

    #[test]
    fn damaged_definitions_and_bad_names_are_refused() {
        let def = FieldDef { name: "tags".into(), id: 3, kind: FieldType::Keyword, building: Some(9) };
        let good = def.encode();
        for cut in 0..good.len() {
            assert_eq!(FieldDef::decode(b"tags", &good[..cut]), None, "cut at {cut}");
        }
        let mut bad_kind = good.clone();
        bad_kind[3] = 9;
        assert_eq!(FieldDef::decode(b"tags", &bad_kind), None);
        assert_eq!(FieldDef::decode(&[0xff], &good), None);
        for name in ["", ".a", "a.", "a..b", &"x".repeat(256)] {
            assert!(check_name(name).is_err(), "{name:?}");
        }
        check_name("meta.lang").unwrap();
    }
}
