#!/usr/bin/env bash
# Which hop holds the open-loop tail: a 3-shard cluster on
# loopback exports every search's trace to `otlp-sink --report`, which cuts
# each trace along its slowest shard call into before / out / remote /
# back / after and says which part is the largest in the slow ones
# (docs/loadtest.md, "Which hop holds the tail").
#
# Usage: loadtest/tail-hops.sh [OUT_DIR]   (default bench-out/tail-hops)
#   RATE (500) queries/s for SECONDS_RUN (20) seconds, at EF (48), SHARDS (3),
#   SAMPLING (1.0: every trace), SLOW_MS (10), WORKERS (1) as in
#   cluster-figures.sh; NOISE (1): run `host-noise --busy-ms 1 --realtime` beside the
#   queries and line the slow traces up with the host's slow episodes
#   ("The host's slow episodes"; 0: without it).
# Needs: cargo build --release -p loadtest -p shoal-shard-node -p shoal-coordinator
#        ../shared/datasets/pypi/make.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-out/tail-hops}
bin=${CARGO_TARGET_DIR:-target}/release
lt=$bin/shoal-loadtest
ds=${DATASET:-../shared/datasets/pypi}
rate=${RATE:-500}
seconds=${SECONDS_RUN:-20}
ef=${EF:-48}
shards=${SHARDS:-3}
sampling=${SAMPLING:-1.0}
slow_ms=${SLOW_MS:-10}
workers=${WORKERS:-1}
noise=${NOISE:-1}
if ((workers > 0)); then export TOKIO_WORKER_THREADS=$workers; fi
mkdir -p "$out"
data=$(mktemp -d)
pids=()
sink=
probe=
. loadtest/lib.sh # after the cd above: wait_port, stop_cluster, cpu_ticks
trap 'stop_cluster; for p in $sink $probe; do kill "$p" 2>/dev/null; done; rm -rf "$data"' EXIT

noise_args=()
rm -f "$out/host-noise.json"
if ((noise)); then noise_args=(--host-noise "$out/host-noise.json"); fi
"$lt" otlp-sink --listen 127.0.0.1:4317 --report "$out/report.json" --slow-ms "$slow_ms" \
  --root-contains Search "${noise_args[@]}" >"$out/otlp-sink.log" 2>&1 &
sink=$!
wait_port 4317
otel=(OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317 OTEL_METRICS_EXPORTER=none
  SHOAL_SHARD_TELEMETRY__SAMPLING_RATIO="$sampling" SHOAL_COORD_TELEMETRY__SAMPLING_RATIO="$sampling")
nodes=()
for ((i = 0; i < shards; i++)); do
  env "${otel[@]}" SHOAL_SHARD_SNAPSHOT__URL="$data/snapshots" "$bin/shoal-shard-node" --node-id "shard-$i" --listen "127.0.0.1:$((7801 + i))" \
    --data-dir "$data/shard-$i" --worker-threads "$workers" >>"$out/shard-$i.log" 2>&1 &
  pids+=($!)
  nodes+=(--shard-node "shard-$i=127.0.0.1:$((7801 + i))")
done
for ((i = 0; i < shards; i++)); do wait_port $((7801 + i)); done
env "${otel[@]}" "$bin/shoal-coordinator" --listen 127.0.0.1:7800 "${nodes[@]}" --worker-threads "$workers" \
  >>"$out/coordinator.log" 2>&1 &
pids+=($!)
wait_port 7800
sleep 1
"$lt" ingest --coordinator http://127.0.0.1:7800 --collection pypi --create --shards "$shards" \
  --base "$ds/base.fvecs" --streams 3 --batch 1000 --no-progress --json "$out/ingest.json" | grep -E 'vectors/s'
if ((noise)); then
  # 1 ms of every 10 on each vCPU, counted per CPU time the probe got,
  # at real-time priority so that a busy cluster does not blind it.
  "$lt" host-noise --seconds "$((seconds + 1))" --busy-ms 1 --realtime --json "$out/host-noise.json" >"$out/host-noise.log" 2>&1 &
  probe=$!
fi
before=$(cpu_ticks "${pids[@]}")
"$lt" query --coordinator http://127.0.0.1:7800 --collection pypi --preload 0 \
  --query "$ds/query.fvecs" --groundtruth "$ds/groundtruth.ivecs" --k 10 --no-progress \
  --rate "$rate" --max-in-flight 1024 --ef "$ef" --duration "${seconds}s" --timeout-ms 2000 \
  --json "$out/query.json" | grep -E 'ok/s|p99'
after=$(cpu_ticks "${pids[@]}")
# The cluster's CPU per search: what it has to catch up on after the host
# slows it (in clock ticks, CLK_TCK a second: thousands over a run).
ticks_per_s=$(getconf CLK_TCK)
echo "cluster CPU: $(((after - before) * 1000000 / ticks_per_s / (rate * seconds))) us per search" | tee "$out/cpu.txt"
if [[ -n $probe ]]; then
  wait "$probe"
  probe=
  cat "$out/host-noise.log"
fi
# The processes flush their spans when they stop; then the sink reports.
stop_cluster
kill -INT "$sink"
wait "$sink" || true
sink=
cat "$out/otlp-sink.log"
