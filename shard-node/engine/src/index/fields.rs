//! Declaring, building and dropping field indexes while the shard serves.
//!
//! An index declared on a shard that holds points is built online: each
//! [`Index::build_field_indexes`] step indexes the next range of internal
//! ids in one write transaction (behind the writer like a batch), and
//! batches meanwhile keep the index exact for the ids the build has passed
//! (`FieldDef::covers`); the build reads the others' payloads as they are
//! when it gets there. A filter on the field is refused until the build is
//! done (or answered from payloads if the request allows a scan).

use std::sync::atomic::Ordering;

use heed::RwTxn;

use super::Index;
use super::writer::{Attempt, attempt};
use crate::error::{Error, InvalidInput, Result};
use crate::fields::update::Changes;
use crate::fields::{FieldDef, FieldIndexInfo, FieldState, FieldType, MAX_FIELD_INDEXES, Schema, postings, schema};
use crate::session;

/// What one build step did.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BuildStep {
    /// The field it indexed.
    pub field: String,
    /// Ids below this are indexed now.
    pub indexed_below: u32,
    /// Ids the shard holds.
    pub of: u32,
    /// The index is ready.
    pub done: bool,
}

impl Index {
    /// Declares an index on `field` as `kind`. On an empty shard it is
    /// ready at once; otherwise it is built by
    /// [`Index::build_field_indexes`] steps (the shard node runs them
    /// between batches). Declaring an index that exists with the same type
    /// changes nothing; with another type it is refused.
    pub fn create_field_index(&self, field: &str, kind: FieldType) -> Result<FieldIndexInfo> {
        schema::check_name(field)?;
        self.write_fields(|index, wtxn| {
            let store = &index.store;
            let schema = Schema::read(store, wtxn)?;
            if let Some(def) = schema.get(field) {
                if def.kind != kind {
                    return Err(InvalidInput::FieldIndexExists { field: field.to_owned(), existing: def.kind, requested: kind }.into());
                }
                return Ok(None);
            }
            if schema.fields.len() >= MAX_FIELD_INDEXES {
                return Err(InvalidInput::TooManyFieldIndexes { max: MAX_FIELD_INDEXES }.into());
            }
            let id = schema.free_id().ok_or(InvalidInput::TooManyFieldIndexes { max: MAX_FIELD_INDEXES })?;
            let state = session::read_state(store, wtxn)?;
            let def = FieldDef { name: field.to_owned(), id, kind, building: (state.next_id > 0).then_some(0) };
            store.dbs.fields.put(wtxn, field.as_bytes(), &def.encode()).map_err(|e| store.err(e))?;
            if def.building.is_some() {
                index.fields_building.store(true, Ordering::Relaxed);
            }
            Ok(Some(()))
        })?;
        self.field_indexes()?.into_iter().find(|i| i.field == field).ok_or_else(|| Error::Corrupt {
            path: self.path.clone(),
            detail: format!("the index on {field} was declared but is not listed"),
        })
    }

    /// Drops the index on `field` with every entry it holds; false if there
    /// was none.
    pub fn drop_field_index(&self, field: &str) -> Result<bool> {
        let dropped = self.write_fields(|index, wtxn| {
            let store = &index.store;
            let Some(def) = Schema::read(store, wtxn)?.get(field).cloned() else { return Ok(None) };
            let err = |e| store.err(e);
            store.dbs.fields.delete(wtxn, field.as_bytes()).map_err(err)?;
            store.dbs.postings.delete_prefix(wtxn, &def.id.to_be_bytes()).map_err(err)?;
            store.dbs.field_columns.delete_prefix(wtxn, &def.id.to_be_bytes()).map_err(err)?;
            Ok(Some(()))
        })?;
        Ok(dropped.is_some())
    }

    /// One step of the online build of the first index that is not ready:
    /// indexes up to `max_points` more ids in one write transaction.
    /// `None` if every index is ready.
    pub fn build_field_indexes(&self, max_points: u32) -> Result<Option<BuildStep>> {
        self.write_fields(|index, wtxn| {
            let store = &index.store;
            let schema = Schema::read(store, wtxn)?;
            let Some(def) = schema.fields.iter().find(|d| d.building.is_some()) else {
                index.fields_building.store(false, Ordering::Relaxed);
                return Ok(None);
            };
            let from = def.building.unwrap_or(0);
            let state = session::read_state(store, wtxn)?;
            let to = from.saturating_add(max_points.max(1)).min(state.next_id);
            let mut changes = Changes::default();
            for id in from..to {
                if session::read_node(store, wtxn, id)?.is_tombstone() {
                    continue;
                }
                let payload = store.dbs.payloads.get(wtxn, id).map_err(|e| store.err(e))?;
                changes.add_to(def, id, payload);
            }
            changes.write(store, wtxn)?;
            let done = to >= state.next_id;
            let new = FieldDef { building: (!done).then_some(to), ..def.clone() };
            store.dbs.fields.put(wtxn, def.name.as_bytes(), &new.encode()).map_err(|e| store.err(e))?;
            Ok(Some(BuildStep { field: def.name.clone(), indexed_below: to, of: state.next_id, done }))
        })
    }

    /// True while a field index is being built: the shard node then runs
    /// [`Index::build_field_indexes`] steps between its batches.
    pub fn field_index_building(&self) -> bool {
        self.fields_building.load(Ordering::Relaxed)
    }

    /// Every field index, with its state and counts.
    pub fn field_indexes(&self) -> Result<Vec<FieldIndexInfo>> {
        let snap = self.snapshot()?;
        let store = &self.store;
        let txn = &snap.session.txn;
        let next_id = snap.session.state.next_id;
        let mut out = Vec::new();
        for def in Schema::read(store, txn)?.fields {
            let present = postings::count(store, txn, &postings::key(def.id, postings::PRESENT, &[]))?;
            let other = postings::count(store, txn, &postings::key(def.id, postings::OTHER, &[]))?;
            let state = match def.building {
                None => FieldState::Ready,
                Some(below) => FieldState::Building { indexed_below: below, of: next_id },
            };
            out.push(FieldIndexInfo { field: def.name, kind: def.kind, state, points: present.saturating_sub(other), other_type: other });
        }
        Ok(out)
    }

    /// Runs `change` in a write transaction of its own behind the writer,
    /// committing it if it returns `Some` (growing the map and running it
    /// again if it ran out of room).
    fn write_fields<T>(&self, change: impl Fn(&Index, &mut RwTxn<'_>) -> Result<Option<T>>) -> Result<Option<T>> {
        let _writer = self.writer.lock();
        loop {
            let attempted = {
                let _shared = self.resize.read();
                self.write_fields_once(&change)
            };
            match attempted {
                Ok(out) => return Ok(out),
                Err(Attempt::MapFull) => self.grow_map()?,
                Err(Attempt::Failed(e)) => return Err(e),
            }
        }
    }

    fn write_fields_once<T>(&self, change: &impl Fn(&Index, &mut RwTxn<'_>) -> Result<Option<T>>) -> Result<Option<T>, Attempt> {
        let store = &self.store;
        let mut wtxn = store.env.write_txn().map_err(|e| attempt(store, e))?;
        let state = session::read_state(store, &wtxn)?;
        match change(self, &mut wtxn)? {
            None => {
                wtxn.abort();
                Ok(None)
            }
            Some(out) => {
                self.commit(wtxn, &state, &state, None, false)?;
                Ok(Some(out))
            }
        }
    }
}
