"""A shoal cluster for the tests: `shoalctl dev --port 0` (a coordinator
and three shard nodes in one process, every one on a free loopback port)
in a temporary directory, stopped with Ctrl-C (SIGINT) at the end.

`SHOALCTL` names the binary; by default the workspace's debug build
(`ops/test.sh` builds it before it runs these tests)."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Dict, Iterator, List

import pytest

REPO = Path(__file__).resolve().parents[3]


def shoalctl() -> str:
    explicit = os.environ.get("SHOALCTL")
    if explicit:
        return explicit
    target = Path(os.environ.get("CARGO_TARGET_DIR", REPO / "target"))
    for profile in ("debug", "release"):
        candidate = target / profile / "shoalctl"
        if candidate.is_file():
            return str(candidate)
    pytest.fail(f"no shoalctl binary under {target} (cargo build --bin shoalctl, or set SHOALCTL)")


def _run_dev(args: List[str]) -> Iterator[str]:
    """`shoalctl dev ARGS` until the generator is closed; yields the
    coordinator's URL once it is printed."""
    proc = subprocess.Popen([shoalctl(), "dev", *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: List[str] = []
    url = None
    deadline = time.monotonic() + 60
    assert proc.stdout is not None
    while time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen.append(line)
        m = re.match(r"\s*coordinator\s+(https?://\S+)", line)
        if m:
            url = m.group(1)
            break
    if url is None:
        proc.kill()
        pytest.fail("shoalctl dev did not print its coordinator within 60 s:\n" + "".join(seen))
    # Keep reading its output so that it never blocks on a full pipe.
    threading.Thread(target=lambda: [seen.append(l) for l in proc.stdout], daemon=True).start()
    yield url
    proc.send_signal(signal.SIGINT)
    try:
        proc.wait(timeout=30)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        sys.stderr.write("".join(seen[-50:]))
        pytest.fail("shoalctl dev did not stop within 30 s of Ctrl-C")


@pytest.fixture(scope="session")
def cluster_url(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    data = tmp_path_factory.mktemp("shoal-dev")
    yield from _run_dev(["--port", "0", "--shard-nodes", "3", "--data-dir", str(data)])


class SecureCluster:
    """A dev cluster with TLS everywhere and API keys, made with shoalctl's
    own `tls init` and `keys new`."""

    def __init__(self, url: str, ca: str, keys: Dict[str, str]):
        self.url = url
        self.ca = ca
        self.keys = keys


@pytest.fixture(scope="session")
def secure_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureCluster]:
    root = tmp_path_factory.mktemp("shoal-secure")
    tls = root / "tls"
    subprocess.run([shoalctl(), "tls", "init", "--out", str(tls)], check=True, capture_output=True)
    keys: Dict[str, str] = {}
    entries = []
    for name, role in (("ops", "admin"), ("ui", "read")):
        made = subprocess.run([shoalctl(), "keys", "new", "--name", name, "--role", role], check=True, capture_output=True, text=True)
        keys[name] = made.stdout.strip()
        entries.append(made.stderr[made.stderr.index("[[keys]]") :])
    keys_file = root / "keys.toml"
    keys_file.write_text("\n".join(entries))
    args = ["--port", "0", "--shard-nodes", "2", "--data-dir", str(root / "data"), "--tls-dir", str(tls), "--keys-file", str(keys_file)]
    for url in _run_dev(args):
        yield SecureCluster(url, str(tls / "ca.pem"), keys)


@pytest.fixture
def client(cluster_url: str):
    from shoal_client import Client

    with Client(cluster_url) as c:
        yield c


@pytest.fixture
def name(request: pytest.FixtureRequest) -> str:
    """A collection name of the test's own (the cluster is shared)."""
    return re.sub(r"[^A-Za-z0-9_-]", "-", request.node.name)[:60]
