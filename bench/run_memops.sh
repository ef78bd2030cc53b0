#!/usr/bin/env bash
# Memory-bound ops benchmark: nanotrain's LayerNorm, GELU and fused cross-entropy (bench_memops)
# and torch's equivalents (bench_memops.py) on the same shapes in one run, next to the device's
# copy bandwidth; prints the side-by-side table and writes it to $build/bench/memops_table.md.
# Builds nothing. Usage: bench/run_memops.sh [build-dir (default build)] [bf16|f16|f32 (default bf16)]
set -euo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
build="${1:-build}"
dtype="${2:-bf16}"
bin="$build/bench/bench_memops"
[ -x "$bin" ] || { echo "run_memops.sh: $bin not found (build first: cmake --build $build)" >&2; exit 1; }
raw="$build/bench/memops_nt.txt"
table="$build/bench/memops_table.md"
"$bin" --dtype "$dtype" | tee "$raw"
echo
python3 "$here/bench_memops.py" "$raw" --dtype "$dtype" | tee "$table"
echo "table written to $table"
