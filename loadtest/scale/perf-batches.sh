#!/usr/bin/env bash
# Where a 1k-point batch's time goes at 100k and at 1M: runs the 16-batch
# protocol of docs/scale.md once (one size after the other) and attaches
# `perf record -e cpu-clock` (no hardware counters needed) to the 16
# batches of each size, from the moment `index-bench` reports the size
# built. Then compares the symbols' shares:
#
#   MILLION=... OUT=dir loadtest/scale/perf-batches.sh
#
# LT is the shoal-loadtest binary (default: the release build of this
# checkout); SECONDS_EACH how long each recording lasts (3.5: enough for
# 16 batches at either size on 2 cores). Writes OUT/perf-{100000,1000000}.data,
# OUT/steady.json and prints the top symbols side by side.
set -euo pipefail
: "${MILLION:?MILLION must name the directory of make-million.sh}"
: "${OUT:?OUT must name a directory for the profiles}"
LT=${LT:-target/release/shoal-loadtest}
SECONDS_EACH=${SECONDS_EACH:-3.5}
command -v perf > /dev/null || { echo "perf is not installed (apt-get install linux-perf)" >&2; exit 1; }
mkdir -p "$OUT" "$MILLION/tmp"
"$LT" index-bench --base "$MILLION/base.fvecs" --query "$MILLION/query.fvecs" --limit 100000 --queries 10 \
    --metric cosine --m 16 --ef-construction 100 --threads 2 --ef 64 \
    --incremental-sizes 100000,1000000 --incremental-repeats 16 --dir "$MILLION/tmp" \
    --json "$OUT/steady.json" > /dev/null 2> "$OUT/steady.err" &
pid=$!
trap 'kill $pid 2> /dev/null || true' EXIT
for size in 100000 1000000; do
  until grep -q "^$size built" "$OUT/steady.err"; do
    kill -0 $pid 2> /dev/null || { echo "index-bench stopped early:" >&2; tail -5 "$OUT/steady.err" >&2; exit 1; }
    sleep 0.2
  done
  perf record -F 1999 -e cpu-clock -p $pid -o "$OUT/perf-$size.data" -- sleep "$SECONDS_EACH" 2> /dev/null
done
wait $pid
trap - EXIT
grep "into" "$OUT/steady.err" | sed 's/median of \[[^]]*\]//'
for size in 100000 1000000; do
  perf report -i "$OUT/perf-$size.data" --no-children --sort symbol --stdio 2> /dev/null > "$OUT/report-$size.txt"
done
python3 - "$OUT/report-100000.txt" "$OUT/report-1000000.txt" <<'PY'
import re, sys
def shares(path):
    out = {}
    for line in open(path, errors="replace"):
        m = re.match(r"\s+([\d.]+)%\s+\[.\]\s+(.*?)\s+-\s+-", line)
        if m:
            out[m.group(2)[:90]] = out.get(m.group(2)[:90], 0) + float(m.group(1))
    return out
a, b = shares(sys.argv[1]), shares(sys.argv[2])
mdb = lambda d: sum(v for k, v in d.items() if k.startswith("mdb_"))
print(f"{'100k %':>7} {'1M %':>7}  symbol")
for k in sorted(set(a) | set(b), key=lambda k: -b.get(k, 0))[:25]:
    print(f"{a.get(k, 0):7.2f} {b.get(k, 0):7.2f}  {k}")
print(f"{mdb(a):7.2f} {mdb(b):7.2f}  (every mdb_* symbol: LMDB's B-tree code)")
PY
