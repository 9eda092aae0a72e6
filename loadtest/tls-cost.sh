#!/usr/bin/env bash
# The cost of TLS (issue 23) on ../shared/datasets/pypi: separate processes
# over loopback (a coordinator and 3 shard nodes), plain text against TLS
# on every hop (clients -> coordinator, coordinator -> nodes with mutual
# TLS), in interleaved rounds whose order turns (the machine is noisy):
#
#   ingest  the 120k base with 3 streams, batches of 1,000: vectors/s;
#   closed  8 clients, closed loop, ef 48, 15 s: queries/s and p99;
#   open    1,000 queries/s, open loop, ef 48, 15 s: p99.
#
# Usage: loadtest/tls-cost.sh [OUT_DIR]   (default bench-out/tls; ROUNDS=3)
# Needs: cargo build --release -p loadtest -p shoal-shard-node -p shoal-coordinator -p shoal-ops
#        ../shared/datasets/pypi/make.sh
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-out/tls}
bin=${CARGO_TARGET_DIR:-target}/release
lt=$bin/shoal-loadtest
ds=${DATASET:-../shared/datasets/pypi}
rounds=${ROUNDS:-3}
ef=${EF:-48}
mkdir -p "$out"
data=$(mktemp -d)
pids=()
log() { printf '== %s\n' "$*" >&2; }

. loadtest/lib.sh # after the cd above: wait_port, stop_cluster
trap 'stop_cluster; rm -rf "$data"' EXIT


"$bin/shoalctl" tls init --out "$data/tls" >/dev/null
t=$data/tls
node_tls=(SHOAL_SHARD_LISTENER__TLS__CERT_FILE="$t/node.pem" SHOAL_SHARD_LISTENER__TLS__KEY_FILE="$t/node-key.pem"
  SHOAL_SHARD_LISTENER__TLS__CLIENT_CA_FILE="$t/ca.pem")
coord_tls=(SHOAL_COORD_LISTENER__TLS__CERT_FILE="$t/coordinator.pem" SHOAL_COORD_LISTENER__TLS__KEY_FILE="$t/coordinator-key.pem"
  SHOAL_COORD_PEERS__TLS__CA_FILE="$t/ca.pem" SHOAL_COORD_PEERS__TLS__CERT_FILE="$t/coordinator.pem"
  SHOAL_COORD_PEERS__TLS__KEY_FILE="$t/coordinator-key.pem")

# start_cluster MODE ROUND: 3 shard nodes on 7901.., a coordinator on 7900,
# fresh data; MODE plain or tls.
start_cluster() {
  local mode=$1 round=$2 i
  local nenv=() cenv=()
  if [[ $mode == tls ]]; then nenv=("${node_tls[@]}"); cenv=("${coord_tls[@]}"); fi
  local nodes=()
  for i in 0 1 2; do
    env ${nenv[@]+"${nenv[@]}"} "$bin/shoal-shard-node" --node-id "shard-$i" --listen "127.0.0.1:$((7901 + i))" \
      --data-dir "$data/$mode-$round/shard-$i" >>"$out/shard-$mode-$i.log" 2>&1 &
    pids+=($!)
    nodes+=(--shard-node "shard-$i=127.0.0.1:$((7901 + i))")
  done
  for i in 0 1 2; do wait_port $((7901 + i)); done
  env ${cenv[@]+"${cenv[@]}"} "$bin/shoal-coordinator" --listen 127.0.0.1:7900 "${nodes[@]}" >>"$out/coordinator-$mode.log" 2>&1 &
  pids+=($!)
  wait_port 7900
  sleep 1
}

run() { # run MODE ROUND
  local mode=$1 round=$2 url=http://127.0.0.1:7900 tls=()
  if [[ $mode == tls ]]; then url=https://127.0.0.1:7900; tls=(--tls-ca "$t/ca.pem"); fi
  start_cluster "$mode" "$round"
  "$lt" ingest --coordinator "$url" "${tls[@]+"${tls[@]}"}" --collection pypi --create --shards 3 \
    --base "$ds/base.fvecs" --streams 3 --batch 1000 --no-progress --json "$out/ingest-$mode-$round.json" |
    grep -E 'vectors/s' | sed "s/^/ingest $mode $round: /"
  local q=(query --coordinator "$url" "${tls[@]+"${tls[@]}"}" --collection pypi --preload 0 --query "$ds/query.fvecs"
    --groundtruth "$ds/groundtruth.ivecs" --k 10 --ef "$ef" --duration 15s --no-progress)
  "$lt" "${q[@]}" --clients 8 --json "$out/closed-$mode-$round.json" | grep -E 'ok/s' | sed "s/^/closed $mode $round: /"
  "$lt" "${q[@]}" --rate 1000 --max-in-flight 1024 --timeout-ms 2000 --json "$out/open-$mode-$round.json" |
    grep -E 'ok/s' | sed "s/^/open $mode $round: /"
  stop_cluster
}

modes=(plain tls)
for ((round = 1; round <= rounds; round++)); do
  for ((turn = 0; turn < 2; turn++)); do
    run "${modes[(turn + round - 1) % 2]}" "$round"
  done
done

python3 - "$out" "$rounds" <<'PY' | tee "$out/summary.txt"
import json, statistics, sys
out, rounds = sys.argv[1], int(sys.argv[2])
def phase(kind, mode, r):
    return json.load(open(f"{out}/{kind}-{mode}-{r}.json"))["phases"][0]
cols = {
    "ingest vectors/s": lambda m, r: phase("ingest", m, r)["items_per_s"],
    "closed-loop queries/s": lambda m, r: phase("closed", m, r)["ok_per_s"],
    "closed-loop p99 ms": lambda m, r: phase("closed", m, r)["latency_ms"]["p99_ms"],
    "open loop 1,000/s p99 ms": lambda m, r: phase("open", m, r)["latency_ms"]["p99_ms"],
}
print(f"| measure | plain (rounds) | TLS (rounds) | median plain | median TLS | TLS vs plain |")
print("|---|---|---|---|---|---|")
for name, f in cols.items():
    p = [f("plain", r) for r in range(1, rounds + 1)]
    t = [f("tls", r) for r in range(1, rounds + 1)]
    mp, mt = statistics.median(p), statistics.median(t)
    fmt = lambda xs: " / ".join(f"{x:,.1f}" if x < 100 else f"{x:,.0f}" for x in xs)
    print(f"| {name} | {fmt(p)} | {fmt(t)} | {fmt([mp])} | {fmt([mt])} | {100 * (mt / mp - 1):+.1f}% |")
PY
log "reports in $out"
