#!/usr/bin/env bash
# Cold-cache costs of shoal and of the LMDB-based peer hannoy on the pypi set,
# one after the other in one run (issue 8; docs/network-disks.md): per
# library a 100k index is built once (kept in $DISK_BENCH_DIR), then warm
# and cold runs of a 1,000-vector insert and 1,000 searches at ef=64, with
# readahead off and on (shoal's default is off, hannoy's and LMDB's on), and
# with readahead off a cgroup run (memory limited to a quarter of the
# environment; with readahead on, 8 MiB read-around per fault on this disk
# makes that run thrash for many minutes, so it is left out). Prints the
# table of `disk-compare`.
#
#   loadtest/disk-peers.sh [--limit N] [--memory-fraction F] ...
# Extra arguments go to every run. Output: bench-out/disk-*.json.
# DISK_BENCH_DIR must be on a disk-backed filesystem (not tmpfs).
set -euo pipefail
cd "$(dirname "$0")/.."
shared=${SHOAL_SHARED:-../shared}
ds=$shared/datasets/pypi
"$ds/make.sh" >&2
out=${BENCH_OUT:-bench-out}
work=${DISK_BENCH_DIR:-$PWD/target/disk-bench}
mkdir -p "$out" "$work"
flags=(--base "$ds/base.fvecs" --query "$ds/query.fvecs" --groundtruth "$ds/groundtruth.ivecs"
       --metric cosine --m 16 --ef-construction 100 --threads 2 --ef 64
       --modes warm,cold --dir "$work" --keep --reuse "$@")
cargo build --release -q -p loadtest
# Where cargo put it (CARGO_TARGET_DIR may point outside the clone).
bin=${CARGO_TARGET_DIR:-target}/release
cargo build --release -q --manifest-path loadtest/hannoy-cold/Cargo.toml --target-dir target/hannoy-cold
cgroup=(--memory-fraction "${MEMORY_FRACTION:-0.25}")
for ra in off on; do
  echo "== shoal, readahead $ra" >&2
  extra=(); [[ $ra == off ]] && extra=("${cgroup[@]}")
  "$bin"/shoal-loadtest disk-bench "${flags[@]}" --read-ahead "$ra" "${extra[@]}" \
    --json "$out/disk-shoal-ra-$ra.json" >/dev/null
done
for ra in on off; do
  echo "== hannoy, readahead $ra" >&2
  extra=(); [[ $ra == off ]] && extra=("${cgroup[@]}")
  ./target/hannoy-cold/release/hannoy-cold "${flags[@]}" --read-ahead "$ra" "${extra[@]}" \
    --json "$out/disk-hannoy-ra-$ra.json" >/dev/null
done
"$bin"/shoal-loadtest disk-compare --against hannoy \
  "$out"/disk-shoal-ra-off.json "$out"/disk-shoal-ra-on.json "$out"/disk-hannoy-ra-on.json "$out"/disk-hannoy-ra-off.json
