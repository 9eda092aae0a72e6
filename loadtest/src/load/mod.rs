//! The load generator (docs/loadtest.md); its commands come in later commits.
#![allow(dead_code)]

mod stats;
mod schedule;
mod npy;
mod recall;
mod data;
mod target;
mod faults;
