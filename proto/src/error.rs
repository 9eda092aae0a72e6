//! The one error type of shoal's services and the one place it becomes a
//! gRPC status (and back, on the client side).

use std::time::Duration;

use tonic::{Code, Status};

/// Metadata key carrying how long to wait before retrying, in milliseconds.
pub const RETRY_AFTER_MS: &str = "retry-after-ms";

/// What a caller can do about an error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[non_exhaustive]
pub enum ErrorCode {
    /// The request is wrong; do not retry it unchanged.
    InvalidArgument,
    /// The collection, shard or point does not exist.
    NotFound,
    /// It exists already.
    AlreadyExists,
    /// A shard or node cannot answer now; retry after the hint.
    Unavailable,
    /// Over a limit (size, memory, disk); shrink the request or wait.
    ResourceExhausted,
    /// The deadline passed before every part answered.
    DeadlineExceeded,
    /// The target is not in the state the request needs, and retrying it
    /// unchanged fails again until the caller re-reads that state: a write
    /// whose epoch is below the shard's (the shard moved: re-read the
    /// placement), a batch log read the log no longer reaches (re-seed
    /// from a snapshot), log entries out of order (re-read `last_seq`).
    FailedPrecondition,
    /// An operation the server started was undone (a shard move rolled
    /// back); the state is as before it. Asking again starts it again.
    Aborted,
    /// The data on disk is damaged (a shard's environment failed its
    /// checks): that copy cannot serve until it is restored (`shard
    /// recover`) or resynced from another replica.
    DataLoss,
    /// A bug or a broken invariant on the server.
    Internal,
}

impl ErrorCode {
    pub fn grpc(self) -> Code {
        match self {
            ErrorCode::InvalidArgument => Code::InvalidArgument,
            ErrorCode::NotFound => Code::NotFound,
            ErrorCode::AlreadyExists => Code::AlreadyExists,
            ErrorCode::Unavailable => Code::Unavailable,
            ErrorCode::ResourceExhausted => Code::ResourceExhausted,
            ErrorCode::DeadlineExceeded => Code::DeadlineExceeded,
            ErrorCode::FailedPrecondition => Code::FailedPrecondition,
            ErrorCode::Aborted => Code::Aborted,
            ErrorCode::DataLoss => Code::DataLoss,
            ErrorCode::Internal => Code::Internal,
        }
    }

    fn from_grpc(code: Code) -> Self {
        match code {
            Code::InvalidArgument | Code::OutOfRange => ErrorCode::InvalidArgument,
            Code::FailedPrecondition => ErrorCode::FailedPrecondition,
            Code::NotFound => ErrorCode::NotFound,
            Code::AlreadyExists => ErrorCode::AlreadyExists,
            Code::Aborted => ErrorCode::Aborted,
            Code::Unavailable | Code::Cancelled => ErrorCode::Unavailable,
            Code::ResourceExhausted => ErrorCode::ResourceExhausted,
            Code::DeadlineExceeded => ErrorCode::DeadlineExceeded,
            Code::DataLoss => ErrorCode::DataLoss,
            Code::Ok | Code::Unknown | Code::PermissionDenied | Code::Unimplemented | Code::Internal | Code::Unauthenticated => {
                ErrorCode::Internal
            }
        }
    }
}

/// An error with its code, a message for humans and an optional retry hint.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ShoalError {
    pub code: ErrorCode,
    pub message: String,
    pub retry_after: Option<Duration>,
}

impl ShoalError {
    pub fn new(code: ErrorCode, message: impl Into<String>) -> Self {
        ShoalError { code, message: message.into(), retry_after: None }
    }

    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::InvalidArgument, message)
    }

    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::NotFound, message)
    }

    pub fn already_exists(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::AlreadyExists, message)
    }

    pub fn unavailable(message: impl Into<String>, retry_after: Duration) -> Self {
        ShoalError { code: ErrorCode::Unavailable, message: message.into(), retry_after: Some(retry_after) }
    }

    pub fn exhausted(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::ResourceExhausted, message)
    }

    pub fn deadline(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::DeadlineExceeded, message)
    }

    pub fn failed_precondition(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::FailedPrecondition, message)
    }

    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorCode::Internal, message)
    }

    /// Prefixes the message with where the error happened.
    pub fn context(mut self, what: impl std::fmt::Display) -> Self {
        self.message = format!("{what}: {}", self.message);
        self
    }
}

impl From<crate::IdError> for ShoalError {
    fn from(e: crate::IdError) -> Self {
        ShoalError::invalid(e.to_string())
    }
}

/// Makes a request that exceeds the server's message size limit fail with
/// RESOURCE_EXHAUSTED, the code gRPC specifies for it (tonic answers
/// OUT_OF_RANGE). Used as `tower::util::MapResponseLayer::new(...)` on the
/// servers; it sees statuses sent in headers, which is where a unary call's
/// decode error goes.
pub fn oversized_is_resource_exhausted<B>(mut resp: tonic::codegen::http::Response<B>) -> tonic::codegen::http::Response<B> {
    let headers = resp.headers_mut();
    let out_of_range = headers.get("grpc-status").is_some_and(|v| v.as_bytes() == b"11");
    let too_large = headers
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        // grpc-message is percent-encoded (spaces become %20).
        .is_some_and(|m| m.replace("%20", " ").contains("message length too large"));
    if out_of_range && too_large {
        headers.insert("grpc-status", tonic::codegen::http::HeaderValue::from_static("8"));
    }
    resp
}

/// Makes a request whose bytes are not the message they should be
/// (truncated, a field of the wrong wire type, a string that is not UTF-8)
/// fail with INVALID_ARGUMENT: tonic answers INTERNAL, which tells the
/// caller the server is broken rather than its request. Like
/// [`oversized_is_resource_exhausted`], it sees statuses sent in headers:
/// unary calls'. A client stream's messages are decoded as its handler
/// reads them, after the headers went out; [`crate::RequestStream`] maps
/// their errors there.
pub fn undecodable_is_invalid_argument<B>(mut resp: tonic::codegen::http::Response<B>) -> tonic::codegen::http::Response<B> {
    let headers = resp.headers_mut();
    let internal = headers.get("grpc-status").is_some_and(|v| v.as_bytes() == b"13");
    let undecodable = headers
        .get("grpc-message")
        .and_then(|m| m.to_str().ok())
        .is_some_and(|m| crate::stream::is_undecodable(Code::Internal, &m.replace("%20", " ")));
    if internal && undecodable {
        headers.insert("grpc-status", tonic::codegen::http::HeaderValue::from_static("3"));
    }
    resp
}

impl From<ShoalError> for Status {
    fn from(e: ShoalError) -> Status {
        let mut status = Status::new(e.code.grpc(), e.message);
        if let Some(after) = e.retry_after
            && let Ok(v) = after.as_millis().to_string().parse()
        {
            status.metadata_mut().insert(RETRY_AFTER_MS, v);
        }
        status
    }
}

impl ShoalError {
    /// What a call to another shoal process failed with, in shoal's terms.
    /// This is the one place where the transport's failures get their code:
    /// a status the peer sent is kept as it is, but one the client side made
    /// up because the connection broke, was reset or timed out (tonic then
    /// attaches the error that caused it, which a status from the wire never
    /// carries) means the peer could not be reached: UNAVAILABLE, worth a
    /// retry, whatever code tonic guessed (UNKNOWN "transport error",
    /// INTERNAL for a reset stream, CANCELLED).
    pub fn from_peer(status: Status) -> ShoalError {
        use std::error::Error;
        let from_transport = status.source().is_some();
        // The call's own deadline, enforced by the client's channel.
        let mut cause = status.source();
        let mut timed_out = false;
        while let Some(e) = cause {
            timed_out |= e.is::<tonic::TimeoutExpired>();
            cause = e.source();
        }
        if timed_out {
            return ShoalError::deadline("no answer before the call's deadline");
        }
        let code = status.code();
        if code == Code::OutOfRange && status.message().contains("message length too large") {
            return ShoalError::exhausted(format!(
                "the answer is larger than the message limit (max_message_bytes): {}; ask for less per request",
                status.message()
            ));
        }
        if from_transport && matches!(code, Code::Unknown | Code::Internal | Code::Cancelled | Code::Unavailable) {
            return ShoalError::unavailable(format!("connection lost: {}", status.message()), Duration::from_secs(1));
        }
        if code == Code::Cancelled {
            return ShoalError::unavailable(format!("call cancelled: {}", status.message()), Duration::from_secs(1));
        }
        let mut e = ShoalError::from(status);
        if e.code == ErrorCode::Unavailable && e.retry_after.is_none() {
            e.retry_after = Some(Duration::from_secs(1));
        }
        e
    }
}

impl From<Status> for ShoalError {
    fn from(s: Status) -> ShoalError {
        let retry_after =
            s.metadata().get(RETRY_AFTER_MS).and_then(|v| v.to_str().ok()).and_then(|v| v.parse().ok()).map(Duration::from_millis);
        ShoalError { code: ErrorCode::from_grpc(s.code()), message: s.message().to_owned(), retry_after }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn errors_round_trip_through_status_with_their_retry_hint() {
        let e = ShoalError::unavailable("shard 3 is restarting", Duration::from_millis(250));
        let s: Status = e.clone().into();
        assert_eq!(s.code(), Code::Unavailable);
        assert_eq!(s.metadata().get(RETRY_AFTER_MS).unwrap(), "250");
        assert_eq!(ShoalError::from(s), e);
        for code in [
            ErrorCode::InvalidArgument,
            ErrorCode::NotFound,
            ErrorCode::AlreadyExists,
            ErrorCode::ResourceExhausted,
            ErrorCode::DeadlineExceeded,
            ErrorCode::FailedPrecondition,
            ErrorCode::Internal,
        ] {
            let s: Status = ShoalError::new(code, "x").into();
            assert_eq!(ShoalError::from(s).code, code);
        }
        // A fenced write keeps its code across the hop, so a coordinator
        // can tell "re-read the placement" from a bad request.
        let fenced: Status = ShoalError::failed_precondition("shard c/0 is at epoch 3, the write carries 2").into();
        assert_eq!(fenced.code(), Code::FailedPrecondition);
        assert_eq!(ShoalError::from_peer(fenced).code, ErrorCode::FailedPrecondition);
    }
}
