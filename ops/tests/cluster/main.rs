//! Cluster tests: a coordinator and shard nodes in this process, talking
//! real gRPC over loopback.

mod bad_requests;
mod common;
mod damaged;
mod dev;
mod dev_etcd;
mod discovery;
mod durability;
mod fencing;
mod filters;
mod hostile;
mod ingest;
mod membership;
mod moves;
mod replicas;
mod runbooks;
mod search;
mod security;
mod snapshots;
