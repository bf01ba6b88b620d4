#!/usr/bin/env bash
# Runs `tandem bench model` and llama.cpp's llama-bench on the same GGUF files,
# alternating, and prints one markdown row per file with both engines'
# medians. llama.cpp is not part of tandem: build it yourself, outside this
# repository, and pass the folder holding its llama-bench and
# llama-batched-bench binaries.
#
#   bench/compare_llamacpp.sh /path/to/llama.cpp/build/bin ROUNDS model1.gguf [model2.gguf ...]
#
# Each round runs tandem (pp512, tg128, batched decode x8/x32/x64 after a
# 16-token prompt, 32 steps; one repetition each), then llama-bench (pp512,
# tg128, -r 1) and llama-batched-bench (-npp 16 -ntg 32 -npl "$batches"), all
# with 2 threads; the table shows the median over rounds. The roofline column
# is tandem's tg128 against the probe run after all its tests, and in
# parentheses against the probe passes taken around each tg128 run.
set -euo pipefail
llama_bin="$1"; rounds="$2"; shift 2
llama_bench="$llama_bin/llama-bench"
llama_batched="$llama_bin/llama-batched-bench"
tandem="$(dirname "$0")/../build/tandem"
threads="${THREADS:-2}"
batches="${BATCHES:-8,32,64}"  # batched-decode sequence counts; the table reports 8, 32 and 64 when present

median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }

echo "| model | tandem pp512 | llama.cpp pp512 | ratio | tandem tg128 | llama.cpp tg128 | ratio | tandem roofline (paired) | tandem x8 / x32 / x64 | llama.cpp x8 / x32 / x64 | ratio x64 |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for model in "$@"; do
  tmp="$(mktemp -d)"
  for ((i = 0; i < rounds; i++)); do
    "$tandem" bench model -m "$model" -t "$threads" -r 1 --batches "$batches" --json >> "$tmp/tandem.jsonl"
    "$llama_bench" -m "$model" -t "$threads" -p 512 -n 128 -r 1 -o jsonl 2>/dev/null >> "$tmp/llama.jsonl"
    "$llama_batched" -m "$model" -t "$threads" -c 4096 -b 2048 -ub 512 -npp 16 -ntg 32 -npl "$batches" \
      --output-format jsonl 2>/dev/null | grep '"pl"' >> "$tmp/batched.jsonl"
  done
  l_b() { grep "\"pl\": $1," "$tmp/batched.jsonl" | grep -o '"speed_tg": [0-9.]*' | awk '{print $2}' | median || true; }
  l_b8=$(l_b 8); l_b32=$(l_b 32); l_b64=$(l_b 64)
  t_pp=$(grep -o '"pp512_tps": [0-9.]*' "$tmp/tandem.jsonl" | awk '{print $2}' | median)
  t_tg=$(grep -o '"tg128_tps": [0-9.]*' "$tmp/tandem.jsonl" | awk '{print $2}' | median)
  t_roof=$(grep -o '"roofline_ratio": [0-9.]*' "$tmp/tandem.jsonl" | awk '{print $2}' | median)
  t_paired=$(grep -o '"roofline_paired_ratio": [0-9.]*' "$tmp/tandem.jsonl" | awk '{print $2}' | median)
  # (a number must follow: batched_limits repeats these keys with objects)
  t_b8=$(grep -o '"8": [0-9][0-9.]*' "$tmp/tandem.jsonl" | awk '{print $2}' | median || true)
  t_b32=$(grep -o '"32": [0-9][0-9.]*' "$tmp/tandem.jsonl" | awk '{print $2}' | median || true)
  t_b64=$(grep -o '"64": [0-9][0-9.]*' "$tmp/tandem.jsonl" | awk '{print $2}' | median || true)
  l_pp=$(grep '"n_prompt": 512' "$tmp/llama.jsonl" | grep -o '"avg_ts": [0-9.]*' | awk '{print $2}' | median)
  l_tg=$(grep '"n_gen": 128' "$tmp/llama.jsonl" | grep -o '"avg_ts": [0-9.]*' | awk '{print $2}' | median)
  printf "| %s | %.1f | %.1f | %.2fx | %.1f | %.1f | %.2fx | %.0f%% (%.0f%%) | %.1f / %.1f / %.1f | %.1f / %.1f / %.1f | %.2fx |\n" \
    "$(basename "$model")" "$t_pp" "$l_pp" "$(echo "$t_pp / $l_pp" | bc -l)" "$t_tg" "$l_tg" \
    "$(echo "$t_tg / $l_tg" | bc -l)" "$(echo "$t_roof * 100" | bc -l)" "$(echo "$t_paired * 100" | bc -l)" "${t_b8:-0}" "${t_b32:-0}" "${t_b64:-0}" \
    "${l_b8:-0}" "${l_b32:-0}" "${l_b64:-0}" "$(echo "${t_b64:-0} / ${l_b64:-1}" | bc -l)"
  rm -rf "$tmp"
done
