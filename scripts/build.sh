#!/usr/bin/env bash
# Configures and builds into a folder (default build/). Extra arguments go to cmake.
#   scripts/build.sh [builddir] [-DOPTION=VALUE ...]
set -euo pipefail
cd "$(dirname "$0")/.."
dir=${1:-build}
shift || true
export PATH="$PATH:/usr/local/cuda/bin"
mkdir -p "$dir"
cmake -S . -B "$dir" -G Ninja "$@" >"$dir/configure.log" 2>&1 || { cat "$dir/configure.log"; exit 1; }
grep "nanotrain:" "$dir/configure.log" || true
ninja -C "$dir"
