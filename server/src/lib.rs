//! What every shoal process shares, in one place: configuration layering,
//! telemetry (logs, OpenTelemetry traces and metrics with head sampling,
//! Prometheus), and the
//! gRPC server around a process's services (accept loop with its limits,
//! keep-alive, health, reflection, trace context, request metrics,
//! `/metrics`). The shard node, the coordinator and the embedded cluster all
//! serve through it, so telemetry plugs in here and nowhere else.

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
