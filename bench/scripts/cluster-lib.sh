# Sourced by the cluster scripts: starts release nodes on 127.0.0.1-N (one
# shard each; nodes 1-3 the controller's voters, later ones brokers that
# join as learners) and waits for their ready lines. Needs: bin, dir,
# port; fills pids. stop_nodes kills them (kill -9, by PID);
# stop_nodes_at_exit does that and removes $dir when the script exits.
start_nodes() {
  local count=$1 voters="1@127.0.0.1:$port,2@127.0.0.2:$port,3@127.0.0.3:$port" n
  pids=()
  for n in $(seq 1 "$count"); do
    "$bin" serve --node-id $n --listen 127.0.0.$n:$port --metrics-listen 127.0.0.$n:0 \
      --data-dir "$dir/n$n" --cores 1 --controller-voters "$voters" > "$dir/n$n.out" 2> "$dir/n$n.log" &
    pids+=($!)
  done
  for n in $(seq 1 "$count"); do
    for _ in $(seq 1 3000); do grep -q ready "$dir/n$n.out" && break; sleep 0.01; done
  done
}

start_three_nodes() {
  start_nodes 3
}

stop_nodes() {
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  for p in "${pids[@]}"; do wait "$p" 2>/dev/null || true; done
  pids=()
}

stop_nodes_at_exit() {
  trap 'stop_nodes; rm -rf "$dir"' EXIT
}
