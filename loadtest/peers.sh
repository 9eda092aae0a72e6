#!/usr/bin/env bash
# Runs `index-bench` for shoal and the peers (hnswlib, faiss, hannoy) on the
# same files with the same flags, one after the other in one run, and prints
# them side by side. Extra arguments are passed to every benchmark.
#
#   loadtest/peers.sh [--limit N] [--no-incremental] ...
# Output: bench-out/{shoal,hnswlib,faiss,hannoy}.json and a table on stdout.
set -euo pipefail
cd "$(dirname "$0")/.."
shared=${SHOAL_SHARED:-../shared}
ds=$shared/datasets/pypi
"$ds/make.sh" >&2
py=$("$shared/peers/setup.sh")
out=${BENCH_OUT:-bench-out}
mkdir -p "$out"
flags=(--base "$ds/base.fvecs" --query "$ds/query.fvecs" --groundtruth "$ds/groundtruth.ivecs"
       --metric cosine --m 16 --ef-construction 100 --threads 2 --ef 16,32,64,128,256 "$@")
cargo build --release -q -p loadtest
# Where cargo put it (CARGO_TARGET_DIR may point outside the clone).
bin=${CARGO_TARGET_DIR:-target}/release
echo "== shoal" >&2
"$bin"/shoal-loadtest index-bench "${flags[@]}" --json "$out/shoal.json" >/dev/null
echo "== hnswlib" >&2
"$py" "$shared/peers/bench.py" --lib hnswlib "${flags[@]}" --json "$out/hnswlib.json" >/dev/null
echo "== faiss" >&2
"$py" "$shared/peers/bench.py" --lib faiss "${flags[@]}" --json "$out/faiss.json" >/dev/null
echo "== hannoy" >&2
# setup.sh builds hannoy-bench with cargo, so it lands in CARGO_TARGET_DIR when set.
"${CARGO_TARGET_DIR:-$shared/peers/hannoy-bench/target}/release/hannoy-bench" "${flags[@]}" --json "$out/hannoy.json" >/dev/null
"$bin"/shoal-loadtest compare "$out"/shoal.json "$out"/hnswlib.json "$out"/faiss.json "$out"/hannoy.json
