#!/usr/bin/env bash
# TTFT and throughput through the router on a 1P1D cluster (one thread per
# instance) against one `--role both` instance with the same total threads,
# at the given concurrency levels. The two never run at once.
#   bench/pd_vs_both.sh [MODEL] [LEVELS] [INPUT_LEN] [OUTPUT_LEN] [MODE]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=./build/tandem
model="${1:-}"
levels="${2:-1,4,16}"
in_len="${3:-128}"
out_len="${4:-32}"
mode="${5:-write}"
margs=()
[ -n "$model" ] && margs=(-m "$model")
port=$((30000 + RANDOM % 10000))
pg=""
cleanup() { [ -n "$pg" ] && { kill -INT -- "-$pg" 2>/dev/null || true; sleep 2; kill -KILL -- "-$pg" 2>/dev/null || true; }; pg=""; }
trap cleanup EXIT
wait_ready() {
  for _ in $(seq 600); do curl -sf "http://127.0.0.1:$1/health" >/dev/null && return 0; sleep 0.2; done
  echo "not ready" >&2; return 1
}
threads=$(nproc)
echo "== 1P1D through the router ($mode mode, ${THREADS_PER_INSTANCE:-$((threads / 2 > 0 ? threads / 2 : 1))} threads per instance, $threads cores)"
per="${THREADS_PER_INSTANCE:-$((threads / 2 > 0 ? threads / 2 : 1))}"
setsid "$bin" cluster --prefill 1 --decode 1 --mode "$mode" --port "$port" -t "$per" "${margs[@]}" 2>/dev/null &
pg=$!
wait_ready "$port"
"$bin" bench serve --url "http://127.0.0.1:$port" -c "$levels" --input-len "$in_len" --output-len "$out_len" 2>/dev/null
cleanup
echo "== one instance (--role both, $threads threads)"
port=$((port + 1))
setsid "$bin" serve --port "$port" -t "$threads" "${margs[@]}" 2>/dev/null &
pg=$!
wait_ready "$port"
"$bin" bench serve --url "http://127.0.0.1:$port" -c "$levels" --input-len "$in_len" --output-len "$out_len" 2>/dev/null
cleanup
