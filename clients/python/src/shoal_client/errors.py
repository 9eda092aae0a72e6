"""Errors as Python exceptions, one class per gRPC code, each carrying the
server's message and, where the server sent one, how long to wait before
retrying (`retry_after`, seconds)."""

from __future__ import annotations

from typing import Dict, Optional, Type

import grpc

# The metadata key the server puts its retry hint under (milliseconds);
# proto/src/error.rs RETRY_AFTER_MS.
RETRY_AFTER_MS = "retry-after-ms"


class ShoalError(Exception):
    """A call the server (or the transport) refused or could not complete."""

    #: The gRPC code of this class of error.
    code: grpc.StatusCode = grpc.StatusCode.UNKNOWN

    def __init__(self, message: str, *, code: Optional[grpc.StatusCode] = None, retry_after: Optional[float] = None):
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code
        #: Seconds the server asked to wait before retrying, if it said.
        self.retry_after = retry_after

    @property
    def retryable(self) -> bool:
        """Whether the same call may succeed later (the cluster was busy,
        a node was down, a deadline passed) as opposed to a request that
        will be refused again unchanged."""
        return self.code in _RETRYABLE

    def __str__(self) -> str:
        return f"{self.code.name}: {self.message}"


class InvalidArgument(ShoalError):
    code = grpc.StatusCode.INVALID_ARGUMENT


class NotFound(ShoalError):
    code = grpc.StatusCode.NOT_FOUND


class AlreadyExists(ShoalError):
    code = grpc.StatusCode.ALREADY_EXISTS


class FailedPrecondition(ShoalError):
    code = grpc.StatusCode.FAILED_PRECONDITION


class Aborted(ShoalError):
    code = grpc.StatusCode.ABORTED


class ResourceExhausted(ShoalError):
    code = grpc.StatusCode.RESOURCE_EXHAUSTED


class Unavailable(ShoalError):
    code = grpc.StatusCode.UNAVAILABLE


class DeadlineExceeded(ShoalError):
    code = grpc.StatusCode.DEADLINE_EXCEEDED


class Unauthenticated(ShoalError):
    code = grpc.StatusCode.UNAUTHENTICATED


class PermissionDenied(ShoalError):
    code = grpc.StatusCode.PERMISSION_DENIED


class Internal(ShoalError):
    code = grpc.StatusCode.INTERNAL


class Cancelled(ShoalError):
    code = grpc.StatusCode.CANCELLED


_BY_CODE: Dict[grpc.StatusCode, Type[ShoalError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        NotFound,
        AlreadyExists,
        FailedPrecondition,
        Aborted,
        ResourceExhausted,
        Unavailable,
        DeadlineExceeded,
        Unauthenticated,
        PermissionDenied,
        Internal,
        Cancelled,
    )
}

_RETRYABLE = {grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED, grpc.StatusCode.ABORTED}


def from_rpc_error(e: grpc.RpcError) -> ShoalError:
    """The exception for a failed call: its class by code, the server's
    message, and its retry hint."""
    code = e.code() if hasattr(e, "code") else grpc.StatusCode.UNKNOWN
    message = e.details() if hasattr(e, "details") else str(e)
    retry_after = None
    trailing = e.trailing_metadata() if hasattr(e, "trailing_metadata") else None
    for key, value in trailing or ():
        if key == RETRY_AFTER_MS:
            try:
                retry_after = int(value) / 1000.0
            except ValueError:
                pass
    if retry_after is None and code == grpc.StatusCode.UNAVAILABLE:
        retry_after = 1.0
    cls = _BY_CODE.get(code, ShoalError)
    return cls(message or code.name, code=code, retry_after=retry_after)
