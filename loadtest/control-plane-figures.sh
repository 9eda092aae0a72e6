#!/usr/bin/env bash
# The control-plane figures of issue 19 on ../shared/datasets/pypi: etcd,
# 3 coordinators and 4 shard nodes, each its own process on loopback, the
# default 10 s lease; `shoal-loadtest mixed` keeps 3 ingest streams and 8
# search clients running through each scenario (spread over the three
# coordinators), and the operator's commands fire as `--fault ...:run:`
# hooks, so the report's timeline shows what they did to the load.
#
#   1. move: a 3-shard collection (37k points a shard, growing to 40k), one shard
#      moved to the empty fourth node;
#   2. drain and add: a 12-shard collection (3 a node), one node drained,
#      then a fifth node started and a rebalance;
#   3. the controller SIGKILLed under load: time until another one is
#      named controller;
#   4. the whole cluster stopped (SIGTERM) and started again: time until
#      every shard answers;
#   5. a shard node SIGKILLed under load: time until its shards are
#      reported down, until its lease ends, and until `shoalctl shard
#      recover` has them serving from their snapshot.
#
# Usage: loadtest/control-plane-figures.sh [OUT_DIR]  (default bench-out/control-plane)
#        STEPS="3 5" loadtest/control-plane-figures.sh  (some scenarios only)
# Needs: etcd on the PATH (Debian: etcd-server), ../shared/datasets/pypi/make.sh,
#        cargo build --release -p loadtest -p ops -p shoal-shard-node -p shoal-coordinator
# Prints a summary (also in OUT_DIR/summary.txt); the loadtest reports are
# OUT_DIR/*.json and *.txt.
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-bench-out/control-plane}
bin=${CARGO_TARGET_DIR:-target}/release
lt=$bin/shoal-loadtest
ctl=$bin/shoalctl
ds=${DATASET:-../shared/datasets/pypi}
dur=${DURATION:-100}
steps=" ${STEPS:-1 2 3 4 5} "
step() { [[ $steps == *" $1 "* ]]; }
mkdir -p "$out"
out=$(cd "$out" && pwd)
data=$(mktemp -d)
prefix=/shoal/figures
declare -A pid_of
etcd_pid=
log() { printf '== %s\n' "$*" >&2; }
now() { date +%s.%N; }
since() { awk -v a="$1" -v b="$(now)" 'BEGIN { printf "%.2f", b - a }'; }
: >"$out/summary.txt"
say() { printf '%s\n' "$*" | tee -a "$out/summary.txt"; }

stop_all() {
  for p in "${pid_of[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pid_of[@]}"; do wait "$p" 2>/dev/null || true; done
  pid_of=()
}
cleanup() {
  stop_all
  [[ -f $data/shard-4.pid ]] && kill -TERM "$(cat "$data/shard-4.pid")" 2>/dev/null || true
  [[ -n $etcd_pid ]] && kill -TERM "$etcd_pid" 2>/dev/null || true
  rm -rf "$data"
}
trap cleanup EXIT

read -r etcd_client etcd_peer < <(python3 -c 'import socket
s=[socket.socket() for _ in range(2)]
[x.bind(("127.0.0.1",0)) for x in s]
print(*[x.getsockname()[1] for x in s])')
ETCD=http://127.0.0.1:$etcd_client
etcd --data-dir "$data/etcd" --listen-client-urls "$ETCD" --advertise-client-urls "$ETCD" \
  --listen-peer-urls "http://127.0.0.1:$etcd_peer" --initial-advertise-peer-urls "http://127.0.0.1:$etcd_peer" \
  --initial-cluster "default=http://127.0.0.1:$etcd_peer" >"$out/etcd.log" 2>&1 &
etcd_pid=$!
# Every node reads and writes snapshots here (a move seeds from one).
export SHOAL_SHARD_SNAPSHOT__URL=$data/snapshots

node_cmd() { # node_cmd I: the command line of shard node I
  echo "$bin/shoal-shard-node --node-id shard-$1 --listen 127.0.0.1:$((7811 + $1)) --data-dir $data/shard-$1 --etcd $ETCD --etcd-prefix $prefix"
}
start_node() {
  $(node_cmd "$1") >>"$out/shard-$1.log" 2>&1 &
  pid_of[shard-$1]=$!
}
start_coordinator() {
  "$bin/shoal-coordinator" --id "coordinator-$1" --listen "127.0.0.1:$((7800 + $1))" --etcd "$ETCD" --etcd-prefix "$prefix" \
    >>"$out/coordinator-$1.log" 2>&1 &
  pid_of[coordinator-$1]=$!
}
E0=http://127.0.0.1:7800
E1=http://127.0.0.1:7801
coords=(--coordinator "$E0" --coordinator "$E1" --coordinator http://127.0.0.1:7802)
until_true() { # until_true SECONDS COMMAND...: polls every 50 ms
  local limit=$1 t0
  shift
  t0=$(now)
  until "$@" >/dev/null 2>&1; do
    if awk -v a="$t0" -v b="$(now)" -v l="$limit" 'BEGIN { exit !(b - a > l) }'; then
      echo "timed out after ${limit}s: $*" >&2
      return 1
    fi
    sleep 0.05
  done
}
nodes_up() { [[ $("$ctl" --endpoint "$E0" node list | grep -c " up ") -eq $1 ]]; }
all_shards_up() {
  local s
  s=$("$ctl" --endpoint "$E0" status) || return 1
  grep -q "^collection" <<<"$s" && ! grep -q " DOWN " <<<"$s"
}
start_cluster() { # the four first nodes, and the fifth once it was added
  for i in 0 1 2 3 4; do
    if [[ $i -lt 4 || -d $data/shard-$i ]]; then start_node "$i"; fi
  done
  for j in 0 1 2; do start_coordinator "$j"; done
}
load() { # load NAME ARGS...: mixed load from the pypi set, report in OUT/NAME.*
  local name=$1
  shift
  "$lt" mixed "${coords[@]}" --base "$ds/base.fvecs" --query "$ds/query.fvecs" \
    --streams 3 --batch 50 --ingest-rate 60 --clients 8 --no-progress \
    --json "$out/$name.json" "$@" | tee "$out/$name.txt"
}

log "starting etcd, 4 shard nodes and 3 coordinators"
until_true 30 curl -sf "$ETCD/health"
start_cluster
until_true 30 nodes_up 4

if step 1; then
log "1. moving a shard under load"
load move --collection pypi --create --shards 3 --preload 112000 --duration "${dur}s" \
  --fault "30s:run:$ctl --endpoint $E1 shard move pypi/0"
"$ctl" --endpoint "$E0" collections drop pypi >/dev/null
fi

# The 12-shard collection the later scenarios run on: made by scenario 2,
# or by the first later one when 2 is skipped.
pypi12=(--collection pypi12)
if ! step 2; then pypi12+=(--create --shards 12 --preload 112000); fi

if step 2; then
log "2. draining a node holding 3 shards, then adding a node and rebalancing"
# The fifth node is started by the run (a hook) and stopped at the end.
cat >"$data/add-node.sh" <<EOF
#!/bin/sh
$(node_cmd 4) >>"$out/shard-4.log" 2>&1 &
echo \$! >"$data/shard-4.pid"
EOF
chmod +x "$data/add-node.sh"
load drain --collection pypi12 --create --shards 12 --preload 112000 --duration "$((dur + 40))s" \
  --fault "20s:run:$ctl --endpoint $E1 node drain shard-3" \
  --fault "80s:run:$data/add-node.sh" \
  --fault "85s:run:$ctl --endpoint $E1 rebalance"
"$ctl" --endpoint "$E0" node list | tee -a "$out/summary.txt"
pid_of[shard-4]=$(cat "$data/shard-4.pid")
rm "$data/shard-4.pid"
fi

if step 3; then
log "3. killing the controller under load"
cat >"$data/kill-controller.sh" <<EOF
#!/bin/bash
# SIGKILLs the controller, then waits until another coordinator names a
# new one; prints the time it took.
set -euo pipefail
controller() { "$ctl" --endpoint "\$1" status 2>/dev/null | sed -n 's/^control plane: .* controller \([^ ]*\) .*/\1/p'; }
dead=\$(controller $E0)
pid=\$(pgrep -f -- "--id \$dead --listen")
kill -9 "\$pid"
t0=\$(date +%s.%N)
# Ask a coordinator that is alive: coordinator-N listens on 7800 + N.
n=\${dead#coordinator-}
survivor=http://127.0.0.1:\$((7800 + (n + 1) % 3))
until now=\$(controller \$survivor) && [[ -n \$now && \$now != "\$dead" ]]; do sleep 0.05; done
echo "controller \$dead killed; \$now took over after \$(awk -v a=\$t0 -v b=\$(date +%s.%N) 'BEGIN { printf "%.2f", b - a }') s"
EOF
chmod +x "$data/kill-controller.sh"
load controller "${pypi12[@]}" --duration 40s --fault "15s:run:$data/kill-controller.sh"
pypi12=(--collection pypi12)
grep -o 'controller [^ ]* killed; .*' "$out/controller.txt" | head -1 | sed 's/^/3. /' | tee -a "$out/summary.txt" || true
fi

if step 4; then
log "4. stopping and starting the whole cluster"
stop_all
t0=$(now)
start_cluster
until_true 120 all_shards_up
say "4. whole cluster (etcd kept) stopped and started: every shard answers after $(since "$t0") s (process start included)"
fi

if step 5; then
log "5. a shard node killed with SIGKILL under load, then recovered from snapshots"
cat >"$data/kill-node.sh" <<EOF
#!/bin/bash
# SIGKILLs shard-2, waits until its shards are reported DOWN and its lease
# ends, recovers each from its snapshot; prints the times.
set -euo pipefail
ctl="$ctl --endpoint $E0"
now() { date +%s.%N; }
since() { awk -v a="\$1" -v b="\$(now)" 'BEGIN { printf "%.2f", b - a }'; }
held=\$(\$ctl status | grep -c "node shard-2 ")
kill -9 "\$(pgrep -f -- "--node-id shard-2 --listen")"
t0=\$(now)
until [[ \$(\$ctl status | grep -c ' DOWN ') -eq \$held ]]; do sleep 0.05; done
t_down=\$(since "\$t0")
while \$ctl node list | grep '^shard-2 ' >/dev/null; do sleep 0.05; done
t_lease=\$(since "\$t0")
t1=\$(now)
for s in \$(\$ctl status | awk '\$1 == "collection" { c = \$2; sub(":", "", c) } \$1 == "shard" && \$5 == "DOWN" { print c "/" \$2 }'); do
  \$ctl shard recover "\$s" >>"$out/recover.txt"
done
while \$ctl status | grep ' DOWN ' >/dev/null; do sleep 0.05; done
echo "shard-2 (held \$held shards) SIGKILLed: its shards DOWN after \$t_down s, its lease ended after \$t_lease s (TTL 10 s); shard recover of all \$held took \$(since "\$t1") s"
EOF
chmod +x "$data/kill-node.sh"
load nodekill "${pypi12[@]}" --duration 60s \
  --fault "10s:run:$ctl --endpoint $E0 snapshot create pypi12" \
  --fault "25s:run:$data/kill-node.sh"
unset 'pid_of[shard-2]'
grep -o 'shard-2 (held .*' "$out/nodekill.txt" | head -1 | sed 's/^/5. under load: /' | tee -a "$out/summary.txt" || true
fi

python3 - "$out" <<'EOF' | tee -a "$out/summary.txt"
import json, sys
out = sys.argv[1]
def p(x): return f"{x:.1f}"
import os
for name in ["move", "drain", "controller", "nodekill"]:
    if not os.path.exists(f"{out}/{name}.json"):
        continue
    r = json.load(open(f"{out}/{name}.json"))
    q = [(row["t"], row["series"].get("query")) for row in r["timeline"]]
    errors = r.get("errors", {})
    ingest = next((ph for ph in r["phases"] if ph["series"] == "ingest"), None)
    acked = (r["preload"] or {}).get("vectors_acked", 0) + (ingest["counts"]["items"] if ingest else 0)
    points = r["collection"]["points"]
    print(f"{name}: errors {errors or 'none'}; acked points {acked}, points after {points}, missing {acked - points if points is not None else '?'}")
    for f in r["faults"]:
        a, b = f["fired_s"], f["done_s"]
        if a is None or b is None:
            print(f"  {f['label']}: not done ({f['outcome']})")
            continue
        before = [s["p99_ms"] for t, s in q if s and 5 <= t < a and s["ok"]]
        during = [s["p99_ms"] for t, s in q if s and a <= t <= b and s["ok"]]
        failed = sum(s["errors"] for t, s in q if s and a <= t <= b + 1)
        med = lambda v: sorted(v)[len(v) // 2] if v else float("nan")
        print(f"  {f['label'][:60]}: took {b - a:.2f} s; searches failed meanwhile {failed}; "
              f"search p99 per second, median (max): before {p(med(before))} ({p(max(before, default=float('nan')))}) ms, "
              f"during {p(med(during))} ({p(max(during, default=float('nan')))}) ms; {f['outcome'].splitlines()[-1][:80] if f['outcome'] else ''}")
EOF
