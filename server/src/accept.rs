//! The accept loop every shoal listener runs: Nagle off, a bounded number
//! of connections, and a deadline for the HTTP/2 handshake.

use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use futures_core::Stream;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{OwnedSemaphorePermit, Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::{Connected, TcpConnectInfo};

/// What one listener accepts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ConnectionLimits {
    /// A connection must send the HTTP/2 preface within this time after it
    /// was accepted, or it is closed: a client that connects and says
    /// nothing would otherwise hold a socket and a task forever.
    pub handshake_timeout: Duration,
    /// Connections open at once; past it, new ones are closed as soon as
    /// they are accepted (the client sees a reset and retries elsewhere or
    /// later), so a flood of sockets cannot exhaust the node's files.
    pub max_connections: usize,
}

impl Default for ConnectionLimits {
    fn default() -> Self {
        ConnectionLimits { handshake_timeout: Duration::from_secs(5), max_connections: 4096 }
    }
}

/// The HTTP/2 connection preface every client sends first (RFC 9113 §3.4).
const PREFACE_LEN: usize = 24;

/// Accepts connections on `listener` for a tonic server: Nagle's algorithm
/// off (without it a small response can wait for the peer's delayed ACK,
/// ~40 ms on Linux, which shows as a p99 of 40 ms on a 1 ms search), at most
/// `limits.max_connections` open, each closed if it does not start HTTP/2
/// within `limits.handshake_timeout`.
///
/// The accept loop runs in its own task and ends when the returned stream
/// is dropped (the server stopped accepting), closing the listening socket.
pub fn accept(listener: TcpListener, limits: ConnectionLimits) -> impl Stream<Item = io::Result<Conn>> {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(accept_loop(listener, limits, tx));
    ReceiverStream::new(rx)
}

async fn accept_loop(listener: TcpListener, limits: ConnectionLimits, tx: mpsc::Sender<io::Result<Conn>>) {
    let permits = Arc::new(Semaphore::new(limits.max_connections.max(1)));
    let mut refused = Throttled::new("connections refused: the listener holds its maximum (max_connections)");
    let mut failed = Throttled::new("accept failed");
    loop {
        let accepted = tokio::select! {
            a = listener.accept() => a,
            () = tx.closed() => return,
        };
        let stream = match accepted {
            Ok((stream, _)) => stream,
            Err(e) => {
                // EMFILE and friends return at once: without a pause the
                // loop would spin on a full process.
                failed.note(&e);
                tokio::time::sleep(Duration::from_millis(50)).await;
                continue;
            }
        };
        let Ok(permit) = Arc::clone(&permits).try_acquire_owned() else {
            refused.note(&format_args!("limit {}", limits.max_connections));
            drop(stream);
            continue;
        };
        if let Err(e) = stream.set_nodelay(true) {
            failed.note(&e);
            continue;
        }
        let conn = Conn {
            io: stream,
            handshake: Some(Box::pin(tokio::time::sleep(limits.handshake_timeout))),
            handshake_timeout: limits.handshake_timeout,
            preface_read: 0,
            _permit: permit,
        };
        if tx.send(Ok(conn)).await.is_err() {
            return;
        }
    }
}

/// Logs a repeated condition at most once a second, with how often it
/// happened meanwhile.
struct Throttled {
    what: &'static str,
    last: Option<Instant>,
    count: u64,
}

impl Throttled {
    fn new(what: &'static str) -> Self {
        Throttled { what, last: None, count: 0 }
    }

    fn note(&mut self, detail: &dyn std::fmt::Display) {
        self.count += 1;
        if self.last.is_none_or(|t| t.elapsed() >= Duration::from_secs(1)) {
            tracing::warn!(times = self.count, "{}: {detail}", self.what);
            self.last = Some(Instant::now());
            self.count = 0;
        }
    }
}

/// An accepted connection: holds its slot under the listener's limit until
/// it closes, and fails its reads once the handshake is overdue.
pub struct Conn {
    io: TcpStream,
    /// Until the preface has been read.
    handshake: Option<Pin<Box<tokio::time::Sleep>>>,
    handshake_timeout: Duration,
    preface_read: usize,
    _permit: OwnedSemaphorePermit,
}

impl AsyncRead for Conn {
    fn poll_read(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let this = &mut *self;
        match Pin::new(&mut this.io).poll_read(cx, buf) {
            Poll::Ready(Ok(())) => {
                if this.handshake.is_some() {
                    this.preface_read += buf.filled().len() - before;
                    if this.preface_read >= PREFACE_LEN {
                        this.handshake = None;
                    }
                }
                Poll::Ready(Ok(()))
            }
            Poll::Pending => {
                let overdue = this.handshake.as_mut().is_some_and(|timer| timer.as_mut().poll(cx).is_ready());
                if overdue {
                    return Poll::Ready(Err(io::Error::new(
                        io::ErrorKind::TimedOut,
                        format!("no HTTP/2 handshake within {:?}", this.handshake_timeout),
                    )));
                }
                Poll::Pending
            }
            ready => ready,
        }
    }
}

impl AsyncWrite for Conn {
    fn poll_write(mut self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write(cx, buf)
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.io).poll_shutdown(cx)
    }

    fn poll_write_vectored(mut self: Pin<&mut Self>, cx: &mut Context<'_>, bufs: &[io::IoSlice<'_>]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.io).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }
}

impl Connected for Conn {
    type ConnectInfo = TcpConnectInfo;

    fn connect_info(&self) -> Self::ConnectInfo {
        self.io.connect_info()
    }
}

#[cfg(test)]
mod tests {
    use tokio::io::AsyncReadExt;
    use tokio_stream::StreamExt;

    use super::*;

    async fn listener() -> (TcpListener, std::net::SocketAddr) {
        let l = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let a = l.local_addr().unwrap();
        (l, a)
    }

    #[tokio::test]
    async fn a_silent_connection_fails_its_read_after_the_handshake_timeout() {
        let (l, addr) = listener().await;
        let limits = ConnectionLimits { handshake_timeout: Duration::from_millis(200), max_connections: 8 };
        let mut incoming = std::pin::pin!(accept(l, limits));
        let _client = TcpStream::connect(addr).await.unwrap();
        let mut conn = incoming.next().await.unwrap().unwrap();
        let started = Instant::now();
        let mut buf = [0u8; 8];
        let err = conn.read(&mut buf).await.unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::TimedOut);
        let took = started.elapsed();
        assert!(took >= Duration::from_millis(150) && took < Duration::from_secs(5), "{took:?}");
    }

    #[tokio::test]
    async fn a_connection_that_sent_its_preface_has_no_deadline() {
        use tokio::io::AsyncWriteExt;
        let (l, addr) = listener().await;
        let limits = ConnectionLimits { handshake_timeout: Duration::from_millis(100), max_connections: 8 };
        let mut incoming = std::pin::pin!(accept(l, limits));
        let mut client = TcpStream::connect(addr).await.unwrap();
        client.write_all(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n").await.unwrap();
        let mut conn = incoming.next().await.unwrap().unwrap();
        let mut preface = [0u8; PREFACE_LEN];
        conn.read_exact(&mut preface).await.unwrap();
        tokio::time::sleep(Duration::from_millis(300)).await;
        client.write_all(b"more").await.unwrap();
        let mut more = [0u8; 4];
        conn.read_exact(&mut more).await.unwrap();
        assert_eq!(&more, b"more");
    }

    #[tokio::test]
    async fn connections_past_the_limit_are_closed_and_slots_come_back() {
        let (l, addr) = listener().await;
        let limits = ConnectionLimits { handshake_timeout: Duration::from_secs(30), max_connections: 2 };
        let mut incoming = std::pin::pin!(accept(l, limits));
        let _a = TcpStream::connect(addr).await.unwrap();
        let _b = TcpStream::connect(addr).await.unwrap();
        let first = incoming.next().await.unwrap().unwrap();
        let _second = incoming.next().await.unwrap().unwrap();
        // The third is accepted by the kernel, then closed by the loop.
        let mut third = TcpStream::connect(addr).await.unwrap();
        let mut buf = [0u8; 1];
        let n = tokio::time::timeout(Duration::from_secs(5), third.read(&mut buf)).await.expect("closed promptly");
        assert!(matches!(n, Ok(0) | Err(_)), "the third connection was served: {n:?}");
        // Closing one frees its slot.
        drop(first);
        let _d = TcpStream::connect(addr).await.unwrap();
        let fourth = tokio::time::timeout(Duration::from_secs(5), incoming.next()).await.expect("a slot came back");
        assert!(fourth.unwrap().is_ok());
    }
}
