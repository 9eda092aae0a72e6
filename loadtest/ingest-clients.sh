#!/usr/bin/env bash
# Issue 21's throughput figures: the same file loaded into one cluster of
# separate processes (3 shard nodes, 1 coordinator, on an etcd) by
# `shoal-loadtest ingest`, `shoalctl ingest` and the Python client's
# `Client.upload`, each into its own 3-shard collection, with the same
# streams, batch size and window; loadtest runs first and last so that
# drift of this shared machine shows.
#
#   loadtest/ingest-clients.sh BASE.fvecs [ROWS]
#
# Needs: release binaries (cargo build --release -p loadtest -p shoal-ops),
# an etcd on $ETCD (default http://127.0.0.1:2379), and a Python with
# shoal_client installed ($PYTHON; pip install ./clients/python).
set -euo pipefail
cd "$(dirname "$0")/.."
base=${1:?usage: loadtest/ingest-clients.sh BASE.fvecs [ROWS]}
rows=${2:-120000}
bin=${BIN:-${CARGO_TARGET_DIR:-target}/release}
etcd=${ETCD:-http://127.0.0.1:2379}
python=${PYTHON:-python3}
streams=3 batch=1000 window=2
dim=$(python3 -c 'import struct, sys; print(struct.unpack("<i", open(sys.argv[1], "rb").read(4))[0])' "$base")
dir=$(mktemp -d)
port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
url="http://127.0.0.1:$port"
export SHOAL_ENDPOINT=$url
"$bin/shoalctl" dev --etcd "$etcd" --etcd-prefix "/shoal-ingest-clients/$$" --shard-nodes 3 --port "$port" \
  --data-dir "$dir/cluster" >"$dir/dev.log" 2>&1 &
dev=$!
trap 'kill -INT $dev 2>/dev/null; wait $dev 2>/dev/null; rm -rf "$dir"' EXIT
for _ in $(seq 100); do grep -q "coordinator" "$dir/dev.log" 2>/dev/null && break; sleep 0.2; done
sleep 2
echo "cluster on $url; $rows rows of $base (dim $dim); $streams streams, batches of $batch, window $window"

rate() { python3 -c "print(f'{$rows / $1:,.0f} rows/s ({$1:.1f} s)')"; }
timed() { local t0 t1; t0=$(date +%s.%N); "$@" >"$dir/out.log" 2>&1 || { cat "$dir/out.log"; exit 1; }; t1=$(date +%s.%N); python3 -c "print($t1 - $t0)"; }

loadtest() {
  timed "$bin/shoal-loadtest" ingest --coordinator "$url" --create --collection "$1" --shards 3 --metric cosine \
    --base "$base" --limit "$rows" --streams $streams --batch $batch --window $window --no-progress
}
lt1=$(loadtest lt_first)
echo "loadtest ingest (first):  $(rate "$lt1")"
rows_file="$dir/rows.fvecs"
head -c $((rows * (4 + 4 * dim))) "$base" >"$rows_file"
ctl=$(timed "$bin/shoalctl" ingest --collection ctl --create --shards 3 --source ctl --streams $streams \
  --batch-points $batch --batch-bytes $((batch * (16 + 4 * dim) + 1024)) --window $window --quiet "$rows_file")
echo "shoalctl ingest:          $(rate "$ctl")"
py=$("$python" - "$url" "$rows_file" "$dim" <<'PY'
import sys, time
import numpy as np
from shoal_client import Client
url, path, dim = sys.argv[1], sys.argv[2], int(sys.argv[3])
raw = np.fromfile(path, dtype=np.float32).reshape(-1, dim + 1)[:, 1:]
vectors = np.ascontiguousarray(raw)
client = Client(url)
client.create_collection("py", dimension=dim, metric="cosine", shards=3)
t0 = time.monotonic()
client.upload("py", vectors, source="py", batch_size=1000, parallel=3, window=2)
print(time.monotonic() - t0)
PY
)
echo "Client.upload (numpy):    $(rate "$py")"
lt2=$(loadtest lt_last)
echo "loadtest ingest (last):   $(rate "$lt2")"
python3 - "$lt1" "$lt2" "$ctl" "$py" <<'PY'
import sys
lt1, lt2, ctl, py = map(float, sys.argv[1:])
lt = (lt1 + lt2) / 2
print(f"shoalctl ingest / loadtest ingest (mean of both): {lt / ctl:.2f}x (target >= 0.9x)")
print(f"Client.upload / shoalctl ingest: {ctl / py:.2f}x (target >= 0.8x)")
PY
"$bin/shoalctl" collections list || true
