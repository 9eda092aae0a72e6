"""What the client returns: plain dataclasses, not protobuf messages, so
that callers need not know the wire format."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional

from ._proto.shoal.v1 import common_pb2, shoal_pb2

METRICS = {"cosine": common_pb2.COSINE, "dot": common_pb2.DOT, "euclidean": common_pb2.EUCLIDEAN}
METRIC_NAMES = {v: k for k, v in METRICS.items()}
FIELD_TYPE_NAMES = {
    common_pb2.KEYWORD: "keyword",
    common_pb2.INTEGER: "integer",
    common_pb2.FLOAT: "float",
    common_pb2.BOOL: "bool",
    common_pb2.DATETIME: "datetime",
}


def encode_payload(value: Any) -> Optional[common_pb2.Payload]:
    """bytes are stored as they are; anything else as its JSON text
    (a str becomes a JSON string). None stores no payload."""
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray, memoryview)):
        return common_pb2.Payload(binary=bytes(value))
    return common_pb2.Payload(json=json.dumps(value, separators=(",", ":")))


def decode_payload(p: common_pb2.Payload) -> Any:
    kind = p.WhichOneof("kind")
    if kind == "binary":
        return p.binary
    if kind == "json":
        return json.loads(p.json)
    return None


@dataclass
class Replica:
    node: str
    #: "active" (in sync), "recovering" (catching up) or "dead".
    state: str
    node_down: bool


@dataclass
class Shard:
    shard: int
    #: The primary: the first in-sync replica's node.
    node: str
    available: bool
    points: int
    tombstones: int
    disk_bytes: int
    replicas: List[Replica]
    #: The primary's payload indexes: field -> dict of type, ready,
    #: progress (0..1 while building), points, other_type.
    indexes: Dict[str, Dict[str, Any]] = field(default_factory=dict)


@dataclass
class CollectionInfo:
    name: str
    dimension: int
    metric: str
    shard_count: int
    replication_factor: int
    min_in_sync: int
    points: int
    #: Filled by `describe_collection` only.
    shards: List[Shard] = field(default_factory=list)
    #: Payload indexes: field -> type ("keyword", "integer", ...).
    indexes: Dict[str, str] = field(default_factory=dict)

    @classmethod
    def from_proto(cls, c: shoal_pb2.CollectionInfo) -> "CollectionInfo":
        shards = [
            Shard(
                shard=s.shard,
                node=s.node,
                available=s.available,
                points=s.points,
                tombstones=s.tombstones,
                disk_bytes=s.disk_bytes,
                replicas=[Replica(r.node, r.state, r.node_down) for r in s.replicas],
                indexes={
                    f.field: {
                        "type": FIELD_TYPE_NAMES.get(f.type, "unspecified"),
                        "ready": f.ready,
                        "progress": 1.0 if f.ready else f.indexed_below / max(f.of, 1),
                        "points": f.points,
                        "other_type": f.other_type,
                    }
                    for f in s.field_indexes
                },
            )
            for s in c.shards
        ]
        return cls(
            name=c.name,
            dimension=c.dimension,
            metric=METRIC_NAMES.get(c.metric, "unspecified"),
            shard_count=c.shard_count,
            replication_factor=c.replication_factor,
            min_in_sync=c.min_in_sync,
            points=c.points,
            shards=shards,
            indexes={f.field: FIELD_TYPE_NAMES.get(f.type, "unspecified") for f in c.field_indexes},
        )


@dataclass
class Hit:
    id: int
    #: Smaller is closer: 1 - cos for cosine, negated inner product for dot.
    distance: float
    payload: Any = None


def hits_of(hits: Any) -> List[Hit]:
    return [Hit(h.id, h.distance, decode_payload(h.payload) if h.HasField("payload") else None) for h in hits]


@dataclass
class SearchResult:
    hits: List[Hit]
    shards_answered: int
    shards_total: int
    #: How each shard found its hits: dicts of shard, node, plan
    #: ("graph", "exact", "scan", "filtered_graph", "empty"), matches
    #: (exact if matches_exact, else the planner's estimate) and compared.
    explain: List[Dict[str, Any]] = field(default_factory=list)

    @property
    def partial(self) -> bool:
        """Some shards did not answer (only with `allow_partial=True`)."""
        return self.shards_answered < self.shards_total

    @property
    def coverage(self) -> float:
        """The share of shards that answered."""
        return self.shards_answered / self.shards_total if self.shards_total else 1.0


@dataclass
class BatchSearchResult:
    #: One list of hits per query, in the order of the queries.
    results: List[List[Hit]]
    shards_answered: int
    shards_total: int
    #: Per query, each shard's plan (as SearchResult.explain).
    explain: List[List[Dict[str, Any]]] = field(default_factory=list)

    @property
    def partial(self) -> bool:
        return self.shards_answered < self.shards_total


@dataclass
class ScrollPage:
    #: Matching points in ascending id order.
    points: List["Point"]
    #: Pass as `after` for the next page; None at the end.
    next_after: Optional[int]


@dataclass
class WriteResult:
    upserted: int
    deleted: int
    #: Ids asked to be deleted that did not exist.
    missing: int


@dataclass
class Point:
    id: int
    #: Empty unless asked for (`get(..., with_vector=True)`).
    vector: List[float]
    payload: Any = None


@dataclass
class GetResult:
    points: Dict[int, Point]
    missing: List[int]


@dataclass
class UploadResult:
    #: Rows in the input.
    rows: int
    #: Batches sent and applied in this run.
    batches_applied: int
    #: Batches a previous run had already applied (skipped, not sent).
    batches_resumed: int
    #: Batches sent whose offset the cluster had already recorded (a
    #: resend after a lost ack): applied once, acknowledged as skipped.
    batches_skipped: int
    retries: int
    seconds: float

    @property
    def rows_per_second(self) -> float:
        return self.rows / self.seconds if self.seconds > 0 else 0.0


@dataclass
class SnapshotInfo:
    collection: str
    shard: int
    id: str
    points: int
    stored_bytes: int
    error: str

    @classmethod
    def from_proto(cls, s: Any) -> "SnapshotInfo":
        return cls(s.collection, s.shard, s.id, s.points, s.stored_bytes, s.error)
