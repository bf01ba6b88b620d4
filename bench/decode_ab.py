#!/usr/bin/env python3
"""Batch-1 decode of two or more tandem binaries on one model, in alternating
rounds (the order reversed every other round), so that a host whose memory
bandwidth drifts with other tenants' load slows every binary alike. Prints
each binary's median tokens/s and its per-round ratio to the first binary.

    bench/decode_ab.py MODEL ROUNDS BINARY_A BINARY_B [...]

A binary may be a wrapper script that sets an environment first.
"""
import re
import statistics
import subprocess
import sys


def tg64(binary: str, model: str) -> float:
    out = subprocess.run([binary, "bench", "model", "-m", model, "-t", "2", "-r", "3", "-p", "16", "-n", "64",
                          "--batches", "1"], capture_output=True, text=True, timeout=600, check=True).stdout
    m = re.search(r"^tg64 \(batch 1\)\s+([\d.]+)", out, re.M)
    if m is None:
        raise SystemExit(f"{binary}: no tg64 line in its output")
    return float(m.group(1))


def main() -> None:
    if len(sys.argv) < 5:
        raise SystemExit(__doc__)
    model, rounds, binaries = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
    runs = {b: [] for b in binaries}
    for i in range(rounds):
        for b in binaries if i % 2 == 0 else binaries[::-1]:
            runs[b].append(tg64(b, model))
    base = runs[binaries[0]]
    for b in binaries:
        ratios = [x / y for x, y in zip(runs[b], base)]
        print(f"{b}: median {statistics.median(runs[b]):.2f} tokens/s, ratio to {binaries[0]}: "
              f"median {statistics.median(ratios):.3f} (min {min(ratios):.3f}, max {max(ratios):.3f})")


if __name__ == "__main__":
    main()
