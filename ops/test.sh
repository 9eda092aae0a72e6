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
trap 'kill "$moto_pid" 2>/dev/null || true; wait "$moto_pid" 2>/dev/null || true; rm -f "$moto_log"' EXIT
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
