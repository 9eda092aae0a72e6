"""Filters from Python against a real cluster (`shoalctl dev`): search,
count, scroll and delete by filter checked against a model of the
payloads; an index made on live data; mistakes named before sending."""

from __future__ import annotations

import numpy as np
import pytest

from shoal_client import Client, InvalidArgument
from shoal_client.filters import to_proto

from test_client import rng


def payloads(n: int) -> list:
    return [{"tag": f"t{i % 4}", "n": i % 50, "at": f"2026-01-{1 + i % 28:02d}T00:00:00Z"} for i in range(n)]


def test_filters_search_count_scroll_and_delete(client: Client, name: str):
    r = rng("test_filters_search_count_scroll_and_delete")
    n = 400
    vectors = r.standard_normal((n, 8)).astype(np.float32)
    client.create_collection(name, dimension=8, metric="euclidean", shards=3, indexes={"tag": "keyword", "n": "integer"})
    pays = payloads(n)
    client.upload(name, vectors, payloads=pays, source="job")

    f = {"must": [{"key": "tag", "match": "t1"}, {"key": "n", "range": {"lt": 20}}]}
    want = [i for i, p in enumerate(pays) if p["tag"] == "t1" and p["n"] < 20]
    assert client.count(name, f) == len(want)
    assert client.count(name) == n
    assert [p.id for p in client.scroll_all(name, f, limit=7)] == want
    page = client.scroll(name, f, limit=5)
    assert [p.id for p in page.points] == want[:5] and page.next_after == want[4]
    assert page.points[0].payload == pays[want[0]]

    q = r.standard_normal(8).astype(np.float32)
    res = client.search(name, q, k=5, filter=f)
    exact = sorted(want, key=lambda i: float(np.linalg.norm(vectors[i] - q)))[:5]
    assert [h.id for h in res.hits] == exact
    assert len(res.explain) == 3 and all(e["plan"] in ("exact", "empty") for e in res.explain)
    batch = client.search_batch(name, np.stack([q, q]), k=5, filter=f)
    assert [h.id for h in batch.results[1]] == exact and len(batch.explain) == 2

    # A field without an index: refused, or read from payloads on request.
    late = {"must": [{"key": "at", "range": {"lte": "2026-01-02T00:00:00Z"}}]}
    with pytest.raises(InvalidArgument, match=r"filter must\[0\]: the field at has no index"):
        client.count(name, late)
    early = [i for i, p in enumerate(pays) if p["at"] <= "2026-01-02T00:00:00Z"]
    assert client.count(name, late, allow_unindexed=True) == len(early)
    info = client.create_index(name, "at", "datetime")
    assert info.indexes["at"] == "datetime" and all(s.indexes["at"]["ready"] for s in info.shards)
    assert client.count(name, late) == len(early)

    w = client.delete(name, filter={"must": [{"key": "tag", "match": "t1"}]})
    assert w.deleted == sum(p["tag"] == "t1" for p in pays)
    assert client.count(name, {"must": [{"key": "tag", "match": "t1"}]}) == 0
    assert client.count(name) == n - w.deleted


def test_filter_mistakes_are_named_before_sending():
    for bad, where in [
        ({"must": [{"key": "a", "matches": 1}]}, r"filter must\[0\]: unknown operator"),
        ({"must": [{"key": "a", "range": {"gte": [1]}}]}, r"filter must\[0\]\.range\.gte"),
        ({"maybe": []}, r"filter \(top\): unknown clause"),
        ({"should": [{"must_not": [{"has_id": [-1]}]}]}, r"filter should\[0\]\.must_not\[0\]\.has_id"),
        ({"must": [{"key": "a", "any": [1.5]}]}, r"filter must\[0\]\.any\[0\]"),
    ]:
        with pytest.raises(InvalidArgument, match=where):
            to_proto(bad)
    f = to_proto({"must": [{"key": "t", "range": {"gte": "2026-01-01T00:00:00Z", "lt": 2.5}}], "must_not": [{"key": "x", "is_empty": True}]})
    assert f.must[0].field.range.gte.datetime == "2026-01-01T00:00:00Z" and f.must[0].field.range.lt.number == 2.5
    assert f.must_not[0].field.is_empty
