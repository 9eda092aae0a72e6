#!/usr/bin/env bash
# The cluster figures of issue 18 on ../shared/datasets/pypi, separate
# processes over loopback (a coordinator and 3 shard nodes, or 1), driven
# by `shoal-loadtest`:
#
#   1. the engine alone: search QPS on 2 threads per ef (the yardstick);
#   2. sustained ingest with 3 streams into 3 shard nodes;
#   3. recall per ef through the 3-shard and the 1-shard cluster (closed
#      loop), and the smallest ef that reaches recall@10 >= 0.95 for each;
#   4. open-loop rate ladders at that ef: the rate each holds with
#      p99 <= 10 ms, and the 3-shard p99 against the 1-shard p99 at equal
#      rates (the price of scatter-gather);
#   5. the cost of telemetry: closed-loop QPS of the 3-shard cluster with
#      the defaults (Prometheus metrics, no export), with metrics off, and
#      with traces exported at 1% to a counting OTLP sink (with and without
#      the OTLP metrics push, OTEL_METRICS_EXPORTER=none), in interleaved
#      rounds (the machine is noisy).
#
# Every process (shard nodes, coordinator, load generator) serves on
# WORKERS worker threads (default 1): four or five processes share the two
# cores here, and more threads than cores cost 15-20% of the searches
# (docs/benchmarks.md, "Worker threads"). WORKERS=0: tokio's default, one
# per core in every process.
#
# Usage: loadtest/cluster-figures.sh [OUT_DIR]   (default bench-out/cluster)
#        TELEMETRY_ONLY=1 EF=48 loadtest/cluster-figures.sh [OUT_DIR]: only
#        the 3-shard ingest and step 5, at that ef
# Needs: cargo build --release -p loadtest -p shoal-shard-node -p shoal-coordinator
#        ../shared/datasets/pypi/make.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-out/cluster}
bin=${CARGO_TARGET_DIR:-target}/release
lt=$bin/shoal-loadtest
ds=${DATASET:-../shared/datasets/pypi}
efs=${EFS:-24,32,40,48,56,64,72,80,96}
rates=${RATES:-500,1000,1500,2000,2500,3000}
rounds=${ROUNDS:-3}
workers=${WORKERS:-1}
if ((workers > 0)); then export TOKIO_WORKER_THREADS=$workers; fi
mkdir -p "$out"
data=$(mktemp -d)
pids=()
log() { printf '== %s\n' "$*" >&2; }

. loadtest/lib.sh # after the cd above: wait_port, stop_cluster, cpu_ticks
trap 'stop_cluster; rm -rf "$data"' EXIT


# start_cluster NODES [KEY=VALUE ...]: shard nodes on 7801.., coordinator
# on 7800, data kept in $data/NODES between starts.
start_cluster() {
  local n=$1 i
  shift
  local nodes=()
  for ((i = 0; i < n; i++)); do
    env "$@" "$bin/shoal-shard-node" --node-id "shard-$i" --listen "127.0.0.1:$((7801 + i))" \
      --data-dir "$data/$n/shard-$i" --worker-threads "$workers" >>"$out/shard-$n-$i.log" 2>&1 &
    pids+=($!)
    nodes+=(--shard-node "shard-$i=127.0.0.1:$((7801 + i))")
  done
  for ((i = 0; i < n; i++)); do wait_port $((7801 + i)); done
  env "$@" "$bin/shoal-coordinator" --listen 127.0.0.1:7800 "${nodes[@]}" --worker-threads "$workers" >>"$out/coordinator-$n.log" 2>&1 &
  pids+=($!)
  wait_port 7800
  sleep 1
}

q() { # q NAME ARGS...: a query run against the cluster on 7800
  local name=$1
  shift
  "$lt" query --coordinator http://127.0.0.1:7800 --collection pypi --preload 0 \
    --query "$ds/query.fvecs" --groundtruth "$ds/groundtruth.ivecs" --k 10 --no-progress \
    --json "$out/$name.json" "$@" | grep -E 'ok/s' | sed "s/^/$name: /"
}

# The smallest ef of a sweep report with recall >= 0.95.
ef_for_recall() {
  python3 - "$1" <<'PY'
import json, sys
r = json.load(open(sys.argv[1]))
for p in r["phases"]:
    if (p.get("recall") or {}).get("mean", 0) >= 0.95:
        print(p["params"]["ef"]); break
else:
    print(max(p["params"]["ef"] for p in r["phases"]))
PY
}

if [[ -n ${TELEMETRY_ONLY:-} ]]; then
  start_cluster 3
  "$lt" ingest --coordinator http://127.0.0.1:7800 --collection pypi --create --shards 3 \
    --base "$ds/base.fvecs" --streams 3 --batch 1000 --no-progress --json "$out/ingest-3.json" | grep -E 'vectors/s'
  stop_cluster
  echo "3 shard(s): ef ${EF:-48} (given)" >"$out/ef-3.txt"
else
log "1. the engine alone, 2 search threads"
"$lt" index-bench --base "$ds/base.fvecs" --query "$ds/query.fvecs" --groundtruth "$ds/groundtruth.ivecs" \
  --metric cosine --m 16 --ef-construction 100 --threads 2 --ef "$efs" --search-threads 2 --no-incremental \
  --json "$out/engine.json" 2>&1 | grep -E '^ef='

for n in 3 1; do
  log "2. ingest with 3 streams into $n shard node(s)"
  start_cluster $n
  "$lt" ingest --coordinator http://127.0.0.1:7800 --collection pypi --create --shards $n \
    --base "$ds/base.fvecs" --streams 3 --batch 1000 --no-progress --json "$out/ingest-$n.json" | grep -E 'vectors/s'
  log "3. recall per ef through $n shard(s), closed loop, 8 clients"
  q "sweep-$n" --clients 8 --ef "$efs" --duration 8s
  ef=$(ef_for_recall "$out/sweep-$n.json")
  echo "$n shard(s): ef $ef reaches recall@10 >= 0.95" | tee "$out/ef-$n.txt"
  log "4. open-loop ladder at ef $ef through $n shard(s)"
  IFS=, read -ra rs <<<"$rates"
  for r in "${rs[@]}"; do
    q "open-$n-$r" --rate "$r" --max-in-flight 1024 --ef "$ef" --duration 15s --timeout-ms 2000
  done
  stop_cluster
done
fi

log "5. the cost of telemetry, $rounds interleaved rounds, 3 shards, closed loop"
ef=$(cat "$out/ef-3.txt" | grep -oE 'ef [0-9]+' | grep -oE '[0-9]+')
"$lt" otlp-sink --listen 127.0.0.1:4317 >"$out/otlp-sink.log" 2>&1 &
sink=$!
wait_port 4317
telemetry_run() { # telemetry_run NAME ROUND: one configuration's closed loop
  case $1 in
  default) start_cluster 3 ;;
  nometrics) start_cluster 3 SHOAL_SHARD_TELEMETRY__METRICS=false SHOAL_COORD_TELEMETRY__METRICS=false ;;
  traced) start_cluster 3 OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317 \
    SHOAL_SHARD_TELEMETRY__SAMPLING_RATIO=0.01 SHOAL_COORD_TELEMETRY__SAMPLING_RATIO=0.01 ;;
  # Traces only: metrics stay on /metrics, no second OTLP aggregation.
  tracedonly) start_cluster 3 OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317 OTEL_METRICS_EXPORTER=none \
    SHOAL_SHARD_TELEMETRY__SAMPLING_RATIO=0.01 SHOAL_COORD_TELEMETRY__SAMPLING_RATIO=0.01 ;;
  esac
  local before after
  before=$(cpu_ticks "${pids[@]}")
  q "telemetry-$1-$2" --clients 8 --ef "$ef" --duration 15s
  after=$(cpu_ticks "${pids[@]}")
  echo $((after - before)) >"$out/telemetry-$1-$2.cpu"
  stop_cluster
}
# The order turns every round, so that no configuration always runs first
# or last after a restart.
configs=(default nometrics traced tracedonly)
for ((round = 1; round <= rounds; round++)); do
  for ((turn = 0; turn < ${#configs[@]}; turn++)); do
    telemetry_run "${configs[(turn + round - 1) % ${#configs[@]}]}" "$round"
  done
done
kill -INT "$sink" && wait "$sink" || true
cat "$out/otlp-sink.log"
python3 - "$out" "$rounds" "$(getconf CLK_TCK)" "${configs[@]}" <<'PY'
# Per configuration: queries/s and the cluster's CPU per query, each
# round's against the default's of the same round.
import json, statistics as st, sys
out, rounds, hz, configs = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4:]
def run(c, r):
    p = json.load(open(f"{out}/telemetry-{c}-{r}.json"))["phases"][0]
    ok = p["counts"]["ok"]
    ticks = int(open(f"{out}/telemetry-{c}-{r}.cpu").read())
    return p["ok_per_s"], ticks / hz / ok * 1e6
rows = {c: [run(c, r) for r in range(1, rounds + 1)] for c in configs}
print("setting | queries/s median | vs default (per-round median) | CPU us/query median | vs default (per-round median, range)")
for c in configs:
    q = [x[0] for x in rows[c]]; u = [x[1] for x in rows[c]]
    dq = [a[0] / b[0] - 1 for a, b in zip(rows[c], rows[configs[0]])]
    du = [a[1] / b[1] - 1 for a, b in zip(rows[c], rows[configs[0]])]
    print(f"{c} | {st.median(q):,.0f} | {st.median(dq):+.1%} | {st.median(u):.1f} | "
          f"{st.median(du):+.1%} ({min(du):+.1%}..{max(du):+.1%})")
PY
log "reports in $out"
