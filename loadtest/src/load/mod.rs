//! The load generator (docs/loadtest.md); its commands come in later commits.
#![allow(dead_code)]

mod chart;
mod data;
mod faults;
mod npy;
mod recall;
mod report;
mod schedule;
mod stats;
mod target;
