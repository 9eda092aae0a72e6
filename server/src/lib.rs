//! What every shoal process shares, in one place: configuration layering,
//! telemetry (logs, OpenTelemetry traces and metrics with head sampling,
//! Prometheus), and the
//! gRPC server around a process's services (accept loop with its limits,
//! keep-alive, health, reflection, trace context, request metrics,
//! `/metrics`). The shard node, the coordinator and the embedded cluster all
//! serve through it, so telemetry plugs in here and nowhere else.
//!
//! # Layout
//!
//! - Serving: `grpc` (a process's services with everything every shoal
//!   server has), `accept` (the accept loop: Nagle off, a bounded number of
//!   connections, a deadline for the HTTP/2 handshake), `listener` (the
//!   `[*.listener]` limits and HTTP/2 settings), `tls` (listeners and the
//!   channels between processes; files read at start, so a bad one stops
//!   the process then, not at the first connection).
//! - Layers under every server: `shed` (RESOURCE_EXHAUSTED past a limit of
//!   requests at once, except health and `/metrics`), `rpc_metrics`
//!   (requests per RPC and status, watched to the end of the body).
//! - Telemetry: `telemetry` (logs, traces and metrics set up in one
//!   place), `sampling` (head sampling in front of the OpenTelemetry
//!   layer, so traces not kept cost no spans), `propagation` (W3C trace
//!   context in and out of calls), `process_metrics` (memory, open files,
//!   build, worker threads).
//! - The process: `config` (defaults, a TOML section, variables, flags),
//!   `runtime` (the tokio runtime, its worker threads a setting for
//!   processes that share cores), `signal` (SIGINT and SIGTERM).

pub mod accept;
pub mod config;
pub mod grpc;
mod listener;
mod process_metrics;
pub mod propagation;
mod rpc_metrics;
pub mod runtime;
pub mod sampling;
mod shed;
mod signal;
pub mod telemetry;
pub mod tls;

pub use accept::{ConnectionLimits, accept};
pub use listener::ListenerConfig;
pub use rpc_metrics::{RpcMetrics, RpcMetricsLayer};
pub use shed::{Shed, ShedLayer};
pub use signal::shutdown_signal;
pub use telemetry::TelemetryConfig;
pub use tls::{ClientTls, ServerTls};
