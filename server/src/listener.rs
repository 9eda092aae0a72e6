//! What every shoal listener shares: its limits on connections and the
//! HTTP/2 settings of the tonic server behind it (`[coordinator.listener]`
//! and `[shard_node.listener]` in the config).

use std::time::Duration;

use crate::accept::ConnectionLimits;
use crate::tls::ServerTls;

/// Connection handling of one gRPC listener.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct ListenerConfig {
    /// A connection that has not started HTTP/2 this long after it was
    /// accepted is closed.
    pub handshake_timeout_ms: u64,
    /// Connections open at once; more are closed as they arrive.
    pub max_connections: usize,
    /// The server pings each client this often over HTTP/2 ...
    pub keepalive_interval_ms: u64,
    /// ... and closes the connection when a ping goes unanswered this long,
    /// so the requests of a client that vanished are cancelled.
    pub keepalive_timeout_ms: u64,
    /// HTTP/2 streams a client may reset before the server has taken them
    /// up, at once, before the connection is closed as an attack ("rapid
    /// reset"). h2's default of 20 is too few between coordinators and
    /// busy shard nodes: a hedged read, a failed-over read and a search
    /// past its deadline each reset their call, and a node that closed
    /// the coordinator's connection for it was marked down and failed
    /// every search in flight (seen in the chaos run).
    pub max_pending_reset_streams: usize,
    /// Requests served at once by the process; past it, a request is
    /// answered RESOURCE_EXHAUSTED with a `retry-after-ms` hint at once
    /// (health checks and `/metrics` excepted). 0: no limit.
    pub max_concurrent_requests: usize,
    /// HTTP/2 streams (calls) one connection may have open at once; a
    /// client past it waits for one of its calls to end.
    pub max_concurrent_streams: u32,
    /// TLS (and, with `client_ca_file`, mutual TLS). Without it the
    /// listener speaks plain text, which it does only on loopback unless
    /// `insecure` is set.
    pub tls: Option<ServerTls>,
    /// Serve plain text on a non-loopback address: only on a network no
    /// one else can reach.
    pub insecure: bool,
    /// On shutdown, calls under way get this long to finish; then their
    /// connections are closed. A client that stopped reading a stream (and
    /// neither closes nor resets it) would otherwise hold the process up
    /// for ever.
    pub shutdown_grace_ms: u64,
}

impl Default for ListenerConfig {
    fn default() -> Self {
        let limits = ConnectionLimits::default();
        ListenerConfig {
            handshake_timeout_ms: limits.handshake_timeout.as_millis() as u64,
            max_connections: limits.max_connections,
            keepalive_interval_ms: 10_000,
            keepalive_timeout_ms: 5_000,
            max_pending_reset_streams: 1_024,
            max_concurrent_requests: 4_096,
            max_concurrent_streams: 1_024,
            tls: None,
            insecure: false,
            shutdown_grace_ms: 10_000,
        }
    }
}

impl ListenerConfig {
    /// The accept loop's limits.
    pub fn limits(&self) -> ConnectionLimits {
        ConnectionLimits {
            handshake_timeout: Duration::from_millis(self.handshake_timeout_ms.max(1)),
            max_connections: self.max_connections.max(1),
        }
    }

    /// What [`ListenerConfig::server`] would refuse, checked before a
    /// process says it started: plain text off loopback, TLS files that
    /// are missing or do not parse.
    pub fn check(&self, addr: std::net::SocketAddr) -> anyhow::Result<()> {
        self.server(addr).map(drop)
    }

    /// A tonic server builder with these settings for a listener bound to
    /// `addr` (TLS loaded from its files; plain text refused off loopback
    /// unless `insecure`); the caller adds layers and services.
    pub fn server(&self, addr: std::net::SocketAddr) -> anyhow::Result<tonic::transport::Server> {
        crate::tls::check_plain_text(addr, self.tls.is_some(), self.insecure)?;
        let mut server = tonic::transport::Server::builder();
        if let Some(tls) = &self.tls {
            server = server.tls_config(tls.load()?)?;
        }
        Ok(server
            .http2_keepalive_interval(Some(Duration::from_millis(self.keepalive_interval_ms.max(1))))
            .http2_keepalive_timeout(Some(Duration::from_millis(self.keepalive_timeout_ms.max(1))))
            .tcp_keepalive(Some(Duration::from_secs(30)))
            .http2_max_pending_accept_reset_streams(Some(self.max_pending_reset_streams.max(1)))
            .max_concurrent_streams(Some(self.max_concurrent_streams.max(1))))
    }
}
