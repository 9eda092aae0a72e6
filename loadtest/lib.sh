# Shell helpers the loadtest scripts share; sourced, not run.

# wait_port PORT [SECONDS]: waits until something on 127.0.0.1 accepts on
# PORT (default 10 s; a process under callgrind takes longer to start).
wait_port() {
  local tries=$((${2:-10} * 10))
  for _ in $(seq "$tries"); do
    if (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; then return 0; fi
    sleep 0.1
  done
  echo "nothing listens on port $1" >&2
  return 1
}

# stop_cluster: stops the processes in the caller's `pids` array (TERM,
# then waits for each) and empties it.
stop_cluster() {
  for p in "${pids[@]}"; do kill -TERM "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}

# cpu_ticks PID...: user + system clock ticks the processes have used.
# The cluster's CPU per query is a steadier measure of what a change
# costs than queries/s on a shared machine, where other tenants move the
# throughput by more than the effect (docs/loadtest.md).
cpu_ticks() {
  local p t=0 f
  for p in "$@"; do
    read -ra f <"/proc/$p/stat"
    # Fields 14 and 15 (utime, stime); the name in field 2 has no spaces here.
    t=$((t + f[13] + f[14]))
  done
  echo "$t"
}
