//! shoal's gRPC contract: the public `shoal.v1.Shoal` service (served by
//! coordinators), the internal `shoal.v1.ShardNode` service (served by shard
//! nodes), typed ids and the error codes both map to gRPC statuses.
//!
//! # Layout
//!
//! - `proto/shoal/v1/`: the contract itself. `shoal.proto` (the public
//!   service), `shard.proto` (the internal one, which trusts that requests
//!   were validated where they entered), `common.proto` and
//!   `snapshot.proto` (messages both use). `build.rs` compiles them with
//!   protox, so no `protoc` is needed, into `v1` and
//!   [`FILE_DESCRIPTOR_SET`].
//! - This file: the rules both sides of a call must agree on:
//!   [`shard_for`] (part of the on-disk contract), [`default_ef`], the
//!   scroll limits.
//! - `error`: [`ShoalError`] and its [`ErrorCode`]s, the one place they
//!   become gRPC statuses and back, and the layers that fix tonic's codes
//!   for bytes that do not decode.
//! - `ids`: [`CollectionName`] and [`NodeId`], validated once.
//! - `stream`: [`RequestStream`], a client's stream of requests with
//!   errors that say which message failed and whose fault it was.
//! - `deadline`: the caller's `grpc-timeout`, for work handed to another
//!   thread; `auth`: the client side of API keys; `json`: how deep a
//!   payload may nest.

/// Generated code of package `shoal.v1`.
#[allow(missing_docs, unreachable_pub, clippy::all, clippy::wildcard_enum_match_arm)]
pub mod v1 {
    tonic::include_proto!("shoal.v1");
}

pub mod auth;
pub mod deadline;
mod error;
mod ids;
pub mod json;
mod stream;

pub use error::{ErrorCode, RETRY_AFTER_MS, ShoalError, oversized_is_resource_exhausted, undecodable_is_invalid_argument};
pub use ids::{CollectionName, IdError, NodeId};
pub use stream::{RequestStream, stream_message_error};

/// The encoded `FileDescriptorSet` of every shoal proto file: served by gRPC
/// reflection and written out by `shoalctl proto-descriptor` for tools such
/// as `grpcurl -protoset`.
pub const FILE_DESCRIPTOR_SET: &[u8] = include_bytes!(concat!(env!("OUT_DIR"), "/shoal_descriptor.bin"));

/// The candidate list a search uses per shard when the request leaves `ef`
/// at 0: twice k, and at least 64, which gives recall@10 around 0.95 on
/// sentence embeddings.
pub fn default_ef(k: u32) -> u32 {
    k.saturating_mul(2).max(64)
}

/// Most points one scroll page holds.
pub const MAX_SCROLL_LIMIT: u32 = 10_000;
/// Points a scroll page holds when the request leaves its limit at 0.
pub const DEFAULT_SCROLL_LIMIT: u32 = 100;

/// The page size a scroll asks for (0: the default), checked.
pub fn scroll_limit(limit: u32) -> Result<u32, ShoalError> {
    match limit {
        0 => Ok(DEFAULT_SCROLL_LIMIT),
        l if l <= MAX_SCROLL_LIMIT => Ok(l),
        l => Err(ShoalError::invalid(format!("limit must be between 1 and {MAX_SCROLL_LIMIT}, got {l}"))),
    }
}

/// The shard of point `id` among `shards`: a fixed 64-bit mix of the id
/// (SplitMix64's finaliser, which spreads sequential ids evenly) reduced
/// with Lemire's multiply-shift. Part of the on-disk contract: changing it
/// moves every point. Here, in the contract, because shard nodes check
/// that the points they are sent are theirs.
pub fn shard_for(id: u64, shards: u32) -> u32 {
    debug_assert!(shards > 0);
    let mut x = id.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^= x >> 31;
    (((x >> 32) * u64::from(shards)) >> 32) as u32
}
