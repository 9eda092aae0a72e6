//! Payload field indexes: which fields of the points' JSON payloads are
//! indexed, as what, and the tables that hold them.
//!
//! A field index lives in the shard's LMDB environment beside the vectors
//! and is changed in the same write transaction as the points it covers,
//! so a reader never sees a point without its index entries or the
//! reverse, and a snapshot or a compaction carries the indexes as they
//! are. Three tables hold them:
//!
//! - `fields`: one definition per indexed field ([`FieldDef`]).
//! - `postings`: per field, the set of internal ids holding each value, a
//!   roaring bitmap (keywords, booleans, and numbers by their exact value),
//!   plus the ids holding any value and those holding a value of another
//!   type ([`postings`]). Retired ids leave every set in the transaction
//!   that retires them, so an id the vacuum frees and a later batch
//!   reuses never carries an old entry.
//! - `field_columns`: per numeric field, every id's value in blocks of
//!   consecutive ids ([`columns`]): what a walk checks a range on, one
//!   point at a time, where a range's sets would have to be merged first.
//!
//! What a payload holds for a field is decided in one place
//! ([`value::extract`]), which both the indexes and the filter evaluated
//! on a payload itself (`filter::on_payload`) use: the two cannot disagree.

pub(crate) mod columns;
pub(crate) mod postings;
pub(crate) mod schema;
pub(crate) mod update;
pub(crate) mod value;

pub(crate) use schema::{FieldDef, Schema};
pub use schema::{FieldIndexInfo, FieldState, FieldType, MAX_FIELD_INDEXES, MAX_FIELD_NAME_BYTES};
