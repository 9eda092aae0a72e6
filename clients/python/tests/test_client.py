"""The client against a real cluster (`shoalctl dev`, conftest.py): every
call checked against what the cluster holds or a brute-force model."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from shoal_client import (
    AlreadyExists,
    Client,
    InvalidArgument,
    NotFound,
    ShoalError,
)
from shoal_client import _wire
from shoal_client._proto.shoal.v1 import common_pb2, shoal_pb2

HERE = Path(__file__).resolve().parent


def rng(seed_name: str) -> np.random.Generator:
    seed = int(os.environ.get("SHOAL_TEST_SEED", "0")) or abs(hash(seed_name)) % (1 << 32)
    print(f"{seed_name}: seed {seed} (SHOAL_TEST_SEED={seed} replays it)")
    return np.random.default_rng(seed)


def exact_top(base: np.ndarray, q: np.ndarray, k: int) -> list:
    d = np.linalg.norm(base - q, axis=1)
    return list(np.argsort(d, kind="stable")[:k])


def test_wire_bytes_decode_to_the_same_request():
    vectors = np.array([[0.5, -1.25, 3.0], [1e-8, 0.0, -0.0]], dtype=np.float32)
    payloads = [_wire.payload_bytes("json", b'{"a":1}'), None]
    raw = _wire.ingest_request("docs", "job:0/2@10p", 300, [0, 2**64 - 1], vectors, payloads)
    want = shoal_pb2.IngestRequest(
        collection="docs",
        source="job:0/2@10p",
        offset=300,
        points=[
            common_pb2.Point(id=0, vector=[0.5, -1.25, 3.0], payload=common_pb2.Payload(json='{"a":1}')),
            common_pb2.Point(id=2**64 - 1, vector=[1e-8, 0.0, -0.0]),
        ],
    )
    assert shoal_pb2.IngestRequest.FromString(raw) == want


def test_collections_are_created_listed_described_and_dropped(client: Client, name: str):
    info = client.create_collection(name, dimension=8, metric="cosine", shards=3)
    assert (info.name, info.dimension, info.metric, info.shard_count) == (name, 8, "cosine", 3)
    assert name in [c.name for c in client.list_collections()]
    with pytest.raises(AlreadyExists) as e:
        client.create_collection(name, dimension=8)
    assert name in e.value.message
    described = client.describe_collection(name)
    assert len(described.shards) == 3 and described.points == 0
    assert all(r.state == "active" for s in described.shards for r in s.replicas)
    client.drop_collection(name)
    assert name not in [c.name for c in client.list_collections()]
    with pytest.raises(NotFound) as e:
        client.describe_collection(name)
    assert name in e.value.message and not e.value.retryable
    with pytest.raises(InvalidArgument):
        client.create_collection(name, dimension=8, metric="manhattan")
    with pytest.raises(InvalidArgument) as e:
        client.create_collection("no spaces allowed", dimension=8)
    assert "no spaces allowed" in str(e.value)


def test_upload_then_search_finds_the_exact_neighbours(client: Client, name: str):
    r = rng(name)
    base = r.standard_normal((1500, 16)).astype(np.float32)
    client.create_collection(name, dimension=16, metric="euclidean", shards=3)
    payloads = [{"row": i} for i in range(len(base))]
    done = client.upload(name, base, payloads=payloads, source="base", batch_size=100, parallel=3)
    assert (done.rows, done.batches_applied, done.batches_resumed) == (1500, 15, 0)
    assert client.describe_collection(name).points == 1500
    queries = r.standard_normal((20, 16)).astype(np.float32)
    for q in queries:
        found = client.search(name, q, k=10, ef=1500, with_payload=True)
        assert (found.shards_answered, found.shards_total, found.partial) == (3, 3, False)
        assert [h.id for h in found.hits] == exact_top(base, q, 10)
        assert all(h.payload == {"row": h.id} for h in found.hits)
        assert found.hits == sorted(found.hits, key=lambda h: h.distance)
    batch = client.search_batch(name, queries, k=10, ef=1500)
    assert len(batch.results) == 20 and not batch.partial
    assert [[h.id for h in hits] for hits in batch.results] == [exact_top(base, q, 10) for q in queries]


def test_upsert_get_delete_round_trip_payloads(client: Client, name: str):
    client.create_collection(name, dimension=4, metric="dot", shards=2)
    vectors = np.arange(12, dtype=np.float32).reshape(3, 4)
    w = client.upsert(name, vectors, ids=[10, 20, 30], payloads=[{"k": [1, "x"]}, b"\x00\xffraw", "text"])
    assert w.upserted == 3
    got = client.get(name, [10, 20, 30, 40])
    assert sorted(got.points) == [10, 20, 30] and got.missing == [40]
    assert got.points[10].payload == {"k": [1, "x"]}
    assert got.points[20].payload == b"\x00\xffraw"
    assert got.points[30].payload == "text"
    assert got.points[30].vector == [8.0, 9.0, 10.0, 11.0]
    w = client.delete(name, [20, 99])
    assert (w.deleted, w.missing) == (1, 1)
    assert client.get(name, [20]).missing == [20]


def test_bad_input_is_refused_precisely_and_sends_nothing(client: Client, name: str):
    client.create_collection(name, dimension=8, metric="cosine", shards=2)
    vectors = np.ones((300, 8), dtype=np.float32)
    vectors[205, 3] = np.nan
    with pytest.raises(InvalidArgument, match=r"row 205, column 3 is nan"):
        client.upload(name, vectors, source="job")
    with pytest.raises(InvalidArgument, match=r"expected 300 ids"):
        client.upload(name, np.ones((300, 8)), ids=range(299), source="job")
    with pytest.raises(InvalidArgument, match=r"row 7 is -1"):
        client.upload(name, np.ones((10, 8)), ids=[0, 1, 2, 3, 4, 5, 6, -1, 8, 9], source="job")
    with pytest.raises(InvalidArgument, match=r"row 1 cannot be stored as JSON"):
        client.upload(name, np.ones((2, 8)), payloads=[{}, {1, 2}], source="job")
    with pytest.raises(InvalidArgument, match=r"source"):
        client.upload(name, np.ones((2, 8)), source="a:b")
    assert client.offsets(name) == {}
    # Refused by the server: its message comes through.
    with pytest.raises(InvalidArgument) as e:
        client.upload(name, np.ones((10, 5)), source="job")
    assert "dimension" in e.value.message, e.value.message
    with pytest.raises(InvalidArgument) as e:
        client.search(name, np.ones(8), k=0)
    assert "k" in e.value.message
    with pytest.raises(NotFound):
        client.search(name + "-missing", np.ones(8))
    assert client.describe_collection(name).points == 0


UPLOAD_SCRIPT = textwrap.dedent(
    """
    import sys
    import numpy as np
    from shoal_client import Client
    url, name, n, dim = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    vectors = np.random.default_rng(7).standard_normal((n, dim)).astype(np.float32)
    Client(url).upload(name, vectors, payloads=[{"row": i} for i in range(n)], source="job", batch_size=200, parallel=2, window=1)
    """
)


def test_upload_killed_mid_way_resumes_with_nothing_missing_or_twice(client: Client, name: str, cluster_url: str):
    n, dim, batch = 40_000, 32, 200
    n_batches = n // batch
    client.create_collection(name, dimension=dim, metric="euclidean", shards=3)
    args = [sys.executable, "-c", UPLOAD_SCRIPT, cluster_url, name, str(n), str(dim)]
    for kill_after in (5, 60):
        proc = subprocess.Popen(args)
        deadline = time.monotonic() + 120
        while sum(client.offsets(name).values()) < kill_after:
            assert proc.poll() is None, f"the upload ended (code {proc.returncode}) before batch {kill_after}"
            assert time.monotonic() < deadline, "no progress within 120 s"
            time.sleep(0.01)
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        acked = sum(client.offsets(name).values())
        print(f"SIGKILL after {acked} of {n_batches} batches acknowledged")
        assert acked < n_batches, "killed too late to test a resume"
    vectors = np.random.default_rng(7).standard_normal((n, dim)).astype(np.float32)
    done = client.upload(name, vectors, payloads=[{"row": i} for i in range(n)], source="job", batch_size=200, parallel=2)
    print(f"resumed: {done}")
    assert done.batches_resumed >= 60 and done.batches_resumed + done.batches_applied + done.batches_skipped == n_batches
    # Each stream's offset is its batch count: every batch applied, once.
    assert client.offsets(name) == {"job:0/2@200p": n_batches // 2, "job:1/2@200p": n_batches // 2}
    assert client.describe_collection(name).points == n
    for start in range(0, n, 5000):
        ids = list(range(start, start + 5000))
        got = client.get(name, ids)
        assert got.missing == []
        for i in ids:
            assert got.points[i].payload == {"row": i}
            assert np.array_equal(np.array(got.points[i].vector, dtype=np.float32), vectors[i])
    # Another plan for the same source is refused, not misapplied.
    with pytest.raises(InvalidArgument, match="parallel=2"):
        client.upload(name, vectors, source="job", batch_size=200, parallel=3)
    # Run again: everything is acknowledged, nothing is sent.
    again = client.upload(name, vectors, source="job", batch_size=200, parallel=2)
    assert (again.batches_resumed, again.batches_applied) == (n_batches, 0)


def test_snapshots_restore_what_was_there(client: Client, name: str):
    r = rng(name)
    base = r.standard_normal((500, 8)).astype(np.float32)
    client.create_collection(name, dimension=8, metric="euclidean", shards=2)
    client.upload(name, base, source="base", batch_size=100)
    shards = client.create_snapshot(name, "snap-1")
    assert sorted(s.shard for s in shards) == [0, 1] and sum(s.points for s in shards) == 500
    assert {s.id for s in client.list_snapshots(name)} >= {"snap-1"}
    client.delete(name, range(250))
    assert client.describe_collection(name).points == 250
    restored = client.restore_snapshot(name, "snap-1", replace=True)
    assert restored.name == name
    assert client.describe_collection(name).points == 500
    assert [h.id for h in client.search(name, base[3], k=1, ef=500).hits] == [3]


def test_errors_are_exceptions_by_code_with_the_servers_message(client: Client):
    with pytest.raises(NotFound) as e:
        client.get("no-such-collection", [1])
    assert isinstance(e.value, ShoalError) and "no-such-collection" in e.value.message
    down = Client("http://127.0.0.1:1", timeout=2)
    with pytest.raises(ShoalError) as e:
        down.list_collections()
    assert e.value.retryable, e.value


@pytest.mark.parametrize("readme", ["clients/python/README.md", "README.md"])
def test_the_readme_example_runs(cluster_url: str, readme: str):
    text = (HERE.parents[2] / readme).read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    assert blocks, f"{readme} has no python example"
    env = dict(os.environ, SHOAL_URL=cluster_url)
    for code in blocks:
        # The top-level README names the address `shoalctl dev` serves on.
        code = code.replace("http://127.0.0.1:7700", cluster_url)
        ran = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
        assert ran.returncode == 0, f"{readme}'s example failed:\n{code}\n{ran.stdout}\n{ran.stderr}"


def test_auth_keys_and_tls_reach_a_secured_cluster(secure_cluster, name: str):
    from shoal_client import PermissionDenied, Unauthenticated

    sc = secure_cluster
    with Client(sc.url, api_key=sc.keys["ops"], tls_ca=sc.ca) as ops:
        ops.create_collection(name, dimension=3, metric="euclidean", shards=2)
        ops.upsert(name, [[1.0, 0.0, 0.0], [0.0, 1.0, 0.0]], ids=[1, 2])
        assert ops.search(name, [0.0, 1.0, 0.0], k=1).hits[0].id == 2
    with Client(sc.url, api_key=sc.keys["ui"], tls_ca=sc.ca) as ui:
        assert ui.search(name, [1.0, 0.0, 0.0], k=1).hits[0].id == 1
        with pytest.raises(PermissionDenied):
            ui.upsert(name, [[0.0, 0.0, 1.0]], ids=[3])
        with pytest.raises(PermissionDenied):
            ui.drop_collection(name)
    with Client(sc.url, tls_ca=sc.ca, api_key="") as nobody:
        with pytest.raises(Unauthenticated):
            nobody.search(name, [1.0, 0.0, 0.0], k=1)
    with Client(sc.url, api_key=sc.keys["ops"], tls_ca=sc.ca) as ops:
        # Nothing the refused calls asked for happened.
        assert ops.describe_collection(name).points == 2
