#!/usr/bin/env bash
# Thread scaling of `tandem bench model`: alternates runs with 1 and with N
# threads (default 2) and prints the median of each figure and the speedup.
#
#   bench/thread_scaling.sh ROUNDS model.gguf [N]
set -euo pipefail
rounds="$1"; model="$2"; n="${3:-2}"
tandem="$(dirname "$0")/../build/tandem"
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT
for ((i = 0; i < rounds; i++)); do
  for t in 1 "$n"; do
    "$tandem" bench model -m "$model" -t "$t" -r 1 --batches 64 --json >> "$tmp/t$t.jsonl"
  done
done
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
field() { grep -o "\"$1\": [0-9.]*" "$tmp/t$2.jsonl" | awk '{print $2}' | median; }
echo "| model | threads | pp512 | tg128 | batched x64 |"
echo "|---|---|---|---|---|"
for t in 1 "$n"; do
  printf "| %s | %s | %.1f | %.1f | %.1f |\n" "$(basename "$model")" "$t" "$(field pp512_tps "$t")" \
    "$(field tg128_tps "$t")" "$(field 64 "$t")"
done
printf "| speedup | %sx | %.2fx | %.2fx | %.2fx |\n" "$n" \
  "$(echo "$(field pp512_tps "$n") / $(field pp512_tps 1)" | bc -l)" \
  "$(echo "$(field tg128_tps "$n") / $(field tg128_tps 1)" | bc -l)" \
  "$(echo "$(field 64 "$n") / $(field 64 1)" | bc -l)"
