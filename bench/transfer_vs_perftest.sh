#!/usr/bin/env bash
# KV transfer bandwidth of tandem's UCX transport against ucx_perftest (Debian
# ucx-utils) on the same machine and UCX transport, in one run.
#   bench/transfer_vs_perftest.sh [TLS] [RUN_BYTES]      (defaults: tcp 1048576)
# ucx_perftest allocates its buffers with UCP_MEM_MAP_ALLOCATE; UCX_ALLOC_PRIO
# makes it use plain pages as tandem's self-registered pool does.
set -euo pipefail
cd "$(dirname "$0")/.."
tls="${1:-tcp}"
size="${2:-1048576}"
bin=./build/tandem
port=$((20000 + RANDOM % 20000))
pids=()
cleanup() { for p in "${pids[@]}"; do kill "$p" 2>/dev/null || true; wait "$p" 2>/dev/null || true; done; }
trap cleanup EXIT

perftest() {  # test name, extra flags
  UCX_TLS="$tls" UCX_NET_DEVICES=lo UCX_ALLOC_PRIO=thp,mmap,heap timeout 60 ucx_perftest -p "$port" -c 0 >/dev/null 2>&1 &
  pids+=($!)
  sleep 1
  UCX_TLS="$tls" UCX_NET_DEVICES=lo UCX_ALLOC_PRIO=thp,mmap,heap timeout 60 \
    ucx_perftest 127.0.0.1 -p "$port" -c 1 -t "$1" -s "$size" -n 2000 -w 100 -e -f "${@:2}" 2>&1 | tail -1
  wait "${pids[-1]}" 2>/dev/null || true
  port=$((port + 1))
}

echo "== ucx_perftest, UCX_TLS=$tls, $size-byte messages (last columns: MB/s average, overall; msg/s)"
echo "put:"; perftest ucp_put_bw -O 16
echo "get:"; perftest ucp_get -O 16
echo "== tandem bench transfer, UCX_TLS=$tls, $((size / 1024)) KiB runs, 16 per flush"
"$bin" bench transfer --tls "$tls" --run-kb $((size / 1024)) --runs-per-op 16
