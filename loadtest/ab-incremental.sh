#!/usr/bin/env bash
# Interleaved A/B rounds of the incremental-insert measurement: each round
# runs `index-bench` once per variant (same binary, different flags), so
# the variants see the same machine state; prints, per variant and round,
# the median and mean ms per vector for each size and the ratio of the
# largest size to the smallest. This shared machine moves whole runs by
# 15-30%: compare variants within rounds, and medians across rounds.
#
#   loadtest/ab-incremental.sh ROUNDS "label:extra flags" ["label:extra flags" ...]
#   REPEATS=13 SIZES=10000,100000 loadtest/ab-incremental.sh 4 "off:--link-log off" "auto:--link-log auto"
#
# REPEATS (default 9) batches per size, each into the index the one before
# left (1 is the issues' protocol); SIZES (default 10000,100000). Run as
# root under `chrt -f 10` for steadier figures (see docs/benchmarks.md).
set -euo pipefail
cd "$(dirname "$0")/.."
ds=${SHOAL_SHARED:-../shared}/datasets/pypi
rounds=$1; shift
cargo build --release -q -p loadtest
bin=${CARGO_TARGET_DIR:-target}/release/shoal-loadtest
for _ in $(seq "$rounds"); do
  for spec in "$@"; do
    label=${spec%%:*}; flags=${spec#*:}
    # shellcheck disable=SC2086 # the flags are meant to split
    "$bin" index-bench --base "$ds/base.fvecs" --query "$ds/query.fvecs" --limit 1000 --queries 10 --ef 64 \
        --incremental-sizes "${SIZES:-10000,100000}" --incremental-repeats "${REPEATS:-9}" $flags 2>&1 >/dev/null |
      python3 -c '
import re, sys
label, out = sys.argv[1], []
for line in sys.stdin:
    m = re.search(r"into (\d+): ([\d.]+) ms/vector, peak RssAnon (\d+) MiB \((\d+)", line)
    if m:
        mean = re.search(r"mean ([\d.]+)", line)
        out.append((int(m[1]), float(m[2]), float(mean[1]) if mean else float(m[2]), int(m[3]), int(m[4])))
if not out:
    sys.exit(f"{label}: index-bench printed no incremental figures")
sizes = " ".join(f"{n // 1000}k med {md:.4f} mean {mn:.4f} rss {pk}({bf})" for n, md, mn, pk, bf in out)
print(f"{label:8s} {sizes}  ratio med {out[-1][1] / out[0][1]:.2f} mean {out[-1][2] / out[0][2]:.2f}")
' "$label"
  done
done
