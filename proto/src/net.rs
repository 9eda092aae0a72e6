//! Socket settings every shoal server needs.

use futures_core::Stream;

/// Accepted connections with Nagle's algorithm off. Without it, a small
/// response can wait for the peer's delayed ACK (~40 ms on Linux), which
/// shows up as a p99 of 40 ms on a search that takes 1 ms.
pub fn nodelay<S>(incoming: S) -> impl Stream<Item = std::io::Result<tokio::net::TcpStream>>
where
    S: Stream<Item = std::io::Result<tokio::net::TcpStream>>,
{
    tokio_stream::StreamExt::map(incoming, |conn| {
        let conn = conn?;
        conn.set_nodelay(true)?;
        Ok(conn)
    })
}

/// Resolves on SIGINT or SIGTERM: what the servers' mains wait for before a
/// graceful shutdown.
pub async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
        Ok(mut term) => {
            tokio::select! { _ = ctrl_c => {}, _ = term.recv() => {} }
        }
        Err(_) => {
            let _ = ctrl_c.await;
        }
    }
}
