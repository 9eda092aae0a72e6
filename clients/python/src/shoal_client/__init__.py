"""shoal-client: the Python client of shoal, a sharded vector index.

    from shoal_client import Client
    client = Client("http://127.0.0.1:7700")
    client.create_collection("docs", dimension=384, metric="cosine")
    client.upload("docs", vectors, source="docs-2026-11-26")
    client.search("docs", vectors[0], k=10).hits
    client.search("docs", vectors[0], k=10, filter={"must": [{"key": "lang", "match": "en"}]}).hits
"""

from .client import Client
from .errors import (
    Aborted,
    AlreadyExists,
    Cancelled,
    DeadlineExceeded,
    FailedPrecondition,
    Internal,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    ResourceExhausted,
    ShoalError,
    Unauthenticated,
    Unavailable,
)
from .types import (
    BatchSearchResult,
    CollectionInfo,
    GetResult,
    Hit,
    Point,
    Replica,
    ScrollPage,
    SearchResult,
    Shard,
    SnapshotInfo,
    UploadResult,
    WriteResult,
)

__all__ = [
    "Aborted",
    "AlreadyExists",
    "BatchSearchResult",
    "Cancelled",
    "Client",
    "CollectionInfo",
    "DeadlineExceeded",
    "FailedPrecondition",
    "GetResult",
    "Hit",
    "Internal",
    "InvalidArgument",
    "NotFound",
    "PermissionDenied",
    "Point",
    "Replica",
    "ResourceExhausted",
    "ScrollPage",
    "SearchResult",
    "Shard",
    "ShoalError",
    "SnapshotInfo",
    "Unauthenticated",
    "Unavailable",
    "UploadResult",
    "WriteResult",
]
