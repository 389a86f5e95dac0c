#!/usr/bin/env bash
# Decommissioning a node that holds about $GIB GiB (default 1): four release
# nodes on 127.0.0.1-4 (one shard each, as bench/scripts/cluster-lib.sh
# starts them), a 4-partition RF 3 queue filled with 10 KB records (acks=all,
# 1 MiB batches) until node 4 holds $GIB GiB, then `strand node decommission
# 4` and the time until `strand node describe 4` shows no replica (every
# move complete: the new replicas caught up and joined the ISR, the old
# ones deleted). Prints node 4's bytes, the time, and the rate.
# Usage: bench/scripts/decommission-bench.sh
# Needs: cargo build --release -p strand-broker -p strand-bench.
set -euo pipefail
cd "$(dirname "$0")/../.."
gib=${GIB:-1}
bin=target/release/strand
bench=target/release/strand-bench
port=${PORT:-29500}
dir=$(mktemp -d)
pids=()
. bench/scripts/cluster-lib.sh
stop_nodes_at_exit
brokers="127.0.0.1:$port,127.0.0.2:$port,127.0.0.3:$port,127.0.0.4:$port"

start_nodes 4
sleep 1
"$bin" queue create big --partitions 4 --replication-factor 3 --retention-bytes 100GiB \
  --brokers 127.0.0.1:$port > /dev/null
sleep 1
held() {
  "$bin" node describe 4 --output json --brokers 127.0.0.1:$port | python3 -c \
    'import json,sys; print(json.load(sys.stdin)["replicas"])'
}
# Node 4 holds 3 of the 4 partitions: 4/3 of the target in all.
count=$(( gib * 1024 * 1024 * 1024 * 4 / 3 / 10000 ))
echo "== filling: $count records of 10 KB (acks=all), node 4 holds $(held) replicas"
"$bench" produce --brokers "$brokers" --queue big --partitions 4 --acks all --message-bytes 10000 \
  --batch-bytes 1048576 --count "$count" | tail -1
sleep 2
# The stored bytes of the partitions node 4 holds (as their leaders report).
bytes=$("$bin" queue describe big --output json --brokers 127.0.0.1:$port | python3 -c \
  'import json,sys; print(sum(p["stored_bytes"] for p in json.load(sys.stdin)["partitions"] if 4 in p["replicas"]))')
echo "node 4 holds $bytes bytes of big in $(held) replicas"
start=$(date +%s.%N)
"$bin" node decommission 4 --brokers 127.0.0.1:$port
until [ "$(held)" = 0 ]; do sleep 0.2; done
end=$(date +%s.%N)
secs=$(echo "$end - $start" | bc)
echo "decommissioned node 4 ($bytes bytes) in $secs s: $(echo "$bytes / $secs / 1048576" | bc) MiB/s"
left=$(du -sb "$dir/n4" | cut -f1)
echo "node 4's data directory now: $left bytes; nodes 1-3 hold $(du -sb "$dir"/n[123]/big | cut -f1 | tr '\n' ' ')bytes of big"
