#!/usr/bin/env bash
# Serving throughput and latency of tandem and llama.cpp's server on the same
# GGUF, measured by `tandem bench serve` in one run. llama.cpp is not part of
# tandem: build its llama-server yourself, outside this repository.
#
#   bench/serve_vs_llamacpp.sh /path/to/llama-server MODEL.gguf [LEVELS] [THREADS]
#
# LEVELS defaults to "1 4 16 64"; each level sends max(8, 2 x concurrency)
# requests of exactly 128 prompt tokens (token-id prompts) and 128 output tokens (greedy, ignore_eos),
# streaming. Both servers get the same thread count and 64 parallel slots.
set -euo pipefail
llama_server="$1"; model="$2"; levels="${3:-1 4 16 64}"; threads="${4:-2}"
tandem="$(dirname "$0")/../build/tandem"
port_t=18731; port_l=18732

wait_ready() {
  for _ in $(seq 1 600); do
    curl -sf "http://127.0.0.1:$1/health" > /dev/null 2>&1 && return 0
    sleep 0.5
  done
  echo "server on port $1 did not become ready" >&2; return 1
}

run_levels() {
  local url="$1" name="$2"
  for c in $levels; do
    local n=$(( 2 * c > 8 ? 2 * c : 8 ))
    "$tandem" bench serve --url "$url" -c "$c" --requests "$n" --input-tokens 128 --output-len 128 --seed "$c" --json 2>/dev/null |
      python3 -c "import json,sys; d=json.load(sys.stdin)['levels'][0]; print('| $name | %d | %d | %d | %.1f | %.3f | %.3f | %.4f | %.2f |' % (d['concurrency'], d['requests'], d['errors'], d['output_tokens_per_s'], d['ttft_s']['p50'], d['ttft_s']['p99'], d['tpot_s']['p50'], d['e2e_s']['p50']))"
  done
}

echo "| server | concurrency | requests | errors | output tok/s | TTFT p50 (s) | TTFT p99 (s) | TPOT p50 (s) | e2e p50 (s) |"
echo "|---|---|---|---|---|---|---|---|---|"

"$tandem" serve -m "$model" --port "$port_t" -t "$threads" --max-num-seqs 64 > /tmp/tandem-serve-bench.log 2>&1 &
pid_t=$!
wait_ready "$port_t"
run_levels "http://127.0.0.1:$port_t" tandem
kill "$pid_t"; wait "$pid_t" || true

"$llama_server" -m "$model" --port "$port_l" -t "$threads" --parallel 64 --cont-batching -c 32768 \
  > /tmp/llama-server-bench.log 2>&1 &
pid_l=$!
wait_ready "$port_l"
run_levels "http://127.0.0.1:$port_l" llama.cpp
kill "$pid_l"; wait "$pid_l" || true
