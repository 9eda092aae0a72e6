//! Sockets that connect and never speak HTTP/2 are closed after the
//! handshake timeout, and each listener holds a bounded number of
//! connections, so a flood of idle sockets neither piles up nor locks out
//! real clients for long.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use shoal_proto::v1;
use tokio::io::AsyncReadExt;
use tokio::net::TcpStream;

use crate::check;
use crate::common::{Fixture, block_on};

/// How many of `socks` the server has closed: reading them reaches EOF or
/// a reset (after whatever the server wrote first, such as its HTTP/2
/// settings) instead of waiting.
async fn closed(socks: &mut [TcpStream]) -> usize {
    let mut n = 0;
    for s in socks.iter_mut() {
        let mut b = [0u8; 256];
        loop {
            match tokio::time::timeout(Duration::from_millis(20), s.read(&mut b)).await {
                Ok(Ok(0) | Err(_)) => {
                    n += 1;
                    break;
                }
                Ok(Ok(_)) => continue,
                Err(_) => break,
            }
        }
    }
    n
}

async fn flood(addr: SocketAddr, n: usize) -> anyhow::Result<Vec<TcpStream>> {
    let mut socks = Vec::with_capacity(n);
    for _ in 0..n {
        socks.push(TcpStream::connect(addr).await?);
    }
    Ok(socks)
}

pub(crate) fn silent_connections_are_closed_and_bounded() -> anyhow::Result<()> {
    let limits = |prefix: &str| {
        vec![
            (format!("{prefix}LISTENER__HANDSHAKE_TIMEOUT_MS"), "500".to_owned()),
            (format!("{prefix}LISTENER__MAX_CONNECTIONS"), "16".to_owned()),
        ]
    };
    let fx = Fixture::start(1, |spec| {
        spec.node_env.extend(limits("SHOAL_SHARD_"));
        spec.coordinator_env.extend(limits("SHOAL_COORD_"));
    })?;
    block_on(async {
        let node = &fx.cluster.nodes[0];
        let coord = &fx.cluster.coordinator;
        // Let the coordinator's own channel to the node settle in.
        let mut client = fx.client().await?;
        client.cluster_status(v1::ClusterStatusRequest {}).await?;
        let files_before = (node.open_files()?, coord.open_files()?);

        for (name, addr) in [("shard node", node.addr), ("coordinator", coord.addr)] {
            let started = Instant::now();
            let mut socks = flood(addr, 50).await?;
            tokio::time::sleep(Duration::from_millis(150)).await;
            // Past the limit of 16 (one slot taken by a real client), the
            // rest were closed as soon as they were accepted.
            let early = closed(&mut socks).await;
            check!(fx, early >= 50 - 16, "{name}: only {early} of 50 idle sockets closed at once");
            // After the handshake timeout, every one of them.
            tokio::time::sleep(Duration::from_millis(800)).await;
            let all = closed(&mut socks).await;
            eprintln!("{name}: {early} of 50 silent sockets closed at once, {all} after {:?}", started.elapsed());
            check!(fx, all == 50, "{name}: {all} of 50 idle sockets closed after the handshake timeout");
        }
        // Real clients are served again, and the sockets are gone.
        let mut fresh = fx.client().await?;
        fresh.cluster_status(v1::ClusterStatusRequest {}).await?;
        tokio::time::sleep(Duration::from_millis(200)).await;
        let files_after = (node.open_files()?, coord.open_files()?);
        check!(
            fx,
            files_after.0 <= files_before.0 + 2 && files_after.1 <= files_before.1 + 4,
            "open files before {files_before:?}, after {files_after:?}"
        );
        Ok(())
    })
}
