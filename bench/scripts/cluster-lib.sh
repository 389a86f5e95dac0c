# Sourced by the controller scripts: starts three release nodes on
# 127.0.0.1-3 (one shard each, voters of one controller) and waits for
# their ready lines. Needs: bin, dir, port; fills pids.
start_three_nodes() {
  local voters="1@127.0.0.1:$port,2@127.0.0.2:$port,3@127.0.0.3:$port" n
  pids=()
  for n in 1 2 3; do
    "$bin" serve --node-id $n --listen 127.0.0.$n:$port --metrics-listen 127.0.0.$n:0 \
      --data-dir "$dir/n$n" --cores 1 --controller-voters "$voters" > "$dir/n$n.out" 2> "$dir/n$n.log" &
    pids+=($!)
  done
  for n in 1 2 3; do
    for _ in $(seq 1 3000); do grep -q ready "$dir/n$n.out" && break; sleep 0.01; done
  done
}
