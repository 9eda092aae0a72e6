"""`Client`: the public `shoal.v1.Shoal` API of a coordinator."""

from __future__ import annotations

import json
import os
from typing import Any, Dict, Iterable, Iterator, List, Mapping, Optional, Sequence, Tuple, Union
from urllib.parse import urlparse

import grpc
import numpy as np

from . import _wire, filters
from ._proto.shoal.v1 import common_pb2, shoal_pb2, shoal_pb2_grpc, snapshot_pb2
from .errors import InvalidArgument, ShoalError, from_rpc_error
from .types import (
    METRICS,
    BatchSearchResult,
    CollectionInfo,
    GetResult,
    Point,
    ScrollPage,
    SearchResult,
    SnapshotInfo,
    UploadResult,
    WriteResult,
    decode_payload,
    encode_payload,
    hits_of,
)
from .upload import Plan, upload

VectorsLike = Union[np.ndarray, Iterable[Sequence[float]]]


def _target(url: str) -> Tuple[str, bool]:
    """`host:port` for grpc from `http(s)://host:port` or `host:port`, and
    whether the URL asks for TLS."""
    if "://" not in url:
        return url, False
    parsed = urlparse(url)
    if parsed.scheme not in ("http", "grpc", "https"):
        raise InvalidArgument(f"unsupported URL scheme {parsed.scheme!r} in {url!r} (http:// or https://)")
    if not parsed.hostname:
        raise InvalidArgument(f"no host in {url!r}")
    host = f"[{parsed.hostname}]" if ":" in parsed.hostname else parsed.hostname
    return f"{host}:{parsed.port or 7700}", parsed.scheme == "https"


def _matrix(vectors: VectorsLike, what: str = "vectors") -> np.ndarray:
    """A 2-d float32 array, or InvalidArgument naming what is wrong."""
    try:
        m = np.asarray(vectors if isinstance(vectors, np.ndarray) else list(vectors), dtype=np.float32)
    except (TypeError, ValueError) as e:
        raise InvalidArgument(f"{what}: not a 2-d array of numbers ({e})") from None
    if m.ndim != 2:
        raise InvalidArgument(f"{what}: expected a 2-d array (rows × dimension), got shape {m.shape}")
    bad = ~np.isfinite(m)
    if bad.any():
        row, col = (int(x) for x in np.argwhere(bad)[0])
        raise InvalidArgument(f"{what}: row {row}, column {col} is {m[row, col]} (only finite numbers)")
    return m


def _ids(ids: Optional[Iterable[int]], n: int) -> np.ndarray:
    if ids is None:
        return np.arange(n, dtype=np.uint64)
    try:
        raw = ids if isinstance(ids, np.ndarray) else list(ids)
        arr = np.asarray(raw)
    except (TypeError, ValueError) as e:
        raise InvalidArgument(f"ids: not a sequence of integers ({e})") from None
    if arr.ndim != 1 or len(arr) != n:
        raise InvalidArgument(f"ids: expected {n} ids (one per row), got shape {arr.shape}")
    if n and arr.dtype.kind not in "iu":
        raise InvalidArgument(f"ids: expected integers, got {arr.dtype}")
    if n and arr.dtype.kind == "i" and (arr < 0).any():
        row = int(np.argmax(arr < 0))
        raise InvalidArgument(f"ids: row {row} is {int(arr[row])} (ids are unsigned 64-bit)")
    return arr.astype(np.uint64)


class Client:
    """A connection to a shoal coordinator.

    >>> client = Client("http://127.0.0.1:7700")            # doctest: +SKIP
    >>> client.search("docs", [0.1, 0.2, 0.3], k=5).hits     # doctest: +SKIP
    """

    def __init__(
        self,
        url: str = "http://127.0.0.1:7700",
        *,
        timeout: Optional[float] = 60.0,
        max_message_bytes: int = 256 << 20,
        api_key: Optional[str] = None,
        tls_ca: Optional[str] = None,
    ):
        """`timeout`: seconds any one call may take (None: no limit);
        uploads are limited per batch by the server instead.

        `api_key` (default: the `SHOAL_API_KEY` environment variable) is
        sent with every call as `authorization: Bearer <key>`. `tls_ca`
        (default: `SHOAL_TLS_CA`) is the PEM file of the CA that signed the
        coordinator's certificate: with it, or with an `https://` URL, the
        channel is TLS (the system's roots when no CA file is given)."""
        self.url = url
        self.timeout = timeout
        options = [
            ("grpc.max_send_message_length", max_message_bytes),
            ("grpc.max_receive_message_length", max_message_bytes),
        ]
        api_key = api_key if api_key is not None else os.environ.get("SHOAL_API_KEY")
        tls_ca = tls_ca if tls_ca is not None else os.environ.get("SHOAL_TLS_CA")
        self._metadata: Tuple[Tuple[str, str], ...] = ()
        if api_key:
            if any(c in api_key for c in "\r\n") or not api_key.isascii():
                raise InvalidArgument("api_key: must be printable ASCII without line breaks")
            self._metadata = (("authorization", f"Bearer {api_key.strip()}"),)
        target, https = _target(url)
        if https or tls_ca:
            root = None
            if tls_ca:
                try:
                    with open(tls_ca, "rb") as f:
                        root = f.read()
                except OSError as e:
                    raise InvalidArgument(f"tls_ca: cannot read {tls_ca}: {e}") from None
            self._channel = grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=root), options=options)
        else:
            self._channel = grpc.insecure_channel(target, options=options)
        self._stub = shoal_pb2_grpc.ShoalStub(self._channel)
        # Uploads send requests serialized by _wire (bytes as they are).
        self._ingest_raw = self._channel.stream_stream(
            "/shoal.v1.Shoal/Ingest",
            request_serializer=lambda b: b,
            response_deserializer=shoal_pb2.IngestAck.FromString,
        )

    def close(self) -> None:
        self._channel.close()

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def _call(self, method: str, request: Any, timeout: Optional[float] = None) -> Any:
        try:
            return getattr(self._stub, method)(
                request, timeout=timeout if timeout is not None else self.timeout, metadata=self._metadata
            )
        except grpc.RpcError as e:
            raise from_rpc_error(e) from None

    # Collections

    def create_collection(
        self,
        name: str,
        dimension: int,
        metric: str = "cosine",
        *,
        shards: int = 0,
        replication_factor: int = 0,
        min_in_sync: int = 0,
        m: int = 0,
        ef_construction: int = 0,
        indexes: Optional[Mapping[str, str]] = None,
    ) -> CollectionInfo:
        """Creates a collection; 0 leaves a setting to the cluster's default.
        `indexes`: payload indexes to make on the empty shards, field ->
        type ("keyword", "integer", "float", "bool", "datetime")."""
        if metric not in METRICS:
            raise InvalidArgument(f"metric {metric!r}: expected one of {sorted(METRICS)}")
        field_indexes = [common_pb2.FieldIndex(field=f, type=filters.field_type(t)) for f, t in (indexes or {}).items()]
        req = shoal_pb2.CreateCollectionRequest(
            name=name,
            dimension=dimension,
            metric=METRICS[metric],
            shard_count=shards,
            index=common_pb2.IndexParams(m=m, ef_construction=ef_construction),
            replication_factor=replication_factor,
            min_in_sync=min_in_sync,
            field_indexes=field_indexes,
        )
        return CollectionInfo.from_proto(self._call("CreateCollection", req))

    def create_index(self, collection: str, field: str, type: str, *, wait: bool = True) -> CollectionInfo:
        """Indexes a payload field on every shard (built online where the
        shards hold points); with `wait`, returns once every copy's index
        is ready."""
        req = shoal_pb2.CreateFieldIndexRequest(
            collection=collection, index=common_pb2.FieldIndex(field=field, type=filters.field_type(type)), wait=wait
        )
        return CollectionInfo.from_proto(self._call("CreateFieldIndex", req))

    def drop_index(self, collection: str, field: str) -> CollectionInfo:
        return CollectionInfo.from_proto(self._call("DropFieldIndex", shoal_pb2.DropFieldIndexRequest(collection=collection, field=field)))

    def list_collections(self) -> List[CollectionInfo]:
        resp = self._call("ListCollections", shoal_pb2.ListCollectionsRequest())
        return [CollectionInfo.from_proto(c) for c in resp.collections]

    def describe_collection(self, name: str) -> CollectionInfo:
        """The collection with its shards, points and replicas."""
        return CollectionInfo.from_proto(self._call("DescribeCollection", shoal_pb2.DescribeCollectionRequest(name=name)))

    def drop_collection(self, name: str) -> None:
        self._call("DropCollection", shoal_pb2.DropCollectionRequest(name=name))

    # Writes

    def upload(
        self,
        collection: str,
        vectors: VectorsLike,
        ids: Optional[Iterable[int]] = None,
        payloads: Optional[Sequence[Any]] = None,
        *,
        source: str,
        batch_size: int = 1000,
        parallel: int = 2,
        window: int = 4,
        retry_for: float = 120.0,
        progress: bool = False,
    ) -> UploadResult:
        """Sends every row exactly once, resumable: run again with the same
        arguments after a crash, it continues after the last batch the
        cluster acknowledged (see `shoal_client.upload`).

        `vectors`: a 2-d array (or rows of numbers); `ids`: one per row
        (default: row numbers); `payloads`: one per row (None for none;
        bytes stored as given, anything else as JSON). `source` names the
        job: its offsets are kept under that name. `parallel` streams, each
        with up to `window` batches of `batch_size` rows in flight.
        Transient failures (a node down, a busy cluster) are retried for
        `retry_for` seconds without an acknowledgement."""
        if not source or any(c in source for c in ":/@"):
            raise InvalidArgument(f"source {source!r}: a non-empty name without ':', '/' or '@'")
        if batch_size < 1 or parallel < 1 or window < 1:
            raise InvalidArgument("batch_size, parallel and window must be at least 1")
        m = _matrix(vectors)
        point_ids = _ids(ids, len(m))
        encoded = None
        if payloads is not None:
            payloads = list(payloads)
            if len(payloads) != len(m):
                raise InvalidArgument(f"payloads: expected {len(m)} (one per row), got {len(payloads)}")
            encoded = [_encoded_payload(p, row) for row, p in enumerate(payloads)]
        bar = _progress_bar(len(m), collection) if progress else None

        def offsets(c: str) -> Dict[str, int]:
            return self.offsets(c)

        return upload(
            call=self._ingest_raw,
            offsets=offsets,
            collection=collection,
            vectors=m,
            ids=point_ids,
            payloads=encoded,
            plan=Plan(source, parallel, batch_size),
            window=window,
            retry_for=retry_for,
            progress=bar,
            metadata=self._metadata,
        )

    def offsets(self, collection: str, sources: Optional[Sequence[str]] = None) -> Dict[str, int]:
        """The last acknowledged offset of each ingest source."""
        resp = self._call("GetOffsets", shoal_pb2.GetOffsetsRequest(collection=collection, sources=list(sources or [])))
        return {o.source: o.offset for o in resp.offsets}

    def upsert(
        self, collection: str, vectors: VectorsLike, ids: Iterable[int], payloads: Optional[Sequence[Any]] = None
    ) -> WriteResult:
        """Inserts or replaces points, atomically, in one request."""
        m = _matrix(vectors)
        point_ids = _ids(ids, len(m))
        if payloads is not None and len(payloads) != len(m):
            raise InvalidArgument(f"payloads: expected {len(m)} (one per row), got {len(payloads)}")
        points = [
            common_pb2.Point(id=int(point_ids[i]), vector=m[i], payload=encode_payload(payloads[i]) if payloads else None)
            for i in range(len(m))
        ]
        resp = self._call("Upsert", shoal_pb2.UpsertRequest(collection=collection, points=points))
        return WriteResult(resp.upserted, resp.deleted, resp.missing)

    def delete(
        self,
        collection: str,
        ids: Iterable[int] = (),
        *,
        filter: Optional[Mapping[str, Any]] = None,
        allow_unindexed: bool = False,
    ) -> WriteResult:
        """Deletes points by id, and every point matching `filter` (a dict
        in the form of docs/filters.md)."""
        req = shoal_pb2.DeleteRequest(
            collection=collection,
            ids=[int(i) for i in ids],
            filter=filters.to_proto(filter) if filter is not None else None,
            allow_unindexed=allow_unindexed,
        )
        resp = self._call("Delete", req)
        return WriteResult(resp.upserted, resp.deleted, resp.missing)

    def count(self, collection: str, filter: Optional[Mapping[str, Any]] = None, *, allow_unindexed: bool = False) -> int:
        """How many points match `filter` (every point without one), exactly."""
        req = shoal_pb2.CountRequest(
            collection=collection, filter=filters.to_proto(filter) if filter is not None else None, allow_unindexed=allow_unindexed
        )
        return int(self._call("Count", req).count)

    def scroll(
        self,
        collection: str,
        filter: Optional[Mapping[str, Any]] = None,
        *,
        after: Optional[int] = None,
        limit: int = 100,
        with_vector: bool = False,
        allow_unindexed: bool = False,
    ) -> ScrollPage:
        """One page of the points matching `filter`, in ascending id order,
        with their payloads; pass the page's `next_after` as `after` for
        the next one."""
        req = shoal_pb2.ScrollRequest(
            collection=collection,
            filter=filters.to_proto(filter) if filter is not None else None,
            allow_unindexed=allow_unindexed,
            limit=limit,
            with_vector=with_vector,
        )
        if after is not None:
            req.after = int(after)
        resp = self._call("Scroll", req)
        points = [Point(p.id, list(p.vector), decode_payload(p.payload) if p.HasField("payload") else None) for p in resp.points]
        return ScrollPage(points, resp.next_after if resp.HasField("next_after") else None)

    def scroll_all(self, collection: str, filter: Optional[Mapping[str, Any]] = None, **kwargs: Any) -> Iterator[Point]:
        """Every point matching `filter`, page after page (an export or a
        re-embedding job); each page reads the latest commit."""
        after = kwargs.pop("after", None)
        while True:
            page = self.scroll(collection, filter, after=after, **kwargs)
            yield from page.points
            if page.next_after is None:
                return
            after = page.next_after

    def get(self, collection: str, ids: Iterable[int], *, with_vector: bool = True) -> GetResult:
        resp = self._call("Get", shoal_pb2.GetRequest(collection=collection, ids=[int(i) for i in ids], with_vector=with_vector))
        points = {
            p.id: Point(p.id, list(p.vector), decode_payload(p.payload) if p.HasField("payload") else None) for p in resp.points
        }
        return GetResult(points, list(resp.missing))

    # Searches

    def search(
        self,
        collection: str,
        vector: Sequence[float],
        k: int = 10,
        ef: Optional[int] = None,
        *,
        allow_partial: bool = False,
        with_payload: bool = False,
        timeout: Optional[float] = None,
        filter: Optional[Mapping[str, Any]] = None,
        allow_unindexed: bool = False,
    ) -> SearchResult:
        """The `k` nearest points over every shard (among those matching
        `filter`, a dict in the form of docs/filters.md). Without
        `allow_partial`, a shard that cannot answer fails the search
        (Unavailable); with it, the result says how many answered. The
        result's `explain` says which plan each shard ran."""
        q = _matrix([vector] if not isinstance(vector, np.ndarray) or vector.ndim == 1 else vector, "vector")
        if len(q) != 1:
            raise InvalidArgument(f"vector: expected one vector, got {len(q)} (search_batch takes many)")
        req = shoal_pb2.SearchRequest(
            collection=collection,
            vector=q[0],
            k=k,
            ef=ef or 0,
            with_payload=with_payload,
            allow_partial=allow_partial,
            timeout_ms=_ms(timeout),
            filter=filters.to_proto(filter) if filter is not None else None,
            allow_unindexed=allow_unindexed,
        )
        resp = self._call("Search", req, timeout=timeout)
        return SearchResult(hits_of(resp.hits), resp.shards_answered, resp.shards_total, filters.explain_of(resp.explain))

    def search_batch(
        self,
        collection: str,
        vectors: VectorsLike,
        k: int = 10,
        ef: Optional[int] = None,
        *,
        allow_partial: bool = False,
        with_payload: bool = False,
        timeout: Optional[float] = None,
        filter: Optional[Mapping[str, Any]] = None,
        allow_unindexed: bool = False,
    ) -> BatchSearchResult:
        """One search per row of the 2-d `vectors`, in one request (each
        among the points matching `filter`, if given)."""
        q = _matrix(vectors, "vectors")
        req = shoal_pb2.SearchBatchRequest(
            collection=collection,
            queries=[common_pb2.Vector(values=row) for row in q],
            k=k,
            ef=ef or 0,
            with_payload=with_payload,
            allow_partial=allow_partial,
            timeout_ms=_ms(timeout),
            filter=filters.to_proto(filter) if filter is not None else None,
            allow_unindexed=allow_unindexed,
        )
        resp = self._call("SearchBatch", req, timeout=timeout)
        return BatchSearchResult(
            [hits_of(r.hits) for r in resp.results],
            resp.shards_answered,
            resp.shards_total,
            [filters.explain_of(q.shards) for q in resp.explain],
        )

    # Snapshots and status

    def create_snapshot(self, collection: str, snapshot_id: str = "", *, zstd_level: int = 0) -> List[SnapshotInfo]:
        """Snapshots every shard to the cluster's object storage."""
        resp = self._call(
            "CreateSnapshot", shoal_pb2.CreateSnapshotRequest(collection=collection, snapshot_id=snapshot_id, zstd_level=zstd_level)
        )
        return [SnapshotInfo.from_proto(s) for s in resp.shards]

    def list_snapshots(self, collection: str) -> List[SnapshotInfo]:
        resp = self._call("ListSnapshots", snapshot_pb2.ListSnapshotsRequest(collection=collection))
        return [SnapshotInfo.from_proto(s) for s in resp.snapshots]

    def restore_snapshot(self, collection: str, snapshot_id: str, *, replace: bool = False) -> CollectionInfo:
        """Restores every shard of `collection` from `snapshot_id`
        (creating the collection; `replace` overwrites an existing one)."""
        req = shoal_pb2.RestoreSnapshotRequest(collection=collection, snapshot_id=snapshot_id, replace=replace)
        return CollectionInfo.from_proto(self._call("RestoreSnapshot", req).collection)

    def status(self) -> Dict[str, Any]:
        """Nodes, collections and the control plane, as a dict."""
        from google.protobuf.json_format import MessageToDict

        return MessageToDict(self._call("ClusterStatus", shoal_pb2.ClusterStatusRequest()), preserving_proto_field_name=True)


def _ms(timeout: Optional[float]) -> int:
    return 0 if timeout is None else max(1, int(timeout * 1000))


def _encoded_payload(value: Any, row: int) -> Optional[bytes]:
    if value is None:
        return None
    if isinstance(value, (bytes, bytearray, memoryview)):
        return _wire.payload_bytes("binary", bytes(value))
    try:
        text = json.dumps(value, separators=(",", ":"))
    except (TypeError, ValueError) as e:
        raise InvalidArgument(f"payloads: row {row} cannot be stored as JSON ({e})") from None
    return _wire.payload_bytes("json", text.encode())


def _progress_bar(total: int, collection: str) -> Any:
    try:
        from tqdm import tqdm
    except ImportError:
        raise ShoalError("progress=True needs tqdm: pip install 'shoal-client[progress]'") from None
    return tqdm(total=total, unit="rows", unit_scale=True, desc=f"upload {collection}")
