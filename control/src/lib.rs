//! shoal's control plane: what a cluster is made of (collections, where
//! their shards live, the member nodes) and the store every process reads
//! it from and changes it through. Shared by coordinators (which route by
//! it and, one at a time, decide placement) and shard nodes (which
//! register in it). See `docs/control-plane.md`.
//!
//! # Layout
//!
//! - `model`: the cluster in the control plane's own types (collections,
//!   shard placement and moves, members); `conversions`: those types to
//!   and from `v1::` messages. Apart so that the protocol and the way
//!   placement is kept can each change without the other.
//! - `config`: where the control plane is (`[*.cluster]`: etcd endpoints,
//!   prefix, lease TTL, TLS files) and the flags that set it.
//! - `metadata`: the `MetadataStore` trait and the `View` every process
//!   serves from, with its stores:
//!   - `memory`: one process's store (`shoalctl demo`, `dev` without etcd,
//!     tests).
//!   - `etcd`: the store coordinators share. `keys` (the key layout) and
//!     `codec` (the stored JSON) are the only places the stored format
//!     lives; `collections` and `election` are the conditional writes;
//!     `lease` keeps registrations alive; `mirror` (pure, tested without
//!     a server) and `watcher` keep the view current; `shared` is the
//!     one way to call etcd; `tls` and `probe` connect, and say why a
//!     connection was refused.
//!   - `placement`: choosing nodes for shards, pure functions of a view.
//!   - `conformance`: the behaviour every store must show, public so
//!     that `tests/etcd_metadata.rs` runs it against a real etcd.
//! - `build.rs` generates nothing: it makes cargo fetch a `protoc` for
//!   etcd-client's build script.

pub mod config;
pub mod conversions;
pub mod metadata;
pub mod model;
pub use config::ClusterConfig;
