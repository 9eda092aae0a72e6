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
