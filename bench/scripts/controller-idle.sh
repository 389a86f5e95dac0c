#!/usr/bin/env bash
# Spurious controller elections and fencings: three release nodes on
# 127.0.0.1-3 left idle for SECONDS; prints every node's vote (term and
# leader) before and after — a term that moved is an election nobody
# needed — and counts the brokers the controller leader fenced (its lease
# expired: a heartbeat came too late). Kills what it started (by PID) and
# removes its data.
# Usage: bench/scripts/controller-idle.sh [SECONDS] [PORT]
set -euo pipefail
secs=${1:-600}
port=${2:-9611}
bin="$(cd "$(dirname "$0")/../.." && pwd)/target/release/strand"
dir=$(mktemp -d /var/tmp/strand-idle.XXXXXX)
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; done; sleep 1; rm -rf "$dir"; }
trap cleanup EXIT
# shellcheck source=cluster-lib.sh
source "$(dirname "$0")/cluster-lib.sh"
start_three_nodes
for n in 1 2 3; do echo "node $n before: $(cat "$dir/n$n/__controller/vote.json")"; done
sleep "$secs"
for n in 1 2 3; do echo "node $n after:  $(cat "$dir/n$n/__controller/vote.json")"; done
echo "brokers fenced: $(cat "$dir"/n?.log | grep -c "lease expired: fencing" || true)"
