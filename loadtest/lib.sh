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
