//! shoal's gRPC contract: the public `shoal.v1.Shoal` service (served by
//! coordinators), the internal `shoal.v1.ShardNode` service (served by shard
//! nodes), typed ids and the error codes both map to gRPC statuses.
#![allow(missing_docs, unreachable_pub, clippy::all)]

/// Generated code of package `shoal.v1`.
pub mod v1 {
    tonic::include_proto!("shoal.v1");
}

mod error;
mod net;

pub use net::{nodelay, shutdown_signal};
mod ids;

pub use error::{ErrorCode, ShoalError, oversized_is_resource_exhausted};
pub use ids::{CollectionName, IdError, NodeId};

/// The encoded `FileDescriptorSet` of every shoal proto file: served by gRPC
/// reflection and written out by `shoalctl proto-descriptor` for tools such
/// as `grpcurl -protoset`.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/shoal_descriptor.bin"));
