#!/usr/bin/env bash
# The README's first command, after the build: starts a local P/D cluster
# (a router, one prefill and one decode instance, KV moved over UCX), sends
# one streamed chat request through the router, and stops everything.
# Extra arguments go to `tandem cluster` (e.g. --mode read, -m model.gguf).
set -euo pipefail
cd "$(dirname "$0")/.."
port="${TANDEM_DEMO_PORT:-8000}"
log="$(mktemp)"
setsid ./build/tandem cluster --prefill 1 --decode 1 --port "$port" "$@" 2>"$log" &
pid=$!
cleanup() {
  kill -INT -- "-$pid" 2>/dev/null || true
  for _ in $(seq 100); do kill -0 "$pid" 2>/dev/null || break; sleep 0.1; done
  kill -KILL -- "-$pid" 2>/dev/null || true
  rm -f "$log"
}
trap cleanup EXIT
echo "demo: starting a router, a prefill and a decode instance (the demo model is generated on first use)..."
for _ in $(seq 1800); do
  grep -q "tandem cluster: ready" "$log" && break
  if ! kill -0 "$pid" 2>/dev/null; then cat "$log"; echo "demo: the cluster did not start" >&2; exit 1; fi
  sleep 0.1
done
grep -q "tandem cluster: ready" "$log" || { cat "$log"; echo "demo: not ready after 180 s" >&2; exit 1; }
grep "tandem cluster: ready" "$log"
echo "demo: POST /v1/chat/completions (stream) through the router:"
curl -sN --max-time 120 "http://127.0.0.1:$port/v1/chat/completions" \
  -d '{"messages":[{"role":"user","content":"Once upon a time"}],"max_tokens":48,"stream":true}'
echo
echo "demo: done; stopping the cluster"
