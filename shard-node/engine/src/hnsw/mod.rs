//! The HNSW algorithms, written against the [`crate::view::Graph`] trait so
//! the same code runs on committed snapshots and on a batch being built.

pub(crate) mod build;
mod insert;
mod level;
mod repair;
mod search;
mod select;
mod vacuum;

pub(crate) use crate::prefetch::prefetch;
pub(crate) use level::level_for;
pub(crate) use search::{Admit, Scored, Scratch, greedy_closest, prefetch_codes, search_layer, walk_layer};
pub(crate) use select::select_neighbours;
