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

# tandem's step counters (/metrics) before and after a level give where its
# step time went: steps carrying only decode rows, only prompt chunks, or both;
# the forward's share; and the time outside steps. llama-server has no such
# series, so the split is printed for tandem only.
split_file=/tmp/tandem-serve-step-split.txt
scrape() { curl -sf "$1/metrics" || true; }
step_split() {
  python3 - "$1" "$2" "$3" "$4" <<'PY'
import re, sys
def parse(path):
    out = {}
    for line in open(path):
        m = re.match(r'(tandem_engine_\w+?)(\{[^}]*\})? (\S+)$', line)
        if not m: continue
        kind = re.search(r'kind="(\w+)"', m.group(2) or '')
        out[(m.group(1), kind.group(1) if kind else None)] = float(m.group(3))
    return out
a, b = parse(sys.argv[1]), parse(sys.argv[2])
d = lambda name, kind=None: b.get((name, kind), 0) - a.get((name, kind), 0)
wall = float(sys.argv[4]); total = d('tandem_engine_step_seconds_total')
for kind in ('decode', 'prefill', 'mixed'):
    steps = d('tandem_engine_steps_by_kind_total', kind)
    if steps == 0: continue
    t = d('tandem_engine_step_seconds_by_kind_total', kind); f = d('tandem_engine_forward_seconds_by_kind_total', kind)
    print('| %s | %s | %d | %.1f | %.1f | %.1f | %.1f | %.1f | %.0f %% |' % (sys.argv[3], kind, steps, t, 1e3 * t / steps,
          1e3 * f / steps, d('tandem_engine_prefill_tokens_by_kind_total', kind) / steps,
          d('tandem_engine_decode_rows_by_kind_total', kind) / steps, 100 * (t - f) / t if t else 0))
print('| %s | outside steps | | %.1f of %.1f s wall | | | | | |' % (sys.argv[3], wall - total, wall))
PY
}

run_levels() {
  local url="$1" name="$2"
  for c in $levels; do
    local n=$(( 2 * c > 8 ? 2 * c : 8 ))
    scrape "$url" > /tmp/serve-metrics-before.txt
    local t0; t0=$(date +%s.%N)
    "$tandem" bench serve --url "$url" -c "$c" --requests "$n" --input-tokens 128 --output-len 128 --seed "$c" --json 2>/dev/null |
      python3 -c "import json,sys; d=json.load(sys.stdin)['levels'][0]; print('| $name | %d | %d | %d | %.1f | %.3f | %.3f | %.4f | %.2f |' % (d['concurrency'], d['requests'], d['errors'], d['output_tokens_per_s'], d['ttft_s']['p50'], d['ttft_s']['p99'], d['tpot_s']['p50'], d['e2e_s']['p50']))"
    if [ "$name" = tandem ]; then
      scrape "$url" > /tmp/serve-metrics-after.txt
      step_split /tmp/serve-metrics-before.txt /tmp/serve-metrics-after.txt "$c" \
        "$(python3 -c "import time; print(time.time() - $t0)")" >> "$split_file"
    fi
  done
}

echo "| server | concurrency | requests | errors | output tok/s | TTFT p50 (s) | TTFT p99 (s) | TPOT p50 (s) | e2e p50 (s) |"
echo "|---|---|---|---|---|---|---|---|---|"

: > "$split_file"
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

echo
echo "tandem's step time by step kind (from /metrics around each level):"
echo "| concurrency | steps carrying | steps | seconds | ms per step | forward ms per step | prompt tokens per step | decode rows per step | outside the forward |"
echo "|---|---|---|---|---|---|---|---|---|"
cat "$split_file"
