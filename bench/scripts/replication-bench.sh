#!/usr/bin/env bash
# Replication on a 3-node loopback cluster (release nodes on 127.0.0.1-3,
# one shard each, as bench/scripts/cluster-lib.sh starts them):
#   1. throughput: 1 KB records in 1 MiB batches, closed loop, RF 1 acks=1
#      against RF 3 acks=all, alternating, $runs runs each (same cluster);
#   2. latency: 100-byte records at $rate/s, open loop, RF 3 acks=all and
#      RF 1 acks=1 for comparison (p50/p99/p99.9 from strand-bench);
#   3. partition-leader failover, $failovers times on a fresh cluster each:
#      kill -9 of the leader of an RF 3 partition, then the time until a
#      one-record acks=all produce through another node succeeds.
# Usage: bench/scripts/replication-bench.sh [runs] [failovers]
# Needs: cargo build --release -p strand-broker -p strand-bench.
set -euo pipefail
cd "$(dirname "$0")/../.."
runs=${1:-3}
failovers=${2:-5}
rate=${RATE:-2000}
bin=target/release/strand
bench=target/release/strand-bench
port=${PORT:-29400}
dir=$(mktemp -d)
pids=()
. bench/scripts/cluster-lib.sh
stop_nodes_at_exit
brokers="127.0.0.1:$port,127.0.0.2:$port,127.0.0.3:$port"

start_three_nodes
"$bin" queue create rf1 --partitions 3 --replication-factor 1 --brokers 127.0.0.1:$port > /dev/null
"$bin" queue create rf3 --partitions 3 --replication-factor 3 --brokers 127.0.0.1:$port > /dev/null
sleep 1
echo "== throughput (closed loop, 1 KB records, 1 MiB batches, 10 s each)"
for i in $(seq 1 "$runs"); do
  for q in rf1 rf3; do
    acks=1; [ $q = rf3 ] && acks=all
    line=$("$bench" produce --brokers "$brokers" --queue $q --acks $acks --message-bytes 1000 \
      --batch-bytes 1048576 --seconds 10 | tail -1)
    echo "$q acks=$acks run $i: $line"
  done
done
echo "== latency (open loop, 100-byte records at $rate/s, 10 s each)"
for q in rf3 rf1; do
  acks=1; [ $q = rf3 ] && acks=all
  line=$("$bench" produce --brokers "$brokers" --queue $q --acks $acks --message-bytes 100 \
    --rate "$rate" --seconds 10 | tail -1)
  echo "$q acks=$acks: $line"
done
stop_nodes

echo "== partition-leader failover (kill -9, then the first acks=all record through another node)"
for i in $(seq 1 "$failovers"); do
  rm -rf "$dir"/n1 "$dir"/n2 "$dir"/n3
  start_three_nodes
  "$bin" queue create fo --partitions 1 --replication-factor 3 --brokers 127.0.0.1:$port > /dev/null
  sleep 1
  leader=$("$bin" queue describe fo --output json --brokers 127.0.0.1:$port | python3 -c \
    'import json,sys; print(json.load(sys.stdin)["partitions"][0]["leader"])')
  other=$(( leader % 3 + 1 ))
  printf 'x\n' | "$bin" produce fo --acks all --brokers 127.0.0.$other:$port > /dev/null
  start=$(date +%s.%N)
  kill -9 "${pids[$((leader - 1))]}"
  until printf 'y\n' | timeout 20 "$bin" produce fo --acks all --brokers 127.0.0.$other:$port \
      > /dev/null 2>&1; do
    sleep 0.05
  done
  end=$(date +%s.%N)
  echo "failover $i: leader $leader killed, acks=all through $other after $(echo "$end - $start" | bc) s"
  stop_nodes
done
