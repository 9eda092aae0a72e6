//! Integration tests of the shard node over loopback gRPC, one module per
//! concern (a single test binary keeps link time down).

mod copies;
mod damaged;
mod moves;
