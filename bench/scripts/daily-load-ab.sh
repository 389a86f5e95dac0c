#!/usr/bin/env bash
# The daily load (suite scenario 6: 1 KB records over 100 partitions,
# 10,000 uniform keys, 2 producers, linger 0, acks=all on a fresh
# fsync=always queue, open loop) against broker configurations side by
# side: for each round, each config file gets a fresh broker (2 shards, its
# own data directory) and one run; prints per run the produce requests and
# flushes (fdatasyncs + write-through writes + shard journal frames) the
# broker counted, and
# strand-bench's JSON line (p50/p99/p99.9, broker_cores, cores_busy).
# Usage: bench/scripts/daily-load-ab.sh SECONDS ROUNDS CONFIG.toml[@BINARY]...
#   CONFIG.toml@BINARY runs that broker binary (two builds side by side:
#   copy one aside before rebuilding); without, target/release/strand.
#   RATE (default 11600) records/s; BENCH_ARGS more strand-bench flags.
# Example (write_through off against on):
#   printf 'write_through = false\n' > /tmp/off.toml; printf '' > /tmp/on.toml
#   bench/scripts/daily-load-ab.sh 20 3 /tmp/off.toml /tmp/on.toml
# Needs: cargo build --release -p strand-broker -p strand-bench.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=$1
rounds=$2
shift 2
rate=${RATE:-11600}
port=${PORT:-29460}
bench=target/release/strand-bench
counter() { curl -s "127.0.0.1:$((port + 1))/metrics" | awk -v m="$1" '$1 ~ "^"m {s+=$2} END {print s+0}'; }
for round in $(seq 1 "$rounds"); do
    for arg in "$@"; do
        config=${arg%%@*}
        bin=target/release/strand
        [[ $arg == *@* ]] && bin=${arg#*@}
        dir=$(mktemp -d)
        "$bin" serve --config "$config" --cores 2 --data-dir "$dir/data" --listen "127.0.0.1:$port" \
            --metrics-listen "127.0.0.1:$((port + 1))" > "$dir/broker.log" 2>&1 &
        pid=$!
        trap 'kill $pid 2>/dev/null || true; wait $pid 2>/dev/null || true; rm -rf "$dir"' EXIT
        for _ in $(seq 50); do curl -sf "127.0.0.1:$((port + 1))/health" > /dev/null && break; sleep 0.1; done
        requests=$(counter strand_produce_requests_total)
        flushes=$(( $(counter strand_fsync_latency_seconds_count) + $(counter strand_write_through_writes_total) + $(counter strand_journal_frames_total) ))
        result=$(timeout $((secs + 60)) "$bench" produce --brokers "127.0.0.1:$port" --partitions 100 --producers 2 \
            --keys uniform:10000 --rate "$rate" --message-bytes 1000 --seconds "$secs" --acks all \
            --broker-pid "$pid" ${BENCH_ARGS:-} | tail -1)
        requests=$(( $(counter strand_produce_requests_total) - requests ))
        flushes=$(( $(counter strand_fsync_latency_seconds_count) + $(counter strand_write_through_writes_total) + $(counter strand_journal_frames_total) - flushes ))
        echo "round $round $(basename "$arg"): requests $requests, flushes $flushes: $result"
        kill "$pid"; wait "$pid" 2>/dev/null || true
        rm -rf "$dir"
        trap - EXIT
    done
done
