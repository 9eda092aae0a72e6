//! The snapshot library against real parts: real LMDB environments through
//! the engine, and every test against each backend (local files, and a real
//! S3-compatible server when `SHOAL_TEST_S3_ENDPOINT` is set, which
//! `ops/test.sh` always does).

mod collections;
mod common;
mod conformance;
mod damage;
mod disk_full;
mod incremental;
mod progress;
mod under_ingest;
