//! The run's clients: coordinators in order of preference, and what a
//! failed call's status says about whom to try next.

use std::time::Duration;

use shoal_proto::v1::shoal_client::ShoalClient;
use tonic::transport::Channel;

/// Coordinators in order of preference; on a refused connection, the next.
#[derive(Clone)]
pub(super) struct Clients {
    pub(super) clients: Vec<ShoalClient<Channel>>,
}

impl Clients {
    pub(super) fn connect(endpoints: &[String]) -> anyhow::Result<Clients> {
        let mut clients = Vec::new();
        for e in endpoints {
            let channel = Channel::from_shared(e.clone())?.connect_timeout(Duration::from_millis(500)).connect_lazy();
            clients.push(ShoalClient::new(channel).max_decoding_message_size(64 << 20));
        }
        Ok(Clients { clients })
    }
}

/// A refused or broken connection (no answer from a coordinator, which
/// always sends a retry hint with UNAVAILABLE): the coordinator is gone.
pub(super) fn coordinator_gone(s: &tonic::Status) -> bool {
    use tonic::Code::{Cancelled, Unavailable, Unknown};
    matches!(s.code(), Unavailable | Unknown | Cancelled) && s.metadata().get(shoal_proto::RETRY_AFTER_MS).is_none()
}

/// The request itself is wrong: sending it again cannot help.
pub(super) fn request_fault(s: &tonic::Status) -> bool {
    use tonic::Code::{AlreadyExists, InvalidArgument, NotFound, PermissionDenied, Unauthenticated, Unimplemented};
    matches!(s.code(), InvalidArgument | NotFound | AlreadyExists | PermissionDenied | Unauthenticated | Unimplemented)
}

pub(super) fn retry_after(s: &tonic::Status) -> Duration {
    let hint = s.metadata().get(shoal_proto::RETRY_AFTER_MS).and_then(|v| v.to_str().ok()?.parse().ok()).unwrap_or(100);
    Duration::from_millis(hint).min(Duration::from_millis(250))
}
