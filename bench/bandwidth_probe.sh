#!/usr/bin/env bash
# The bandwidth probe against a plain C read loop, in the same run (issue 18):
# `tandem bench bandwidth` must read at least what bench/read_loop.c reads.
# Alternates the two ROUNDS times so neither gets a quieter minute.
# Usage: bench/bandwidth_probe.sh [BUILD_DIR] [THREADS] [ROUNDS]
set -euo pipefail
build="${1:-build}"
threads="${2:-2}"
rounds="${3:-3}"
[[ -x "$build/read_loop" ]] || { echo "no $build/read_loop (built where OpenMP is)" >&2; exit 1; }
for ((i = 1; i <= rounds; i++)); do
  OMP_NUM_THREADS="$threads" OMP_PROC_BIND=spread "$build/read_loop" 1 8
  "$build/tandem" bench bandwidth -t "$threads" --passes 8 --gib 1
done
