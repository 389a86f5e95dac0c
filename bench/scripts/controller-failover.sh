#!/usr/bin/env bash
# The controller's election and failover times on one machine: RUNS times,
# start three release nodes on 127.0.0.1-3 (one shard each) together and
# time until all print their ready line; read the controller leader from
# its vote file, kill -9 it, and time a `strand queue create` through
# another node. Then kill everything it started (by PID) and remove its
# data. Usage: bench/scripts/controller-failover.sh [RUNS] [PORT]
# (build first: cargo build --release -p strand-broker).
set -euo pipefail
runs=${1:-5}
port=${2:-9711}
bin="$(cd "$(dirname "$0")/../.." && pwd)/target/release/strand"
dir=$(mktemp -d /var/tmp/strand-failover.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done; rm -rf "$dir"; }
trap cleanup EXIT
# shellcheck source=cluster-lib.sh
source "$(dirname "$0")/cluster-lib.sh"
for run in $(seq 1 "$runs"); do
  rm -rf "${dir:?}"/*
  start=$(date +%s.%N)
  start_three_nodes
  ready=$(date +%s.%N)
  leader=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['leader_id']['node_id'])" "$dir/n1/__controller/vote.json")
  other=$(( leader % 3 + 1 ))
  kill -9 "${pids[$((leader - 1))]}"
  killed=$(date +%s.%N)
  "$bin" queue create "after-kill" --brokers 127.0.0.$other:$port > /dev/null
  created=$(date +%s.%N)
  printf 'run %d: all ready after %.2f s; leader %d killed, a create through node %d took %.2f s\n' \
    "$run" "$(echo "$ready - $start" | bc)" "$leader" "$other" "$(echo "$created - $killed" | bc)"
  for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; done
  wait 2>/dev/null || true
done
