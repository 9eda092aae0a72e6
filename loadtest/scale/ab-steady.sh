#!/usr/bin/env bash
# Alternates two builds of `shoal-loadtest` on the 16-batch steady-state
# protocol of docs/scale.md (1k into 100k and into 1M, 16 batches each),
# so that a change is judged against its predecessor on the same host in
# the same hour.
#
#   A=/path/to/a/shoal-loadtest B=/path/to/b/shoal-loadtest MILLION=/work/scratch/million \
#     loadtest/scale/ab-steady.sh ROUNDS OUTDIR
#
# MILLION holds the set of make-million.sh --extra 16000 (1,016,000 rows).
# Writes OUTDIR/ab-{a,b}-ROUND.json and prints each run's summary lines.
set -euo pipefail
rounds=${1:?rounds}
out=${2:?output directory}
: "${A:?A: the first shoal-loadtest}" "${B:?B: the second shoal-loadtest}"
million=${MILLION:-/work/scratch/million}
[[ -s "$million/base.fvecs" ]] || { echo "no $million/base.fvecs (loadtest/scale/make-million.sh --extra 16000)" >&2; exit 1; }
mkdir -p "$out"
for round in $(seq 1 "$rounds"); do
  for which in a b; do
    if [[ $which == a ]]; then bin=$A; else bin=$B; fi
    rm -rf "$million/tmp"; mkdir -p "$million/tmp"
    echo "== $which round $round $(date -u +%T)"
    "$bin" index-bench --base "$million/base.fvecs" --query "$million/query.fvecs" --limit 100000 --queries 10 \
      --metric cosine --m 16 --ef-construction 100 --threads 2 --ef 64 \
      --incremental-sizes 100000,1000000 --incremental-repeats 16 --dir "$million/tmp" \
      --json "$out/ab-$which-$round.json" 2>&1 | grep -v '^\s\|^{\|^}' || true
  done
done
rm -rf "$million/tmp"
echo "== done $(date -u +%T)"
