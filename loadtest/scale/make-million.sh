#!/usr/bin/env bash
# Makes the 1M-point stand-in set (see make-million.py and docs/scale.md).
#
#   DATASET=../shared/datasets/pypi MILLION=/somewhere/outside/the/repo loadtest/scale/make-million.sh [flags]
#
# DATASET: the pypi set (base.fvecs, query.fvecs; default ../shared/datasets/pypi,
# made by its make.sh). MILLION: output directory (default /work/scratch/million;
# never inside the git tree). Needs numpy and faiss: uses the peers' venv
# (../shared/peers/setup.sh), creating it if needed. Idempotent.
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
shared=${SHOAL_SHARED:-$here/../../../shared}
export DATASET=${DATASET:-$shared/datasets/pypi}
if [[ ! -s "$DATASET/base.fvecs" || ! -s "$DATASET/query.fvecs" ]]; then
  if [[ -x "$DATASET/make.sh" ]]; then "$DATASET/make.sh" >&2
  else echo "no pypi set in $DATASET (run ../shared/datasets/pypi/make.sh or set DATASET)" >&2; exit 1; fi
fi
venv="${XDG_CACHE_HOME:-$HOME/.cache}/shoal-peers/venv"
if [[ -x "$venv/bin/python" ]] && "$venv/bin/python" -c 'import numpy, faiss' 2>/dev/null; then
  py="$venv/bin/python"
else
  # setup.sh also builds hannoy-bench; keep cargo to one job on this 2-core machine.
  py=$(CARGO_BUILD_JOBS=${CARGO_BUILD_JOBS:-1} "$shared/peers/setup.sh")
fi
exec nice -n "${NICE:-10}" "$py" "$here/make-million.py" "$@"
