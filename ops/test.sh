#!/usr/bin/env bash
# shoal's one test command: installs what the tests need on a fresh Debian
# machine with only the Rust toolchain, then runs every test of the
# workspace. `.ci/run` calls exactly this.
#
#   ./ops/test.sh            # everything
#   ./ops/test.sh -p shoal-engine   # extra arguments go to `cargo test`
set -euo pipefail
cd "$(dirname "$0")/.."

log() { printf '== %s\n' "$*" >&2; }

# System packages the tests use. The disk-full test mounts a tmpfs (needs
# root and util-linux's `mount`); it skips with a printed reason elsewhere.
need_pkgs=()
command -v mount >/dev/null 2>&1 || need_pkgs+=(mount)
if ((${#need_pkgs[@]})); then
  if [[ $(id -u) -eq 0 ]] && command -v apt-get >/dev/null 2>&1; then
    log "installing ${need_pkgs[*]}"
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_pkgs[@]}" >/dev/null
  else
    log "missing ${need_pkgs[*]}; the tests that need them will skip"
  fi
fi

log "cargo test (workspace)"
cargo test --workspace --locked "$@"
