//! Gathering one write transaction's changes to the field indexes and
//! writing them: each set and column block read and written once.

use std::collections::BTreeMap;

use heed::RwTxn;

use crate::store::Store;

use super::value::{self, Extracted};
use super::{FieldDef, Schema, columns, postings};

/// Where one point's entries in one index are.
pub(crate) struct Entries {
    /// The keys of the sets that hold it.
    pub(crate) sets: Vec<Vec<u8>>,
    /// For a numeric index, its value key in the column (0: none).
    pub(crate) column: Option<u64>,
}

/// The entries of a point whose payload object is `object` in `def`.
pub(crate) fn entries(def: &FieldDef, object: Option<&serde_json::Value>) -> Entries {
    let found = object.and_then(|o| value::lookup(o, def.path()));
    let extracted = value::extract(found, def.kind);
    let mut sets = postings::value_keys(def.id, &extracted);
    match extracted {
        Extracted::Absent => {}
        Extracted::Other => sets.extend([postings::key(def.id, postings::PRESENT, &[]), postings::key(def.id, postings::OTHER, &[])]),
        Extracted::Keywords(_) | Extracted::Number(_) | Extracted::Bool(_) => sets.push(postings::key(def.id, postings::PRESENT, &[])),
    }
    let column = def.kind.is_numeric().then_some(match extracted {
        Extracted::Number(n) => n,
        Extracted::Absent | Extracted::Other | Extracted::Keywords(_) | Extracted::Bool(_) => 0,
    });
    Entries { sets, column }
}

/// Ids to add to and remove from one set.
#[derive(Default)]
struct Delta {
    add: Vec<u32>,
    remove: Vec<u32>,
}

/// The changes of one transaction.
#[derive(Default)]
pub(crate) struct Changes {
    sets: BTreeMap<Vec<u8>, Delta>,
    /// (field, id) → the id's new value key (0: none).
    columns: BTreeMap<(u16, u32), u64>,
}

impl Changes {
    pub(crate) fn is_empty(&self) -> bool {
        self.sets.is_empty() && self.columns.is_empty()
    }

    /// Takes `id`'s entries out of every index of `schema` that holds
    /// them; `payload` is what the id held.
    pub(crate) fn remove_point(&mut self, schema: &Schema, id: u32, payload: Option<&[u8]>) {
        self.point(schema.fields.iter().filter(|d| d.covers(id)), id, payload, false);
    }

    /// Puts `id`'s entries into every index of `schema` that keeps them.
    pub(crate) fn add_point(&mut self, schema: &Schema, id: u32, payload: Option<&[u8]>) {
        self.point(schema.fields.iter().filter(|d| d.covers(id)), id, payload, true);
    }

    /// Puts `id`'s entries into the index `def` (an online build's step).
    pub(crate) fn add_to(&mut self, def: &FieldDef, id: u32, payload: Option<&[u8]>) {
        self.point(std::iter::once(def), id, payload, true);
    }

    fn point<'d>(&mut self, defs: impl Iterator<Item = &'d FieldDef>, id: u32, payload: Option<&[u8]>, add: bool) {
        let mut defs = defs.peekable();
        if defs.peek().is_none() {
            return;
        }
        let object = payload.and_then(value::payload_object);
        for def in defs {
            let Entries { sets, column } = entries(def, object.as_ref());
            for k in sets {
                let d = self.sets.entry(k).or_default();
                if add { d.add.push(id) } else { d.remove.push(id) }
            }
            if let Some(n) = column {
                // An id is retired or given a point in one transaction,
                // never both (a batch never reuses a slot it retires).
                self.columns.insert((def.id, id), if add { n } else { 0 });
            }
        }
    }

    /// Writes the changes into `wtxn`.
    pub(crate) fn write(self, store: &Store, wtxn: &mut RwTxn<'_>) -> crate::error::Result<()> {
        let err = |e| store.err(e);
        for (key, delta) in self.sets {
            let mut set = postings::read(store, wtxn, &key)?;
            for id in delta.remove {
                set.remove(id);
            }
            for id in delta.add {
                set.insert(id);
            }
            if set.is_empty() {
                store.dbs.postings.delete(wtxn, &key).map_err(err)?;
            } else {
                store.dbs.postings.put(wtxn, &key, &postings::encode(&set)).map_err(err)?;
            }
        }
        let mut by_field: BTreeMap<u16, Vec<(u32, u64)>> = BTreeMap::new();
        for ((field, id), n) in self.columns {
            by_field.entry(field).or_default().push((id, n));
        }
        for (field, values) in by_field {
            columns::patch(store, wtxn, field, &values).map_err(err)?;
        }
        Ok(())
    }
}
