#!/usr/bin/env bash
# shoal's one test command: installs what the tests need on a fresh Debian
# machine with only the Rust toolchain, then runs every test of the
# workspace. `.ci/run` calls exactly this.
#
#   ./ops/test.sh            # everything
#   ./ops/test.sh -p shoal-engine   # extra arguments go to `cargo test`
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '== %s\n' "$*" >&2; }

# The docs against the code, first (a second, no build): paths that exist,
# real `shoalctl` subcommands, no development history, the README's error
# table matching docs/errors.md. Rules at the top of ops/check_docs.py; its
# own tests make sure it can fail.
log "python3 ops/check_docs.py"
python3 ops/check_docs_test.py
python3 ops/check_docs.py

# No new cycle between the modules of a crate (a second, no build): the
# cycles that exist are listed at the top of ops/check_cycles.py, a list
# that may only shrink; its own tests make sure it can fail.
log "python3 ops/check_cycles.py"
python3 ops/check_cycles_test.py
python3 ops/check_cycles.py

# System packages the tests use. The disk-full test mounts a tmpfs (needs
# root and util-linux's `mount`); it skips with a printed reason elsewhere.
need_pkgs=()
command -v mount >/dev/null 2>&1 || need_pkgs+=(mount)
if ((${#need_pkgs[@]})); then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    log "installing ${need_pkgs[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
  else
    log "missing ${need_pkgs[*]}; the tests that need them will skip"
  fi
fi

# The servers started below (moto, etcd), stopped and removed on exit.
stop_servers() {
  local pid
  for pid in ${moto_pid:-} ${etcd_pid:-}; do
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
  done
  rm -f "${moto_log:-}"
  if [[ -n ${etcd_dir:-} ]]; then rm -rf "$etcd_dir"; fi
}
trap stop_servers EXIT

# A real S3-compatible server for the snapshot tests: moto_server from PyPI
# in a venv under the cache dir (installed once), on a free loopback port,
# stopped when this script exits. The tests read its endpoint from
# SHOAL_TEST_S3_ENDPOINT and use the bucket SHOAL_TEST_S3_BUCKET.
moto_venv="${XDG_CACHE_HOME:-$HOME/.cache}/shoal-test/moto-venv"
if ! "$moto_venv/bin/python" -c 'import moto, boto3' >/dev/null 2>&1; then
  log "installing moto[server] into $moto_venv"
  rm -rf "$moto_venv"
  if ! python3 -m venv "$moto_venv" 2>/dev/null; then
    # Debian's python3 lacks venv until python3-venv is installed.
    if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3 python3-venv >/dev/null
    fi
    rm -rf "$moto_venv"
    python3 -m venv "$moto_venv"
  fi
  "$moto_venv/bin/pip" install -q "moto[server]"
fi
moto_port=$("$moto_venv/bin/python" -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
moto_log=$(mktemp)
"$moto_venv/bin/moto_server" -H 127.0.0.1 -p "$moto_port" >"$moto_log" 2>&1 &
moto_pid=$!
export SHOAL_TEST_S3_ENDPOINT="http://127.0.0.1:$moto_port"
export SHOAL_TEST_S3_BUCKET=shoal-test
"$moto_venv/bin/python" - <<PY || { cat "$moto_log" >&2; exit 1; }
import time, boto3
s3 = boto3.client("s3", endpoint_url="$SHOAL_TEST_S3_ENDPOINT", region_name="us-east-1",
                  aws_access_key_id="testing", aws_secret_access_key="testing")
for _ in range(100):
    try:
        s3.create_bucket(Bucket="$SHOAL_TEST_S3_BUCKET")
        break
    except Exception:
        time.sleep(0.1)
else:
    raise SystemExit("moto_server did not come up on $SHOAL_TEST_S3_ENDPOINT")
PY
log "moto_server (S3) on $SHOAL_TEST_S3_ENDPOINT, pid $moto_pid"

# A real etcd for the metadata store's tests: Debian's etcd-server, one
# member on free loopback ports with its data in a temp dir, stopped and
# removed on exit. The tests read its endpoint from SHOAL_TEST_ETCD_ENDPOINT
# (and start etcds of their own from PATH).
if ! command -v etcd >/dev/null 2>&1; then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    log "installing etcd-server"
    # A fresh machine may not have package lists yet.
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null 2>&1 ||
      { apt-get update -qq >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq etcd-server >/dev/null; }
  fi
  command -v etcd >/dev/null 2>&1 || { log "etcd is missing: install Debian's etcd-server (needs root and apt-get)"; exit 1; }
fi
# etcd 3.4 exits on architectures it does not list as supported (arm64 among
# them) unless this names the machine's (Go) architecture; others ignore it.
case "$(uname -m)" in
  aarch64 | arm64) export ETCD_UNSUPPORTED_ARCH=arm64 ;;
  ppc64le) export ETCD_UNSUPPORTED_ARCH=ppc64le ;;
  s390x) export ETCD_UNSUPPORTED_ARCH=s390x ;;
  armv7l | armv6l) export ETCD_UNSUPPORTED_ARCH=arm ;;
  i?86) export ETCD_UNSUPPORTED_ARCH=386 ;;
esac
read -r etcd_client_port etcd_peer_port < <(python3 -c 'import socket
socks = [socket.socket() for _ in range(2)]
for s in socks: s.bind(("127.0.0.1", 0))
print(*(s.getsockname()[1] for s in socks))')
etcd_dir=$(mktemp -d)
etcd_client="http://127.0.0.1:$etcd_client_port"
etcd_peer="http://127.0.0.1:$etcd_peer_port"
etcd --name shoal-test --data-dir "$etcd_dir/data" \
  --listen-client-urls "$etcd_client" --advertise-client-urls "$etcd_client" \
  --listen-peer-urls "$etcd_peer" --initial-advertise-peer-urls "$etcd_peer" \
  --initial-cluster "shoal-test=$etcd_peer" >"$etcd_dir/etcd.log" 2>&1 &
etcd_pid=$!
export SHOAL_TEST_ETCD_ENDPOINT=$etcd_client
python3 - "$etcd_client/health" <<'PY' || { cat "$etcd_dir/etcd.log" >&2; exit 1; }
import json, sys, time, urllib.request
for _ in range(150):
    try:
        if json.load(urllib.request.urlopen(sys.argv[1], timeout=1)).get("health") == "true":
            break
    except Exception:
        pass
    time.sleep(0.1)
else:
    raise SystemExit("etcd did not become healthy at " + sys.argv[1])
PY
log "etcd $(etcd --version | head -1 | awk '{print $3}') on $SHOAL_TEST_ETCD_ENDPOINT, pid $etcd_pid"

# What the workspace declares, enforced: formatting (rustfmt.toml), lints
# with warnings as errors, and documentation that builds without warnings.
# Skipped when arguments narrow the run to some tests.
if (($# == 0)); then
  log "cargo fmt --check"
  cargo fmt --all -- --check
  log "cargo clippy (warnings are errors)"
  cargo clippy --workspace --all-targets --locked -- -D warnings
  log "cargo doc (warnings are errors)"
  RUSTDOCFLAGS="-D warnings" cargo doc --workspace --no-deps --locked --quiet
fi

log "cargo test (workspace)"
cargo test --workspace --locked "$@"

# The Python client (clients/python): installed with its test extras into
# a venv under the cache dir (like moto's), then its tests run against
# `shoalctl dev --port 0` from the build above. The package itself is
# reinstalled every run: its stubs are generated from proto/ as it builds.
# Skipped when arguments narrow the run to some Rust tests.
if (($# == 0)); then
  py_venv="${XDG_CACHE_HOME:-$HOME/.cache}/shoal-test/py-client-venv"
  if ! "$py_venv/bin/python" -c 'import pytest, grpc, numpy, tqdm' >/dev/null 2>&1; then
    log "creating the Python client's test venv in $py_venv"
    rm -rf "$py_venv"
    python3 -m venv "$py_venv"
    "$py_venv/bin/pip" install -q --upgrade pip
  fi
  log "pip install ./clients/python[test]"
  "$py_venv/bin/pip" install -q "./clients/python[test]"
  "$py_venv/bin/pip" install -q --force-reinstall --no-deps ./clients/python
  # `cargo test` above built shoalctl (shoal-ops' integration tests use it).
  target_dir=$(cargo metadata --format-version 1 --no-deps | python3 -c 'import json, sys; print(json.load(sys.stdin)["target_directory"])')
  [[ -x "$target_dir/debug/shoalctl" ]] || cargo build --locked --bin shoalctl
  log "pytest clients/python"
  SHOALCTL="$target_dir/debug/shoalctl" "$py_venv/bin/python" -m pytest -q -p no:cacheprovider clients/python/tests
fi
