#!/usr/bin/env bash
# Configures and builds tandem (Release) into build/. Extra arguments go to cmake.
set -euo pipefail
cd "$(dirname "$0")/.."
# Paths relative to the checkout let ccache hit across clones in different folders.
export CCACHE_BASEDIR="$PWD"
cmake -S . -B build -G Ninja -DCMAKE_BUILD_TYPE=Release "$@" > /dev/null
cmake --build build --parallel "$(nproc)"
