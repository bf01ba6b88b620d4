#!/usr/bin/env bash
# What data parallelism costs a decode step: `serve --data-parallel-size 2`
# (expert parallel for the MoE architectures) on the small preset of each
# architecture, one thread per rank, two concurrent requests (one per rank);
# from each rank's /debug/parallel and /metrics deltas: the step consensus
# and the expert dispatch + combine per step, against the engine's step time.
# The consensus cost is the rank the other waits for (its consensus time is
# the collective's own); the other rank's column adds its wait for it.
# REQUESTS=1: one request, on rank 0; rank 1 runs dummy steps (and its
# experts for rank 0's rows), so rank 0's consensus time is the collective's.
# REQUESTS=2 (default): one request per rank, both busy.
#   bench/dp_step_cost.sh [ARCHS] [OUTPUT_LEN]
set -euo pipefail
cd "$(dirname "$0")/.."
bin=./build/tandem
archs="${1:-llama qwen3moe qwen3next}"
out_len="${2:-128}"
port=$((30000 + RANDOM % 10000))
pg=""
cleanup() { [ -n "$pg" ] && { kill -TERM -- "-$pg" 2>/dev/null || true; sleep 1; kill -KILL -- "-$pg" 2>/dev/null || true; }; pg=""; }
trap cleanup EXIT
printf "%-10s %-4s %10s %14s %8s %16s %8s %10s %18s\n" arch ep "step ms" "consensus us" "share" "dispatch+comb us" "share" "per layer" "other rank's wait"
for arch in $archs; do
  model="/tmp/tandem-bench-small-$arch.gguf"
  [ -f "$model" ] || "$bin" make-model --preset small --arch "$arch" -o "$model" >/dev/null
  ep=""
  case "$arch" in qwen3moe|qwen3next) ep="--enable-expert-parallel" ;; esac
  setsid "$bin" serve -m "$model" --port "$port" -t 1 --kv-cache-mb 256 --data-parallel-size 2 $ep 2>/dev/null &
  pg=$!
  for _ in $(seq 600); do curl -sf "http://127.0.0.1:$port/health" >/dev/null && break; sleep 0.2; done
  rank1=$(curl -s "http://127.0.0.1:$port/debug/parallel" | python3 -c 'import json,sys; print(json.load(sys.stdin)["ranks"][1]["http"])')
  snap() { for u in "127.0.0.1:$port" "$rank1"; do curl -s "http://$u/debug/parallel"; echo; curl -s "http://$u/metrics" | grep -E '^tandem_engine_(step_seconds|steps)_total'; done; }
  before=$(snap)
  body="{\"prompt\":\"data parallel\",\"max_tokens\":$out_len,\"temperature\":0,\"ignore_eos\":true}"
  if [ "${REQUESTS:-2}" = 1 ]; then
    curl -s "http://127.0.0.1:$port/v1/completions" -d "$body" >/dev/null
  else
    curl -s "http://127.0.0.1:$port/v1/completions" -d "$body" >/dev/null &
    first=$!
    sleep 0.3
    curl -s "http://127.0.0.1:$port/v1/completions" -d "$body" >/dev/null
    wait "$first"
  fi
  after=$(snap)
  python3 - "$arch" "${ep:+yes}" <<PY
import json, sys
def parse(text):
    ranks, cur = [], None
    for line in text.splitlines():
        if line.startswith("{"):
            cur = {"dbg": json.loads(line)}; ranks.append(cur)
        elif line.startswith("tandem_engine_step_seconds_total"):
            cur["step_s"] = float(line.split()[-1])
        elif line.startswith("tandem_engine_steps_total"):
            cur["steps"] = float(line.split()[-1])
    return ranks
b, a = parse("""$before"""), parse("""$after""")
arch, ep = sys.argv[1], sys.argv[2] or "no"
rows = []
for rb, ra in zip(b, a):
    steps = ra["steps"] - rb["steps"]
    if steps <= 0: continue
    step_ms = (ra["step_s"] - rb["step_s"]) / steps * 1e3
    k = lambda r, op, f: r["dbg"]["ops_by_kind"][op][f]
    # Steps some rank had work in (idle rounds between requests excluded).
    cons_n = (ra["dbg"]["steps"] - ra["dbg"]["idle_steps"]) - (rb["dbg"]["steps"] - rb["dbg"]["idle_steps"])
    cons_us = (ra["dbg"]["busy_consensus_s"] - rb["dbg"]["busy_consensus_s"]) / cons_n * 1e6
    ex_us = sum(k(ra, op, "time_s") - k(rb, op, "time_s") for op in ("expert_dispatch", "expert_combine")) / cons_n * 1e6
    layers = (k(ra, "expert_dispatch", "count") - k(rb, "expert_dispatch", "count")) / cons_n
    rows.append((step_ms, cons_us, ex_us, layers))
# The rank that waits least in the consensus is the one the others wait
# for: its time is the collective's own; the other's adds the wait for it.
rows.sort(key=lambda r: r[1])
step_ms, cons_us, ex_us, layers = rows[0]
print("%-10s %-4s %10.2f %14.1f %7.2f%% %16.1f %7.2f%% %8.1f us %15.1f us" % (arch, ep, step_ms, cons_us,
      cons_us / 10 / step_ms, ex_us, ex_us / 10 / step_ms, ex_us / layers if layers > 0 else 0, rows[-1][1]))
PY
  cleanup
  port=$((port + 1))
done
