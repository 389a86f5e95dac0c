#!/usr/bin/env bash
# TLS against plaintext on one machine (issue 42's benchmark): two release
# brokers side by side, one plaintext and one with --tls-cert (a CA and a
# certificate made here with openssl), $CORES shards each, and the two
# measurements alternating per round, $rounds rounds:
#   1. throughput: 1 KB records in 1 MiB batches, acks=1, fsync=always,
#      2 producers on 2 partitions, closed loop, $SECONDS_EACH s;
#   2. latency: one 100-byte record in flight, acks=1 (p50/p99/p99.9).
# Prints each run's last line and, per measure, the median TLS/plaintext
# ratio. On a machine with few cores the broker and the bench share them:
# say so with the figures.
# Usage: bench/scripts/tls-ab.sh [rounds]
# Needs: cargo build --release -p strand-broker -p strand-bench; openssl.
set -euo pipefail
cd "$(dirname "$0")/../.."
rounds=${1:-3}
cores=${CORES:-1}
seconds=${SECONDS_EACH:-5}
bin=target/release/strand
bench=target/release/strand-bench
plain_port=${PORT:-29500}
tls_port=$((plain_port + 1))
dir=$(mktemp -d)
pids=()
trap 'for p in "${pids[@]}"; do kill -9 "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; rm -rf "$dir"' EXIT

pki() {
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$dir/ca.key" \
    -out "$dir/ca.pem" -subj /CN=bench-ca -days 2 2> /dev/null
  openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes -keyout "$dir/broker.key" \
    -out "$dir/broker.csr" -subj /CN=strand-broker.1 2> /dev/null
  printf 'subjectAltName=IP:127.0.0.1\n' > "$dir/san.ext"
  openssl x509 -req -in "$dir/broker.csr" -CA "$dir/ca.pem" -CAkey "$dir/ca.key" -CAcreateserial \
    -out "$dir/broker.pem" -days 2 -extfile "$dir/san.ext" 2> /dev/null
}

start() { # name port [serve flags...]
  local name=$1 port=$2
  shift 2
  "$bin" serve --listen 127.0.0.1:"$port" --metrics-listen 127.0.0.1:0 --data-dir "$dir/$name" \
    --cores "$cores" "$@" > "$dir/$name.out" 2> "$dir/$name.log" &
  pids+=($!)
  for _ in $(seq 1 3000); do grep -q ready "$dir/$name.out" && return; sleep 0.01; done
  echo "broker $name did not start: $(tail -3 "$dir/$name.log")" >&2
  exit 1
}

pki
start plain "$plain_port"
start tls "$tls_port" --tls-cert "$dir/broker.pem" --tls-key "$dir/broker.key" --tls-ca "$dir/ca.pem"
tls=(--tls-ca "$dir/ca.pem")
for mode in plain tls; do
  port=$plain_port flags=()
  [ $mode = tls ] && port=$tls_port flags=("${tls[@]}")
  "$bin" queue create through --partitions 2 --brokers 127.0.0.1:$port "${flags[@]}" > /dev/null
  "$bin" queue create one --partitions 1 --brokers 127.0.0.1:$port "${flags[@]}" > /dev/null
done

# A field of strand-bench's last line (JSON).
figure() { python3 -c 'import json,sys; print(json.loads(sys.stdin.read())[sys.argv[1]])' "$1"; }
through=() latency=()
for i in $(seq 1 "$rounds"); do
  for mode in plain tls; do
    port=$plain_port flags=()
    [ $mode = tls ] && port=$tls_port flags=("${tls[@]}")
    t=$("$bench" "${flags[@]}" produce --brokers 127.0.0.1:$port --queue through --partitions 2 --producers 2 \
      --message-bytes 1024 --batch-bytes 1048576 --linger-ms 5 --acks 1 --fsync always --seconds "$seconds" | tail -1)
    l=$("$bench" "${flags[@]}" produce --brokers 127.0.0.1:$port --queue one --in-flight 1 --message-bytes 100 \
      --acks 1 --seconds "$seconds" | tail -1)
    echo "round $i $mode throughput: $t"
    echo "round $i $mode one in flight: $l"
    through+=("$mode $(echo "$t" | figure mib_s)")
    latency+=("$mode $(echo "$l" | figure p50_us)")
  done
done
summary() { # label unit: medians of "mode value" lines on stdin
  python3 -c '
import statistics, sys
label, unit = sys.argv[1], sys.argv[2]
runs = [l.split() for l in sys.stdin if l.strip()]
plain, tls = (statistics.median(float(v) for k, v in runs if k == m) for m in ("plain", "tls"))
print("%s medians: plaintext %.0f %s, TLS %.0f %s (ratio %.2f, %+.0f)" % (label, plain, unit, tls, unit, tls / plain, tls - plain))
' "$1" "$2"
}
printf '%s\n' "${through[@]}" | summary throughput MiB/s
printf '%s\n' "${latency[@]}" | summary "one in flight p50" us
