#!/usr/bin/env bash
# The cost of telemetry in instructions per query: the 3-shard cluster of
# cluster-figures.sh step 5 (pypi ingested once, then restarted per
# setting), every shard node and the coordinator under callgrind, and a
# fixed count of closed-loop queries. Counts are zeroed after a warm-up
# and dumped after the measured queries, so opening and warming are left
# out.
#
# Why: queries/s on this shared 2-core machine moves by ±5-10% from round
# to round, more than the ≤ 3% being measured (docs/loadtest.md, "The cost
# of telemetry"), and the VM has no hardware counters for `perf stat`.
# Instructions executed do not depend on the neighbours. They leave out
# what instructions cannot see (cache misses, a closed loop's idle time),
# so they complement the queries/s rounds rather than replace them.
#
# Usage: loadtest/telemetry-instructions.sh [OUT_DIR]   (default bench-out/telemetry-ir)
#   QUERIES (default 4000) measured queries per setting, WARMUP (200),
#   IDLE (10) seconds with no query after them, EF (48),
#   CONFIGS (default "default nometrics traced tracedonly").
# Needs: cargo build --release -p loadtest -p shoal-shard-node -p shoal-coordinator,
#        ../shared/datasets/pypi/make.sh, valgrind (apt-get install valgrind).
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-out/telemetry-ir}
bin=${CARGO_TARGET_DIR:-target}/release
lt=$bin/shoal-loadtest
ds=${DATASET:-../shared/datasets/pypi}
queries=${QUERIES:-4000}
warmup=${WARMUP:-200}
idle=${IDLE:-10}
ef=${EF:-48}
read -ra configs <<<"${CONFIGS:-default nometrics traced tracedonly}"
export TOKIO_WORKER_THREADS=1
mkdir -p "$out"
data=$(mktemp -d)
pids=()
sink=
. loadtest/lib.sh # after the cd above: wait_port, stop_cluster
trap 'stop_cluster; [[ -n $sink ]] && kill "$sink" 2>/dev/null; rm -rf "$data"' EXIT


# start_cluster WRAP [KEY=VALUE ...]: 3 shard nodes and a coordinator, each
# run as `WRAP NAME binary ...` (WRAP "" runs them plain).
start_cluster() {
  local wrap=$1 i nodes=()
  shift
  for i in 0 1 2; do
    env "$@" $wrap${wrap:+"$out/cg-shard-$i.%p"} "$bin/shoal-shard-node" --node-id "shard-$i" \
      --listen "127.0.0.1:$((7811 + i))" --data-dir "$data/shard-$i" --worker-threads 1 >>"$out/shard-$i.log" 2>&1 &
    pids+=($!)
    nodes+=(--shard-node "shard-$i=127.0.0.1:$((7811 + i))")
  done
  for i in 0 1 2; do wait_port $((7811 + i)) 60; done
  env "$@" $wrap${wrap:+"$out/cg-coordinator.%p"} "$bin/shoal-coordinator" --listen 127.0.0.1:7810 "${nodes[@]}" \
    --worker-threads 1 >>"$out/coordinator.log" 2>&1 &
  pids+=($!)
  wait_port 7810 60
}

q() { # q JSON ARGS...: closed-loop queries through the coordinator
  local json=$1
  shift
  "$lt" query --coordinator http://127.0.0.1:7810 --collection pypi --preload 0 --query "$ds/query.fvecs" \
    --k 10 --ef "$ef" --clients 8 --timeout-ms 60000 --no-progress --json "$json" "$@" | grep -E 'ok/s'
}

echo "== ingest $(date -u +%T)" >&2
start_cluster ""
"$lt" ingest --coordinator http://127.0.0.1:7810 --collection pypi --create --shards 3 \
  --base "$ds/base.fvecs" --streams 3 --batch 1000 --no-progress --json "$out/ingest.json" | grep -E 'vectors/s'
stop_cluster

"$lt" otlp-sink --listen 127.0.0.1:4317 >"$out/otlp-sink.log" 2>&1 &
sink=$!
wait_port 4317
cg="valgrind --tool=callgrind --dump-instr=no --callgrind-out-file="
traced=(OTEL_EXPORTER_OTLP_ENDPOINT=http://127.0.0.1:4317
  SHOAL_SHARD_TELEMETRY__SAMPLING_RATIO=0.01 SHOAL_COORD_TELEMETRY__SAMPLING_RATIO=0.01)
for c in "${configs[@]}"; do
  echo "== $c $(date -u +%T)" >&2
  rm -f "$out"/cg-*
  case $c in
  default) start_cluster "$cg" ;;
  nometrics) start_cluster "$cg" SHOAL_SHARD_TELEMETRY__METRICS=false SHOAL_COORD_TELEMETRY__METRICS=false ;;
  traced) start_cluster "$cg" "${traced[@]}" ;;
  tracedonly) start_cluster "$cg" "${traced[@]}" OTEL_METRICS_EXPORTER=none ;;
  *) echo "unknown setting $c" >&2; exit 2 ;;
  esac
  q "$out/warmup-$c.json" --count "$warmup" >/dev/null
  for p in "${pids[@]}"; do callgrind_control -z "$p" >/dev/null; done
  q "$out/ir-$c.json" --count "$queries" | sed "s/^/$c: /"
  for p in "${pids[@]}"; do callgrind_control -d "$p" >/dev/null; done
  # What the processes execute with no query at all (timers, samplers),
  # which a slower run charges to more of its queries.
  for p in "${pids[@]}"; do callgrind_control -z "$p" >/dev/null; done
  sleep "$idle"
  for p in "${pids[@]}"; do callgrind_control -d "$p" >/dev/null; done
  # The dump after the measured queries is each process's first ("*.1"),
  # the idle one its second.
  total=0 idle_total=0
  for f in "$out"/cg-*.1; do
    ir=$(awk '/^summary:/ {print $2}' "$f")
    idle_ir=$(awk '/^summary:/ {print $2}' "${f%.1}.2")
    total=$((total + ir)) idle_total=$((idle_total + idle_ir))
    echo "$c $(basename "${f%.1}") $ir $idle_ir" >>"$out/ir-by-process.txt"
  done
  echo "$c $total $idle_total" >>"$out/ir.txt"
  stop_cluster
done
kill -INT "$sink" && wait "$sink" || true
sink=
cat "$out/otlp-sink.log"
python3 - "$out" "$idle" <<'PY'
# Instructions per query of the four processes, against the first
# setting: as counted, and less what the same processes execute idle for
# as long as the queries took.
import json, sys
out, idle = sys.argv[1], float(sys.argv[2])
rows = []
for line in open(f"{out}/ir.txt"):
    c, ir, idle_ir = line.split()
    p = json.load(open(f"{out}/ir-{c}.json"))["phases"][0]
    ok, secs = p["counts"]["ok"], p["counts"]["ok"] / p["ok_per_s"]
    per = int(ir) / ok
    net = (int(ir) - int(idle_ir) / idle * secs) / ok
    rows.append((c, ok, per, int(idle_ir) / idle, net))
print("setting | queries | instructions per query | vs first | idle instructions/s | net of idle, per query | vs first")
for c, ok, per, rate, net in rows:
    print(f"{c} | {ok:,} | {per:,.0f} | {per / rows[0][2] - 1:+.2%} | {rate:,.0f} | {net:,.0f} | {net / rows[0][4] - 1:+.2%}")
PY
