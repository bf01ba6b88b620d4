#!/usr/bin/env bash
# How many greedy tokens tandem and llama.cpp agree on, per GGUF file and
# prompt. llama.cpp is not part of tandem: build its llama-simple yourself,
# outside this repository, and pass the folder holding it.
#
#   bench/greedy_vs_llamacpp.sh /path/to/llama.cpp/build/bin model1.gguf [model2.gguf ...]
#
# A greedy text of K tokens is a prefix of the text of K + 1 tokens, so the
# first K at which `llama-simple -n K` and `tandem generate --temp 0 -n K`
# print different texts is the first token they differ on: found by a
# binary search over K up to MAX_TOKENS (16). Prints one markdown row per
# file: the tokens agreed on for each prompt ("16" means all of them).
set -euo pipefail
llama_bin="$1"; shift
max="${MAX_TOKENS:-16}"
tandem="$(dirname "$0")/../build/tandem"
prompts=("Once upon a time" "The quick brown fox" "Hello, my name is")

trim() { sed -e 's/^[[:space:]]*//' -e 's/[[:space:]]*$//'; }
tandem_text() { "$tandem" generate -m "$1" -p "$2" -n "$3" --temp 0 -t 2 2>/dev/null | trim; }
llama_text() { "$llama_bin/llama-simple" -m "$1" -n "$3" "$2" 2>/dev/null | trim; }
same() { [ "$(tandem_text "$1" "$2" "$3")" = "$(llama_text "$1" "$2" "$3")" ]; }

# Tokens of `prompt` the two agree on, at most max.
agreed() {
  local model="$1" prompt="$2" lo=0 hi="$max" mid
  if same "$model" "$prompt" "$max"; then echo "$max"; return; fi
  while (( hi - lo > 1 )); do
    mid=$(( (lo + hi) / 2 ))
    if same "$model" "$prompt" "$mid"; then lo=$mid; else hi=$mid; fi
  done
  echo "$lo"
}

header="| file |"; rule="|---|"
for p in "${prompts[@]}"; do header+=" \"$p\" |"; rule+="---|"; done
echo "$header"; echo "$rule"
for model in "$@"; do
  row="| $(basename "$model") |"
  for p in "${prompts[@]}"; do row+=" $(agreed "$model" "$p") |"; done
  echo "$row"
done
