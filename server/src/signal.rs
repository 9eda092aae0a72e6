//! The signals a server's main waits for.

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
