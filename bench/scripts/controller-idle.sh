#!/usr/bin/env bash
# Spurious controller elections: three release nodes on 127.0.0.1-3 left
# idle for SECONDS; prints every node's vote (term and leader) before and
# after — a term that moved is an election nobody needed. Kills what it
# started (by PID) and removes its data.
# Usage: bench/scripts/controller-idle.sh [SECONDS] [PORT]
set -euo pipefail
secs=${1:-600}
port=${2:-9611}
bin="$(cd "$(dirname "$0")/../.." && pwd)/target/release/strand"
dir=$(mktemp -d /var/tmp/strand-idle.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; sleep 1; rm -rf "$dir"; }
trap cleanup EXIT
voters="1@127.0.0.1:$port,2@127.0.0.2:$port,3@127.0.0.3:$port"
for n in 1 2 3; do
  "$bin" serve --node-id $n --listen 127.0.0.$n:$port --metrics-listen 127.0.0.$n:0 \
    --data-dir "$dir/n$n" --cores 1 --controller-voters "$voters" > "$dir/n$n.out" 2> "$dir/n$n.log" &
  pids+=($!)
done
for n in 1 2 3; do
  for _ in $(seq 1 3000); do grep -q ready "$dir/n$n.out" && break; sleep 0.01; done
done
for n in 1 2 3; do echo "node $n before: $(cat "$dir/n$n/__controller/vote.json")"; done
sleep "$secs"
for n in 1 2 3; do echo "node $n after:  $(cat "$dir/n$n/__controller/vote.json")"; done
