//! shoal's filter language: which points a search, a count, a scroll or
//! a delete may touch, asked of the fields of their JSON payloads
//! (docs/filters.md).
//!
//! No storage here: a [`Filter`] is checked on its own ([`Filter::check`]:
//! its size, depth and values), then resolved against the field indexes a
//! shard keeps ([`resolve()`]: a field without a ready index is refused
//! unless a scan was allowed, a value of the wrong type for its index is
//! refused), and the engine answers the resolved form. Coordinators check
//! a filter once with the same code ([`Filter::check_against`]) before
//! any shard sees it.
//!
//! ```
//! let f = shoal_filter::parse_json(r#"{"must": [{"key": "tags", "match": "rust"}]}"#)?;
//! f.check_against(&[("tags".into(), shoal_filter::FieldType::Keyword)], false)?;
//! let err = f.check_against(&[], false).unwrap_err();
//! assert!(err.to_string().starts_with("filter must[0]: the field tags has no index"));
//! # Ok::<(), shoal_filter::FilterError>(())
//! ```
//!
//! # Layout
//!
//! - `language`: the types, their limits and the checks that need no index.
//! - `field_type`: what a field index holds; which names a field may have.
//! - `keys`: numbers and times as ordered keys.
//! - `json`: the JSON form (`shoalctl --filter`, the benchmarks' cases).
//! - `resolve`: a filter against a shard's field indexes.
//! - `wire` (feature `wire`): to and from the `shoal.v1` messages.
#![warn(missing_docs)]

mod error;
mod field_type;
mod json;
mod keys;
mod language;
pub mod resolve;
#[cfg(feature = "wire")]
pub mod wire;

pub use error::FilterError;
pub use field_type::{FieldType, MAX_FIELD_NAME_BYTES, check_name};
pub use json::parse_json;
pub use keys::{MAX_KEYWORD_BYTES, f64_of, ord_f64, ord_i64, parse_datetime};
pub use language::{Bound, Condition, Filter, MAX_ANY_VALUES, MAX_FILTER_CONDITIONS, MAX_FILTER_DEPTH, MAX_HAS_IDS, MatchValue, Range};
pub use resolve::resolve;
